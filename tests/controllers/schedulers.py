"""The member's schedulers and kubelet, played over its API (bindings through
``pods/<name>/binding``, status through ``/status``, so watches hear them).

* ``pin``: the default scheduler with the broker's pins: an ungated pod whose required
  node affinity names one node is bound there only while that node has its GPUs free; else
  it stays Pending.
* ``coscheduling``: scheduler-plugins' Coscheduling plugin and PodGroup controller
  (kubernetes-sigs/scheduler-plugins ``pkg/coscheduling``, ``pkg/controllers/podgroup``):
  pods labelled ``scheduling.x-k8s.io/pod-group`` that name its scheduler are bound only
  once the group has ``minMember`` pods ("cannot find enough sibling pods" otherwise) and
  enough of them fit at once, each on the node of ITS choice (most allocated first) among
  those its ``nodeSelector`` selects; the
  PodGroup's ``status.phase`` goes Pending -> Scheduling (pods >= minMember) -> Scheduled
  (``scheduled`` >= minMember) -> Running (running + succeeded >= minMember) -> Finished
  (succeeded >= minMember) or Failed (the CRD's status has no ``scheduled``: counted here).
* ``volcano``: Volcano's gang plugin (volcano-sh/volcano): pods annotated
  ``scheduling.k8s.io/group-name`` with ``schedulerName: volcano``, the same gang rule, nodes
  of its choice (least allocated first); the PodGroup goes Pending -> Inqueue -> Running
  (``running`` >= minMember) -> Completed (all succeeded).
* The kubelet runs every bound Pending pod (``Running``, Ready); the test ends pods
  (``end``) when it says.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Literal

import kmock as kmocklib

from controllers.base import PODS, TERMINAL, Controllers, Obj, labels_of, path_of, phase

Mode = Literal["pin", "coscheduling", "volcano"]
NODES = kmocklib.resource("", "v1", "nodes")
COSCHED = kmocklib.resource("scheduling.x-k8s.io", "v1alpha1", "podgroups")
VOLCANO = kmocklib.resource("scheduling.volcano.sh", "v1beta1", "podgroups")
COSCHED_LABEL = "scheduling.x-k8s.io/pod-group"
VOLCANO_ANNOTATION = "scheduling.k8s.io/group-name"
GPU = "nvidia.com/gpu"
SCHEDULER = {"coscheduling": "scheduler-plugins-scheduler", "volcano": "volcano"}


def gpus_of(pod: Mapping[str, Any]) -> int:
    """The GPUs a pod asks for (requests, else limits; an init container's if larger)."""

    def ask(c: Mapping[str, Any]) -> int:
        res = c.get("resources") or {}
        return int((res.get("requests") or {}).get(GPU) or (res.get("limits") or {}).get(GPU) or 0)

    spec = pod.get("spec") or {}
    main = sum(ask(c) for c in spec.get("containers") or ())
    return max([main, *(ask(c) for c in spec.get("initContainers") or ())])


def pinned(pod: Mapping[str, Any]) -> str | None:
    """The one node the pod's required node affinity names (None: none)."""
    affinity = ((pod.get("spec") or {}).get("affinity") or {}).get("nodeAffinity") or {}
    required = affinity.get("requiredDuringSchedulingIgnoredDuringExecution") or {}
    for term in required.get("nodeSelectorTerms") or ():
        for field in term.get("matchFields") or ():
            if field.get("key") == "metadata.name" and len(field.get("values") or ()) == 1:
                return str(field["values"][0])
    return None


class Schedulers:
    """The scheduler of ``mode`` and the kubelet of one member."""

    def __init__(self, c: Controllers, mode: Mode) -> None:
        self.c = c
        self.mode = mode

    def capacity(self) -> dict[str, int]:
        return {
            name: int(((n.get("status") or {}).get("allocatable") or {}).get(GPU) or 0)
            for name, n in self.c.stored(NODES).items()
        }

    def used(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for pod in self.c.live(PODS):
            node = (pod.get("spec") or {}).get("nodeName")
            if node and phase(pod) not in TERMINAL:
                out[node] = out.get(node, 0) + gpus_of(pod)
        return out

    def free(self) -> dict[str, int]:
        used = self.used()
        return {n: gpus - used.get(n, 0) for n, gpus in self.capacity().items()}

    async def step(self) -> None:
        if self.mode == "pin":
            await self._pin()
        else:
            await self._gangs()
        await self._kubelet()

    def _waiting(self) -> list[Obj]:
        return [
            p
            for p in self.c.live(PODS)
            if not p["spec"].get("nodeName")
            and not p["spec"].get("schedulingGates")
            and phase(p) == "Pending"
        ]

    async def _pin(self) -> None:
        for pod in self._waiting():
            node, free = pinned(pod), self.free()
            if node is not None and free.get(node, 0) >= gpus_of(pod):
                await self._bind(pod, node)

    def _group_of(self, pod: Mapping[str, Any]) -> str | None:
        if pod["spec"].get("schedulerName") != SCHEDULER[self.mode]:
            return None
        if self.mode == "coscheduling":
            return labels_of(pod).get(COSCHED_LABEL)
        return ((pod.get("metadata") or {}).get("annotations") or {}).get(VOLCANO_ANNOTATION)

    async def _gangs(self) -> None:
        resource = COSCHED if self.mode == "coscheduling" else VOLCANO
        for (ns, group), members in self._groups().items():
            found = self.c.stored(resource, ns).get(group)
            if found is None:
                continue  # no PodGroup: the gang scheduler keeps them Pending
            waiting = [
                p for p in members if not p["spec"].get("nodeName") and phase(p) == "Pending"
            ]
            if waiting and len(members) >= int(found["spec"].get("minMember") or 1):
                choice = self._fit(waiting)
                for pod, node in (choice or {}).items():
                    await self._bind(self.c.stored(PODS, ns)[pod], node)
            await self._group_status(resource, found, self._groups().get((ns, group), []))

    def _groups(self) -> dict[tuple[str, str], list[Obj]]:
        out: dict[tuple[str, str], list[Obj]] = {}
        for pod in self.c.live(PODS):
            group = self._group_of(pod)
            if group is not None:
                out.setdefault((pod["metadata"]["namespace"], group), []).append(pod)
        return out

    def _fit(self, pods: Iterable[Obj]) -> dict[str, str] | None:
        """Nodes for all ``pods`` at once (most allocated first for coscheduling, least for
        Volcano), each among the nodes its ``nodeSelector`` selects (the scheduler's
        NodeAffinity filter), or None when they do not all fit."""
        free, capacity = self.free(), self.capacity()
        labels = {name: labels_of(n) for name, n in self.c.stored(NODES).items()}
        choice: dict[str, str] = {}
        for pod in pods:
            need = gpus_of(pod)
            wants = (pod.get("spec") or {}).get("nodeSelector") or {}
            fits = [
                n
                for n, f in free.items()
                if f >= need and capacity[n] > 0 and wants.items() <= labels[n].items()
            ]
            if not fits:
                return None
            most = self.mode == "coscheduling"
            fits.sort(key=lambda n: ((free[n] if most else -free[n]), n))
            choice[pod["metadata"]["name"]] = fits[0]
            free[fits[0]] -= need
        return choice

    async def _group_status(self, resource: Any, group: Obj, pods: list[Obj]) -> None:
        minimum = int(group["spec"].get("minMember") or 1)
        running = sum(1 for p in pods if phase(p) == "Running")
        succeeded = sum(1 for p in pods if phase(p) == "Succeeded")
        failed = sum(1 for p in pods if phase(p) == "Failed")
        scheduled = sum(1 for p in pods if p["spec"].get("nodeName"))
        old = group.get("status") or {}
        now = old.get("phase") or "Pending"
        if self.mode == "coscheduling":
            new = _cosched_phase(now, len(pods), scheduled, running, succeeded, failed, minimum)
            status: Obj = {"phase": new, "running": running, "succeeded": succeeded,
                           "failed": failed}  # fmt: skip
        else:
            new = _volcano_phase(now, len(pods), running, succeeded, minimum)
            status = {"phase": new, "running": running, "succeeded": succeeded, "failed": failed}
        if any(old.get(k) != v for k, v in status.items()):
            await self.c.status(resource, group, status)

    async def _bind(self, pod: Obj, node: str) -> None:
        """A binding through ``pods/<name>/binding`` (a pod deleted meanwhile is skipped)."""
        name = pod["metadata"]["name"]
        body = {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": name},
                "target": {"apiVersion": "v1", "kind": "Node", "name": node}}  # fmt: skip
        await self.c.write("POST", f"{path_of(PODS, pod['metadata'])}/binding", body)

    async def _kubelet(self) -> None:
        for pod in self.c.live(PODS):
            if pod["spec"].get("nodeName") and phase(pod) == "Pending":
                await self.end([pod], "Running")

    async def end(self, pods: Iterable[Mapping[str, Any]], to: str) -> None:
        """The kubelet reports each pod ``to`` (Running, Succeeded or Failed)."""
        ready = "True" if to == "Running" else "False"
        for pod in pods:
            status: Obj = {"phase": to, "conditions": [
                {"type": "Initialized", "status": "True"},
                {"type": "Ready", "status": ready}, {"type": "ContainersReady", "status": ready},
                {"type": "PodScheduled", "status": "True"}]}  # fmt: skip
            await self.c.status(PODS, pod, status)


def _cosched_phase(
    now: str, pods: int, scheduled: int, running: int, succeeded: int, failed: int, minimum: int
) -> str:
    if pods < minimum:
        return "Pending"
    if now == "Pending":
        return "Scheduling"
    if succeeded >= minimum:
        return "Finished"
    if failed and failed + running + succeeded >= minimum:
        return "Failed"
    if now == "Scheduling" and scheduled >= minimum:
        return "Scheduled"
    if now == "Scheduled" and running + succeeded >= minimum:
        return "Running"
    return now


def _volcano_phase(now: str, pods: int, running: int, succeeded: int, minimum: int) -> str:
    if pods and succeeded == pods:
        return "Completed"
    if running + succeeded >= minimum:
        return "Running"
    if now == "Pending" and pods >= minimum:
        return "Inqueue"
    return now
