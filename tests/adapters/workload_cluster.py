"""A member cluster for the workload tests (tests/adapters/test_kube_workload*.py): kmock
with Namespaces and every workload kind served, jobs admitted from real manifests (the
WorkloadSpec comes from admission, not hand-built paths), their placements, and the
parts of Kubernetes the launcher leaves to others, played by the test: each kind's
controller making pods from the stored workload's templates, named and index-labelled
as that controller does (the MPI Operator and LeaderWorkerSet, which make more than pods
and write status, in tests/adapters/workload_players.py, one class each), and a scheduler +
kubelet that binds an ungated pod to the node its required affinity names and runs it, Ready
(recording how full each node ever got)."""

from __future__ import annotations

import itertools
import json
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, cast

import kmock as kmocklib
from kmock_namespaces import NamespacedEmulator
from kubernetes.aio.client import ApiClient, Configuration
from tenacity import wait_none
from test_workloads import (
    CPU,
    GPU8,
    INIT,
    batch_job,
    group,
    jobset,
    lws,
    mpijob,
    pytorch,
    ray_cluster,
    rj,
)
from workload_players import PLAYERS, Player

from adapters.kube.launch import KubeLauncher
from adapters.kube.objects import LABEL_POD_SET, Flavor, Mode
from adapters.kube.settings import LaunchSettings
from adapters.kube.slots import gated
from adapters.kube.workloads import api_version, template_at
from broker.manifest import admit_templates, parse_manifest, to_job, workload_of
from broker.manifest.workloads import INTEGRATIONS, Integration, batchjob, pytorchjob
from broker.manifest.workloads import jobset as jobset_kind
from broker.model import Placement, PodPlacement
from broker.ports import LaunchSpec

Obj = dict[str, Any]
Emulator = NamespacedEmulator
NS = "team-acme"
JOB = "train"
PODS = kmocklib.resource("", "v1", "pods")
EVENTS = kmocklib.resource("", "v1", "events")
COSCHED = kmocklib.resource("scheduling.x-k8s.io", "v1alpha1", "podgroups")
VOLCANO = kmocklib.resource("scheduling.volcano.sh", "v1beta1", "podgroups")
KINDS: Mapping[str, Integration] = {i.kind: i for i in INTEGRATIONS}
KIND_RES = {k: kmocklib.resource(w.group, w.version, w.plural) for k, w in KINDS.items()}
CRD_FILES = {
    "JobSet": "jobset.x-k8s.io_jobsets.yaml",
    "PyTorchJob": "kubeflow.org_pytorchjobs.yaml",
    "RayJob": "ray.io_rayjobs.yaml",
    "RayCluster": "ray.io_rayclusters.yaml",
    "MPIJob": "kubeflow.org_mpijobs-v2beta1.yaml",
    "LeaderWorkerSet": "leaderworkerset.x-k8s.io_leaderworkersets.yaml",
}
MAX_POLLS = 30
USER_META = {"labels": {"team": "vision"}, "annotations": {"owner": "ana"}}
LABELLED = {"metadata": {"labels": {"app": "trainer"}, "annotations": {"note": "kept"}}}


def _t(template: Obj) -> Obj:
    """The template with the user's own pod labels and annotations."""
    return {**template, **LABELLED}


def _job_t(template: Obj) -> Obj:
    """``_t`` for a batch Job's template (a JobSet's are Job templates too): the Job API
    takes only restartPolicy OnFailure or Never, and the default is Always."""
    out = _t(template)
    return {**out, "spec": {**out["spec"], "restartPolicy": "Never"}}


# One real manifest's workload per kind (the builders of tests/config/test_workloads.py,
# which asserts every kind's derived pod sets, init containers and overhead included).
WORKLOADS: Mapping[str, Obj] = {
    "Job": batch_job(_job_t(INIT), parallelism=3, completions=3, completionMode="Indexed"),
    "JobSet": jobset(rj("driver", _job_t(CPU)),
                     rj("workers", _job_t(INIT), replicas=2, parallelism=2)),
    "PyTorchJob": pytorch(
        Master={"replicas": 1, "template": _t(INIT)},
        Worker={"replicas": 2, "template": _t(GPU8)},
    ),
    "RayJob": {"apiVersion": "ray.io/v1", "kind": "RayJob", "spec": {
        "entrypoint": "python train.py",
        "rayClusterSpec": ray_cluster(
            group("gpu", _t(GPU8), replicas=2, minReplicas=2, maxReplicas=2), head=_t(CPU))}},
    "RayCluster": {"apiVersion": "ray.io/v1", "kind": "RayCluster", "spec": ray_cluster(
        group("GPU-Workers", _t(INIT), replicas=1, minReplicas=1, maxReplicas=1,
              numOfHosts=2), head=_t(CPU))},
    "MPIJob": mpijob(2, _t(GPU8), _t(CPU), runPolicy={"backoffLimit": 0}),
    "LeaderWorkerSet": lws(2, 2, _t(CPU), _t(INIT)),
}  # fmt: skip


async def emulator(kmock: Any) -> Emulator:
    k8s = cast(Emulator, kmock)
    info = kmocklib.ResourceInfo(namespaced=True)
    for name in ("v1/pods", "v1/events", "v1/services", "scheduling.x-k8s.io/v1alpha1/podgroups",
                 "scheduling.volcano.sh/v1beta1/podgroups", "batch/v1/jobs"):  # fmt: skip
        k8s.resources[name] = info
    for kind in INTEGRATIONS:
        k8s.resources[f"{api_version(kind)}/{kind.plural}"] = info
    return k8s


def client_config(k8s: Emulator) -> Configuration:
    return Configuration(host=str(k8s.url).rstrip("/"))


def admitted(kind: str, job: str = JOB, nodes: str = "node") -> tuple[Placement, LaunchSpec]:
    """Job ``acme/<job>`` with ``WORKLOADS[kind]`` (with the user's labels) admitted as the
    service does, its launch spec, and a placement of two pods a node, pod sets in order."""
    body = {**WORKLOADS[kind], "metadata": USER_META}
    manifest = {"apiVersion": "fedbroker.io/v1alpha1", "kind": "FederatedJob",
                "metadata": {"name": job}, "spec": {"workload": body}}  # fmt: skip
    parsed = admit_templates(
        parse_manifest(json.dumps(manifest).encode(), None), "baseline", ["default"]
    )
    derived = to_job(parsed, "acme", "training")
    spec = LaunchSpec(
        tenant="acme", job=job, queue="training", schedule_timeout_seconds=120,
        pod_sets=tuple(p.name for p in derived.pod_sets), workload=workload_of(parsed.wire()),
    )  # fmt: skip
    slots = [(ps, i) for ps in derived.pod_sets for i in range(ps.count)]
    pods = tuple(
        PodPlacement(
            f"acme.{job}-{ps.name}-{i}",
            f"{nodes}-{n // 2}",
            tuple(range(ps.resources.gpus * (n % 2), ps.resources.gpus * (n % 2 + 1))),
            ps.resources,
        )
        for n, (ps, i) in enumerate(slots)
    )
    return Placement(f"acme/{job}", "east", pods), spec


Pause = Callable[[float], Awaitable[None]]


def launcher(
    api: ApiClient, sleep: Pause, mode: Mode = "pin", flavor: Flavor = "coscheduling", **kw: Any
) -> KubeLauncher:
    """A launcher of tenant namespaces ``team-<tenant>`` in cluster ``east``, polling by
    ``sleep`` (the test's controller, scheduler and kubelet), without retry waits."""
    settings = LaunchSettings(
        "team-{tenant}", mode, flavor, cluster="east", retry_wait=wait_none(), **kw
    )
    return KubeLauncher(api, settings, kinds=INTEGRATIONS, sleep=sleep)  # fmt: skip


def stored(k8s: Emulator, res: Any) -> dict[str, Obj]:
    return {n: o.raw for (r, _, n), o in list(k8s.objects.items()) if r == res and not o.deleted}


def workload(k8s: Emulator, kind: str, name: str = JOB) -> Obj | None:
    return stored(k8s, KIND_RES[kind]).get(name)


def node_of(pod: Mapping[str, Any]) -> str | None:
    """The one node every required node selector term of the pod names (None: unpinned)."""
    affinity = (pod.get("spec") or {}).get("affinity") or {}
    required = (affinity.get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    ) or {}
    nodes = {
        tuple(f["values"])
        for term in required.get("nodeSelectorTerms") or ()
        for f in term.get("matchFields") or ()
        if f["key"] == "metadata.name"
    }
    assert len(nodes) <= 1 and all(len(n) == 1 for n in nodes), nodes
    return nodes.pop()[0] if nodes else None


Names = Iterator[tuple[str, Obj]]


def _job_pods(job: str, pod_set: str, count: int, parent: Obj) -> Names:
    """The Job controller: ``<job>-<index>-<x>`` with the completion index label."""
    for i in range(count):
        yield f"{job}-{i}", {batchjob.COMPLETION_INDEX: str(i)}


def _jobset_pods(job: str, pod_set: str, count: int, parent: Obj) -> Names:
    """JobSet: child Jobs ``<jobset>-<replicatedJob>-<jobIndex>`` of ``parallelism`` pods
    each, labelled with the replicated job, the Job's index and the completion index."""
    per_job = int((parent.get("spec") or {}).get("parallelism") or 1)
    for i in range(count):
        j, p = divmod(i, per_job)
        yield f"{job}-{pod_set}-{j}-{p}", {
            jobset_kind.REPLICATED_JOB: pod_set, jobset_kind.JOB_INDEX: str(j),
            batchjob.COMPLETION_INDEX: str(p)}  # fmt: skip


def _pytorch_pods(job: str, pod_set: str, count: int, parent: Obj) -> Names:
    """The training operator: ``<job>-<type>-<index>`` with its replica index label."""
    for i in range(count):
        labels = {pytorchjob.REPLICA_INDEX: str(i),
                  "training.kubeflow.org/replica-type": pod_set}  # fmt: skip
        yield f"{job}-{pod_set}-{i}", labels


def _ray_pods(job: str, pod_set: str, count: int, parent: Obj) -> Names:
    """KubeRay: ``<cluster>-head-<x>``, ``<cluster>-<group>-worker-<x>``, no index; a
    RayJob's submitter Job is named after the RayJob."""
    if pod_set == "submitter":
        yield from ((job, {"job-name": job}) for _ in range(count))
        return
    role = "head" if pod_set == "head" else f"{pod_set}-worker"
    yield from ((f"{job}-{role}", {"ray.io/group": pod_set}) for _ in range(count))


# kind -> its controller's pod names and labels for ``count`` pods of one pod set, given
# the pod set's parent object (a JobSet's Job template); a new kind is one entry.
NAMES: Mapping[str, Callable[[str, str, int, Obj], Names]] = {
    "Job": _job_pods,
    "JobSet": _jobset_pods,
    "PyTorchJob": _pytorch_pods,
    "RayJob": _ray_pods,
    "RayCluster": _ray_pods,
}


@dataclass
class Cluster:
    """The controller, scheduler and kubelet of one member (see the module's docstring)."""

    k8s: Emulator
    kind: str
    spec: LaunchSpec
    sets: list[str]  # the pod set of each pod of the placement
    extra: int = 0  # pods the controller makes beyond the plan (in the last pod set)
    bind: bool = True
    made: int = 0
    polls: int = 0  # poll pauses so far; past MAX_POLLS the test fails instead of hanging
    counter: itertools.count[int] = field(default_factory=itertools.count)
    peak: dict[str, int] = field(default_factory=dict)  # node -> most pods running at once
    player: Player | None = None  # the kind's controller, when workload_players plays it
    ns: str = NS

    def __post_init__(self) -> None:
        if self.player is None and self.kind in PLAYERS:
            self.player = PLAYERS[self.kind]()

    @property
    def resource(self) -> Any:
        return KIND_RES[self.kind]

    def stored(self, res: Any) -> dict[str, Obj]:
        return stored(self.k8s, res)

    def workload(self) -> Obj | None:
        return workload(self.k8s, self.kind, self.spec.job)

    def patch(self, res: Any, obj: Obj, status: Obj) -> None:
        """Write ``status`` on a stored object, as its controller does."""
        self.k8s.objects[res, self.ns, obj["metadata"]["name"]].patch({"status": status})

    def create_pod(self, name: str, meta: Obj, spec: Obj) -> str:
        """One pod made by a controller, through the member's rules (a template that
        cannot become a pod fails the test here)."""
        self.made += 1
        return self.k8s.controller_create(PODS, NS, {
            "apiVersion": "v1", "kind": "Pod", "spec": spec,
            "metadata": {**meta, "name": name, "namespace": NS, "uid": f"uid-{name}",
                         "resourceVersion": "1",
                         "creationTimestamp": f"2026-01-01T00:00:{len(self.pods()):02d}Z"},
        })  # fmt: skip

    def bounded(self) -> None:
        self.polls += 1
        assert self.polls <= MAX_POLLS, f"still polling after {MAX_POLLS} polls"

    def pods(self) -> dict[str, Obj]:
        return stored(self.k8s, PODS)

    def make(self, pod_set: str, base: str, labels: Obj) -> str:
        """One pod of ``pod_set`` from the stored workload's template, as its controller
        makes it (``<base>-<5 chars>``); returns its name."""
        assert self.spec.workload is not None
        obj = workload(self.k8s, self.kind, self.spec.job)
        assert obj is not None, "the controller needs its workload"
        path = dict(self.spec.workload.pod_sets)[pod_set]
        template = json.loads(json.dumps(template_at(obj, path)))
        name = f"{base}-{next(self.counter):05d}"
        meta = template.get("metadata") or {}
        # Through the member's rules, as the controller's create goes: a template that
        # cannot become a pod fails the test here.
        return self.k8s.controller_create(PODS, NS, {
            "apiVersion": "v1", "kind": "Pod", "spec": template["spec"],
            "metadata": {**meta, "name": name, "namespace": NS, "uid": f"uid-{name}",
                         "resourceVersion": "1",
                         "creationTimestamp": f"2026-01-01T00:00:{len(self.pods()):02d}Z",
                         "labels": {**meta.get("labels", {}), **labels}},
        })  # fmt: skip

    def control(self, limit: int | None = None) -> None:
        """Make the workload's pods (``extra`` more in its last pod set), at most ``limit``
        more this time."""
        assert self.spec.workload is not None
        if self.player is not None:
            self.player.reconcile(self, limit)
            return
        obj = workload(self.k8s, self.kind, self.spec.job)
        if obj is None:
            return
        plan: list[tuple[str, str, Obj]] = []
        sets = self.spec.workload.pod_sets
        for n, (pod_set, path) in enumerate(sets):
            count = self.sets.count(pod_set)
            count += self.extra if n == len(sets) - 1 else 0
            parent = template_at(obj, path[:-2]) if self.kind == "JobSet" else {}
            names = NAMES[self.kind](self.spec.job, pod_set, count, parent)
            plan += [(pod_set, base, labels) for base, labels in names]
        for pod_set, base, labels in plan[self.made :][:limit]:
            self.make(pod_set, base, labels)
            self.made += 1

    def schedule(self) -> None:
        """Bind every ungated, unbound pod to the node its affinity names ("node-x" when
        none) and run it; record each node's peak of running pods and GPUs."""
        if not self.bind:
            return
        for (res, _, _name), obj in list(self.k8s.objects.items()):
            if res != PODS or obj.deleted or gated(obj.raw) or obj.raw["spec"].get("nodeName"):
                continue
            ready = {"type": "Ready", "status": "True"}
            obj.patch({"spec": {"nodeName": node_of(obj.raw) or "node-x"},
                       "status": {"phase": "Running", "conditions": [ready]}})  # fmt: skip
        running: dict[str, list[Obj]] = {}
        for pod in self.pods().values():
            if (pod.get("status") or {}).get("phase") == "Running":
                running.setdefault(pod["spec"]["nodeName"], []).append(pod)
        for node, pods in running.items():
            self.peak[node] = max(self.peak.get(node, 0), len(pods))
            gpus = [g for p in pods for g in _gpus(p)]
            assert len(gpus) == len(set(gpus)), f"GPUs of {node} given twice: {gpus}"

    async def step(self, _: float) -> None:
        """The launcher's poll pause: the controller, then the scheduler and kubelet."""
        self.bounded()
        self.control()
        self.schedule()


def _gpus(pod: Obj) -> list[str]:
    given = (pod["metadata"].get("annotations") or {}).get("fedbroker.io/gpus") or ""
    return [g for g in given.split(",") if g]


def cluster(k8s: Emulator, kind: str, placement: Placement, spec: LaunchSpec, **kw: Any) -> Cluster:
    sets = [p.pod[len(f"acme.{spec.job}-") :].rpartition("-")[0] for p in placement.pods]
    return Cluster(k8s, kind, spec, sets, **kw)


def pod_set_label(pod: Mapping[str, Any]) -> str:
    return str(pod["metadata"]["labels"][LABEL_POD_SET])
