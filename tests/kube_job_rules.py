"""The API server's batch/v1 Job: its defaults, the selector it generates and its
validation, as the test member applies them to a decoded body (``kube_schema``).

From kubernetes/kubernetes: ``pkg/apis/batch/v1/defaults.go`` (``SetDefaults_Job``:
completions and parallelism 1 when both are unset, else parallelism 1; backoffLimit 6
(MaxInt32 with backoffLimitPerIndex); completionMode NonIndexed; suspend false;
podReplacementPolicy TerminatingOrFailed (Failed with a podFailurePolicy); the Job's labels
from its template's when it has none; and the template's ``SetDefaults_PodSpec``, so a
template without restartPolicy has Always), ``pkg/registry/batch/job/strategy.go``
(``generateSelector`` unless ``manualSelector``: the template gets ``controller-uid``,
``batch.kubernetes.io/controller-uid``, ``job-name`` and ``batch.kubernetes.io/job-name``
labels, the selector matches the uid) and ``pkg/apis/batch/validation/validation.go``
(``ValidateJob``: parallelism, completions, backoffLimit, activeDeadlineSeconds and
ttlSecondsAfterFinished bounds; completionMode NonIndexed or Indexed, Indexed needing
completions, both at most 100000; the selector required and matching the template's
labels; the template a valid pod template whose restartPolicy is OnFailure or Never; on
update, the template, selector and completionMode immutable unless the Job is suspended).
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any

from kube_pod_rules import default_pod_spec, labels, metadata, pod_spec
from kube_schema import Cause, invalid, required, unsupported

CONTROLLER_UID = "batch.kubernetes.io/controller-uid"
JOB_NAME = "batch.kubernetes.io/job-name"
LEGACY_UID = "controller-uid"
LEGACY_NAME = "job-name"
MAX_INDEXED = 100_000
MAX_INT32 = 2**31 - 1


def default_job(job: dict[str, Any]) -> None:
    """``SetDefaults_Job``, the template's pod spec defaults, a uid, and the generated
    selector (``generateSelector``), in place."""
    meta = job.setdefault("metadata", {})
    meta.setdefault("uid", str(uuid.uuid4()))
    spec = job.setdefault("spec", {})
    if spec.get("completions") is None and spec.get("parallelism") is None:
        spec["completions"] = 1
    spec.setdefault("parallelism", 1)
    spec.setdefault(
        "backoffLimit", MAX_INT32 if spec.get("backoffLimitPerIndex") is not None else 6
    )
    spec.setdefault("completionMode", "NonIndexed")
    spec.setdefault("suspend", False)
    spec.setdefault(
        "podReplacementPolicy", "Failed" if spec.get("podFailurePolicy") else "TerminatingOrFailed"
    )
    template = spec.setdefault("template", {})
    default_pod_spec(template.setdefault("spec", {}))
    template_labels = (template.get("metadata") or {}).get("labels")
    if template_labels and not meta.get("labels"):
        meta["labels"] = dict(template_labels)
    if not spec.get("manualSelector"):
        _generate_selector(job)


def _generate_selector(job: dict[str, Any]) -> None:
    meta, spec = job["metadata"], job["spec"]
    template_labels = spec["template"].setdefault("metadata", {}).setdefault("labels", {})
    for key in (LEGACY_NAME, JOB_NAME):
        template_labels.setdefault(key, meta.get("name", ""))
    for key in (LEGACY_UID, CONTROLLER_UID):
        template_labels.setdefault(key, meta["uid"])
    selector = spec.get("selector") or {}
    spec["selector"] = selector
    selector.setdefault("matchLabels", {}).setdefault(CONTROLLER_UID, meta["uid"])


def _matches(selector: Mapping[str, Any], given: Mapping[str, Any]) -> bool:
    if any(given.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for expression in selector.get("matchExpressions") or ():
        key, operator, values = (
            expression.get("key"),
            expression.get("operator"),
            expression.get("values") or [],
        )
        present = key in given
        if (operator == "In" and given.get(key) not in values) or (
            operator == "NotIn" and present and given[key] in values
        ):
            return False
        if (operator == "Exists") != present and operator in ("Exists", "DoesNotExist"):
            return False
    return True


def job_create(job: Mapping[str, Any]) -> list[Cause]:
    """``ValidateJob`` of a defaulted Job."""
    spec = job.get("spec") or {}
    out = metadata(job.get("metadata") or {})
    for key in ("parallelism", "completions", "backoffLimit", "ttlSecondsAfterFinished"):
        if spec.get(key) is not None and spec[key] < 0:
            out.append(invalid(f"spec.{key}", spec[key], "must be greater than or equal to 0"))
    deadline = spec.get("activeDeadlineSeconds")
    if deadline is not None and deadline <= 0:
        out.append(invalid("spec.activeDeadlineSeconds", deadline, "must be greater than 0"))
    out += _completion_mode(spec)
    selector = spec.get("selector")
    template = spec.get("template") or {}
    template_meta = template.get("metadata") or {}
    if not selector:
        out.append(required("spec.selector"))
    else:
        out += labels(selector.get("matchLabels"), "spec.selector.matchLabels")
        if not _matches(selector, template_meta.get("labels") or {}):
            out.append(
                invalid(
                    "spec.template.metadata.labels",
                    template_meta.get("labels"),
                    "`selector` does not match template `labels`",
                )
            )
    out += metadata(template_meta, "spec.template.metadata")
    out += pod_spec(template.get("spec") or {}, "spec.template.spec")
    policy = (template.get("spec") or {}).get("restartPolicy")
    if policy not in ("OnFailure", "Never"):
        out.append(unsupported("spec.template.spec.restartPolicy", policy, ["OnFailure", "Never"]))
    return out


def _completion_mode(spec: Mapping[str, Any]) -> list[Cause]:
    mode = spec.get("completionMode")
    if mode not in ("NonIndexed", "Indexed"):
        return [unsupported("spec.completionMode", mode, ["NonIndexed", "Indexed"])]
    if mode != "Indexed":
        return []
    out: list[Cause] = []
    completions, parallelism = spec.get("completions"), spec.get("parallelism") or 0
    if completions is None:
        out.append(required("spec.completions", "when completion mode is Indexed"))
    elif completions > MAX_INDEXED:
        out.append(
            invalid(
                "spec.completions",
                completions,
                f"must be less than or equal to {MAX_INDEXED} when completion mode is Indexed",
            )
        )
    if parallelism > MAX_INDEXED:
        out.append(
            invalid(
                "spec.parallelism",
                parallelism,
                f"must be less than or equal to {MAX_INDEXED} when completion mode is Indexed",
            )
        )
    return out


def job_update(new: Mapping[str, Any], old: Mapping[str, Any]) -> list[Cause]:
    """``ValidateJobUpdate``: the new Job valid, and what may not change while it runs."""
    out = job_create(new)
    new_spec, old_spec = new.get("spec") or {}, old.get("spec") or {}
    for key in ("selector", "completionMode", "template"):
        if key == "template" and old_spec.get("suspend"):
            continue
        if new_spec.get(key) != old_spec.get(key):
            out.append(invalid(f"spec.{key}", new_spec.get(key), "field is immutable"))
    return out
