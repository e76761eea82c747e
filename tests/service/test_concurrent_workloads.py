"""60 workload jobs submitted at once by two tenants, placed in one cycle and launched
together into one Kubernetes member (kmock over real HTTP, pin mode): none is rolled back.
The member holds each LIST of Jobs until every create is answered
(``test_kube_concurrent_launches.HeldListings``, a slow LIST overtaken by the creates), so a
launch that read a listing begun before its own create as its Job gone would be rolled
back "disappeared" and requeued. The test plays the Job controller (a pod per Job, from
its stored template), the scheduler and the kubelet (through the API, which the broker
watches)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any, cast

import kmock
import kmock as kmocklib
import pytest
from test_kube_concurrent_launches import HeldListings
from test_workload_service import JOBS, NODES, PODS, node_obj

from adapters.kube.slots import gated
from broker.config import parse_config
from broker.manifest import parse_manifest
from broker.service.facade import Service

pytestmark = pytest.mark.kmock(cls=HeldListings)

TENANTS = ("team-a", "team-b")
PER_TENANT = 30
CONFIG = """
store: {{url: "sqlite:///{db}"}}
clusters:
- name: east
  source:
    kube: {{kubeconfig: "{kubeconfig}", context: east, launchMode: pin, podPollSeconds: 0.02}}
queues:
- {{name: training, policy: gang}}
tenants:
- {{name: team-a, defaultQueue: training, token: {{value: tok-a-00000000000000000000000000}}}}
- {{name: team-b, defaultQueue: training, token: {{value: tok-b-00000000000000000000000000}}}}
"""
ONE_GPU_JOB = {
    "apiVersion": "batch/v1", "kind": "Job",
    "spec": {"backoffLimit": 0, "template": {
        "metadata": {"labels": {"app": "trainer"}},
        "spec": {"restartPolicy": "Never", "containers": [{
            "name": "main", "image": "trainer:1.0",
            "resources": {"limits": {"nvidia.com/gpu": 1, "cpu": "1", "memory": "1Gi"}}}]},
    }},
}  # fmt: skip


def submission(name: str) -> Any:
    body = {"apiVersion": "fedbroker.io/v1alpha1", "kind": "FederatedJob",
            "metadata": {"name": name}, "spec": {"workload": ONE_GPU_JOB}}  # fmt: skip
    return parse_manifest(json.dumps(body).encode(), "application/json")


@pytest.fixture
def k8s(kmock: kmock.KubernetesEmulator) -> HeldListings:
    for name in ("v1/pods", "v1/services", "batch/v1/jobs"):
        kmock.resources[name] = kmocklib.ResourceInfo(namespaced=True)
    kmock.resources["v1/nodes"] = kmocklib.ResourceInfo(namespaced=False)
    for i in range(8):  # 64 GPUs for 60 one-GPU jobs
        node = node_obj(f"n{i}")
        node["status"]["allocatable"]["nvidia.com/gpu"] = "8"
        kmock.objects[NODES, None, f"n{i}"] = node
    return cast(HeldListings, kmock)


def play(k8s: HeldListings) -> list[asyncio.Future[None]]:
    """One turn of the controller (a pod for each Job that has none), the scheduler and the
    kubelet (each ungated pod bound where it was pinned and run, through the API)."""
    live = [(key, o) for key, o in list(k8s.objects.items()) if not o.deleted]
    made = {(ns, o.raw["metadata"]["labels"]["job-name"]) for (r, ns, _), o in live if r == PODS}
    turns: list[asyncio.Future[None]] = []
    for (res, namespace, name), obj in live:
        if res == JOBS and (namespace, name) not in made:
            template = obj.raw["spec"]["template"]
            labels = {**template["metadata"]["labels"], "job-name": name,
                      "batch.kubernetes.io/job-name": name}  # fmt: skip
            k8s.controller_create(PODS, str(namespace), {
                "apiVersion": "v1", "kind": "Pod", "spec": template["spec"],
                "metadata": {**template["metadata"], "name": f"{name}-x7k2q",
                             "namespace": namespace, "labels": labels},
            })  # fmt: skip
        elif res == PODS and not gated(obj.raw) and not obj.raw["spec"].get("nodeName"):
            [term] = obj.raw["spec"]["affinity"]["nodeAffinity"][
                "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]  # fmt: skip
            node = term["matchFields"][0]["values"][0]
            patch = {"spec": {"nodeName": node}, "status": {"phase": "Running"}}
            turns.append(asyncio.ensure_future(k8s.patch_pod(str(namespace), name, patch)))
    return turns


MAX_ROUNDS = 6000


async def test_sixty_workloads_of_two_tenants_launched_at_once_none_rolled_back(
    k8s: HeldListings, tmp_path: Path
) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "east",
        "contexts": [{"name": "east", "context": {"cluster": "c-east", "user": "u"}}],
        "clusters": [{"name": "c-east", "cluster": {"server": str(k8s.url).rstrip("/")}}],
        "users": [{"name": "u", "user": {"token": "not-a-real-token"}}],
    }))  # fmt: skip
    service = Service(
        parse_config(CONFIG.format(db=tmp_path / "jobs.db", kubeconfig=kubeconfig), "test")
    )
    await service.start()
    try:
        jobs = [(t, f"train-{i}") for t in TENANTS for i in range(PER_TENANT)]
        await asyncio.gather(*(service.submit(t, submission(name)) for t, name in jobs))
        k8s.hold_until(len(jobs))
        await service.schedule_once()
        placed = [await service.get(t, name) for t, name in jobs]
        assert {r.state for r in placed} == {"Placed"}
        # The member's controllers play a round between the launches' polls; bounded in
        # rounds, not seconds, so a slow machine only takes longer.
        for _ in range(MAX_ROUNDS):
            if not service.lifecycle.launches() or all(
                la.running for la in service.lifecycle.launches()
            ):
                break
            await asyncio.gather(*play(k8s))
            await asyncio.sleep(0.01)  # paced under the launches' poll (podPollSeconds 0.02)
        else:
            raise AssertionError(f"launches still starting after {MAX_ROUNDS} rounds")
        await service.launches_done(timeout=10)
        records = [await service.get(t, name) for t, name in jobs]
        assert [(r.state, r.attempts) for r in records] == [("Running", 0)] * len(jobs)
        assert k8s.lists > 1
    finally:
        await service.close()
