"""The pod-gang launcher: a ``podSets`` job's own pods (no workload controller), created
by the broker, confirmed running and followed to their end through the one list+watch of
our pods per member (``adapters.kube.run_watch``).

Launch: the tenant's namespace, the mode's preparation (delegate: the PodGroup), the gang's
rendezvous Service (``adapters.kube.rendezvous``), then its pods (pinned in pin mode, in
the PodGroup in delegate mode: ``GangObjects.pod_body``); objects that already exist with
the job's labels are adopted (``adapters.kube.creating``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from adapters.kube.creating import Creator
from adapters.kube.modes import LaunchMode
from adapters.kube.namespace import NamespaceApi
from adapters.kube.objects import GangObjects, KubeLaunchError
from adapters.kube.our_pods import OurPods
from adapters.kube.rendezvous import Rendezvous
from adapters.kube.run_watch import GangPods
from broker.model import Placement, PodPlacement
from broker.ports import LaunchSpec, RunEnd, RunHandle

log = logging.getLogger(__name__)


class PodGangLauncher:
    """Creates, confirms and follows the pod gangs of one member."""

    def __init__(
        self,
        api: NamespaceApi,
        creator: Creator,
        mode: LaunchMode,
        our_pods: OurPods,
        *,
        poll_seconds: float,
        sleep: Callable[[float], Awaitable[None]],
    ) -> None:
        self._api = api
        self._objects: GangObjects = creator.objects
        self._creator = creator
        self._mode = mode
        self._our_pods = our_pods
        self.runs = GangPods(our_pods, creator.objects)
        self._poll_seconds = poll_seconds
        self._sleep = sleep

    async def create(self, placement: Placement, spec: LaunchSpec) -> None:
        """The namespace, the mode's preparation, the rendezvous Service, then the pods."""
        await self._creator.ensure_namespace(spec)
        await self._mode.prepare(placement, spec)
        rendezvous = self._objects.rendezvous(placement, spec)
        await self._ensure_service(rendezvous, spec)
        for pod in placement.pods:
            await self._ensure_pod(pod, spec, rendezvous)
        where = f"{self._objects.cluster}/{self._objects.namespace(spec.tenant)}"
        log.info(
            "created gang %s (%d pods, %s) in %s",
            spec.key, len(placement.pods), self._objects.mode, where,
        )  # fmt: skip

    async def _ensure_service(self, rendezvous: Rendezvous, spec: LaunchSpec) -> None:
        body = self._objects.service_body(rendezvous, spec)
        await self._creator.create_or_adopt(
            "service", body, spec, self._api.create_service, self._api.read_service
        )

    async def _ensure_pod(
        self, pod: PodPlacement, spec: LaunchSpec, rendezvous: Rendezvous | None = None
    ) -> None:
        body = self._objects.pod_body(pod, spec, rendezvous)
        await self._creator.create_or_adopt(
            "pod", body, spec, self._api.create_pod, self._api.read_pod
        )

    async def wait_running(self, placement: Placement, spec: LaunchSpec) -> None:
        """Return when every pod of the gang is Running (or the mode says the gang started:
        a delegate-mode PodGroup Running); raise ``KubeLaunchError`` as soon as a pod failed
        or vanished, or our pods cannot be listed (the list's bounded retries spent) before
        they ever were. The pods' phases come from the watch of our pods
        (``run_watch.GangPods.started``); the mode is asked every ``poll_seconds``. The
        caller applies the gang timeout."""
        running, handle = self.runs.started(placement, spec)
        try:
            while not running.done():
                failure = self._our_pods.list_failure
                if failure is not None and not self._our_pods.synced:
                    raise KubeLaunchError(failure)
                if await self._mode.started(spec):
                    return
                pause = asyncio.ensure_future(self._sleep(self._poll_seconds))
                try:
                    await asyncio.wait({running, pause}, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    pause.cancel()
            running.result()
        finally:
            handle.cancel()

    async def finished(self, placement: Placement, spec: LaunchSpec) -> RunEnd:
        """Wait for a running gang to end (``run_watch.run_end``: succeeded once every pod
        Succeeded, failed as soon as one Failed or vanished)."""
        ended: asyncio.Future[RunEnd] = asyncio.get_running_loop().create_future()

        def on_end(end: RunEnd) -> None:
            if not ended.done():
                ended.set_result(end)

        handle = self.runs.watch(placement, spec, on_end)
        try:
            return await ended
        finally:
            handle.cancel()

    def watch(
        self, placement: Placement, spec: LaunchSpec, on_end: Callable[[RunEnd], None]
    ) -> RunHandle:
        """``on_end`` when the running gang ends, from the one list+watch of our pods."""
        return self.runs.watch(placement, spec, on_end)


__all__ = ["PodGangLauncher"]
