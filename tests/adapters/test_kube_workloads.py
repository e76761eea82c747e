"""Workload jobs in a Kubernetes member (kmock over real HTTP, the real ``kubernetes.aio``
client): each kind's object as the launcher creates it, valid against the kind's real CRD
(batch Job: the Kubernetes OpenAPI schema), dressed for pin or delegate mode; how each
kind's own status ends a run; garbage collection; a foreign object of the job's name.
Launch end to end (slots, restart, retries, rollback): test_kube_workload_pins.py. The
derived pod sets of every kind (init containers and overhead included) are asserted in
tests/config/test_workloads.py, whose manifests these are."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import kubernetes_validate  # type: ignore[import-untyped]
import pytest
from crds import schema_problems
from kmock_namespaces import NamespacedEmulator
from kubernetes.aio.client import ApiClient
from workload_cluster import (
    COSCHED,
    CRD_FILES,
    JOB,
    KIND_RES,
    NS,
    VOLCANO,
    WORKLOADS,
    Emulator,
    admitted,
    launcher,
    stored,
    workload,
)
from workload_cluster import (
    KINDS as REGISTERED,
)

from adapters.kube.objects import (
    COSCHEDULING_LABEL,
    LABEL_JOB,
    LABEL_ORIGIN,
    LABEL_POD_SET,
    LABEL_TENANT,
    VOLCANO_ANNOTATION,
    Flavor,
    KubeLaunchError,
    Mode,
    pod_set_of,
)
from adapters.kube.plan import ANNOTATION_PLAN, plan_annotation
from adapters.kube.workloads import GATE, template_at
from broker.manifest.workloads import INTEGRATIONS
from broker.ports import LaunchError, RunEnd

pytestmark = pytest.mark.kmock(cls=NamespacedEmulator)

OURS = {LABEL_ORIGIN: "fedbroker", LABEL_TENANT: "acme", LABEL_JOB: JOB}
KINDS = sorted(WORKLOADS)
SCHEDULER = "scheduler-plugins-scheduler"
# (mode, PodGroup flavour, the cluster's GPU resource name)
MODES = [("pin", "coscheduling", "nvidia.com/gpu"),
         ("delegate", "coscheduling", "example.com/gpu"),
         ("delegate", "volcano", "nvidia.com/gpu")]  # fmt: skip
GPU_NAMES = {"nvidia.com/gpu", "amd.com/gpu", "example.com/gpu"}


class Stop(Exception):
    """The poll pause's bound: raised after the polls a test allows."""


class Polls:
    """A poll pause that lets ``n`` polls pass, then raises ``Stop``; counts in ``calls``."""

    def __init__(self, n: int) -> None:
        self.n, self.calls = n, 0

    async def __call__(self, _: float) -> None:
        self.calls += 1
        if self.calls > self.n:
            raise Stop


def gpu_amounts(pod_spec: Mapping[str, Any]) -> dict[str, int]:
    """GPU resource name -> amount over every container's limits and the overhead."""
    out: dict[str, int] = {}
    maps = [
        c.get("resources", {}).get("limits") or {}
        for c in [*pod_spec["containers"], *pod_spec.get("initContainers", ())]
    ]
    for amounts in [*maps, pod_spec.get("overhead") or {}]:  # fmt: skip
        for name, value in amounts.items():
            if name in GPU_NAMES or name.endswith("/gpu"):
                out[name] = out.get(name, 0) + int(value)
    return out


@pytest.mark.parametrize(("mode", "flavor", "gpu"), MODES, ids=[f"{m}-{f}" for m, f, _ in MODES])
@pytest.mark.parametrize("kind", KINDS)
async def test_each_kind_is_created_dressed_and_valid(
    api: ApiClient, k8s: Emulator, kind: str, mode: Mode, flavor: Flavor, gpu: str
) -> None:
    placement, spec = admitted(kind)
    scheduler = SCHEDULER if flavor == "coscheduling" and mode == "delegate" else None
    kube = launcher(api, Polls(0), mode, flavor, gpu_resource=gpu, scheduler_name=scheduler)
    await kube.workloads.create(placement, spec)
    obj = workload(k8s, kind)
    assert obj is not None and spec.workload is not None
    assert obj["metadata"]["labels"] == {"team": "vision", **OURS}
    # In pin mode the placement is recorded on it, for a restart (adapters.kube.plan).
    plan = {ANNOTATION_PLAN: plan_annotation(placement, spec)} if mode == "pin" else {}
    assert obj["metadata"]["annotations"] == {"owner": "ana", **plan}
    assert (obj["metadata"]["name"], obj["metadata"]["namespace"]) == (JOB, NS)
    if kind in CRD_FILES:
        assert schema_problems(obj, CRD_FILES[kind]) == []
    else:  # no CRD: the Kubernetes API's own schema, strict (no unknown fields)
        kubernetes_validate.validate(obj, "1.31", strict=True)
    assert [name for name, _ in spec.workload.pod_sets] == list(spec.pod_sets)
    per_set = {p.pod.rpartition("-")[0]: p.resources for p in placement.pods}
    for pod_set, path in spec.workload.pod_sets:
        meta, pod_spec = template_at(obj, path)["metadata"], template_at(obj, path)["spec"]
        user = {} if pod_set == "submitter" else {"app": "trainer"}  # KubeRay's default one
        want_labels = {**user, **OURS, LABEL_POD_SET: pod_set}
        want_notes = {"note": "kept"} if user else {}
        if kind == "Job":  # the API server's selector labels (manualSelector unset)
            uid = obj["metadata"]["uid"]
            want_labels |= {"job-name": JOB, "batch.kubernetes.io/job-name": JOB}
            want_labels |= {"controller-uid": uid, "batch.kubernetes.io/controller-uid": uid}
        if mode == "pin":
            assert pod_spec["schedulingGates"] == [{"name": GATE}]
            # none sent: a Job's template is defaulted by the API server, a CRD's is not
            assert pod_spec.get("schedulerName") == ("default-scheduler" if kind == "Job" else None)
        elif flavor == "coscheduling":
            want_labels[COSCHEDULING_LABEL] = JOB
            assert pod_spec["schedulerName"] == SCHEDULER
        else:
            want_notes[VOLCANO_ANNOTATION] = JOB
            assert pod_spec["schedulerName"] == "volcano"
        if mode == "delegate":
            assert "schedulingGates" not in pod_spec
        assert meta["labels"] == want_labels
        assert meta.get("annotations", {}) == want_notes
        gpus = per_set[f"acme.{JOB}-{pod_set}"].gpus
        assert gpu_amounts(pod_spec) == ({gpu: gpus} if gpus else {})
        # the admitted object is left as it was (a relaunch dresses it again)
        original = template_at(spec.workload.object, path)
        assert LABEL_ORIGIN not in (original.get("metadata") or {}).get("labels", {})
    groups = {**stored(k8s, COSCHED), **stored(k8s, VOLCANO)}
    if mode == "pin":
        assert groups == {}
    else:
        # Pods of late pod sets (a RayJob's submitter, made once the Ray cluster is ready)
        # are left out: the gang scheduler would wait for them for ever.
        late_sets = next(i for i in INTEGRATIONS if i.kind == kind).late_pod_sets
        late = [p for p in placement.pods if pod_set_of(p.pod[len("acme.") :], spec) in late_sets]
        assert bool(late) == (kind in ("RayJob", "MPIJob"))
        assert groups[JOB]["spec"]["minMember"] == len(placement.pods) - len(late)
        assert groups[JOB]["metadata"]["labels"] == OURS


def _true(kind: str, reason: str, message: str) -> dict[str, Any]:
    return {"type": kind, "status": "True", "reason": reason, "message": message,
            "lastTransitionTime": "2026-01-01T01:00:00Z"}  # fmt: skip


JOB_DONE = "Reached expected number of succeeded pods"
JOB_FAILED = "Job has reached the specified backoff limit"
JS_DONE, JS_FAILED = (
    "jobset completed successfully",
    "jobset failed due to one or more job failures",
)
PT = f"PyTorchJob {NS}/{JOB}"
PT_DONE, PT_FAILED = (
    f"{PT} successfully completed.",
    f"{PT} is failed because 1 Worker replica(s) failed.",
)
MPI = f"MPIJob {NS}/{JOB}"
MPI_DONE = f"{MPI} successfully completed."
MPI_FAILED = "Job has reached the specified backoff limit: exit code 1"
RAY_FAILED = "Job entrypoint command failed with exit code 1"
RAY_LATE = "The RayJob has passed the activeDeadlineSeconds."
RAY_INVALID = "The RayJob spec is invalid: backoffLimit must be a positive integer"
# (kind, status as its controller writes it, the run's end)
ENDS: list[tuple[str, dict[str, Any], RunEnd]] = [
    ("Job", {"conditions": [_true("SuccessCriteriaMet", "CompletionsReached", JOB_DONE),
                            _true("Complete", "CompletionsReached", JOB_DONE)],
             "succeeded": 3, "completedIndexes": "0-2"},
     RunEnd(True, "CompletionsReached", JOB_DONE)),
    ("Job", {"conditions": [_true("FailureTarget", "BackoffLimitExceeded", JOB_FAILED),
                            _true("Failed", "BackoffLimitExceeded", JOB_FAILED)], "failed": 7},
     RunEnd(False, "BackoffLimitExceeded", JOB_FAILED)),
    ("JobSet", {"conditions": [_true("Completed", "AllJobsCompleted", JS_DONE)]},
     RunEnd(True, "AllJobsCompleted", JS_DONE)),
    ("JobSet", {"conditions": [_true("Failed", "FailedJobs", JS_FAILED)],
                "terminalState": "Failed"},
     RunEnd(False, "FailedJobs", JS_FAILED)),
    ("PyTorchJob", {"conditions": [
        _true("Created", "PyTorchJobCreated", f"{PT} is created."),
        {**_true("Running", "PyTorchJobRunning", f"{PT} is running."), "status": "False"},
        _true("Succeeded", "PyTorchJobSucceeded", PT_DONE)],
        "replicaStatuses": {"Master": {"succeeded": 1}, "Worker": {"succeeded": 2}}},
     RunEnd(True, "PyTorchJobSucceeded", PT_DONE)),
    ("PyTorchJob", {"conditions": [_true("Failed", "PyTorchJobFailed", PT_FAILED)],
                    "replicaStatuses": {"Worker": {"failed": 1}}},
     RunEnd(False, "PyTorchJobFailed", PT_FAILED)),
    ("RayJob", {"jobStatus": "SUCCEEDED", "jobDeploymentStatus": "Complete", "message": "done"},
     RunEnd(True, "SUCCEEDED", "done")),
    ("RayJob", {"jobStatus": "FAILED", "jobDeploymentStatus": "Failed", "reason": "AppFailed",
                "message": RAY_FAILED},
     RunEnd(False, "AppFailed", RAY_FAILED)),
    ("RayJob", {"jobStatus": "STOPPED", "jobDeploymentStatus": "Complete"},
     RunEnd(False, "STOPPED", "")),
    ("RayJob", {"jobDeploymentStatus": "Failed", "reason": "DeadlineExceeded",
                "message": RAY_LATE},
     RunEnd(False, "DeadlineExceeded", RAY_LATE)),
    ("RayJob", {"jobDeploymentStatus": "Failed"}, RunEnd(False, "DeploymentFailed", "")),
    # KubeRay refuses the spec for good: it fails at once with KubeRay's reason and message.
    ("RayJob", {"jobDeploymentStatus": "ValidationFailed", "reason": "ValidationFailed",
                "message": RAY_INVALID},
     RunEnd(False, "ValidationFailed", RAY_INVALID, refused=True)),
    ("MPIJob", {"conditions": [
        _true("Created", "MPIJobCreated", f"{MPI} is created."),
        {**_true("Running", "MPIJobRunning", f"{MPI} is running."), "status": "False"},
        _true("Succeeded", "MPIJobSucceeded", MPI_DONE)],
        "replicaStatuses": {"Launcher": {"succeeded": 1}, "Worker": {}}},
     RunEnd(True, "MPIJobSucceeded", MPI_DONE)),
    ("MPIJob", {"conditions": [_true("Failed", "BackoffLimitExceeded/Error", MPI_FAILED)],
                "replicaStatuses": {"Launcher": {"failed": 1}}},
     RunEnd(False, "BackoffLimitExceeded/Error", MPI_FAILED)),
    ("MPIJob", {"conditions": [_true("Failed", "MPIJobEvicted", "1/2 workers are evicted")]},
     RunEnd(False, "MPIJobEvicted", "1/2 workers are evicted")),
]  # fmt: skip
AVAILABLE = _true("Available", "AllGroupsReady", "All replicas are ready")
# Statuses of a run that goes on: finished() keeps polling.
RUNNING: list[tuple[str, dict[str, Any]]] = [
    ("Job", {"active": 3, "conditions": [{"type": "Complete", "status": "False"}]}),
    ("JobSet", {"conditions": [{**_true("Completed", "x", "y"), "status": "False"}]}),
    ("PyTorchJob", {"conditions": [_true("Running", "PyTorchJobRunning", "running")]}),
    ("RayJob", {"jobStatus": "RUNNING", "jobDeploymentStatus": "Running"}),
    # An attempt failed with spec.backoffLimit left: KubeRay tries again, no end.
    (
        "RayJob",
        {
            "jobStatus": "FAILED",
            "jobDeploymentStatus": "Retrying",
            "failed": 1,
            "reason": "AppFailed",
            "message": RAY_FAILED,
        },
    ),
    ("RayCluster", {"state": "ready", "readyWorkerReplicas": 1}),
    ("MPIJob", {"conditions": [_true("Running", "MPIJobRunning", "running")]}),
    ("LeaderWorkerSet", {"conditions": [AVAILABLE], "replicas": 2, "readyReplicas": 2}),
]


def _valid_status(kind: str, obj: dict[str, Any]) -> None:
    """The status is one its controller could write (its CRD's or the Kubernetes schema)."""
    if kind in CRD_FILES:
        assert schema_problems(obj, CRD_FILES[kind]) == []
    else:
        kubernetes_validate.validate(obj, "1.31", strict=True)


@pytest.mark.parametrize(
    ("kind", "status", "end"), ENDS, ids=[f"{k}-{e.reason}" for k, _, e in ENDS]
)
async def test_finished_reads_each_kinds_own_status(
    api: ApiClient, k8s: Emulator, kind: str, status: dict[str, Any], end: RunEnd
) -> None:
    placement, spec = admitted(kind)
    pause = Polls(2)
    kube = launcher(api, pause)
    await kube.workloads.create(placement, spec)
    k8s.objects[KIND_RES[kind], NS, JOB].patch({"status": status})
    _valid_status(kind, k8s.objects[KIND_RES[kind], NS, JOB].raw)
    assert await kube.finished(placement, spec) == end
    assert pause.calls == 0


@pytest.mark.parametrize(
    ("kind", "status"), RUNNING, ids=[f"{k}-{s.get('jobDeploymentStatus', '')}" for k, s in RUNNING]
)
async def test_a_running_workload_is_polled_until_deleted(
    api: ApiClient, k8s: Emulator, kind: str, status: dict[str, Any]
) -> None:
    placement, spec = admitted(kind)
    kube = launcher(api, Polls(3))
    await kube.workloads.create(placement, spec)
    k8s.objects[KIND_RES[kind], NS, JOB].patch({"status": status})
    _valid_status(kind, k8s.objects[KIND_RES[kind], NS, JOB].raw)
    with pytest.raises(Stop):
        await kube.finished(placement, spec)  # a RayCluster never ends by itself

    async def delete_it(_: float) -> None:
        await kube.api.delete_workload(REGISTERED[kind], NS, JOB)

    kube.pause = delete_it
    message = f"{kind} {NS}/{JOB} was deleted"
    assert await kube.finished(placement, spec) == RunEnd(False, "WorkloadDeleted", message)
    assert workload(k8s, kind) is None


async def test_garbage_collection_keeps_live_and_foreign_workloads(
    api: ApiClient, k8s: Emulator
) -> None:
    kube = launcher(api, Polls(0))
    for kind in KINDS:
        for job in (f"{kind.lower()}-live", f"{kind.lower()}-dead"):
            await kube.workloads.create(*admitted(kind, job))
    meta = {"name": "theirs", "namespace": NS, "labels": {"team": "x"}}
    foreign = {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "metadata": meta}
    k8s.objects[KIND_RES["JobSet"], NS, "theirs"] = foreign
    live = {f"acme/{kind.lower()}-live" for kind in KINDS}
    deleted = await kube.collect_garbage(live)
    assert sorted(deleted) == sorted(f"{k}/{NS}/{k.lower()}-dead" for k in KINDS)
    for kind in KINDS:
        left = set(stored(k8s, KIND_RES[kind]))
        assert left == {f"{kind.lower()}-live"} | ({"theirs"} if kind == "JobSet" else set())
    deletes = [r for kind in KINDS for r in k8s["delete"][KIND_RES[kind]]]
    assert len(deletes) == len(KINDS)
    assert {r.params.get("propagationPolicy") for r in deletes} == {"Background"}
    assert await kube.collect_garbage(live) == []


@pytest.mark.parametrize(("mode", "flavor"), [("pin", "coscheduling"), ("delegate", "volcano")])
async def test_another_jobs_workload_of_that_name_fails_the_launch_and_stays(
    api: ApiClient, k8s: Emulator, mode: Mode, flavor: Flavor
) -> None:
    theirs = {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {"name": JOB, "namespace": NS, "labels": {**OURS, LABEL_JOB: "other"}},
        "spec": {},
    }
    k8s.objects[KIND_RES["JobSet"], NS, JOB] = theirs
    placement, spec = admitted("JobSet")
    kube = launcher(api, Polls(5), mode, flavor)
    with pytest.raises(KubeLaunchError, match="does not belong to acme/train") as caught:
        await kube.launch(placement, spec)
    assert isinstance(caught.value, LaunchError)
    assert workload(k8s, "JobSet") == theirs
    assert not k8s["delete"][KIND_RES["JobSet"]]
    assert stored(k8s, VOLCANO) == {}  # the PodGroup it made first is rolled back
