"""The two launch modes as strategies: what a launch does beyond creating the job's
objects, whichever launcher (pod gangs or workloads) creates them.

* ``Pin``: the broker's own nodes. The broker's pods are created pinned
  (``GangObjects.pod_body``); a workload's pods come from its controller gated, and
  ``tend`` gives each a slot of the placement (``adapters.kube.slots``: the slot's node
  ANDed into the pod's required affinity, the slot recorded, the gate removed; a pod left
  without one stays gated, with one Warning Event). The member never says a pinned gang
  started: its pods do.
* ``Delegate``: the member's gang scheduler. ``prepare`` creates (or adopts) the job's
  PodGroup; the gang has started once the PodGroup's phase is Running (read from one
  listing of our PodGroups shared by every gang starting at the time: a poll costs one LIST
  per member, not one GET per gang), or its pods run.
"""

from __future__ import annotations

import datetime
import logging
from collections.abc import Mapping
from typing import Any, Protocol

from kubernetes.aio.client.exceptions import ApiException

from adapters.kube.creating import Creator
from adapters.kube.namespace import NamespaceApi
from adapters.kube.objects import GangObjects, KubeLaunchError, Mode, namespace_of, pod_group_name
from adapters.kube.slots import Index as PodIndex
from adapters.kube.slots import gated, grants, no_slot_event, slot_name, terminal, ungate_patch
from adapters.kubeapi.calls import describe
from broker.model import Placement
from broker.ports import LaunchSpec

log = logging.getLogger(__name__)

# A slot grant the API server refuses for good (not a pod changed or gone meanwhile, 409 or
# 404, which the next poll retries): the gang could never start, so its launch fails now.
_GRANT_REFUSED = frozenset({400, 403, 422})


class LaunchMode(Protocol):
    """What a mode adds to a launch (see the module's docstring)."""

    async def prepare(self, placement: Placement, spec: LaunchSpec, late: int = 0) -> None:
        """Before the job's pods or workload are created; ``late``: the placement's pods
        its workload's controller makes only once the others run."""
        ...

    async def started(self, spec: LaunchSpec) -> bool:
        """Whether the member says the gang has started (its pods may say so first)."""
        ...

    async def tend(
        self,
        placement: Placement,
        spec: LaunchSpec,
        pods: list[dict[str, Any]],
        index: PodIndex,
    ) -> None:
        """A workload's pods, as last listed, looked after while it starts or runs."""
        ...


class Pin:
    """The broker's nodes: gated workload pods get the placement's slots."""

    def __init__(self, api: NamespaceApi, objects: GangObjects) -> None:
        self._api = api
        self._objects = objects
        self._noted: set[str] = set()  # pods already given a no-slot Event (namespace/name)

    async def prepare(self, placement: Placement, spec: LaunchSpec, late: int = 0) -> None:
        return None

    async def started(self, spec: LaunchSpec) -> bool:
        return False

    async def tend(
        self,
        placement: Placement,
        spec: LaunchSpec,
        pods: list[dict[str, Any]],
        index: PodIndex,
    ) -> None:
        """Give the job's gated pods slots of the placement. Only when the listing shows a
        gated pod: the grants are decided on a fresh listing of the job's pods. A pod
        changed or gone meanwhile (409/404) is tried again next time."""
        if not any(gated(p) and not terminal(p) for p in pods):
            return
        namespace = self._objects.namespace(spec.tenant)
        fresh = await self._api.job_pods(namespace, spec.tenant, spec.job)
        to_grant, left = grants(placement, spec, fresh, index)  # (job_pods: this job's only)
        for grant in to_grant:
            try:
                await self._api.patch_pod(namespace, grant.name, ungate_patch(grant, spec))
            except ApiException as exc:
                if exc.status in _GRANT_REFUSED:
                    raise KubeLaunchError(
                        f"grant pod {namespace}/{grant.name} a slot: {describe(exc)}"
                    ) from exc
                log.info("pod %s/%s not granted now (%s)", namespace, grant.name, describe(exc))
                continue
            log.info(
                "pod %s/%s: slot %s on node %s", namespace, grant.name,
                slot_name(grant.slot, spec), grant.slot.node,
            )  # fmt: skip
        await self._note_unslotted(spec, left)

    async def _note_unslotted(self, spec: LaunchSpec, pods: list[Mapping[str, Any]]) -> None:
        """One Warning Event per pod left gated (best effort: a failure is logged)."""
        now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        for pod in pods:
            key = f"{namespace_of(pod)}/{pod['metadata']['name']}"
            if key in self._noted:
                continue
            self._noted.add(key)
            log.warning("pod %s stays gated: no slot of %s's placement is free", key, spec.key)
            try:
                await self._api.create_event(no_slot_event(pod, spec, self._objects.origin, now))
            except KubeLaunchError as exc:
                log.warning("no event for pod %s: %s", key, exc)


class Delegate:
    """The member's gang scheduler: a PodGroup per job."""

    def __init__(self, api: NamespaceApi, objects: GangObjects, creator: Creator) -> None:
        self._api = api
        self._objects = objects
        self._creator = creator

    async def prepare(self, placement: Placement, spec: LaunchSpec, late: int = 0) -> None:
        await self._creator.ensure_pod_group(placement, spec, late)

    async def started(self, spec: LaunchSpec) -> bool:
        """Its PodGroup's phase is Running, as one listing shared by every gang starting at
        the time shows it (one not there yet has not started)."""
        namespace, name = self._objects.namespace(spec.tenant), pod_group_name(spec)
        for group in await self._api.shared_pod_groups():
            meta = group.get("metadata") or {}
            here = meta.get("name") == name and namespace_of(group) == namespace
            if here and self._objects.ours(group, spec):
                return (group.get("status") or {}).get("phase") == "Running"
        return False

    async def tend(
        self,
        placement: Placement,
        spec: LaunchSpec,
        pods: list[dict[str, Any]],
        index: PodIndex,
    ) -> None:
        return None


def launch_mode(
    mode: Mode, api: NamespaceApi, objects: GangObjects, creator: Creator
) -> LaunchMode:
    """The strategy of ``mode``."""
    return Pin(api, objects) if mode == "pin" else Delegate(api, objects, creator)


__all__ = ["Delegate", "LaunchMode", "Pin", "PodIndex", "launch_mode"]
