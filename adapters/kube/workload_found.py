"""Reading workload jobs back after a restart (pin mode): for each workload object of ours,
the plan recorded on it (``adapters.kube.plan``), whether it ended while the broker was
away (its own status), and its pods as they stand: the live ones that hold a slot (under
the slot's ledger pod name, bound or not yet), how many wait gated for one, how many
ended. A restarted broker restores the job from this as it was (``broker.service``'s
recovery), whatever part of it has already finished.

One LIST per workload kind and one of our pods, only when some workload of ours exists.
A kind that cannot be listed, or the pods, fails the whole read (the member is then
treated as unreadable and its jobs requeued): a job read without its pods would be
restored with slots its running pods hold taken for free.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from adapters.kube.namespace import NamespaceApi
from adapters.kube.objects import GangObjects, job_key, namespace_of
from adapters.kube.plan import read_plan
from adapters.kube.slots import gated, terminal
from adapters.kube.translate import ANNOTATION_POD
from broker.model import PodBound
from broker.ports import WorkloadFound, WorkloadKind

log = logging.getLogger(__name__)


async def workloads_found(
    api: NamespaceApi,
    objects: GangObjects,
    kinds: Sequence[WorkloadKind],
    delegated: bool = False,
) -> dict[str, WorkloadFound]:
    """Every workload job of ours in the member, by job key (see the module's docstring);
    ``delegated``: the member's gang scheduler placed their pods (nothing recorded: only
    whether each ended)."""
    objs: dict[str, tuple[WorkloadKind, Mapping[str, Any]]] = {}  # job key -> (kind, object)
    for kind in kinds:
        for obj in await api.our_workloads(kind):
            objs[job_key(obj)] = (kind, obj)
    if not objs:
        return {}
    if delegated:
        return {key: _ended(kind, obj) for key, (kind, obj) in objs.items()}
    pods: dict[str, list[Mapping[str, Any]]] = {}
    for pod in await api.our_pods():
        pods.setdefault(job_key(pod), []).append(pod)
    return {key: _found(objects, kind, obj, pods.get(key, [])) for key, (kind, obj) in objs.items()}


def _found(
    objects: GangObjects,
    kind: WorkloadKind,
    obj: Mapping[str, Any],
    pods: list[Mapping[str, Any]],
) -> WorkloadFound:
    """One workload and its pods as a ``WorkloadFound``; an unreadable plan or status is
    said (the job is requeued), never raised: it must not cost the other jobs."""
    where = f"{kind.kind} {namespace_of(obj)}/{(obj.get('metadata') or {}).get('name')}"
    try:
        plan = read_plan(obj)
        end = kind.end(obj)
    except Exception as exc:  # any: this one job is requeued, the others restored
        log.warning("%s not restorable: %s", where, exc)
        return WorkloadFound(None, plan_error=f"{where}: {exc}")
    slotted: list[PodBound] = []
    waiting = ended = 0
    for pod in pods:
        if terminal(pod):
            ended += 1
        elif gated(pod):
            waiting += 1
        elif slot := ((pod.get("metadata") or {}).get("annotations") or {}).get(ANNOTATION_POD):
            try:
                slotted.append(objects.bound_of(pod, str(slot)))
            except Exception as exc:  # a slot held but unreadable: the job is requeued
                log.warning("%s: a pod not read back: %s", where, type(exc).__name__)
                return WorkloadFound(plan, plan_error=f"{where}: a pod of it is unreadable")
    return WorkloadFound(plan, end, tuple(slotted), waiting, ended)


def _ended(kind: WorkloadKind, obj: Mapping[str, Any]) -> WorkloadFound:
    """A delegated workload: whether it ended (an unreadable status is said, not raised)."""
    try:
        return WorkloadFound(None, kind.end(obj), delegated=True)
    except Exception as exc:  # any: this one job is requeued, the others restored
        where = f"{kind.kind} {namespace_of(obj)}/{(obj.get('metadata') or {}).get('name')}"
        return WorkloadFound(None, plan_error=f"{where}: {exc}", delegated=True)


__all__ = ["workloads_found"]
