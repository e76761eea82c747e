"""Pin mode for workloads: the pods a workload's controller makes get the slots of the
placement (pure).

A workload's pod templates carry the scheduling gate ``fedbroker.io/placement``
(``adapters.kube.workloads``), so its controller's pods wait, unscheduled. Each placement
pod is a slot: a node, GPU indexes and resources of one pod set. ``grants`` gives every
gated pod of the job a free slot of its pod set (``fedbroker.io/pod-set`` label), and
``ungate_patch`` is the merge patch that narrows the pod's required node affinity to that
node (``matchFields`` ``metadata.name``, ANDed into every term the user gave: a gated pod's
affinity may be narrowed, Kubernetes 1.27+), records the slot in annotations and removes
the gate. The recorded slot is what a restarted broker reads: a pod that holds a slot keeps
it, and the ledger reads the pod back under the placement's pod name
(``fedbroker.io/pod``) on the GPUs the broker picked (``fedbroker.io/gpus``).

A slot is held by every non-terminal pod that records it (a pod being deleted still runs
on its node); a pod that Succeeded or Failed frees its slot for the pod its controller
makes next. A gated pod with no free slot left stays gated (``unslotted``): the workload
asks for more pods than the broker placed, and an Event on the pod says so.

Complexity: ``grants`` is O(p log p) in the job's pods and slots (sorting); nothing here
depends on other jobs.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, cast

from adapters.kube.objects import LABEL_POD_SET, labels_of, pinned_to, pod_name, pod_set_of
from adapters.kube.pods import ANNOTATION_SLOT
from adapters.kube.translate import ANNOTATION_GPUS, ANNOTATION_POD, pod_index
from adapters.kube.workloads import GATE
from broker.model import Placement, PodPlacement
from broker.ports import LaunchSpec

TERMINAL = ("Succeeded", "Failed")
NO_SLOT_REASON = "FedbrokerNoSlot"


@dataclass(frozen=True, slots=True)
class Grant:
    """Give member pod ``pod`` (its name) the placement's ``slot``."""

    pod: Mapping[str, Any]
    slot: PodPlacement

    @property
    def name(self) -> str:
        return str(self.pod["metadata"]["name"])


def _meta(pod: Mapping[str, Any]) -> Mapping[str, Any]:
    return cast(Mapping[str, Any], pod.get("metadata") or {})


def gated(pod: Mapping[str, Any]) -> bool:
    """The pod still carries our scheduling gate."""
    gates = (pod.get("spec") or {}).get("schedulingGates") or ()
    return any(isinstance(g, Mapping) and g.get("name") == GATE for g in gates)


def terminal(pod: Mapping[str, Any]) -> bool:
    return (pod.get("status") or {}).get("phase") in TERMINAL


def slot_name(slot: PodPlacement, spec: LaunchSpec) -> str:
    """``<podset>-<index>``: the slot as ``GET /v1/jobs/{name}/pods`` shows it."""
    return pod_name(slot, spec)[len(spec.job) + 1 :]


_index = pod_index  # the pod's index as its controller labelled it, if any


def _slot_index(slot: PodPlacement) -> int:
    tail = slot.pod.rpartition("-")[2]
    return int(tail) if tail.isdigit() else 0


def _recorded(pod: Mapping[str, Any]) -> str:
    return str((_meta(pod).get("annotations") or {}).get(ANNOTATION_POD) or "")


def _order(pod: Mapping[str, Any]) -> tuple[int, str, str]:
    index = _index(pod)
    meta = _meta(pod)
    created = str(meta.get("creationTimestamp") or "")
    return (index if index is not None else 1 << 30, created, str(meta.get("name") or ""))


def grants(
    placement: Placement, spec: LaunchSpec, pods: Iterable[Mapping[str, Any]]
) -> tuple[list[Grant], list[Mapping[str, Any]]]:
    """The slot grants to make for the job's gated pods among ``pods`` (a fresh listing of
    the job's pods), and the gated pods left without a slot. A gated pod recording a free
    slot of its pod set gets that one again; the others take the free slot of their own
    index when there is one, else the lowest free one."""
    set_of = {p.pod: pod_set_of(pod_name(p, spec), spec) for p in placement.pods}
    free: dict[str, dict[str, PodPlacement]] = {}
    for slot in placement.pods:
        free.setdefault(set_of[slot.pod], {})[slot.pod] = slot
    live = sorted((p for p in pods if not terminal(p)), key=_order)
    # Pods past the gate hold the slot they record (they may run on its node), whatever
    # their labels say now; then a gated pod gets back the free slot it recorded.
    for pod in (p for p in live if not gated(p)):
        recorded = _recorded(pod)
        if recorded in set_of:
            free[set_of[recorded]].pop(recorded, None)
    waiting: list[tuple[Mapping[str, Any], PodPlacement | None]] = []
    for pod in (p for p in live if gated(p)):
        recorded = _recorded(pod)
        mine = recorded in set_of and set_of[recorded] == labels_of(pod).get(LABEL_POD_SET)
        waiting.append((pod, free[set_of[recorded]].pop(recorded, None) if mine else None))
    out: list[Grant] = []
    left: list[Mapping[str, Any]] = []
    for pod, held in waiting:
        if held is not None:
            out.append(Grant(pod, held))
            continue
        choices = free.get(labels_of(pod).get(LABEL_POD_SET, ""), {})
        if not choices:
            left.append(pod)
            continue
        index = _index(pod)
        same = [s for s in choices.values() if _slot_index(s) == index]
        slot = same[0] if same else min(choices.values(), key=_slot_index)
        del choices[slot.pod]
        out.append(Grant(pod, slot))
    return out, left


def ungate_patch(grant: Grant, spec: LaunchSpec) -> dict[str, Any]:
    """The merge patch giving ``grant.pod`` its slot: required affinity to the slot's node
    ANDed into the pod's own, the slot recorded in annotations, our gate removed (other
    gates stay). Carries the pod's resourceVersion: a pod changed since it was listed
    answers 409 and is granted again from a fresh listing."""
    pod, slot = grant.pod, grant.slot
    pod_spec = pod.get("spec") or {}
    gates = [g for g in pod_spec.get("schedulingGates") or () if g != {"name": GATE}]
    metadata: dict[str, Any] = {
        "annotations": {
            ANNOTATION_SLOT: slot_name(slot, spec),
            ANNOTATION_POD: slot.pod,
            ANNOTATION_GPUS: ",".join(str(g) for g in slot.gpus),
        }
    }
    version = _meta(pod).get("resourceVersion")
    if version:
        metadata["resourceVersion"] = version
    return {
        "metadata": metadata,
        "spec": {
            "schedulingGates": gates or None,
            "affinity": pinned_to(slot.node, pod_spec.get("affinity")),
        },
    }


def no_slot_event(
    pod: Mapping[str, Any], spec: LaunchSpec, origin: str, now: str
) -> dict[str, Any]:
    """A Warning Event on a pod left gated: the broker placed fewer pods of its pod set
    than its workload's controller made. ``now`` is an RFC 3339 time."""
    meta = _meta(pod)
    name, namespace = str(meta.get("name")), str(meta.get("namespace"))
    pod_set = labels_of(pod).get(LABEL_POD_SET, "")
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": f"{name}.{origin}-no-slot", "namespace": namespace},
        "involvedObject": {
            "apiVersion": "v1",
            "kind": "Pod",
            "name": name,
            "namespace": namespace,
            "uid": meta.get("uid"),
        },
        "reason": NO_SLOT_REASON,
        "message": (
            f"{origin} placed no more pods of pod set {pod_set!r} of job {spec.job}: "
            "this pod stays gated until a slot frees"
        ),
        "type": "Warning",
        "source": {"component": origin},
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
    }
