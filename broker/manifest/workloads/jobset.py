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
``JOB_SPEC`` and, as metadata, labels and annotations only."""

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
from broker.manifest.workloads.batchjob import JOB_SPEC, MANAGED_BY, SUSPENDED, TTL
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

API_VERSION = "jobset.x-k8s.io/v1alpha2"
KIND = "JobSet"

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
