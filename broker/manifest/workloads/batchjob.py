"""batch/v1 Job: one pod set ``main`` (Kueue's default pod set name) of the pods the Job
runs at once: ``parallelism`` (default 1), or ``completions`` when that is smaller, Indexed
or not (Kueue's ``podsCount``). The pod template is ``spec.template``. A pod's index is
its completion index label; the Job ends by its ``Complete``/``Failed`` condition.

The API server's rules for a Job hold (``rules``). ``JOB_SPEC`` is what a tenant may set
in a JobSpec (this kind's ``spec``, and a JobSet's Job templates): field names from the
batch/v1 API (Kubernetes' OpenAPI, ``JobSpec``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from broker.manifest.apirules import job_spec_problems
from broker.manifest.podrequests import Violation
from broker.manifest.workloads.allowlist import (
    INT32_MAX,
    MAX_FAILED_INDEXES,
    MAX_RETRIES,
    MIN_TTL_SECONDS,
    TEMPLATE,
    Table,
    false_only,
    one_of,
    refused,
    string,
    whole,
)
from broker.manifest.workloads.integration import Integration
from broker.manifest.workloads.reading import DerivedPodSet, bounded, pod_template, pods_of_job
from broker.manifest.workloads.status import condition_end, label_index
from broker.ports import RunEnd

GROUP, VERSION = "batch", "v1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "Job"
POD_SET = "main"
# The index the Job controller gives an Indexed Job's pod (Kubernetes 1.28+; older
# releases write it as an annotation only, and the pod takes the lowest free slot).
COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"

RETRIES = "retries run inside the placement the broker made"
TTL = "the broker reads how it ended from the object, and deletes it itself"
SUSPENDED = "a suspended workload makes no pods while the broker holds its gang (cancel the job)"
MANAGED_BY = (
    "hands the object to another controller, maybe in another cluster, while the broker "
    "holds its gang"
)
SELECTOR = "the Job's controller makes its selector; one of your own could adopt other pods"

JOB_SPEC: Table = (
    ("parallelism", whole(1, why="pods at once, counted")),
    ("completions", whole(1, why="caps the pods at once, counted")),
    ("completionMode", one_of("NonIndexed", "Indexed")),
    ("backoffLimit", whole(0, MAX_RETRIES, RETRIES)),
    ("backoffLimitPerIndex", whole(0, MAX_RETRIES, RETRIES)),
    ("maxFailedIndexes", whole(0, MAX_FAILED_INDEXES, "Kubernetes' own bound")),
    ("activeDeadlineSeconds", whole(1, why="ends the job sooner, never later")),
    ("ttlSecondsAfterFinished", whole(MIN_TTL_SECONDS, why=TTL)),
    ("podFailurePolicy.rules[*].action", one_of("FailJob", "FailIndex", "Ignore", "Count")),
    ("podFailurePolicy.rules[*].onExitCodes.containerName", string()),
    ("podFailurePolicy.rules[*].onExitCodes.operator", one_of("In", "NotIn")),
    ("podFailurePolicy.rules[*].onExitCodes.values[*]", whole(-INT32_MAX - 1)),
    ("podFailurePolicy.rules[*].onPodConditions[*].type", string()),
    ("podFailurePolicy.rules[*].onPodConditions[*].status", one_of("True", "False", "Unknown")),
    ("podReplacementPolicy", one_of("TerminatingOrFailed", "Failed")),
    ("successPolicy.rules[*].succeededIndexes", string()),
    ("successPolicy.rules[*].succeededCount", whole(1)),
    ("template", TEMPLATE),
    ("suspend", false_only(SUSPENDED)),
    ("managedBy", refused(MANAGED_BY)),
    ("selector", refused(SELECTOR)),
    ("manualSelector", refused(SELECTOR)),
)
# Newer than the JobSpec a JobSet embeds (its CRD has no such field).
SCHEDULING = (
    "workload-aware scheduling and shared resource claims: the broker places the gang and "
    "counts no claim"
)
FIELDS: Table = (*JOB_SPEC, ("scheduling", refused(SCHEDULING)))


def pod_sets(spec: Mapping[str, Any]) -> list[DerivedPodSet]:
    at = ("spec",)
    template, path = pod_template(spec, "template", at)
    return [bounded(DerivedPodSet(POD_SET, pods_of_job(spec, at), template, path), at)]


def rules(name: str, spec: Mapping[str, Any]) -> list[Violation]:
    """The Job API's own rules (``validateJobSpec``): the object is created as is."""
    return job_spec_problems(spec, ("spec",))


def index(workload: Mapping[str, Any], pod: Mapping[str, Any]) -> int | None:
    return label_index(pod, COMPLETION_INDEX)


def end(obj: Mapping[str, Any]) -> RunEnd | None:
    """The Job's terminal conditions (``Complete``/``Failed``, Kubernetes 1.31+ writes them
    once its pods are gone)."""
    return condition_end(obj, "Complete", "Failed")


INTEGRATION = Integration(
    GROUP, VERSION, KIND, "jobs", pod_sets, FIELDS, rules=rules, index=index, ending=end,
    pod_sets_doc=f"`{POD_SET}` (`spec.template`)",
    count_doc="`parallelism` (default 1), or `completions` if smaller; Indexed or not",
)  # fmt: skip
