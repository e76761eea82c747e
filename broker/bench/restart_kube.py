"""``fedbroker bench --restart --kube``: time to ready after ``kill -9`` with N running jobs
on Kubernetes members, served by kmock over real HTTP.

As ``--restart`` (``broker.bench.restart``), but every live job is Running on a Kubernetes
member, with its pod in the member as the broker's launcher makes it (``GangObjects.pod_body``
in pin mode, bound to its node, phase Running). A restarted broker requeues nothing: it lists
each member's nodes and pods before it leads, reads our pods back, and restores each job's
reservation from them (``Recovery._restore``). Members are ``--clusters`` kmock emulators in
this process (kmock is a test dependency: ``pip install .[test]``), with as many 8-GPU nodes
each as the jobs need. The emulators share the machine with the broker, so the figure
includes the mock API server's own time to list.
"""

from __future__ import annotations

import contextlib
import json
import math
import secrets
import tempfile
import time
from pathlib import Path
from typing import Any

from adapters.kube.objects import GangObjects
from broker.bench.restart import (
    TENANT,
    bench_store,
    check_store,
    compile_project,
    free_port,
    job_name,
    load_statements,
    load_store,
    start_once,
)
from broker.bench.serving import bench_document
from broker.model import PodPlacement, Resources
from broker.ports import LaunchSpec
from broker.store.migrations import Dialect

GPUS_PER_NODE = 8
NAMESPACE_PATTERN = "fedbroker-{tenant}"
POD = Resources(gpus=1, cpu_milli=4000, memory_mib=16 * 1024)  # bench.e2e.job_body's pod


def cluster_name(c: int) -> str:
    return f"kube-{c:03d}"


def slot_of(i: int, clusters: int) -> tuple[str, str, int]:
    """Job ``i``'s (cluster, node, GPU): round robin over the clusters, then filling each
    cluster's nodes GPU by GPU."""
    c, k = i % clusters, i // clusters
    return cluster_name(c), f"{cluster_name(c)}-n{k // GPUS_PER_NODE:05d}", k % GPUS_PER_NODE


def node_object(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": {"nvidia.com/gpu.product": "A100"}},
        "spec": {},
        "status": {
            "allocatable": {"nvidia.com/gpu": str(GPUS_PER_NODE), "cpu": "96",
                            "memory": "768Gi"},
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }  # fmt: skip


def pod_object(objects: GangObjects, i: int, node: str, gpu: int) -> dict[str, Any]:
    """Job ``i``'s pod as the launcher creates it, then bound to ``node`` and running."""
    name = job_name(i)
    spec = LaunchSpec(tenant=TENANT, job=name, queue="bench", pod_sets=("main",))
    body = objects.pod_body(PodPlacement(f"{TENANT}.{name}-main-0", node, (gpu,), POD), spec)
    body["spec"]["nodeName"] = node
    body["status"] = {"phase": "Running"}
    return body


def log_counts(log: Path) -> dict[str, Any]:
    """A start's warnings and errors, with the first of them (JSON lines: ``level``,
    ``msg``)."""
    problems = []
    for line in log.read_text(errors="replace").splitlines():
        with contextlib.suppress(ValueError):
            record = json.loads(line)
            if record.get("level") in ("warning", "error", "critical"):
                problems.append(str(record.get("msg", "")))
    return {"problems": len(problems), "first_problem": next(iter(problems), None)}


def _kubeconfig(server: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1", "kind": "Config", "current-context": "bench",
        "contexts": [{"name": "bench", "context": {"cluster": "member", "user": "bench"}}],
        "clusters": [{"name": "member", "cluster": {"server": server}}],
        "users": [{"name": "bench", "user": {"token": secrets.token_urlsafe(16)}}],
    }  # fmt: skip


async def _members(
    stack: contextlib.AsyncExitStack, jobs: int, clusters: int, nodes: int
) -> list[str]:
    """``clusters`` kmock emulators, served over HTTP until ``stack`` closes, each with its
    ``nodes`` nodes and its share of the jobs' pods (``slot_of``); their URLs."""
    import kmock  # a test dependency: checked by run_restart_kube

    pods, node_kind = kmock.resource("", "v1", "pods"), kmock.resource("", "v1", "nodes")
    members, urls = [], []
    for c in range(clusters):
        k8s = await stack.enter_async_context(kmock.KubernetesEmulator())
        k8s.resources["v1/pods"] = kmock.ResourceInfo(namespaced=True)
        k8s.resources["v1/nodes"] = kmock.ResourceInfo(namespaced=False)
        # What the broker's garbage collection lists besides pods (none are made).
        k8s.resources["v1/services"] = kmock.ResourceInfo(namespaced=True)
        k8s.resources["scheduling.x-k8s.io/v1alpha1/podgroups"] = kmock.ResourceInfo(
            namespaced=True
        )
        server = await stack.enter_async_context(kmock.Server(k8s))
        for n in range(nodes):
            name = f"{cluster_name(c)}-n{n:05d}"
            k8s.objects[node_kind, None, name] = node_object(name)
        objects = GangObjects(
            NAMESPACE_PATTERN, "pin", "coscheduling", "fedbroker", cluster=cluster_name(c),
            gpu_resource="nvidia.com/gpu", shared_gpu_resource=None, scheduler_name=None,
            default_image="busybox:stable",
        )  # fmt: skip
        members.append((k8s, objects))
        urls.append(str(server.url).rstrip("/"))
    for i in range(jobs):
        _, node, gpu = slot_of(i, clusters)
        k8s, objects = members[i % clusters]
        body = pod_object(objects, i, node, gpu)
        meta = body["metadata"]
        k8s.objects[pods, meta["namespace"], meta["name"]] = body
    return urls


def _config(url: str, token: str, members: list[str]) -> dict[str, Any]:
    """The broker's config: the benchmarks' document with the kmock members, pin mode."""
    doc = bench_document(url, token, 0, 0)
    doc["clusters"] = [
        {"name": cluster_name(c), "source": {"kube": {
            "kubeconfigInline": _kubeconfig(server), "context": "bench", "launchMode": "pin",
            "namespacePattern": NAMESPACE_PATTERN,
        }}}
        for c, server in enumerate(members)
    ]  # fmt: skip
    doc["leaderElection"] = {"identity": "restart-bench"}
    return doc


async def run_restart_kube(jobs: int, clusters: int, store: str | None) -> dict[str, Any]:
    try:
        import kmock  # noqa: F401  # only whether it is there
    except ImportError:
        raise SystemExit("bench --restart --kube needs kmock: pip install .[test]") from None
    token = secrets.token_urlsafe(32)
    nodes = math.ceil(jobs / clusters / GPUS_PER_NODE)
    with tempfile.TemporaryDirectory(prefix="fedbroker-restart-kube-") as tmp_dir:
        tmp = Path(tmp_dir)
        async with contextlib.AsyncExitStack() as stack:
            begin = time.perf_counter()
            members = await _members(stack, jobs, clusters, nodes)
            async with bench_store(store, tmp) as url:
                dialect: Dialect = "sqlite" if url.startswith("sqlite") else "postgres"
                statements = load_statements(
                    dialect, jobs, insert=True, state=lambda _: "Running",
                    slot=lambda i: slot_of(i, clusters)[:2],
                )  # fmt: skip
                await load_store(url, statements)
                load_s = time.perf_counter() - begin
                config = tmp / "config.json"
                config.write_text(json.dumps(_config(url, token, members)))
                compile_project()
                first = await start_once(config, free_port(), token, tmp / "first.log")
                first.update(log_counts(tmp / "first.log"))
                second = await start_once(config, free_port(), token, tmp / "second.log")
                second.update(log_counts(tmp / "second.log"))
                after = await check_store(url)
    return {
        "jobs": jobs, "store": dialect, "clusters": clusters, "nodes_per_cluster": nodes,
        "members": "kube (kmock)", "load_s": round(load_s, 2), "first_start": first,
        "after_kill": second, "jobs_back": after["active"], "states": after["states"],
        "inconsistent": after["inconsistent"],
    }  # fmt: skip
