"""What restoring a job after a restart takes (pure; ``broker.service.recovery`` applies
it): a job of the broker's own pods or a delegated workload's, from its pods read back and
its stored placement (``pods_adoptable``); a pinned workload job, from the plan its workload
records (or, when none was recorded, the store's placement), checked against the pods it
has now (``workload_adoptable``).

A running workload job is restored as it was, whatever part of it has finished: the
reservation is the whole plan; the pods that hold a slot are bound into it under the
slot's ledger pod name (the watcher had counted them as pods of no job); a slot no live pod
holds (its pod finished, its successor still gated) is ``idle``: a running job's idle
slots are released, as the watch releases a finished pod's, until the launcher grants them
to the successors and those bind (a slot granted to a pod not yet bound stays held: that
pod is pinned to its node). A job whose workload ended while the broker was away is
restored too, and its end recorded from the workload's status. It cannot be restored (and
is requeued, as a job of the store alone is) when its plan is unreadable, when the plan on
the object is not the placement the store holds (the object was made for another
placement), or when a pod holds a slot the plan does not have, or holds it on another node.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from broker.core.queue import Pending
from broker.model import Job, Placement, PodBound, PodPlacement, Resources
from broker.ports import WorkloadFound
from broker.service.state import pending_of
from broker.store import JobRecord

log = logging.getLogger(__name__)

Plan = dict[str, tuple[str, tuple[int, ...]]]  # ledger pod name -> (node, GPU indexes)


@dataclass(frozen=True, slots=True)
class Adoptable:
    """A workload job ready to restore: its queue entry, its reservation, the pods the
    watcher counted as no job's (bound into it now), and its slots no live pod holds."""

    pending: Pending
    placement: Placement
    bound: tuple[PodBound, ...]
    idle: tuple[str, ...]


def _stored_plan(record: JobRecord) -> Plan:
    pods: list[Any] = (record.placement or {}).get("pods") or []
    return {
        str(p["pod"]): (str(p["node"]), tuple(int(g) for g in p.get("gpus") or ())) for p in pods
    }


def slot_resources(pod: str, job: Job) -> Resources:
    """The requests of the pod set a ledger pod name (``...<job>-<pod set>-<index>``) is of."""
    head = pod.rpartition("-")[0]
    sets = [ps for ps in job.pod_sets if head.endswith(f"{job.name}-{ps.name}")]
    if not sets:
        raise ValueError(f"slot {pod} is of no pod set of job {job.name}")
    return max(sets, key=lambda ps: len(ps.name)).resources


def _refused(key: str, why: str) -> None:
    log.warning("cannot restore %s: %s; requeueing", key, why)


def workload_adoptable(record: JobRecord, found: WorkloadFound, cluster: str) -> Adoptable | None:
    """The job's restore, or None (said in the log) when it cannot be restored (see the
    module's docstring). Raises on a stored record it cannot read."""
    key = f"{record.tenant}/{record.name}"
    if found.plan_error:
        _refused(key, found.plan_error)
        return None
    stored = _stored_plan(record)
    plan = {s.pod: (s.node, s.gpus) for s in found.plan} if found.plan is not None else stored
    if not plan:
        _refused(key, "no plan recorded on its workload nor stored")
        return None
    if found.plan is not None and stored and plan != stored:
        _refused(key, "the plan on its workload is not the placement stored for it")
        return None
    for pod in found.slotted:
        slot = plan.get(pod.pod)
        if slot is None or (pod.node and pod.node != slot[0]):
            _refused(key, f"pod {pod.pod} holds no slot of its plan on node {pod.node or '-'}")
            return None
    pending = pending_of(record)
    slots = tuple(
        PodPlacement(pod, node, gpus, slot_resources(pod, pending.job))
        for pod, (node, gpus) in plan.items()
    )
    policy = str((record.placement or {}).get("policy") or "")
    held = {p.pod for p in found.slotted}
    return Adoptable(
        pending,
        Placement(key, cluster, slots, policy),
        tuple(p for p in found.slotted if p.node),
        tuple(pod for pod in plan if pod not in held),
    )


Counted = Callable[[str, str], tuple[str, tuple[int, ...]] | None]
"""Where the ledger counts a pod now (``Ledger.counted``): its node and GPUs, or None."""


def pods_adoptable(
    record: JobRecord,
    pods: list[PodBound],
    counted: Counted,
    partial: bool = False,
    running: bool = False,
) -> tuple[Pending, Placement, list[PodBound]] | None:
    """What restoring a job from its pods needs, read before anything changes (what can
    fail on a stored record or a member's pods fails here): its queue entry, its placement,
    and the pods the watcher already counted; None when the pods do not make its gang.
    ``partial``: a delegated workload's (whose finished pods are gone), which needs no more
    than a live pod per slot: ``running``, its reservation is its live pods' (the shares of
    finished ones were released as they ended, and the member's gang scheduler may have put
    other pods where they were reserved); still starting, the rest of its placement is
    reserved where it was."""
    key = f"{record.tenant}/{record.name}"
    stored = record.placement or {}
    reserved = {str(p["pod"]): p for p in stored.get("pods") or ()}
    if len(pods) > len(reserved) or (len(pods) < len(reserved) and not partial):
        return None
    bound = [p for p in pods if p.node]  # the watcher counted these as pods of no job
    slots = [_slot(p, reserved.get(p.pod), counted) for p in pods]
    if not all(slots) or any(p.pod not in reserved for p in pods):
        return None
    pending, held = pending_of(record), {p.pod for p in pods}
    idle = [] if running else [name for name in reserved if name not in held]
    free = (
        PodPlacement(name, str(reserved[name]["node"]),
                     tuple(int(g) for g in reserved[name].get("gpus") or ()),
                     slot_resources(name, pending.job))
        for name in idle
    )  # fmt: skip
    placement = Placement(
        key, record.cluster or "", (*(s for s in slots if s), *free),
        str(stored.get("policy") or ""),
    )  # fmt: skip
    return pending, placement, bound


def _slot(
    pod: PodBound, reserved: Mapping[str, Any] | None, counted: Counted
) -> PodPlacement | None:
    """Where a pod read back is reserved: where it is bound, on the GPUs the ledger counts
    it on (the broker's pick, or the ledger's for a pod whose node a delegate member's gang
    scheduler chose); a pod not bound yet, on the node and GPUs the broker reserved for it
    (None: it reserved none of that name)."""
    if pod.node:
        now = counted(pod.cluster, pod.pod)
        gpus = now[1] if now and now[0] == pod.node else pod.gpus
        return PodPlacement(pod.pod, pod.node, gpus or (), pod.resources)
    if reserved is None:
        return None
    gpus = pod.gpus or tuple(int(g) for g in reserved.get("gpus") or ())
    return PodPlacement(pod.pod, str(reserved["node"]), gpus, pod.resources)


__all__ = ["Adoptable", "pods_adoptable", "slot_resources", "workload_adoptable"]
