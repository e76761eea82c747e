"""What the kind modules share to read their controllers' objects back: a pod's index
label, and an end from a workload's status conditions (pure)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from broker.ports import RunEnd


def label_index(pod: Mapping[str, Any], key: str) -> int | None:
    """The whole number in the pod's label ``key``, or None (absent or not a number)."""
    value = ((pod.get("metadata") or {}).get("labels") or {}).get(key)
    return int(value) if isinstance(value, str) and value.isdigit() else None


def condition_end(obj: Mapping[str, Any], succeeded: str, failed: str) -> RunEnd | None:
    """The end a workload's conditions say: ``failed`` True first, then ``succeeded``
    True, with that condition's reason (else its type) and message; None otherwise."""
    conditions = (obj.get("status") or {}).get("conditions") or ()
    found: dict[str, Mapping[str, Any]] = {}
    for condition in conditions:
        if isinstance(condition, Mapping) and condition.get("status") == "True":
            found[str(condition.get("type"))] = condition
    for kind, ok in ((failed, False), (succeeded, True)):
        if kind in found:
            reason = str(found[kind].get("reason") or kind)
            return RunEnd(ok, reason, str(found[kind].get("message") or ""))
    return None
