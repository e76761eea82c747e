"""The plan recorded on a workload: each slot of the placement (pod set, index, node, GPU
indexes) written on the workload object when the launcher creates it, so a restarted
broker restores a running workload job from what its member shows (pure).

Why on the workload object: it lives exactly as long as the run (deleted with it, kept
through the pods' turnover), and it is there before any pod is: a gated pod carries no
slot, and a pod that finished may be gone; the slots recorded on granted pods
(``adapters.kube.slots``) say which slots are held now, the plan says which exist. The
broker's store has the placement too; the object's own copy is what shows that this
object was made for that placement (a restart restores a job only when they agree).

Annotation ``fedbroker.io/plan``, compact JSON::

    {"pod": "<tenant>.<job>-", "slots": [["<pod set>-<index>", "<node>", [<gpu>, ...]], ...]}

where ``pod`` + a slot's name is the ledger's pod name. A Kubernetes object's annotations
may total 256 KiB; the plan takes at most ``PLAN_LIMIT`` (64 KiB, about 1,500 slots on
node names of 20 characters) and leaves the rest to the tenant's and controllers' own. A
larger plan is not recorded: a restart then restores the job from the store's placement
and the slots its pods record.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from adapters.kube.slots import slot_name
from broker.model import Placement
from broker.ports import LaunchSpec, PlannedSlot

ANNOTATION_PLAN = "fedbroker.io/plan"
PLAN_LIMIT = 64 * 1024  # bytes of the annotation's value


def plan_annotation(placement: Placement, spec: LaunchSpec) -> str | None:
    """The placement as the plan annotation's value; None when it would pass PLAN_LIMIT."""
    slots = [[slot_name(p, spec), p.node, list(p.gpus)] for p in placement.pods]
    first = placement.pods[0] if placement.pods else None
    prefix = first.pod[: len(first.pod) - len(slot_name(first, spec))] if first else ""
    if first is not None and prefix + slot_name(first, spec) != first.pod:
        raise ValueError(f"pod {first.pod} is not named after job {spec.job}")
    text = json.dumps({"pod": prefix, "slots": slots}, separators=(",", ":"))
    return text if len(text.encode()) <= PLAN_LIMIT else None


def read_plan(obj: Mapping[str, Any]) -> tuple[PlannedSlot, ...] | None:
    """The plan recorded on a workload object; None when none was. ``ValueError`` (naming
    what is wrong) when one is there but cannot be read."""
    annotations = (obj.get("metadata") or {}).get("annotations") or {}
    text = annotations.get(ANNOTATION_PLAN) if isinstance(annotations, Mapping) else None
    if text is None:
        return None
    try:
        doc = json.loads(text)
        prefix = doc["pod"]
        slots = tuple(
            PlannedSlot(prefix + name, node, tuple(int(g) for g in gpus))
            for name, node, gpus in doc["slots"]
        )
    except (TypeError, ValueError, KeyError) as exc:
        raise ValueError(f"annotation {ANNOTATION_PLAN} unreadable: {type(exc).__name__}") from exc
    if not all(isinstance(s.pod, str) and isinstance(s.node, str) and s.node for s in slots):
        raise ValueError(f"annotation {ANNOTATION_PLAN}: a slot without a pod name or node")
    return slots


__all__ = ["ANNOTATION_PLAN", "PLAN_LIMIT", "plan_annotation", "read_plan"]
