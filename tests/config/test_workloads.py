"""spec.workload: each supported kind's pod sets (names, counts, per-pod requests counted
from the templates, init containers and overhead included) equal a hand-computed table, the
launcher's WorkloadSpec points at each template, bad objects are one-line errors naming the
field, and whatever the counts, the derived pod sets stay within every bound."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.manifest import (
    ManifestError,
    PolicyViolation,
    admit_templates,
    parse_manifest,
    to_job,
    workload_of,
)
from broker.manifest.fields import MAX_POD_SETS, MAX_PODS, MAX_PODS_PER_SET
from broker.manifest.workloads import templates
from broker.model import PodSet, Resources

Obj = dict[str, Any]


def container(name: str, limits: Obj | None = None, requests: Obj | None = None) -> Obj:
    resources: Obj = {}
    if limits:
        resources["limits"] = limits
    if requests:
        resources["requests"] = requests
    return {"name": name, "image": "trainer:1.0", "resources": resources}


def pod(*containers: Obj, init: tuple[Obj, ...] = (), overhead: Obj | None = None) -> Obj:
    spec: Obj = {"containers": list(containers)}
    if init:
        spec["initContainers"] = list(init)
    if overhead:
        spec["overhead"] = overhead
    return {"spec": spec}


GPU8 = pod(container("main", {"nvidia.com/gpu": 8, "cpu": "32", "memory": "256Gi"}))
# init 16 CPUs > running 4 + sidecar 2 (init peak: 2 + 16 = 18); no overhead: a member's
# RuntimeClass sets it, and refuses a pod that sets its own
INIT = pod(
    container("main", {"nvidia.com/gpu": 1, "cpu": "4", "memory": "8Gi"}),
    init=(container("log", requests={"cpu": "2", "memory": "1Gi"}) | {"restartPolicy": "Always"},
          container("fetch", requests={"cpu": "16", "memory": "2Gi"})),
)  # fmt: skip
CPU = pod(container("head", requests={"cpu": "4", "memory": "16Gi"}))


def restarting(template: Obj, policy: str = "Never") -> Obj:
    """The template with a restartPolicy (the Job API refuses a Job's template without)."""
    spec = template.get("spec") or {}
    return template if "restartPolicy" in spec else {
        **template, "spec": {**spec, "restartPolicy": policy}}  # fmt: skip


def batch_job(template: Obj = GPU8, **job: Any) -> Obj:
    spec = {**job, "template": restarting(template)}
    return {"apiVersion": "batch/v1", "kind": "Job", "spec": spec}


def jobset(*replicated: Obj) -> Obj:
    return {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
            "spec": {"replicatedJobs": list(replicated)}}  # fmt: skip


def rj(name: str, template: Obj = GPU8, replicas: int | None = None, **job: Any) -> Obj:
    out: Obj = {"name": name, "template": {"spec": {**job, "template": template}}}
    if replicas is not None:
        out["replicas"] = replicas
    return out


def as_pytorch(replica: Obj) -> Obj:
    """A replica spec as the training operator takes it: its first container named
    ``pytorch`` (the operator's) unless one is."""
    template: Obj = replica.get("template") or {}
    spec: Obj = template.get("spec") or {}
    containers = spec.get("containers")
    if (
        not isinstance(containers, list)
        or not containers
        or any(isinstance(c, dict) and c.get("name") == "pytorch" for c in containers)
    ):
        return replica
    first = containers[0]
    if isinstance(first, dict):
        first = {**first, "name": "pytorch"}
    spec = {**spec, "containers": [first, *containers[1:]]}
    return {**replica, "template": {**template, "spec": spec}}


def pytorch(**replicas: Obj) -> Obj:
    """A PyTorchJob of these replica specs; a Master's ``replicas`` is written in as 1 (the
    operator's webhook refuses a Master without it)."""
    specs = {kind: as_pytorch(r) if isinstance(r, dict) else r for kind, r in replicas.items()}
    if isinstance(specs.get("Master"), dict):
        specs["Master"] = {"replicas": 1, **specs["Master"]}
    return {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
            "spec": {"pytorchReplicaSpecs": specs}}  # fmt: skip


def ray_cluster(*groups: Obj, head: Obj = CPU, **extra: Any) -> Obj:
    return {"headGroupSpec": {"template": head}, "workerGroupSpecs": list(groups), **extra}


def group(name: str, template: Obj = GPU8, **counts: Any) -> Obj:
    return {"groupName": name, "template": template, **counts}


def mpijob(workers: int | None = 2, template: Obj = GPU8, launcher: Obj = CPU, **extra: Any) -> Obj:
    """An MPIJob v2beta1 of a launcher and ``workers`` workers (None: no Worker spec)."""
    specs: Obj = {"Launcher": {"replicas": 1, "template": launcher}}
    if workers is not None:
        specs["Worker"] = {"replicas": workers, "template": template}
    return {"apiVersion": "kubeflow.org/v2beta1", "kind": "MPIJob",
            "spec": {"slotsPerWorker": 8, "mpiReplicaSpecs": specs, **extra}}  # fmt: skip


def lws(
    replicas: int | None = 2,
    size: int = 4,
    leader: Obj | None = CPU,
    workers: Obj = GPU8,
    **extra: Any,
) -> Obj:
    """A LeaderWorkerSet of ``replicas`` groups of ``size`` pods (leader: its template, or
    None for the worker template's)."""
    template: Obj = {"size": size, "workerTemplate": workers}
    if leader is not None:
        template["leaderTemplate"] = leader
    spec: Obj = {"leaderWorkerTemplate": template, **extra}
    if replicas is not None:
        spec["replicas"] = replicas
    return {"apiVersion": "leaderworkerset.x-k8s.io/v1", "kind": "LeaderWorkerSet",
            "spec": spec}  # fmt: skip


def ray_job(cluster: Obj, **extra: Any) -> Obj:
    spec = {"entrypoint": "python train.py", "rayClusterSpec": cluster, **extra}
    return {"apiVersion": "ray.io/v1", "kind": "RayJob", "spec": spec}


def manifest(workload: Obj, **spec: Any) -> bytes:
    return federated({**spec, "workload": workload})


def federated(spec: Obj, name: str = "w") -> bytes:
    return json.dumps({"apiVersion": "fedbroker.io/v1alpha1", "kind": "FederatedJob",
                       "metadata": {"name": name}, "spec": spec}).encode()  # fmt: skip


R8 = Resources(gpus=8, cpu_milli=32_000, memory_mib=256 * 1024)
RCPU = Resources(cpu_milli=4000, memory_mib=16 * 1024)
RSUB = Resources(cpu_milli=500, memory_mib=200)
SPEC_T = ("spec", "template")
# INIT by hand: running = main 4 + sidecar 2 = 6 CPU, 8Gi + 1Gi = 9Gi; init peaks: log 2 CPU
# 1Gi, fetch 2 + 16 = 18 CPU, 1 + 2 = 3Gi; max -> 18 CPU, 9Gi.
RINIT = Resources(gpus=1, cpu_milli=18_000, memory_mib=9 * 1024)
MPI = ("spec", "mpiReplicaSpecs")
LWT = ("spec", "leaderWorkerTemplate")

# (id, workload, [(pod set, count, per-pod resources, template path in the object)])
KINDS: list[tuple[str, Obj, list[tuple[str, int, Resources, tuple[str | int, ...]]]]] = [
    ("Job default parallelism", batch_job(), [("main", 1, R8, SPEC_T)]),
    ("indexed Job", batch_job(INIT, parallelism=4, completions=8, completionMode="Indexed"),
     [("main", 4, RINIT, SPEC_T)]),
    ("Job completions below parallelism", batch_job(parallelism=6, completions=2),
     [("main", 2, R8, SPEC_T)]),
    ("JobSet", jobset(rj("driver", CPU), rj("workers", GPU8, replicas=3, parallelism=2)),
     [("driver", 1, RCPU, ("spec", "replicatedJobs", 0, "template", "spec", "template")),
      ("workers", 6, R8, ("spec", "replicatedJobs", 1, "template", "spec", "template"))]),
    ("JobSet parallelism capped by completions",
     jobset(rj("w", INIT, replicas=2, parallelism=4, completions=3)),
     [("w", 6, RINIT, ("spec", "replicatedJobs", 0, "template", "spec", "template"))]),
    ("PyTorchJob", pytorch(Worker={"replicas": 3, "template": GPU8}, Master={"template": INIT}),
     [("master", 1, RINIT, ("spec", "pytorchReplicaSpecs", "Master", "template")),
      ("worker", 3, R8, ("spec", "pytorchReplicaSpecs", "Worker", "template"))]),
    ("PyTorchJob workers only", pytorch(Worker={"replicas": 2, "template": GPU8}),
     [("worker", 2, R8, ("spec", "pytorchReplicaSpecs", "Worker", "template"))]),
    ("RayCluster", {"apiVersion": "ray.io/v1", "kind": "RayCluster", "spec": ray_cluster(
        group("GPU-Workers", replicas=2, minReplicas=1, maxReplicas=4, numOfHosts=2),
        group("idle", minReplicas=0, maxReplicas=3))},
     [("head", 1, RCPU, ("spec", "headGroupSpec", "template")),
      ("gpu-workers", 4, R8, ("spec", "workerGroupSpecs", 0, "template"))]),
    ("RayCluster replicas clamped", {"apiVersion": "ray.io/v1", "kind": "RayCluster",
        "spec": ray_cluster(group("a", minReplicas=3, maxReplicas=5),
                            group("b", replicas=9, maxReplicas=2))},
     [("head", 1, RCPU, ("spec", "headGroupSpec", "template")),
      ("a", 3, R8, ("spec", "workerGroupSpecs", 0, "template")),
      ("b", 2, R8, ("spec", "workerGroupSpecs", 1, "template"))]),
    ("RayJob default submitter", ray_job(ray_cluster(group("gpu", replicas=2))),
     [("head", 1, RCPU, ("spec", "rayClusterSpec", "headGroupSpec", "template")),
      ("gpu", 2, R8, ("spec", "rayClusterSpec", "workerGroupSpecs", 0, "template")),
      ("submitter", 1, RSUB, ("spec", "submitterPodTemplate"))]),
    ("RayJob own submitter", ray_job(ray_cluster(group("gpu", replicas=1)),
                                     submitterPodTemplate=INIT),
     [("head", 1, RCPU, ("spec", "rayClusterSpec", "headGroupSpec", "template")),
      ("gpu", 1, R8, ("spec", "rayClusterSpec", "workerGroupSpecs", 0, "template")),
      ("submitter", 1, RINIT, ("spec", "submitterPodTemplate"))]),
    ("RayJob HTTP mode: no submitter", ray_job(ray_cluster(group("gpu", replicas=1)),
                                               submissionMode="HTTPMode"),
     [("head", 1, RCPU, ("spec", "rayClusterSpec", "headGroupSpec", "template")),
      ("gpu", 1, R8, ("spec", "rayClusterSpec", "workerGroupSpecs", 0, "template"))]),
    ("MPIJob", mpijob(3, INIT),
     [("launcher", 1, RCPU, (*MPI, "Launcher", "template")),
      ("worker", 3, RINIT, (*MPI, "Worker", "template"))]),
    ("MPIJob launcher as worker, no Worker", mpijob(None, launcher=GPU8, runLauncherAsWorker=True),
     [("launcher", 1, R8, (*MPI, "Launcher", "template"))]),
    ("MPIJob waits for workers", mpijob(1, launcherCreationPolicy="WaitForWorkersReady"),
     [("launcher", 1, RCPU, (*MPI, "Launcher", "template")),
      ("worker", 1, R8, (*MPI, "Worker", "template"))]),
    ("LeaderWorkerSet", lws(3, 4, leader=INIT),
     [("leader", 3, RINIT, (*LWT, "leaderTemplate")),
      ("worker", 9, R8, (*LWT, "workerTemplate"))]),
    ("LeaderWorkerSet one template", lws(None, 2, leader=None),
     [("main", 2, R8, (*LWT, "workerTemplate"))]),
    ("LeaderWorkerSet leaders only", lws(2, 1),
     [("leader", 2, RCPU, (*LWT, "leaderTemplate"))]),
]  # fmt: skip


def _at(obj: Obj, path: tuple[str | int, ...]) -> Any:
    for part in path:
        obj = obj[part]  # type: ignore[index]
    return obj


@pytest.mark.parametrize(
    ("workload", "expected"), [k[1:] for k in KINDS], ids=[k[0] for k in KINDS]
)
def test_each_kind_derives_the_pod_sets_kueue_does(
    workload: Obj, expected: list[tuple[str, int, Resources, tuple[str | int, ...]]]
) -> None:
    parsed = admit_templates(parse_manifest(manifest(workload), None), "baseline", ["default"])
    job = to_job(parsed, "team-a", "training")
    assert job.pod_sets == tuple(PodSet(name, n, r) for name, n, r, _ in expected)
    assert job.launch_kind == workload["kind"]  # what an agent-fed member must launch
    wire = parsed.wire()
    spec = workload_of(wire)
    assert spec is not None
    assert spec.kind == workload["kind"]
    assert spec.pod_sets == tuple((name, path) for name, _, _, path in expected)
    for _, path in spec.pod_sets:  # every path leads to a pod template in the stored object
        assert _at(dict(spec.object), path)["spec"]["containers"]
    # ... and is one of the templates the template policy checks
    assert {path for _, path in spec.pod_sets} <= {path for path, _ in templates(spec.object)}
    # the stored manifest reads back to the same job (recovery rebuilds it from the store)
    again = parse_manifest(json.dumps(wire).encode(), "application/json")
    assert to_job(again, "team-a", "training") == job
    assert again.wire() == wire


def test_the_default_submitter_runs_the_heads_image_and_passes_restricted() -> None:
    workload = ray_job(ray_cluster(group("gpu", replicas=1), head=pod(
        container("head", requests={"cpu": "4", "memory": "16Gi"}) | {"image": "rayproject/ray:2.9"}
    )))  # fmt: skip
    parsed = parse_manifest(manifest(workload), None)
    stored = parsed.wire()["spec"]["workload"]["spec"]["submitterPodTemplate"]
    assert stored["spec"]["containers"][0]["image"] == "rayproject/ray:2.9"
    assert stored["spec"]["restartPolicy"] == "Never"
    # the only template that fails "restricted" is the head's, not the default submitter's
    with pytest.raises(PolicyViolation) as refused:
        admit_templates(parsed, "restricted", [])
    assert {v.path[:6] for v in refused.value.violations} == {
        ("spec", "workload", "spec", "rayClusterSpec", "headGroupSpec", "template")
    }


def test_a_podsets_job_is_no_workload() -> None:
    pod_set = {"name": "w", "count": 1, "resources": {"nvidia.com/gpu": 1}}
    body = federated({"podSets": [pod_set]})
    assert workload_of(parse_manifest(body, None).wire()) is None


def _with(workload: Obj, path: tuple[str | int, ...], value: Any) -> Obj:
    out = copy.deepcopy(workload)
    target: Any = out
    for part in path[:-1]:
        target = target[part]
    target[path[-1]] = value
    return out


JS = jobset(rj("w", GPU8, replicas=2))
RJ = ray_job(ray_cluster(group("gpu", replicas=2)))
PT = pytorch(Worker={"replicas": 2, "template": GPU8})
W = "spec.workload"
NO_CONTAINERS: Obj = {"spec": {"containers": []}}
# (id, spec.workload or a whole spec, field path of the error, words in the message)
BAD: list[tuple[str, Obj, str, str]] = [
    ("a Pod", {"apiVersion": "v1", "kind": "Pod", "spec": {}}, f"{W}.kind",
     "batch/v1 Job, jobset.x-k8s.io/v1alpha2 JobSet"),
    ("JobSet at another version", {**JS, "apiVersion": "jobset.x-k8s.io/v1"}, f"{W}.kind",
     '"jobset.x-k8s.io/v1"'),
    ("no spec", {"apiVersion": "batch/v1", "kind": "Job"}, f"{W}.spec", "required"),
    ("unknown top-level field", {**JS, "status": {}}, f"{W}.status", "unknown field"),
    ("metadata.name", {**JS, "metadata": {"name": "x"}}, f"{W}.metadata.name", "unknown field"),
    ("bad label value", {**JS, "metadata": {"labels": {"a": "b c"}}}, f"{W}.metadata.labels.a",
     "label value"),
    ("33 labels", {**JS, "metadata": {"labels": {f"k{i}": "v" for i in range(33)}}},
     f"{W}.metadata.labels", "at most 32"),
    ("no containers", batch_job(NO_CONTAINERS), f"{W}.spec.template.spec.containers",
     "at least one container"),
    ("no template", {"apiVersion": "batch/v1", "kind": "Job", "spec": {"parallelism": 2}},
     f"{W}.spec.template", "required"),
    ("parallelism 0", batch_job(parallelism=0), f"{W}.spec.parallelism", ">= 1"),
    ("parallelism text", batch_job(parallelism="2"), f"{W}.spec.parallelism", "integer"),
    ("parallelism true", batch_job(parallelism=True), f"{W}.spec.parallelism", "integer"),
    ("Job of 1025 pods", batch_job(parallelism=1025), f"{W}.spec", "at most 1024"),
    ("JobSet without jobs", jobset(), f"{W}.spec.replicatedJobs", "at least one"),
    ("JobSet job not a DNS label", jobset(rj("Work_ers")), f"{W}.spec.replicatedJobs[0].name",
     "DNS-1123"),
    ("JobSet duplicate job", jobset(rj("a"), rj("a")), f"{W}.spec.replicatedJobs[1].name",
     "duplicate"),
    ("JobSet replicas 0", jobset(rj("a", replicas=0)), f"{W}.spec.replicatedJobs[0].replicas",
     ">= 1"),
    ("JobSet no containers", jobset(rj("a", NO_CONTAINERS)),
     f"{W}.spec.replicatedJobs[0].template.spec.template.spec.containers", "container"),
    ("JobSet of 9 jobs", jobset(*[rj(f"j{i}") for i in range(9)]), f"{W}.spec", "at most 8"),
    ("JobSet of 4097 pods", jobset(*[rj(f"j{i}", replicas=1024) for i in range(4)],
                                   rj("one")), f"{W}.spec", "at most 4096"),
    ("JobSet set of 2048 pods", jobset(rj("a", replicas=2, parallelism=1024)),
     f"{W}.spec.replicatedJobs[0]", "at most 1024"),
    ("PyTorch Launcher", pytorch(Launcher={"template": GPU8}),
     f"{W}.spec.pytorchReplicaSpecs.Launcher", "not Master or Worker"),
    ("PyTorch nothing", pytorch(), f"{W}.spec.pytorchReplicaSpecs", "Master or a Worker"),
    ("PyTorch no template", pytorch(Worker={"replicas": 2}),
     f"{W}.spec.pytorchReplicaSpecs.Worker.template", "required"),
    ("Ray autoscaling", ray_job(ray_cluster(enableInTreeAutoscaling=True)),
     f"{W}.spec.rayClusterSpec.enableInTreeAutoscaling", "autoscaling must be off"),
    ("RayJob on an existing cluster", {"apiVersion": "ray.io/v1", "kind": "RayJob", "spec": {
        "clusterSelector": {"ray.io/cluster": "shared"}}}, f"{W}.spec.rayClusterSpec",
     "clusterSelector"),
    ("Ray group called head", ray_job(ray_cluster(group("Head", replicas=1))),
     f"{W}.spec.rayClusterSpec.workerGroupSpecs[0].groupName", "taken"),
    ("Ray group called submitter", ray_job(ray_cluster(group("submitter", replicas=1))),
     f"{W}.spec.rayClusterSpec.workerGroupSpecs[0].groupName", "taken"),
    ("Ray group name", ray_job(ray_cluster(group("gpu workers", replicas=1))),
     f"{W}.spec.rayClusterSpec.workerGroupSpecs[0].groupName", "DNS-1123"),
    ("Ray numOfHosts 0", ray_job(ray_cluster(group("g", replicas=1, numOfHosts=0))),
     f"{W}.spec.rayClusterSpec.workerGroupSpecs[0].numOfHosts", ">= 1"),
    ("Ray head without image, default submitter",
     ray_job(ray_cluster(head={"spec": {"containers": [{"name": "head"}]}})),
     f"{W}.spec.rayClusterSpec.headGroupSpec.template.spec.containers[0].image", "head's image"),
    ("Ray no head", ray_job({"workerGroupSpecs": []}), f"{W}.spec.rayClusterSpec.headGroupSpec",
     "required"),
    ("not plain JSON", _with(JS, ("spec", "x"), float("inf")), f"{W}.spec.x", "finite"),
    ("MPIJob v1 is not v2beta1", {**mpijob(), "apiVersion": "kubeflow.org/v1"}, f"{W}.kind",
     '"kubeflow.org/v1" "MPIJob" is not a supported'),
    ("MPIJob no launcher", _with(mpijob(), ("spec", "mpiReplicaSpecs"), {"Worker": {
        "replicas": 1, "template": GPU8}}), f"{W}.spec.mpiReplicaSpecs.Launcher", "required"),
    ("MPIJob two launchers", _with(mpijob(), (*MPI, "Launcher", "replicas"), 2),
     f"{W}.spec.mpiReplicaSpecs.Launcher.replicas", "must be 1"),
    ("MPIJob Worker without replicas", _with(mpijob(), (*MPI, "Worker"), {"template": GPU8}),
     f"{W}.spec.mpiReplicaSpecs.Worker.replicas", "defaults it to 0"),
    ("MPIJob Server", _with(mpijob(), (*MPI, "Server"), {"replicas": 1, "template": CPU}),
     f"{W}.spec.mpiReplicaSpecs.Server", "not Launcher or Worker"),
    ("LWS no groups", lws(0), f"{W}.spec.replicas", ">= 1"),
    ("LWS size 0", lws(size=0), f"{W}.spec.leaderWorkerTemplate.size", ">= 1"),
    ("LWS no worker template", _with(lws(), (*LWT, "workerTemplate"), None),
     f"{W}.spec.leaderWorkerTemplate.workerTemplate", "required"),
    ("LWS of 1025 workers", lws(1025, 2), f"{W}.spec.leaderWorkerTemplate", "at most 1024"),
    # Only the broker writes a member runtime, and only for a kind whose pods one shapes.
    ("a runtime on a JobSet", {**JS, "runtime": {"kind": "ClusterTrainingRuntime"}},
     f"{W}.runtime", "a JobSet has no member runtime"),
]  # fmt: skip


@pytest.mark.parametrize(("workload", "path", "words"), [b[1:] for b in BAD],
                         ids=[b[0] for b in BAD])  # fmt: skip
def test_a_bad_workload_names_the_field(workload: Obj, path: str, words: str) -> None:
    with pytest.raises(ManifestError) as refused:
        parse_manifest(manifest(workload), None)
    message = str(refused.value)
    assert message.startswith(f"{path}: "), message
    assert words in message
    assert "\n" not in message


@pytest.mark.parametrize(
    ("spec", "path", "words"),
    [({"podSets": [{"name": "w", "count": 1, "resources": {"nvidia.com/gpu": 1}}],
       "workload": JS}, "spec.workload", "not both"),
     ({}, "spec.podSets", "podSets or workload"),
     ({"workload": JS, "gang": {"minMember": 3}}, "spec.gang.minMember", "<= the job's 2 pods")],
)  # fmt: skip
def test_exactly_one_of_pod_sets_and_workload(spec: Obj, path: str, words: str) -> None:
    body = json.dumps({"apiVersion": "fedbroker.io/v1alpha1", "kind": "FederatedJob",
                       "metadata": {"name": "x"}, "spec": spec}).encode()  # fmt: skip
    with pytest.raises(ManifestError) as refused:
        parse_manifest(body, None)
    assert str(refused.value).startswith(f"{path}: ")
    assert words in str(refused.value)


# Fields the allowlist refuses (admission, past parsing): (id, workload, path, words)
REFUSED: list[tuple[str, Obj, str, str]] = [
    ("MPIJob gang policy", mpijob(runPolicy={"schedulingPolicy": {"minAvailable": 1}}),
     f"{W}.spec.runPolicy.schedulingPolicy.minAvailable", "the broker makes the gang"),
    ("MPIJob suspended", mpijob(runPolicy={"suspend": True}), f"{W}.spec.runPolicy.suspend",
     "must be false"),
    ("MPIJob ExitCode", _with(mpijob(), (*MPI, "Worker", "restartPolicy"), "ExitCode"),
     f"{W}.spec.mpiReplicaSpecs.Worker.restartPolicy", "Never or OnFailure"),
    ("LWS LeaderReady", lws(startupPolicy="LeaderReady"), f"{W}.spec.startupPolicy",
     "gang scheduler holds the leader"),
    ("LWS surge", lws(rolloutStrategy={"rollingUpdateConfiguration": {"maxSurge": 1}}),
     f"{W}.spec.rolloutStrategy.rollingUpdateConfiguration.maxSurge", "beyond the placement"),
    ("LWS sub-groups", _with(lws(), (*LWT, "subGroupPolicy"), {"subGroupSize": 2}),
     f"{W}.spec.leaderWorkerTemplate.subGroupPolicy", "not allowed"),
    ("LWS volume claims", _with(lws(), (*LWT, "volumeClaimTemplates"), []),
     f"{W}.spec.leaderWorkerTemplate.volumeClaimTemplates", "PersistentVolumeClaims"),
    *((f"LWS {key.rpartition('/')[2]}",
       {**lws(), "metadata": {"annotations": {key: "kubernetes.io/hostname"}}},
       f"{W}.metadata.annotations.{key}", "alone in a topology domain")
      for key in ("leaderworkerset.sigs.k8s.io/exclusive-topology",
                  "leaderworkerset.sigs.k8s.io/subgroup-exclusive-topology")),
]  # fmt: skip


@pytest.mark.parametrize(("workload", "path", "words"), [r[1:] for r in REFUSED],
                         ids=[r[0] for r in REFUSED])  # fmt: skip
def test_the_allowlist_refuses_what_the_broker_cannot_honour(
    workload: Obj, path: str, words: str
) -> None:
    parsed = parse_manifest(manifest(workload), None)
    with pytest.raises(PolicyViolation) as refused:
        admit_templates(parsed, "baseline", ["default"])
    message = str(refused.value)
    assert message.startswith(f"{path}: "), message
    assert words in message


# (id, job name, workload, words in the refusal at metadata.name; "" admitted)
NAMES: list[tuple[str, str, Obj, str]] = [
    ("MPIJob a digit first", "7b", mpijob(), "DNS-1035"),
    ("MPIJob last worker's hostname", "m" * 52, mpijob(2), ""),
    ("MPIJob last worker's hostname too long", "m" * 55, mpijob(10), "worker-9"),
    ("LWS a digit first", "7b", lws(), "DNS-1035"),
    ("LWS last StatefulSet at the bound", "l" * 50, lws(10, 2), ""),
    ("LWS last StatefulSet too long", "l" * 50, lws(11, 2), "controller-revision-hash"),
    ("LWS of one-pod groups: no worker StatefulSet", "l" * 52, lws(11, 1), ""),
]  # fmt: skip


@pytest.mark.parametrize(("name", "workload", "words"), [n[1:] for n in NAMES],
                         ids=[n[0] for n in NAMES])  # fmt: skip
def test_the_names_a_controller_makes_are_valid(name: str, workload: Obj, words: str) -> None:
    body = federated({"workload": workload}, name=name)
    if not words:
        admit_templates(parse_manifest(body, None), "baseline", ["default"])
        return
    with pytest.raises(ManifestError) as refused:
        admit_templates(parse_manifest(body, None), "baseline", ["default"])
    assert str(refused.value).startswith("metadata.name: "), str(refused.value)
    assert words in str(refused.value)


# (id, workload, level, field path of the refusal, status-like kind)
POLICY: list[tuple[str, Obj, str, type[ManifestError]]] = [
    ("JobSet privileged container", jobset(rj("w", pod(container("m") | {
        "securityContext": {"privileged": True}}))),
     f"{W}.spec.replicatedJobs[0].template.spec.template.spec.containers[0]"
     ".securityContext.privileged", PolicyViolation),
    ("PyTorch hostPath", pytorch(Master={"template": {"spec": {
        "containers": [container("m")], "volumes": [{"name": "r", "hostPath": {"path": "/"}}]}}}),
     f"{W}.spec.pytorchReplicaSpecs.Master.template.spec.volumes[0].hostPath", PolicyViolation),
    ("Ray worker nodeName", ray_job(ray_cluster(group("g", {"spec": {
        "nodeName": "n1", "containers": [container("m")]}}, replicas=1))),
     f"{W}.spec.rayClusterSpec.workerGroupSpecs[0].template.spec.nodeName", PolicyViolation),
    ("broker label on the object", {**JS, "metadata": {"labels": {"fedbroker.io/job": "x"}}},
     f"{W}.metadata.labels.fedbroker.io/job", PolicyViolation),
    ("GPU request without limit", batch_job(pod(container("m", requests={"nvidia.com/gpu": 1}))),
     f"{W}.spec.template.spec.containers[0].resources.requests.nvidia.com/gpu", ManifestError),
    ("17 GPUs a pod", batch_job(pod(container("m", {"nvidia.com/gpu": 9}),
                                    container("n", {"nvidia.com/gpu": 8}))),
     f"{W}.spec.template.spec", ManifestError),
    ("MIG slice", batch_job(pod(container("m", {"nvidia.com/mig-1g.5gb": 1}))),
     f"{W}.spec.template.spec.containers[0].resources.limits.nvidia.com/mig-1g.5gb",
     ManifestError),
    ("MPIJob launcher hostNetwork", mpijob(launcher={"spec": {"hostNetwork": True,
                                                            "containers": [container("l")]}}),
     f"{W}.spec.mpiReplicaSpecs.Launcher.template.spec.hostNetwork", PolicyViolation),
    ("LWS leader privileged", lws(leader=pod(container("m") | {
        "securityContext": {"privileged": True}})),
     f"{W}.spec.leaderWorkerTemplate.leaderTemplate.spec.containers[0].securityContext"
     ".privileged", PolicyViolation),
    ("LWS uncounted worker template hostPath", lws(2, 1, workers={"spec": {
        "containers": [container("m")], "volumes": [{"name": "r", "hostPath": {"path": "/"}}]}}),
     f"{W}.spec.leaderWorkerTemplate.workerTemplate.spec.volumes[0].hostPath", PolicyViolation),
]  # fmt: skip


@pytest.mark.parametrize(("workload", "path", "kind"), [p[1:] for p in POLICY],
                         ids=[p[0] for p in POLICY])  # fmt: skip
def test_every_template_of_a_workload_passes_the_template_policy(
    workload: Obj, path: str, kind: type[ManifestError]
) -> None:
    parsed = parse_manifest(manifest(workload), None)
    with pytest.raises(ManifestError) as refused:
        admit_templates(parsed, "baseline", ["default"])
    assert type(refused.value) is kind
    assert str(refused.value).startswith(f"{path}: "), str(refused.value)


@settings(max_examples=60, deadline=None)
@given(
    replicas=st.lists(st.integers(0, 1100), min_size=1, max_size=10),
    parallelism=st.integers(0, 1100),
    completions=st.one_of(st.none(), st.integers(0, 1100)),
)
def test_derived_pod_sets_are_bounded_or_refused(
    replicas: list[int], parallelism: int, completions: int | None
) -> None:
    """Whatever the counts: admitted means every bound holds and each pod set's count is
    replicas x min(parallelism, completions); else a one-line error under spec.workload."""
    extra = {"parallelism": parallelism} | (
        {} if completions is None else {"completions": completions}
    )
    workload = jobset(*[rj(f"j{i}", CPU, replicas=r, **extra) for i, r in enumerate(replicas)])
    try:
        job = to_job(parse_manifest(manifest(workload), None), "t", "q")
    except ManifestError as exc:
        assert str(exc).startswith(f"{W}.spec")
        assert "\n" not in str(exc)
        return
    per_job = min(parallelism, completions if completions is not None else parallelism)
    assert [ps.count for ps in job.pod_sets] == [r * per_job for r in replicas]
    assert len(job.pod_sets) <= MAX_POD_SETS
    assert all(1 <= ps.count <= MAX_PODS_PER_SET for ps in job.pod_sets)
    assert sum(ps.count for ps in job.pod_sets) <= MAX_PODS
