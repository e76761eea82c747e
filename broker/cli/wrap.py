"""``fedbroker submit -f`` with a plain Kubernetes object (JobSet, PyTorchJob, RayJob,
RayCluster, batch Job: no FederatedJob around it): wrapped into a FederatedJob whose
``spec.workload`` is the object (pure).

The job's name is the object's ``metadata.name``; its queue and priority come from
``--queue``/``--priority`` or else the labels ``fedbroker.io/queue``/``fedbroker.io/priority``
(the flag wins), which are taken off the object (``fedbroker.io`` labels are the broker's).
Of the object's metadata only labels and annotations are kept: the broker names the object
and chooses its namespace (the tenant's). The broker checks the rest and names the field.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

QUEUE_LABEL = "fedbroker.io/queue"
PRIORITY_LABEL = "fedbroker.io/priority"
FEDERATED_GROUP = "fedbroker.io/"


class WrapError(ValueError):
    """One line naming what is wrong in the file."""


def is_plain_object(doc: object) -> bool:
    """A mapping whose apiVersion is not the broker's: a workload object to wrap."""
    if not isinstance(doc, Mapping):
        return False
    api_version = doc.get("apiVersion")
    return isinstance(api_version, str) and not api_version.startswith(FEDERATED_GROUP)


def wrap(doc: Mapping[str, Any], queue: str | None, priority: int | None) -> dict[str, Any]:
    """The FederatedJob for a plain workload object; WrapError naming the field."""
    meta = doc.get("metadata") or {}
    if not isinstance(meta, Mapping):
        raise WrapError("metadata: must be a mapping")
    name = meta.get("name")
    if not isinstance(name, str) or not name:
        raise WrapError("metadata.name: required (the job is named after the object)")
    labels = dict(meta.get("labels") or {})
    label_queue = labels.pop(QUEUE_LABEL, None)
    label_priority = labels.pop(PRIORITY_LABEL, None)
    if priority is None and label_priority is not None:
        try:
            priority = int(str(label_priority))
        except ValueError:
            raise WrapError(
                f"metadata.labels.{PRIORITY_LABEL}: must be an integer, got {label_priority!r}"
            ) from None
    workload: dict[str, Any] = {k: v for k, v in doc.items() if k not in ("metadata", "status")}
    kept = {"labels": labels, "annotations": meta.get("annotations")}
    kept = {k: v for k, v in kept.items() if v}
    if kept:
        workload["metadata"] = kept
    spec: dict[str, Any] = {"workload": workload}
    if queue is not None or label_queue is not None:
        spec["queue"] = queue if queue is not None else label_queue
    if priority is not None:
        spec["priority"] = priority
    return {"apiVersion": "fedbroker.io/v1alpha1", "kind": "FederatedJob",
            "metadata": {"name": name}, "spec": spec}  # fmt: skip
