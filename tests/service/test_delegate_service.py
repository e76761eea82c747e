"""Delegate mode through the Service, on a Kubernetes member served by kmock (real HTTP, the
real ``kubernetes.aio`` client from a kubeconfig file): the broker reserves capacity in its
ledger, makes the PodGroup and the workload (or its own pods), and the member's gang
scheduler places the pods, on nodes of its own choosing.

The test plays the training operator (v1.9: pods ``<job>-<type>-<index>`` labelled
``training.kubeflow.org/replica-type``/``replica-index``, ``init-pytorch`` on workers), the
gang scheduler (scheduler-plugins coscheduling or Volcano: a group's pods bound all at once
when ``minMember`` of them exist, each to the free node it likes best by the pods bound
there, last node first, so not where the broker reserved it; then the group's phase
Running) and the kubelet. What must hold: a placed job's pods are counted
once, where they run, so no job is rolled back for its own pods; and a restart restores a
delegated job from its pods."""

from __future__ import annotations

import copy
import json
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, cast

import kmock
import kmock as kmocklib
import pytest
from builders import until
from kmock_namespaces import NamespacedEmulator

from adapters.kube.translate import pod_resources
from broker.config import Config, parse_config
from broker.manifest import parse_manifest
from broker.manifest.workloads.pytorchjob import INIT_PYTORCH
from broker.service.facade import Service

NODES = kmock.resource("", "v1", "nodes")
PODS = kmock.resource("", "v1", "pods")
PYTORCHJOBS = kmock.resource("kubeflow.org", "v1", "pytorchjobs")
GROUPS = {
    "coscheduling": kmock.resource("scheduling.x-k8s.io", "v1alpha1", "podgroups"),
    "volcano": kmock.resource("scheduling.volcano.sh", "v1beta1", "podgroups"),
}
NS = "fedbroker-team-a"
GPUS_PER_NODE = 8

CONFIG = """
store: {{url: "sqlite:///{db}"}}
clusters:
- name: east
  source:
    kube: {{kubeconfig: "{kubeconfig}", context: east, launchMode: delegate,
            podGroup: {flavor}, podPollSeconds: 0.02}}
queues:
- {{name: training, policy: gang}}
tenants:
- {{name: team-a, defaultQueue: training, token: {{value: tok-a-00000000000000000000000000}}}}
"""

TEMPLATE = {
    "metadata": {"labels": {"app": "trainer"}},
    "spec": {
        "containers": [{
            "name": "pytorch", "image": "trainer:1.0",
            "resources": {"limits": {"nvidia.com/gpu": GPUS_PER_NODE, "cpu": "8",
                                     "memory": "32Gi"}},
        }],
    },
}  # fmt: skip
# A 2 x 8-GPU PyTorchJob: a Master and a Worker, a whole node each.
PYTORCHJOB = {
    "apiVersion": "kubeflow.org/v1",
    "kind": "PyTorchJob",
    "spec": {"pytorchReplicaSpecs": {
        "Master": {"replicas": 1, "restartPolicy": "Never", "template": TEMPLATE},
        "Worker": {"replicas": 1, "restartPolicy": "Never", "template": TEMPLATE},
    }},
}  # fmt: skip


def node_obj(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {"nvidia.com/gpu.product": "A100"}},
        "spec": {},
        "status": {
            "allocatable": {"nvidia.com/gpu": str(GPUS_PER_NODE), "cpu": "64", "memory": "256Gi"},
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }


def make_config(tmp_path: Path, server: str, flavor: str) -> Config:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "east",
        "contexts": [{"name": "east", "context": {"cluster": "c-east", "user": "u"}}],
        "clusters": [{"name": "c-east", "cluster": {"server": server}}],
        "users": [{"name": "u", "user": {"token": "not-a-real-token"}}],
    }))  # fmt: skip
    text = CONFIG.format(db=tmp_path / "jobs.db", kubeconfig=kubeconfig, flavor=flavor)
    return parse_config(text, "test")


def workload_manifest(name: str, workload: dict[str, Any] = PYTORCHJOB) -> Any:
    body = {"apiVersion": "fedbroker.io/v1alpha1", "kind": "FederatedJob",
            "metadata": {"name": name}, "spec": {"workload": workload}}  # fmt: skip
    return parse_manifest(json.dumps(body).encode(), "application/json")


def pod_sets_manifest(name: str) -> Any:
    pod_set = {
        "name": "worker",
        "count": 2,
        "resources": {"nvidia.com/gpu": GPUS_PER_NODE, "cpu": "8", "memory": "32Gi"},
    }
    body = {"apiVersion": "fedbroker.io/v1alpha1", "kind": "FederatedJob",
            "metadata": {"name": name}, "spec": {"podSets": [pod_set]}}  # fmt: skip
    return parse_manifest(json.dumps(body).encode(), "application/json")


pytestmark = pytest.mark.kmock(cls=NamespacedEmulator)


def member(kmock: kmock.KubernetesEmulator, nodes: int) -> NamespacedEmulator:
    for name in ("v1/pods", "v1/services", "kubeflow.org/v1/pytorchjobs", "ray.io/v1/rayclusters",
                 "scheduling.x-k8s.io/v1alpha1/podgroups",
                 "scheduling.volcano.sh/v1beta1/podgroups"):  # fmt: skip
        kmock.resources[name] = kmocklib.ResourceInfo(namespaced=True)
    kmock.resources["v1/nodes"] = kmocklib.ResourceInfo(namespaced=False)
    for n in range(1, nodes + 1):
        kmock.objects[NODES, None, f"n{n:02d}"] = node_obj(f"n{n:02d}")
    return cast(NamespacedEmulator, kmock)


def live(k8s: NamespacedEmulator, resource: Any) -> dict[str, Any]:
    return {
        name: obj
        for (res, ns, name), obj in list(k8s.objects.items())
        if res == resource and ns == NS and not obj.deleted
    }


def operator(k8s: NamespacedEmulator) -> list[str]:
    """The training operator: every PyTorchJob's missing pods, from its stored templates,
    named and labelled as v1.9 does (workers get ``init-pytorch``: the job has a Master)."""
    made = []
    pods = live(k8s, PODS)
    for job, obj in live(k8s, PYTORCHJOBS).items():
        for rtype, replica in obj.raw["spec"]["pytorchReplicaSpecs"].items():
            for index in range(int(replica.get("replicas", 1))):
                name = f"{job}-{rtype.lower()}-{index}"
                if name in pods:
                    continue
                template = copy.deepcopy(replica["template"])
                meta = template.get("metadata") or {}
                spec = template["spec"]
                if rtype == "Worker":
                    spec["initContainers"] = [*spec.get("initContainers", []), INIT_PYTORCH]
                labels = {**meta.get("labels", {}),
                          "training.kubeflow.org/job-name": job,
                          "training.kubeflow.org/operator-name": "pytorchjob-controller",
                          "training.kubeflow.org/replica-type": rtype.lower(),
                          "training.kubeflow.org/replica-index": str(index)}  # fmt: skip
                k8s.controller_create(PODS, NS, {
                    "apiVersion": "v1", "kind": "Pod", "spec": spec,
                    "metadata": {**meta, "name": name, "namespace": NS, "labels": labels,
                                 "uid": f"uid-{name}",
                                 "ownerReferences": [{
                                     "apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
                                     "name": job, "uid": f"uid-{job}", "controller": True}]},
                })  # fmt: skip
                made.append(name)
    return made


def _group_of(pod: dict[str, Any]) -> str | None:
    meta = pod["metadata"]
    return (meta.get("labels") or {}).get("scheduling.x-k8s.io/pod-group") or (
        meta.get("annotations") or {}
    ).get("scheduling.k8s.io/group-name")


def gpus_of(pod: dict[str, Any]) -> int:
    return pod_resources(pod["spec"]).gpus


def pods_gpus(k8s: NamespacedEmulator) -> dict[str, int]:
    """Node -> GPUs of the pods bound there and not ended (what the member runs)."""
    out: dict[str, int] = {}
    for (res, _, _), obj in list(k8s.objects.items()):
        pod = obj.raw
        node = pod.get("spec", {}).get("nodeName")
        phase = (pod.get("status") or {}).get("phase")
        if res == PODS and not obj.deleted and node and phase not in ("Succeeded", "Failed"):
            out[node] = out.get(node, 0) + gpus_of(pod)
    return {n: g for n, g in out.items() if g}


def ledger_gpus(service: Service) -> dict[str, int]:
    """Node -> GPUs the ledger counts taken there (bound and reserved)."""
    view = service.ledger.snapshot().clusters["east"]
    out = {n: GPUS_PER_NODE - s.whole_free for n, s in view.nodes.items()}
    return {n: g for n, g in out.items() if g}


async def gang_scheduler(k8s: NamespacedEmulator, flavor: str) -> dict[str, str]:
    """Bind every group whose ``minMember`` pods all exist and are unbound, all or none:
    each pod to the free node it likes best (last node first) by the pods bound there, it
    knows nothing of the broker's reservations; then its kubelet runs them and the group's
    phase becomes Running. Returns pod -> node of what it bound."""
    bound: dict[str, str] = {}
    used = pods_gpus(k8s)
    nodes = sorted((n for (r, _, n) in list(k8s.objects) if r == NODES), reverse=True)
    for group_name, group in sorted(live(k8s, GROUPS[flavor]).items()):
        members = sorted(
            (n, o.raw) for n, o in live(k8s, PODS).items() if _group_of(o.raw) == group_name
        )
        waiting = [(n, p) for n, p in members if not p["spec"].get("nodeName")]
        if not waiting or len(members) < group.raw["spec"]["minMember"]:
            continue
        trial = dict(used)
        choice: dict[str, str] = {}
        for name, pod in waiting:
            fits = [n for n in nodes if trial.get(n, 0) + gpus_of(pod) <= GPUS_PER_NODE]
            if not fits:
                break
            choice[name] = fits[0]
            trial[fits[0]] = trial.get(fits[0], 0) + gpus_of(pod)
        if len(choice) < len(waiting):
            continue  # the gang does not fit: none of it is bound
        used = trial
        for name, node in choice.items():
            await k8s.patch_pod(NS, name, {"spec": {"nodeName": node},
                                           "status": {"phase": "Running"}})  # fmt: skip
        group.patch({"status": {"phase": "Running", "running": len(members)}})
        bound.update(choice)
    return bound


@asynccontextmanager
async def broker(k8s: NamespacedEmulator, tmp_path: Path, flavor: str) -> Any:
    service = Service(make_config(tmp_path, str(k8s.url).rstrip("/"), flavor))
    await service.start()
    try:
        yield service
    finally:
        await service.close()


def reserved_nodes(service: Service) -> dict[str, str]:
    """Pod name in the member -> the node the broker reserved for it."""
    return {
        p.pod.partition(".")[2]: p.node
        for placement in service.ledger.reservations().values()
        for p in placement.pods
    }


async def history(service: Service, name: str) -> list[str]:
    return [t.state for t in await service.store.history("team-a", name)]


async def run_delegated(service: Service, k8s: NamespacedEmulator, flavor: str,
                        names: list[str]) -> dict[str, str]:  # fmt: skip
    """Submit PyTorchJobs ``names``, place them, play the operator, the gang scheduler and
    the kubelet until every job runs. Returns pod -> (node reserved, node bound) changes."""
    for name in names:
        await service.submit("team-a", workload_manifest(name))
    await service.schedule_once()
    for name in names:
        assert (await service.get("team-a", name)).state == "Placed"
    reserved = reserved_nodes(service)
    await until(lambda: set(live(k8s, PYTORCHJOBS)) == set(names))
    operator(k8s)
    bound = await gang_scheduler(k8s, flavor)
    assert len(bound) == 2 * len(names), sorted(live(k8s, GROUPS[flavor]))  # none rolled back
    await service.launches_done(timeout=10)
    for name in names:
        assert (await service.get("team-a", name)).state == "Running"
    return {pod: node for pod, node in bound.items() if reserved.get(pod) != node}


async def succeed(service: Service, k8s: NamespacedEmulator, name: str) -> None:
    """The pods end, then the operator writes the job's Succeeded condition."""
    for pod, obj in live(k8s, PODS).items():
        if obj.raw["metadata"]["labels"].get("training.kubeflow.org/job-name") == name:
            await k8s.patch_pod(NS, pod, {"status": {"phase": "Succeeded"}})
    live(k8s, PYTORCHJOBS)[name].patch({"status": {"conditions": [
        {"type": "Succeeded", "status": "True", "reason": "PyTorchJobSucceeded",
         "message": f"PyTorchJob {NS}/{name} successfully completed."},
    ]}})  # fmt: skip


FLAVORS = ["coscheduling", "volcano"]


# Two nodes: the scheduler swaps the gang's pods between the broker's two; three: one pod
# goes to the node the broker left free.
@pytest.mark.parametrize("nodes", [2, 3])
@pytest.mark.parametrize("flavor", FLAVORS)
async def test_a_delegated_pytorchjob_is_counted_once_and_succeeds(
    kmock: kmock.KubernetesEmulator, tmp_path: Path, flavor: str, nodes: int
) -> None:
    k8s = member(kmock, nodes)
    async with broker(k8s, tmp_path, flavor) as service:
        moved = await run_delegated(service, k8s, flavor, ["train"])
        assert moved, "the gang scheduler chose the broker's nodes: nothing was tested"
        # Each pod counted once, where it runs; nothing on a node without a pod.
        await until(lambda: ledger_gpus(service) == pods_gpus(k8s))
        assert sum(pods_gpus(k8s).values()) == 2 * GPUS_PER_NODE
        await succeed(service, k8s, "train")
        await service.runs_done(timeout=10)
        assert (await service.get("team-a", "train")).state == "Succeeded"
        assert await history(service, "train") == ["Queued", "Placed", "Running", "Succeeded"]
        await until(lambda: ledger_gpus(service) == {})
        assert not service.ledger.reservations()


@pytest.mark.parametrize("flavor", FLAVORS)
async def test_six_delegated_jobs_at_once_none_rolled_back(
    kmock: kmock.KubernetesEmulator, tmp_path: Path, flavor: str
) -> None:
    k8s = member(kmock, nodes=12)
    names = [f"train{i}" for i in range(6)]
    async with broker(k8s, tmp_path, flavor) as service:
        moved = await run_delegated(service, k8s, flavor, names)
        # The scheduler took nodes the broker had given other gangs: their guesses moved.
        assert len(moved) > 2
        await until(lambda: ledger_gpus(service) == pods_gpus(k8s))
        for name in names:
            assert await history(service, name) == ["Queued", "Placed", "Running"]
        assert set(live(k8s, PYTORCHJOBS)) == set(names)


@pytest.mark.parametrize("flavor", FLAVORS)
async def test_a_restart_restores_a_running_delegated_job(
    kmock: kmock.KubernetesEmulator, tmp_path: Path, flavor: str
) -> None:
    k8s = member(kmock, nodes=3)
    async with broker(k8s, tmp_path, flavor) as service:
        moved = await run_delegated(service, k8s, flavor, ["train"])
        assert moved
    pods_before = set(live(k8s, PODS))
    async with broker(k8s, tmp_path, flavor) as service:
        record = await service.get("team-a", "train")
        assert record.state == "Running"
        assert await history(service, "train") == ["Queued", "Placed", "Running"]
        assert set(live(k8s, PODS)) == pods_before and "train" in live(k8s, PYTORCHJOBS)
        assert ledger_gpus(service) == pods_gpus(k8s)
        await succeed(service, k8s, "train")
        await service.runs_done(timeout=10)
        assert (await service.get("team-a", "train")).state == "Succeeded"
        await until(lambda: ledger_gpus(service) == {})
        assert not service.ledger.reservations()


@pytest.mark.parametrize("flavor", FLAVORS)
async def test_a_delegated_pod_sets_gang_is_counted_once(
    kmock: kmock.KubernetesEmulator, tmp_path: Path, flavor: str
) -> None:
    k8s = member(kmock, nodes=2)  # the scheduler swaps the two pods' nodes
    async with broker(k8s, tmp_path, flavor) as service:
        await service.submit("team-a", pod_sets_manifest("gang"))
        await service.schedule_once()
        reserved = reserved_nodes(service)
        await until(lambda: {"gang-worker-0", "gang-worker-1"} <= set(live(k8s, PODS)))
        bound = await gang_scheduler(k8s, flavor)
        assert all(reserved[pod] != node for pod, node in bound.items())
        await service.launches_done(timeout=10)
        assert (await service.get("team-a", "gang")).state == "Running"
        await until(lambda: ledger_gpus(service) == pods_gpus(k8s))
        for pod in bound:
            await k8s.patch_pod(NS, pod, {"status": {"phase": "Succeeded"}})
        await service.runs_done(timeout=10)
        assert await history(service, "gang") == ["Queued", "Placed", "Running", "Succeeded"]
        await until(lambda: ledger_gpus(service) == {})
