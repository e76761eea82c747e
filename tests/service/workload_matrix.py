"""The member and broker of the workload matrix (tests/service/test_workload_matrix.py): a
kmock member serving every workload kind and both PodGroup kinds, four nodes of 4 GPUs,
the controllers and the scheduler of one mode played (``controllers.Member``), and the
real ``Service`` on it from a kubeconfig, polling the member every 0.01 s, on a test clock.
One small workload per registered kind (1-GPU pods, a few of them), each of its own
controller's shape: an Indexed Job whose completions exceed its parallelism and a JobSet
whose child Jobs do too (successors made as pods succeed), a PyTorchJob (master and two
workers), a RayJob and a RayCluster (a head and two GPU workers)."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

import kmock as kmocklib
from builders import Clock
from controllers import RESOURCES, Member, Mode
from controllers.base import PODS, SERVICES, Obj, labels_of, phase
from controllers.schedulers import COSCHED, NODES, VOLCANO, gpus_of
from kmock_namespaces import NamespacedEmulator

from broker.config import parse_config
from broker.manifest import parse_manifest
from broker.service.facade import Service

NS = "fedbroker-team-a"
T0 = 1_000.0
MODES: tuple[Mode, ...] = ("pin", "coscheduling", "volcano")
KUBE = {
    "pin": "launchMode: pin",
    "coscheduling": "launchMode: delegate, schedulerName: scheduler-plugins-scheduler",
    "volcano": "launchMode: delegate, podGroup: volcano",
}
CONFIG = """
store: {{url: "sqlite:///{db}"}}
clusters:
- name: east
  source:
    kube: {{kubeconfig: "{kubeconfig}", context: east, podPollSeconds: 0.01, {kube}}}
queues:
- {{name: training, policy: gang}}
tenants:
- {{name: team-a, defaultQueue: training, token: {{value: tok-a-00000000000000000000000000}}}}
- {{name: team-b, defaultQueue: training, token: {{value: tok-b-00000000000000000000000000}}}}
"""
SERVED = ("v1/pods", "v1/services", "v1/events", "batch/v1/jobs",
          "jobset.x-k8s.io/v1alpha2/jobsets", "kubeflow.org/v1/pytorchjobs",
          "ray.io/v1/rayjobs", "ray.io/v1/rayclusters",
          "scheduling.x-k8s.io/v1alpha1/podgroups",
          "scheduling.volcano.sh/v1beta1/podgroups")  # fmt: skip


def _pod(name: str = "main", gpus: int = 1) -> Obj:
    limits: Obj = {"cpu": "1", "memory": "1Gi"} | ({"nvidia.com/gpu": gpus} if gpus else {})
    return {"metadata": {"labels": {"app": "trainer"}}, "spec": {
        "restartPolicy": "Never",
        "containers": [{"name": name, "image": "trainer:1.0", "resources": {"limits": limits}}],
    }}  # fmt: skip


INDEXED = {"completionMode": "Indexed", "backoffLimit": 0}
CLUSTER = {
    "headGroupSpec": {"template": _pod("ray-head", gpus=0)},
    "workerGroupSpecs": [{"groupName": "gpu", "replicas": 2, "minReplicas": 2,
                          "maxReplicas": 2, "template": _pod("ray-worker")}],
}  # fmt: skip
WORKLOADS: Mapping[str, Obj] = {
    "Job": {"apiVersion": "batch/v1", "kind": "Job",
            "spec": {**INDEXED, "completions": 4, "parallelism": 2, "template": _pod()}},
    "JobSet": {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "spec": {
        "replicatedJobs": [{"name": "workers", "replicas": 2, "template": {"spec": {
            **INDEXED, "completions": 2, "parallelism": 1, "template": _pod()}}}]}},
    "PyTorchJob": {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "spec": {
        "pytorchReplicaSpecs": {
            "Master": {"replicas": 1, "restartPolicy": "Never", "template": _pod("pytorch")},
            "Worker": {"replicas": 2, "restartPolicy": "Never", "template": _pod("pytorch")}}}},
    "RayJob": {"apiVersion": "ray.io/v1", "kind": "RayJob", "spec": {
        "entrypoint": "python train.py", "backoffLimit": 0, "rayClusterSpec": CLUSTER}},
    "RayCluster": {"apiVersion": "ray.io/v1", "kind": "RayCluster", "spec": CLUSTER},
}  # fmt: skip


def node_obj(name: str) -> Obj:
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {"nvidia.com/gpu.product": "A100"}},
            "spec": {}, "status": {
                "allocatable": {"nvidia.com/gpu": "4", "cpu": "64", "memory": "256Gi"},
                "conditions": [{"type": "Ready", "status": "True"}]}}  # fmt: skip


def serve(k8s: NamespacedEmulator, nodes: int = 4) -> NamespacedEmulator:
    info = kmocklib.ResourceInfo(namespaced=True)
    for name in SERVED:
        k8s.resources[name] = info
    k8s.resources["v1/nodes"] = kmocklib.ResourceInfo(namespaced=False)
    for i in range(1, nodes + 1):
        k8s.objects[NODES, None, f"n{i}"] = node_obj(f"n{i}")
    return k8s


def config_text(tmp_path: Path, server: str, mode: Mode) -> str:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "east",
        "contexts": [{"name": "east", "context": {"cluster": "c-east", "user": "u"}}],
        "clusters": [{"name": "c-east", "cluster": {"server": server}}],
        "users": [{"name": "u", "user": {"token": "not-a-real-token"}}],
    }))  # fmt: skip
    return CONFIG.format(db=tmp_path / "jobs.db", kubeconfig=kubeconfig, kube=KUBE[mode])


@contextlib.asynccontextmanager
async def broker(k8s: NamespacedEmulator, tmp_path: Path, mode: Mode) -> AsyncIterator[Service]:
    """The broker on the member (started, then closed), on a clock of its own."""
    text = config_text(tmp_path, str(k8s.url).rstrip("/"), mode)
    service = Service(parse_config(text, "test"), clock=Clock(T0))
    await service.start()
    try:
        yield service
    finally:
        await service.close()


def manifest(kind: str, name: str = "train", workload: Obj | None = None) -> Any:
    spec = {"workload": workload or WORKLOADS[kind]}
    body = {"apiVersion": "fedbroker.io/v1alpha1", "kind": "FederatedJob",
            "metadata": {"name": name}, "spec": spec}  # fmt: skip
    return parse_manifest(json.dumps(body).encode(), "application/json")


def ours(member: Member, resource: Any) -> dict[str, Obj]:
    return member.c.stored(resource, NS)


def leftovers(member: Member) -> list[str]:
    """Everything of ours still in the tenant's namespace: pods, workloads (and their
    children), PodGroups, Services."""
    kinds = [PODS, SERVICES, COSCHED, VOLCANO, *RESOURCES.values()]
    return [f"{r.plural}/{n}" for r in kinds for n in ours(member, r)]


def running_pods(member: Member) -> list[Obj]:
    return [p for p in ours(member, PODS).values() if phase(p) == "Running"]


def pods_gpus(member: Member) -> int:
    """The GPUs of our pods bound to a node and not ended (what the member has in use)."""
    return sum(
        gpus_of(p)
        for p in ours(member, PODS).values()
        if p["spec"].get("nodeName") and phase(p) not in ("Succeeded", "Failed")
    )


def ledger_gpus(service: Service) -> float:
    view = service.ledger.snapshot().clusters["east"]
    return view.gpus_total() - view.free_milli() / 1000


def enders(member: Member, kind: str) -> list[Obj]:
    """The running pods whose end ends the workload: a RayJob's submitter (the Ray job's
    outcome), every other kind's running pods."""
    pods = running_pods(member)
    if kind == "RayJob":
        return [p for p in pods if "batch.kubernetes.io/job-name" in labels_of(p)]
    return pods


def made_twice(member: Member) -> list[str]:
    """Pods made twice for one index of one Job (a rerun)."""
    seen: dict[tuple[str, str], int] = {}
    for pod in member.c.made:
        labels = labels_of(pod)
        index = labels.get("batch.kubernetes.io/job-completion-index")
        if index is not None:
            key = (labels.get("batch.kubernetes.io/job-name", ""), index)
            seen[key] = seen.get(key, 0) + 1
    return [f"{job} index {i}" for (job, i), n in seen.items() if n > 1]
