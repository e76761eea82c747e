"""trainer.kubeflow.org/v1alpha1 TrainJob (Kubeflow Trainer v2): its pods' shape lives in a
runtime in the member cluster (a ClusterTrainingRuntime, or a TrainingRuntime in the
TrainJob's namespace, named by ``spec.runtimeRef``), so its pod sets are derived from that
runtime, given as data (``pod_sets_with``), as the Trainer controller builds the JobSet it
runs (kubeflow/trainer ``pkg/runtime/framework/plugins/jobset/builder.go``): the JobSet is
the runtime's ``spec.template``, named as the TrainJob, one pod set per replicated job,
named as it. The replicated job labelled ``trainer.kubeflow.org/trainjob-ancestor-step:
trainer`` is the trainer node: one Job (``replicas`` 1) of ``numNodes`` pods (parallelism
and completions; ``spec.trainer.numNodes``, else the runtime's ``mlPolicy.numNodes``, else
1), whose containers named ``node`` take the TrainJob's ``image``, ``command``, ``args``,
``resourcesPerNode`` (the container's whole resources, when it gives requests or limits)
and ``env`` (by name). Initializer jobs run one Job; any other replicated job is counted as
a JobSet's.

The broker cannot count what it cannot read: the runtime is looked up in the members'
caches when the job is submitted (``broker.service.admission``) and stored with the job
(``spec.workload.runtime``: kind, name, the members whose runtime makes the same pods, and
the runtime's ``spec`` as admitted), so a restart derives the same pod sets. Refused, as a
runtime the broker cannot count: replicated jobs held back by ``dependsOn`` (the gang
starts together) and MPI's ``runLauncherAsNode`` (the launcher would be a node too).

The pods reach the member through the TrainJob's ``spec.runtimePatches``: the broker's own
entry (manager ``fedbroker.io/broker``, as the CRD provides for managers like Kueue) gives
each replicated job's pods the broker's labels and gate or PodGroup label
(``launch_form``). Pure: no I/O; errors are ``FieldError``s with paths from the object's
root.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from broker.manifest.apirules import DNS1035_LABEL, name_problem
from broker.manifest.errors import FieldError, show
from broker.manifest.podrequests import Violation
from broker.manifest.workloads.allowlist import (
    Table,
    false_only,
    one_of,
    refused,
    string,
    whole,
)
from broker.manifest.workloads.batchjob import COMPLETION_INDEX, MANAGED_BY, SUSPENDED
from broker.manifest.workloads.injection import Injection
from broker.manifest.workloads.integration import Integration
from broker.manifest.workloads.jobset import JOB_INDEX
from broker.manifest.workloads.reading import (
    DerivedPodSet,
    Path,
    bounded,
    count,
    items,
    mapping,
    optional_mapping,
    pod_set_name,
    pod_template,
    pods_of_job,
    text,
)
from broker.manifest.workloads.status import condition_end, label_index
from broker.ports import MemberResource, RunEnd

GROUP = "trainer.kubeflow.org"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "TrainJob"
PLURAL = "trainjobs"
CLUSTER_RUNTIME = "ClusterTrainingRuntime"
RUNTIME = "TrainingRuntime"
RUNTIME_PLURALS = {CLUSTER_RUNTIME: "clustertrainingruntimes", RUNTIME: "trainingruntimes"}
# What the launcher reads besides the kind itself: both runtime kinds (RBAC get/list/watch).
READS = tuple(
    MemberResource(kind, GROUP, VERSION, plural, kind == RUNTIME)
    for kind, plural in RUNTIME_PLURALS.items()
)
LATE_POD_SETS: frozenset[str] = frozenset()
# The Trainer adds no container to the pods beyond its runtime's, which the template policy
# sees whole (the runtime's templates are checked as the pods will be made).
INJECTIONS: tuple[Injection, ...] = ()
ANCESTOR = "trainer.kubeflow.org/trainjob-ancestor-step"
TRAINER = "trainer"
INITIALIZERS = ("dataset-initializer", "model-initializer")
NODE_CONTAINER = "node"
MANAGER = "fedbroker.io/broker"
RUNTIME_AT: Path = ("runtime",)

_ENV = "env[*]"
_QUANTITY = "a quantity, counted as the pod's resources"
FIELDS: Table = (
    ("runtimeRef.apiGroup", one_of(GROUP)),
    ("runtimeRef.kind", one_of(CLUSTER_RUNTIME, RUNTIME)),
    ("runtimeRef.name", string("looked up in the members when the job is submitted")),
    ("trainer.numNodes", whole(1, why="the trainer's pods, counted")),
    ("trainer.numProcPerNode", whole(1, why="processes per pod, within its own resources")),
    ("trainer.image", string()),
    ("trainer.command[*]", string()),
    ("trainer.args[*]", string()),
    (f"trainer.{_ENV}.name", string()),
    (f"trainer.{_ENV}.value", string()),
    (f"trainer.{_ENV}.valueFrom.fieldRef.fieldPath", string()),
    *(
        (f"trainer.{_ENV}.valueFrom.{ref}.{key}", string())
        for ref in ("configMapKeyRef", "secretKeyRef")
        for key in ("name", "key")
    ),
    ("trainer.resourcesPerNode.requests.*", string(_QUANTITY)),
    ("trainer.resourcesPerNode.limits.*", string(_QUANTITY)),
    (
        "trainer.resourcesPerNode.claims",
        refused("resource claims are devices the broker neither counts nor places"),
    ),
    *(
        (f"initializer.{step}.{key}", string())
        for step in ("dataset", "model")
        for key in ("storageUri", "secretRef.name", f"{_ENV}.name", f"{_ENV}.value")
    ),
    ("activeDeadlineSeconds", whole(1, why="ends the job sooner, never later")),
    ("suspend", false_only(SUSPENDED)),
    ("managedBy", refused(MANAGED_BY)),
    (
        "runtimePatches",
        refused(
            "patches the runtime's pods past what the broker counted; the broker writes its "
            "own entry"
        ),
    ),
)


def runtime_ref(spec: Mapping[str, Any]) -> tuple[str, str]:
    """The runtime a TrainJob names: (kind, name), defaulted as the CRD defaults them."""
    at: Path = ("spec", "runtimeRef")
    ref = mapping(spec, "runtimeRef", ("spec",))
    group = text(ref, "apiGroup", at, default=GROUP)
    if group != GROUP:
        raise FieldError((*at, "apiGroup"), f"must be {GROUP}, got {show(group)}")
    kind = text(ref, "kind", at, default=CLUSTER_RUNTIME)
    if kind not in RUNTIME_PLURALS:
        raise FieldError((*at, "kind"), f"must be {CLUSTER_RUNTIME} or {RUNTIME}")
    return kind, text(ref, "name", at)


def pod_sets(spec: Mapping[str, Any]) -> list[DerivedPodSet]:
    """Without its runtime a TrainJob's pods are unknown: refused where it names it."""
    kind, name = runtime_ref(spec)
    raise FieldError(
        ("spec", "runtimeRef", "name"),
        f"{kind} {show(name)} is looked up in the members when the job is submitted",
    )


def pod_sets_with(spec: Mapping[str, Any], runtime: Mapping[str, Any]) -> list[DerivedPodSet]:
    """The pod sets the Trainer controller makes for ``spec`` from ``runtime`` (a runtime's
    ``spec``), paths below ``RUNTIME_AT`` + ``spec``; FieldError naming the field."""
    at: Path = (*RUNTIME_AT, "spec")
    trainer = optional_mapping(spec, "trainer", ("spec",)) or {}
    policy = optional_mapping(runtime, "mlPolicy", at) or {}
    mpi = optional_mapping(policy, "mpi", (*at, "mlPolicy")) or {}
    if mpi.get("runLauncherAsNode"):
        raise FieldError((*at, "mlPolicy", "mpi", "runLauncherAsNode"),
                         "the launcher as a node is not counted by the broker")  # fmt: skip
    nodes = count(policy, "numNodes", (*at, "mlPolicy"), default=1, least=1)
    nodes = count(trainer, "numNodes", ("spec", "trainer"), default=nodes, least=1)
    jobset_at: Path = (*at, "template", "spec")
    jobset = mapping(mapping(runtime, "template", at), "spec", (*at, "template"))
    replicated = items(jobset, "replicatedJobs", jobset_at)
    if not replicated:
        raise FieldError((*jobset_at, "replicatedJobs"), "required: at least one replicated job")
    out: list[DerivedPodSet] = []
    for rj, where in replicated:
        name = pod_set_name(text(rj, "name", where), (*where, "name"))
        if rj.get("dependsOn"):
            raise FieldError((*where, "dependsOn"), "holds a replicated job back; the broker "
                             "starts a gang's pods together")  # fmt: skip
        job = mapping(rj, "template", where)
        job_meta = optional_mapping(job, "metadata", (*where, "template")) or {}
        ancestor = (optional_mapping(job_meta, "labels", where) or {}).get(ANCESTOR)
        job_at = (*where, "template", "spec")
        template, path = pod_template(
            mapping(job, "spec", (*where, "template")), "template", job_at
        )
        if ancestor == TRAINER:
            pods, template = nodes, overridden(template, trainer)
        elif ancestor in INITIALIZERS:
            pods = pods_of_job(job["spec"], job_at)
        else:
            replicas = count(rj, "replicas", where, default=1, least=1)
            pods = replicas * pods_of_job(job["spec"], job_at)
        if any(ps.name == name for ps in out):
            raise FieldError((*where, "name"), f"duplicate replicated job name {show(name)}")
        out.append(bounded(DerivedPodSet(name, pods, template, path), where))
    return out


def overridden(template: Mapping[str, Any], trainer: Mapping[str, Any]) -> dict[str, Any]:
    """The trainer node's pod template with the TrainJob's ``trainer`` written into its
    ``node`` containers, as the controller writes it (a copy)."""
    out = copy.deepcopy(dict(template))
    resources = trainer.get("resourcesPerNode") or {}
    given = {k: resources[k] for k in ("requests", "limits") if resources.get(k)}
    for container in (out.get("spec") or {}).get("containers") or ():
        if not isinstance(container, dict) or container.get("name") != NODE_CONTAINER:
            continue
        for key in ("image", "command", "args"):
            if trainer.get(key) is not None:
                container[key] = copy.deepcopy(trainer[key])
        if given:
            container["resources"] = copy.deepcopy(given)
        env = [e for e in container.get("env") or () if isinstance(e, Mapping)]
        for var in trainer.get("env") or ():
            env = [e for e in env if e.get("name") != var.get("name")] + [dict(var)]
        if env:
            container["env"] = env
    return out


def launch_form(obj: Mapping[str, Any]) -> tuple[dict[str, Any], tuple[tuple[str, Path], ...]]:
    """The TrainJob to create (the stored runtime left out) with the broker's own
    ``runtimePatches`` entry, one pod template patch per replicated job, and each pod
    set's path to its patch (where the launcher writes labels and the gate)."""
    body = {k: copy.deepcopy(v) for k, v in obj.items() if k != "runtime"}
    spec = body["spec"] = dict(body.get("spec") or {})
    runtime = mapping(obj, "runtime", ())
    names = [ps.name for ps in pod_sets_with(spec, mapping(runtime, "spec", RUNTIME_AT))]
    patches = [p for p in spec.get("runtimePatches") or () if p.get("manager") != MANAGER]
    at: Path = ("spec", "runtimePatches", len(patches), "trainingRuntimeSpec", "template",
                "spec", "replicatedJobs")  # fmt: skip
    jobs = [{"name": n, "template": {"spec": {"template": {"metadata": {}, "spec": {}}}}}
            for n in names]  # fmt: skip
    entry = {"manager": MANAGER, "trainingRuntimeSpec": {"template": {"spec": {
        "replicatedJobs": jobs}}}}  # fmt: skip
    spec["runtimePatches"] = [*patches, entry]
    paths = tuple((n, (*at, i, "template", "spec", "template")) for i, n in enumerate(names))
    return body, paths


def rules(name: str, spec: Mapping[str, Any]) -> list[Violation]:
    """The Trainer's webhook: the TrainJob's name names its JobSet and the JobSet's Jobs
    and Services, so it is a DNS-1035 label."""
    problem = name_problem(name, DNS1035_LABEL, 63, "a DNS-1035 label (a letter first)")
    if problem is None:
        return []
    return [Violation(("metadata", "name"), f"a TrainJob's name: {problem}")]


def pod_index(workload: Mapping[str, Any], pod: Mapping[str, Any]) -> int | None:
    """A pod's index within its replicated job, as the JobSet it runs as numbers it: the
    Job's index times its parallelism plus the completion index."""
    labels = (pod.get("metadata") or {}).get("labels") or {}
    # The trainer's replicated job runs one Job (its replicas are set to 1); another
    # replicated job's later Jobs are told apart by the launcher's slot annotation.
    first_job = str(labels.get(JOB_INDEX) or "0") == "0"
    return label_index(pod, COMPLETION_INDEX) if first_job else None


def end(obj: Mapping[str, Any]) -> RunEnd | None:
    """How a TrainJob ended by its conditions (``Complete`` or ``Failed`` True, as the
    controller copies them from its JobSet), or None while it runs."""
    return condition_end(obj, "Complete", "Failed")


INTEGRATION = Integration(
    GROUP, VERSION, KIND, PLURAL, pod_sets, FIELDS, INJECTIONS, rules=rules,
    index=pod_index, ending=end, reads=READS, runtime_pod_sets=pod_sets_with,
    launch_form=launch_form, runtime_ref=runtime_ref, templates_name_scheduler=False,
    pod_sets_doc="one per replicated job of its runtime's JobSet, by its name",
    count_doc="the trainer's `numNodes` (TrainJob, else the runtime); a JobSet's otherwise",
)  # fmt: skip
