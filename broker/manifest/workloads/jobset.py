"""jobset.x-k8s.io/v1alpha2 JobSet: one pod set per ``spec.replicatedJobs[i]``, named as
the replicated job, of ``replicas`` (default 1) times the pods each of its Jobs runs at
once (``parallelism``, default 1, capped by ``completions``: Kueue's ``podsCount``). The
pod template is ``spec.replicatedJobs[i].template.spec.template``.

``rules``: each replicated job's Job must pass the Job API's rules (JobSet's webhook first
writes OnFailure into an empty restartPolicy and Indexed into an empty completionMode), and
the names JobSet's webhook checks (kubernetes-sigs/jobset ``pkg/webhooks/jobset_webhook.go``):
``<jobset>-<replicatedJob>-<last job index>`` a DNS-1035 label, and for an Indexed job
with completions its longest pod name plus a 6-character suffix too.

``FIELDS``: what a tenant may set, names from the real CRD (kubernetes-sigs/jobset,
``config/components/crd/bases``); each replicated job's Job template takes a batch Job's
``JOB_SPEC`` and, as metadata, labels and annotations only.

A pod's index within its pod set (``index``) is the JobSet's global one: its child Job's
``jobset.sigs.k8s.io/job-index`` times the pods each Job of that replicated job runs at
once, plus the pod's completion index within its Job. It ends by its ``Completed``/``Failed``
condition."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from broker.manifest.apirules import DNS1035_LABEL, job_spec_problems, name_problem
from broker.manifest.errors import FieldError, show
from broker.manifest.podrequests import Violation
from broker.manifest.workloads.allowlist import (
    MAX_RETRIES,
    MIN_TTL_SECONDS,
    Table,
    boolean,
    false_only,
    one_of,
    refused,
    string,
    template_meta,
    under,
    whole,
)
from broker.manifest.workloads.batchjob import (
    COMPLETION_INDEX,
    JOB_SPEC,
    MANAGED_BY,
    SUSPENDED,
    TTL,
)
from broker.manifest.workloads.integration import Integration
from broker.manifest.workloads.reading import (
    DerivedPodSet,
    bounded,
    count,
    items,
    mapping,
    pod_set_name,
    pod_template,
    pods_of_job,
    text,
)
from broker.manifest.workloads.status import condition_end, label_index
from broker.ports import RunEnd

GROUP, VERSION = "jobset.x-k8s.io", "v1alpha2"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "JobSet"
# The labels JobSet's controller writes on each child Job's pods (api/jobset/v1alpha2).
REPLICATED_JOB = "jobset.sigs.k8s.io/replicatedjob-name"
JOB_INDEX = "jobset.sigs.k8s.io/job-index"

_JOB = "replicatedJobs[*].template"
HELD_BACK = (
    "the broker starts a gang's pods together; a replicated job held back until another is "
    "ready or complete starts late, past the gang timeout, or never"
)
FIELDS: Table = (
    ("replicatedJobs[*].name", string("names its pod set")),
    ("replicatedJobs[*].replicas", whole(1, why="Jobs of this template, counted")),
    ("replicatedJobs[*].groupName", string("a label on its pods")),
    ("replicatedJobs[*].dependsOn", refused(HELD_BACK)),
    *template_meta(f"{_JOB}.metadata"),
    *under(f"{_JOB}.spec", JOB_SPEC),
    ("successPolicy.operator", one_of("All", "Any")),
    ("successPolicy.targetReplicatedJobs[*]", string()),
    (
        "failurePolicy.maxRestarts",
        whole(0, MAX_RETRIES, "each restart runs every Job again, inside the placement"),
    ),
    ("failurePolicy.restartStrategy", one_of("Recreate", "BlockingRecreate", "InPlaceRestart")),
    ("failurePolicy.rules[*].name", string()),
    (
        "failurePolicy.rules[*].action",
        one_of(
            "FailJobSet",
            "RestartJobSet",
            "RestartJob",
            why="the ...AndIgnoreMaxRestarts actions restart without bound",
        ),
    ),
    ("failurePolicy.rules[*].onJobFailureReasons[*]", string()),
    ("failurePolicy.rules[*].onJobFailureMessagePatterns[*]", string()),
    ("failurePolicy.rules[*].targetReplicatedJobs[*]", string()),
    ("network.enableDNSHostnames", boolean()),
    ("network.publishNotReadyAddresses", boolean()),
    (
        "network.subdomain",
        refused(
            "names the JobSet's headless Service; the broker names it after the job, so that no "
            "two jobs' Services collide"
        ),
    ),
    ("coordinator.replicatedJob", string()),
    ("coordinator.jobIndex", whole(0)),
    ("coordinator.podIndex", whole(0)),
    ("startupPolicy", refused(HELD_BACK)),
    ("suspend", false_only(SUSPENDED)),
    ("managedBy", refused(MANAGED_BY)),
    ("ttlSecondsAfterFinished", whole(MIN_TTL_SECONDS, why=TTL)),
    (
        "volumeClaimPolicies",
        refused("makes PersistentVolumeClaims the broker neither counts nor deletes"),
    ),
)


def pod_sets(spec: Mapping[str, Any]) -> list[DerivedPodSet]:
    at = ("spec",)
    replicated = items(spec, "replicatedJobs", at)
    if not replicated:
        raise FieldError((*at, "replicatedJobs"), "required: at least one replicated job")
    out: list[DerivedPodSet] = []
    for rj, where in replicated:
        name = pod_set_name(text(rj, "name", where), (*where, "name"))
        replicas = count(rj, "replicas", where, default=1, least=1)
        job = mapping(rj, "template", where)
        job_spec = mapping(job, "spec", (*where, "template"))
        job_at = (*where, "template", "spec")
        template, path = pod_template(job_spec, "template", job_at)
        pods = replicas * pods_of_job(job_spec, job_at)
        if any(ps.name == name for ps in out):
            raise FieldError((*where, "name"), f"duplicate replicated job name {show(name)}")
        out.append(bounded(DerivedPodSet(name, pods, template, path), where))
    return out


def rules(name: str, spec: Mapping[str, Any]) -> list[Violation]:
    found: list[Violation] = []
    for i, rj in enumerate(spec.get("replicatedJobs") or ()):
        if not isinstance(rj, Mapping):
            continue
        at = ("spec", "replicatedJobs", i)
        job_spec = (rj.get("template") or {}).get("spec") or {}
        found += job_spec_problems(job_spec, (*at, "template", "spec"), defaulted=True)
        given = rj.get("replicas")
        replicas = given if isinstance(given, int) else 1
        job_name = f"{name}-{rj.get('name')}-{max(replicas - 1, 0)}"
        problem = name_problem(job_name, DNS1035_LABEL, 63, "a DNS-1035 label")
        completions = job_spec.get("completions")
        indexed = job_spec.get("completionMode", "Indexed") == "Indexed"
        if problem is None and indexed and isinstance(completions, int):
            pod_name = f"{job_name}-{max(completions - 1, 0)}-abcde"
            problem = name_problem(pod_name, DNS1035_LABEL, 63, "a DNS-1035 label")
        if problem is not None:
            found.append(Violation((*at, "name"), f"JobSet names its Jobs and pods "
                                   f"<job>-<replicatedJob>-<index>: {problem}"))  # fmt: skip
    return found


def index(workload: Mapping[str, Any], pod: Mapping[str, Any]) -> int | None:
    """See the module's docstring; None for a pod of no replicated job of ``workload``, or
    whose completion index lies past its Job's pods at once (a successor: any free slot of
    its pod set fits it)."""
    labels = (pod.get("metadata") or {}).get("labels") or {}
    job, within = label_index(pod, JOB_INDEX), label_index(pod, COMPLETION_INDEX)
    if job is None or within is None:
        return None
    for rj in (workload.get("spec") or {}).get("replicatedJobs") or ():
        if not isinstance(rj, Mapping) or rj.get("name") != labels.get(REPLICATED_JOB):
            continue
        try:
            per_job = pods_of_job((rj.get("template") or {}).get("spec") or {}, ())
        except FieldError:
            return None
        return job * per_job + within if within < per_job else None
    return None


def end(obj: Mapping[str, Any]) -> RunEnd | None:
    return condition_end(obj, "Completed", "Failed")


INTEGRATION = Integration(
    GROUP, VERSION, KIND, "jobsets", pod_sets, FIELDS, rules=rules, index=index, ending=end,
    pod_sets_doc="one per `replicatedJobs[i]`, by its name",
    count_doc="`replicas` (default 1) x the Job's pods as above",
)  # fmt: skip
