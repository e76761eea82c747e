"""Reading a workload object's fields for its integration: typed getters that refuse what
is not there or not of the right type with a ``FieldError`` naming the path (pure).

Every path is from the workload object's root (``("spec", "replicatedJobs", 0, ...)``);
``broker.manifest.models`` puts ``spec.workload`` in front. Counts follow Kubernetes'
int32 fields: whole numbers (a boolean is not one), defaulted as the API server does.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from broker.manifest.errors import FieldError, show
from broker.manifest.fields import MAX_PODS_PER_SET, dns_label

Path = tuple[str | int, ...]


@dataclass(frozen=True, slots=True)
class DerivedPodSet:
    """One pod set as the workload's controller will make it: ``count`` pods from the pod
    template at ``path`` (from the object's root)."""

    name: str
    count: int
    template: Mapping[str, Any]
    path: Path


def mapping(obj: Mapping[str, Any], key: str, at: Path) -> Mapping[str, Any]:
    """``obj[key]`` as a mapping; refused as "required" when absent."""
    value = optional_mapping(obj, key, at)
    if value is None:
        raise FieldError((*at, key), "required")
    return value


def optional_mapping(obj: Mapping[str, Any], key: str, at: Path) -> Mapping[str, Any] | None:
    """``obj[key]`` as a mapping; None when absent."""
    value = obj.get(key)
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise FieldError((*at, key), "must be a mapping")
    return value


def items(obj: Mapping[str, Any], key: str, at: Path) -> list[tuple[Mapping[str, Any], Path]]:
    """``obj[key]`` as a list of mappings, each with its path; absent: empty."""
    value = obj.get(key)
    if value is None:
        return []
    if not isinstance(value, list):
        raise FieldError((*at, key), "must be a list")
    out: list[tuple[Mapping[str, Any], Path]] = []
    for i, item in enumerate(value):
        if not isinstance(item, Mapping):
            raise FieldError((*at, key, i), "must be a mapping")
        out.append((item, (*at, key, i)))
    return out


def count(obj: Mapping[str, Any], key: str, at: Path, default: int, least: int = 0) -> int:
    """``obj[key]`` as a whole number >= ``least``, ``default`` when absent."""
    value = obj.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise FieldError((*at, key), "must be an integer")
    if value < least:
        raise FieldError((*at, key), f"must be >= {least}")
    return value


def text(obj: Mapping[str, Any], key: str, at: Path, default: str | None = None) -> str:
    value = obj.get(key, default)
    if value is None:
        raise FieldError((*at, key), "required")
    if not isinstance(value, str):
        raise FieldError((*at, key), "must be a string")
    return value


def flag(obj: Mapping[str, Any], key: str, at: Path) -> bool:
    value = obj.get(key, False)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise FieldError((*at, key), "must be a boolean (true or false)")
    return value


def pods_of_job(job_spec: Mapping[str, Any], at: Path) -> int:
    """The pods a batch/v1 JobSpec runs at once, as Kueue counts them: ``parallelism``
    (default 1), but ``completions`` when that is smaller."""
    parallelism = count(job_spec, "parallelism", at, default=1, least=1)
    completions = count(job_spec, "completions", at, default=parallelism, least=1)
    return min(parallelism, completions)


def pod_template(obj: Mapping[str, Any], key: str, at: Path) -> tuple[Mapping[str, Any], Path]:
    """The pod template at ``obj[key]``, which must have at least one container."""
    template = mapping(obj, key, at)
    where = (*at, key)
    spec = mapping(template, "spec", where)
    containers = spec.get("containers")
    if not isinstance(containers, list) or not containers:
        raise FieldError((*where, "spec", "containers"), "required: at least one container")
    return template, where


def bounded(pod_set: DerivedPodSet, at: Path) -> DerivedPodSet:
    """The pod set, if its count is within the per-set bound (else refused at ``at``)."""
    if pod_set.count > MAX_PODS_PER_SET:
        raise FieldError(
            at, f"makes {pod_set.count} pods of pod set {show(pod_set.name)}, "
            f"at most {MAX_PODS_PER_SET} allowed",
        )  # fmt: skip
    return pod_set


def pod_set_name(value: str, at: Path) -> str:
    """``value`` as a pod set name: a DNS-1123 label (refused at ``at`` otherwise)."""
    try:
        return dns_label(value)
    except ValueError as exc:
        raise FieldError(at, str(exc)) from None
