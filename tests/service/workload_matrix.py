"""The member and broker of the workload matrix (tests/service/test_workload_matrix.py): a
kmock member serving every workload kind and both PodGroup kinds, four nodes of 4 GPUs,
the controllers and the scheduler of one mode played (``controllers.Member``), and the
real ``Service`` on it from a kubeconfig, polling the member every 0.01 s, on a test clock.
One small workload per registered kind (1-GPU pods, a few of them), each of its own
controller's shape: an Indexed Job whose completions exceed its parallelism and a JobSet
(a driver and two worker Jobs) whose worker Jobs do too (successors made as pods succeed),
a PyTorchJob (master and two workers), a RayJob and a RayCluster (a head and two GPU
workers), a TrainJob of two nodes (the member has its ClusterTrainingRuntime, whose pods
name the gang scheduler in delegate mode), an MPIJob (a launcher and two workers) and a
LeaderWorkerSet (two groups of a leader and a worker). The waits of the matrix
(``settle``, ``launched``) count the member's steps and move the broker's clock, never a
wall-clock budget."""

from __future__ import annotations

import contextlib
import inspect
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

import kmock as kmocklib
from builders import Clock
from controllers import CHILDREN, QUIET_STEPS, RESOURCES, Member, Mode
from controllers.base import PODS, SERVICES, Obj, labels_of, phase
from controllers.mpijob import is_launcher
from controllers.schedulers import COSCHED, NODES, SCHEDULER, VOLCANO, gpus_of
from controllers.trainjob import ANCESTOR, CLUSTER_RUNTIMES
from kmock_namespaces import NamespacedEmulator

from broker.config import parse_config
from broker.manifest import parse_manifest
from broker.service.facade import Service

NS = "fedbroker-team-a"
T0 = 1_000.0
MODES: tuple[Mode, ...] = ("pin", "coscheduling", "volcano")
MAX_STEPS = 5_000  # a member still changing after this many steps runs away
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
SERVED = ("v1/pods", "v1/services", "v1/events", "v1/configmaps", "v1/secrets",
          "batch/v1/jobs", "apps/v1/statefulsets",
          "jobset.x-k8s.io/v1alpha2/jobsets", "kubeflow.org/v1/pytorchjobs",
          "ray.io/v1/rayjobs", "ray.io/v1/rayclusters",
          "trainer.kubeflow.org/v1alpha1/trainjobs",
          "trainer.kubeflow.org/v1alpha1/trainingruntimes",
          "kubeflow.org/v2beta1/mpijobs", "leaderworkerset.x-k8s.io/v1/leaderworkersets",
          "scheduling.x-k8s.io/v1alpha1/podgroups",
          "scheduling.volcano.sh/v1beta1/podgroups")  # fmt: skip
CLUSTER_SERVED = ("v1/nodes", "trainer.kubeflow.org/v1alpha1/clustertrainingruntimes")
RUNTIME = "torch-distributed"  # the ClusterTrainingRuntime the member has, a TrainJob names


def pod_template(name: str = "main", gpus: int = 1) -> Obj:
    limits: Obj = {"cpu": "1", "memory": "1Gi"} | ({"nvidia.com/gpu": gpus} if gpus else {})
    return {"metadata": {"labels": {"app": "trainer"}}, "spec": {
        "restartPolicy": "Never",
        "containers": [{"name": name, "image": "trainer:1.0", "resources": {"limits": limits}}],
    }}  # fmt: skip


def serving(name: str, gpus: int = 1) -> Obj:
    """A pod template of a StatefulSet's pods (restartPolicy Always, the default)."""
    template = pod_template(name, gpus)
    return {**template, "spec": {k: v for k, v in template["spec"].items()
                                 if k != "restartPolicy"}}  # fmt: skip


def runtime(mode: Mode) -> Obj:
    """The member's torch ClusterTrainingRuntime (one replicated job, the trainer node, its
    container ``node``; its pods name the gang scheduler of a delegate ``mode``)."""
    pod = pod_template("node", gpus=0)
    pod["spec"]["containers"][0]["command"] = ["torchrun", "train.py"]
    if mode != "pin":
        pod["spec"]["schedulerName"] = SCHEDULER[mode]
    job = {"metadata": {"labels": {ANCESTOR: "trainer"}},
           "spec": {**INDEXED, "template": pod}}  # fmt: skip
    return {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "ClusterTrainingRuntime",
            "metadata": {"name": RUNTIME},
            "spec": {"mlPolicy": {"numNodes": 1, "torch": {}},
                     "template": {"spec": {"replicatedJobs": [
                         {"name": "node", "template": job}]}}}}  # fmt: skip


TORCH = pod_template("pytorch")
INDEXED = {"completionMode": "Indexed", "backoffLimit": 0}
CLUSTER = {
    "headGroupSpec": {"template": pod_template("ray-head", gpus=0)},
    "workerGroupSpecs": [{"groupName": "gpu", "replicas": 2, "minReplicas": 2,
                          "maxReplicas": 2, "template": pod_template("ray-worker")}],
}  # fmt: skip
WORKLOADS: Mapping[str, Obj] = {
    "Job": {"apiVersion": "batch/v1", "kind": "Job",
            "spec": {**INDEXED, "completions": 4, "parallelism": 2, "template": pod_template()}},
    "JobSet": {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "spec": {
        "replicatedJobs": [
            {"name": "driver", "replicas": 1, "template": {"spec": {
                **INDEXED, "completions": 1, "parallelism": 1, "template": pod_template()}}},
            {"name": "workers", "replicas": 2, "template": {"spec": {
                **INDEXED, "completions": 2, "parallelism": 1, "template": pod_template()}}}]}},
    "PyTorchJob": {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "spec": {
        "pytorchReplicaSpecs": {
            "Master": {"replicas": 1, "restartPolicy": "Never", "template": TORCH},
            "Worker": {"replicas": 2, "restartPolicy": "Never", "template": TORCH}}}},
    "RayJob": {"apiVersion": "ray.io/v1", "kind": "RayJob", "spec": {
        "entrypoint": "python train.py", "backoffLimit": 0, "rayClusterSpec": CLUSTER}},
    "RayCluster": {"apiVersion": "ray.io/v1", "kind": "RayCluster", "spec": CLUSTER},
    "TrainJob": {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob", "spec": {
        "runtimeRef": {"name": RUNTIME},
        "trainer": {"numNodes": 2, "image": "trainer:2.0", "resourcesPerNode": {
            "limits": {"nvidia.com/gpu": 1, "cpu": "1", "memory": "1Gi"}}}}},
    "MPIJob": {"apiVersion": "kubeflow.org/v2beta1", "kind": "MPIJob", "spec": {
        "slotsPerWorker": 1, "runPolicy": {"backoffLimit": 0, "cleanPodPolicy": "Running"},
        "mpiReplicaSpecs": {
            "Launcher": {"replicas": 1, "restartPolicy": "Never",
                         "template": pod_template("launcher", gpus=0)},
            "Worker": {"replicas": 2, "restartPolicy": "Never",
                       "template": pod_template("worker")}}}},
    "LeaderWorkerSet": {"apiVersion": "leaderworkerset.x-k8s.io/v1", "kind": "LeaderWorkerSet",
                        "spec": {"replicas": 2, "leaderWorkerTemplate": {
                            "size": 2, "leaderTemplate": serving("leader"),
                            "workerTemplate": serving("worker")}}},
}  # fmt: skip


def node_obj(name: str) -> Obj:
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {"nvidia.com/gpu.product": "A100"}},
            "spec": {}, "status": {
                "allocatable": {"nvidia.com/gpu": "4", "cpu": "64", "memory": "256Gi"},
                "conditions": [{"type": "Ready", "status": "True"}]}}  # fmt: skip


def serve(k8s: NamespacedEmulator, mode: Mode, nodes: int = 4) -> NamespacedEmulator:
    """The member: every kind served, ``nodes`` nodes, the runtime of ``mode`` installed."""
    for name in SERVED:
        k8s.resources[name] = kmocklib.ResourceInfo(namespaced=True)
    for name in CLUSTER_SERVED:
        k8s.resources[name] = kmocklib.ResourceInfo(namespaced=False)
    for i in range(1, nodes + 1):
        k8s.objects[NODES, None, f"n{i}"] = node_obj(f"n{i}")
    k8s.controller_create(CLUSTER_RUNTIMES, None, runtime(mode))
    return k8s


def member_of(k8s: NamespacedEmulator, mode: Mode, nodes: int = 4) -> Member:
    return Member(serve(k8s, mode, nodes), mode)


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
async def broker(
    k8s: NamespacedEmulator, tmp_path: Path, mode: Mode, cluster_keys: str = ""
) -> AsyncIterator[Service]:
    """The broker on the member (started, then closed), on a clock of its own;
    ``cluster_keys``: YAML lines added to the member's cluster entry."""
    text = config_text(tmp_path, str(k8s.url).rstrip("/"), mode)
    text = text.replace("- name: east\n", "- name: east\n" + cluster_keys, 1)
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
    kinds = [PODS, SERVICES, COSCHED, VOLCANO, *RESOURCES.values(), *CHILDREN]
    return [f"{r.plural}/{n}" for r in kinds for n in ours(member, r)]


def running_pods(member: Member) -> list[Obj]:
    return [p for p in ours(member, PODS).values() if phase(p) == "Running"]


def pods_gpus(member: Member, everywhere: bool = False) -> dict[str, int]:
    """Node -> the GPUs of our pods (``everywhere``: every tenant's) bound there and not
    ended (what the member has in use; nodes without any left out)."""
    out: dict[str, int] = {}
    for pod in member.c.live(PODS) if everywhere else ours(member, PODS).values():
        node = pod["spec"].get("nodeName")
        if node and phase(pod) not in ("Succeeded", "Failed") and gpus_of(pod):
            out[node] = out.get(node, 0) + gpus_of(pod)
    return out


def ledger_gpus(service: Service) -> dict[str, float]:
    """Node -> the GPUs the broker's ledger counts taken there (reserved or bound; nodes
    with none left out)."""
    view = service.ledger.snapshot().clusters["east"]
    taken = {
        name: node.node.allocatable.gpus - node.free_milli / 1000
        for name, node in view.nodes.items()
    }
    return {name: gpus for name, gpus in taken.items() if gpus}


def enders(member: Member, kind: str) -> list[Obj]:
    """The running pods whose end ends the workload: a RayJob's submitter (the Ray job's
    outcome), an MPIJob's launcher (``mpirun``'s exit), every other kind's running pods."""
    pods = running_pods(member)
    if kind == "RayJob":
        return [p for p in pods if "batch.kubernetes.io/job-name" in labels_of(p)]
    if kind == "MPIJob":
        return [p for p in pods if is_launcher(p)]
    return pods


def made_twice(member: Member) -> list[str]:
    """Pods made twice for one index of one Job, or twice under one name (a PyTorchJob's
    replicas), in one namespace: a rerun."""
    seen: dict[str, int] = {}
    for pod in member.c.made:
        labels = labels_of(pod)
        index = labels.get("batch.kubernetes.io/job-completion-index")
        job = labels.get("batch.kubernetes.io/job-name", "")
        name = pod["metadata"]["name"] if index is None else f"{job} index {index}"
        key = f"{pod['metadata']['namespace']}/{name}"
        seen[key] = seen.get(key, 0) + 1
    return [key for key, n in seen.items() if n > 1]


def state_of(member: Member) -> dict[str, object]:
    """What the member holds of ours, for a failing assertion's message."""
    pods = {n: (phase(p), p["spec"].get("nodeName")) for n, p in ours(member, PODS).items()}
    groups = {n: (g.get("status") or {}) for n, g in ours(member, COSCHED).items()}
    groups |= {n: (g.get("status") or {}) for n, g in ours(member, VOLCANO).items()}
    return {"steps": member.steps, "failure": repr(member.failure), "pods": pods,
            "podgroups": groups, "left": leftovers(member)}  # fmt: skip


async def settle(member: Member, done: Callable[[], bool | Awaitable[bool]]) -> bool:
    """Wait, a member step at a time, until ``done()`` holds (True) or the member has
    settled without it (False): nothing written to it, by anyone, for ``QUIET_STEPS``
    steps since the wait began. Counted in steps, so a slow machine only makes it slower;
    a member that never settles fails after ``MAX_STEPS``."""

    async def holds() -> bool:
        given = done()
        return await given if inspect.isawaitable(given) else bool(given)

    start = member.steps
    while not await holds():
        if member.steps - max(start, member.changed) >= QUIET_STEPS:
            return await holds()
        assert member.steps - start < MAX_STEPS, f"the member never settled: {state_of(member)}"
        await member.next_step()
    return True


async def launched(service: Service, member: Member, *jobs: tuple[str, str]) -> None:
    """Wait until the launches of ``jobs`` (tenant, name) have concluded (none of them
    Placed any more). Gangs the member has settled without are taken past their timeout
    on the broker's own clock, so that the broker concludes (rolls them back, with its
    reason) as it would in time."""

    async def concluded() -> bool:
        states = [(await service.get(tenant, name)).state for tenant, name in jobs]
        return "Placed" not in states

    if not await settle(member, concluded):
        launches = [service.lifecycle.get(f"{tenant}/{name}") for tenant, name in jobs]
        clock = service.shared.clock
        assert isinstance(clock, Clock)
        clock.now += max(x.pending.job.schedule_timeout_seconds for x in launches if x) + 1
        await service.schedule_once()
    await service.launches_done()
