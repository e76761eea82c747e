"""Our pods in one member cluster, listed once and then watched: each pod's tenant, job and
phase, kept as the API server's events say, for what ends running gangs
(``adapters.kube.run_watch``) without listing every pod of ours on a timer.

``OurPods`` lists our pods (our origin label, across namespaces, filtered to each tenant's
own namespace as every listing of ours is: ``NamespaceApi.our_pod_list``), then watches
them from the list's resourceVersion with bookmarks. The watch is opened again when the
server ends it or it goes quiet for ``inactivity_timeout``; a 410 Gone relists at once;
any other failure (whatever it raised: the record must outlive a bad answer, as every gang
followed depends on it) is logged and retried after an exponential, jittered backoff,
relisting, for as long as anything is followed.
Every ``resync_seconds`` it relists anyway: a real API server's watch misses nothing, but a
relist bounds what a lost event could cost (a gang's end noticed late, never not at all).

The one listener hears ``changed`` for every pod whose record changed (None: deleted, or
no longer ours) and ``relisted`` after every list. Cost: O(our pods) per list (once, then
per resync or failure), O(1) per event; memory one ``PodPhase`` per pod of ours. Runs from
``start`` to ``stop`` (its owner stops it when it has nothing to follow). Log lines name the
cluster and the failure's type or HTTP status, never the client configuration.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import Awaitable, Callable, Mapping
from contextlib import aclosing
from typing import Any, NamedTuple, Protocol

import aiohttp

from adapters.kube.namespace import NamespaceApi
from adapters.kube.objects import LABEL_JOB, LABEL_TENANT, KubeLaunchError, labels_of, namespace_of
from adapters.kube.watch import Backoff, Gone, resource_version, watch_events
from broker.ports import WatchError

log = logging.getLogger(__name__)

PodKey = tuple[str, str]  # (namespace, name)


class PodPhase(NamedTuple):
    """What is kept of one pod of ours."""

    tenant: str
    job: str
    phase: str


def pod_phase(pod: Mapping[str, Any]) -> PodPhase:
    """The record of a pod of ours (its labels and status as the API sent them)."""
    labels = labels_of(pod)
    phase = (pod.get("status") or {}).get("phase") or "Pending"
    # Interned: a hundred thousand pods share a handful of tenants and phases.
    return PodPhase(
        sys.intern(str(labels.get(LABEL_TENANT, ""))),
        str(labels.get(LABEL_JOB, "")),
        sys.intern(str(phase)),
    )


def _pod_ref(pod: Mapping[str, Any]) -> PodKey:
    """Where a pod is (not ``translate.pod_key``, the ledger's name for it)."""
    return namespace_of(pod), str((pod.get("metadata") or {}).get("name") or "")


class PodListener(Protocol):
    def changed(self, key: PodKey, pod: PodPhase | None) -> None: ...

    def relisted(self) -> None: ...


class OurPods:
    """The record of one cluster's pods of ours (``pods``), kept by list+watch."""

    def __init__(
        self,
        cluster: str,
        api: NamespaceApi,
        *,
        resync_seconds: float = 300.0,
        inactivity_timeout: float = 90.0,
        server_timeout: int = 300,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        backoff: Backoff | None = None,
    ) -> None:
        self.cluster = cluster
        self.api = api
        self.resync_seconds = resync_seconds
        self.listener: PodListener | None = None
        self.pods: dict[PodKey, PodPhase] = {}
        self.lists_begun = 0  # never reset: a list that began after N tells what N did not
        self.lists = 0  # completed since the last start; the record is complete once > 0
        # Why the last list failed (the request's bounded retries spent), until one succeeds.
        self.list_failure: str | None = None
        self._inactivity = inactivity_timeout
        self._server_timeout = server_timeout
        self._sleep = sleep
        self._backoff = backoff or Backoff()
        self._rv = ""
        self._task: asyncio.Task[None] | None = None
        self._traced: set[str] = set()  # unexpected exceptions' types logged with traceback

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    @property
    def synced(self) -> bool:
        """A list has completed since the start: every pod of ours is in the record."""
        return self.lists > 0

    def start(self) -> None:
        if not self.running:
            self._task = asyncio.create_task(self._run(), name=f"our-pods-{self.cluster}")

    def stop(self) -> None:
        """Cancel the list+watch and forget the record (a start lists again)."""
        if self._task is not None:
            self._task.cancel()
            self._task = None
        self.pods = {}
        self.lists = 0
        self.list_failure = None

    async def _run(self) -> None:
        attempt = 0
        while True:
            try:
                await self._list()
                attempt = 0
                await self._watch_until_resync()
            except Gone:
                log.info("cluster %s: watch of our pods expired (410), relisting", self.cluster)
            except KubeLaunchError as exc:  # the list's own retries are spent
                self.list_failure = str(exc)
                attempt = await self._back_off(attempt, str(exc))
            except WatchError as exc:
                attempt = await self._back_off(attempt, str(exc))
            except (aiohttp.ClientError, OSError, TimeoutError, ValueError) as exc:
                attempt = await self._back_off(attempt, type(exc).__name__)
            except Exception as exc:  # a bad answer or a mistake of ours: retried the same
                if not self.synced:  # a gang waiting to start is told (see wait_running)
                    self.list_failure = f"list pods: {type(exc).__name__}"
                attempt = await self._back_off(attempt, type(exc).__name__, exc)

    async def _back_off(self, attempt: int, why: str, error: Exception | None = None) -> int:
        """Wait before the next list; an unexpected ``error``'s traceback is logged the
        first time its type is met (a member answering the same way again is one line)."""
        delay = self._backoff.delay(attempt)
        traced = error is not None and why not in self._traced
        if traced:
            self._traced.add(why)
        log.warning("cluster %s: cannot follow our pods (%s); again in %.1fs",
                    self.cluster, why, delay, exc_info=error if traced else None)  # fmt: skip
        await self._sleep(delay)
        return attempt + 1

    async def _list(self) -> None:
        self.lists_begun += 1
        pods, self._rv = await self.api.our_pod_list()
        self.list_failure = None
        self.pods = {_pod_ref(pod): pod_phase(pod) for pod in pods}
        self.lists += 1
        if self.listener is not None:
            self.listener.relisted()

    async def _watch_until_resync(self) -> None:
        what = f"cluster {self.cluster}: our pods watch"
        request_timeout = float(self._server_timeout) + self._inactivity
        try:
            async with asyncio.timeout(self.resync_seconds):
                while True:
                    events = watch_events(
                        lambda: self.api.watch_our_pods(
                            self._rv, self._server_timeout, request_timeout
                        ),
                        what,
                        self._inactivity,
                    )
                    try:
                        async with aclosing(events):
                            async for event in events:
                                self._on_event(event)
                    except TimeoutError:  # quiet for the inactivity timeout: watch again
                        log.debug("%s inactive, re-watching", what)
        except TimeoutError:  # the resync's (the inactivity's are caught inside)
            log.debug("cluster %s: relisting our pods (resync)", self.cluster)

    def _on_event(self, event: Mapping[str, Any]) -> None:
        obj: Mapping[str, Any] = event.get("object") or {}
        rv = resource_version(obj)
        if rv:
            self._rv = rv
        etype = event.get("type")
        if etype == "BOOKMARK":
            return
        key = _pod_ref(obj)
        ours = etype != "DELETED" and self.api.objects.in_its_namespace(obj)
        pod = pod_phase(obj) if ours else None
        if pod is None:
            if self.pods.pop(key, None) is None:
                return  # not ours, and never was
        elif self.pods.get(key) == pod:
            return  # nothing kept here changed (a status condition, an annotation)
        else:
            self.pods[key] = pod
        if self.listener is not None:
            self.listener.changed(key, pod)


__all__ = ["OurPods", "PodKey", "PodListener", "PodPhase", "pod_phase"]
