"""List+watch of one member cluster's nodes and pods, as capacity events.

``ClusterWatcher`` implements ``broker.ports.CapacitySource``: ``run`` lists nodes and pods,
emits the translated events (with deletions for objects that vanished since the last list),
then watches both from the lists' resourceVersions with bookmarks. A pod is counted under
``translate.pod_key`` (the ledger's name for a pod of ours), or under its own
``namespace/name`` while another live pod holds that key, so no pod is ever lost to a clash;
its deletion removes the key it was counted under. A 410 Gone (HTTP status
or an ERROR event) relists at once; any other failure reports the cluster disconnected and
reconnects (relisting) after an exponential, jittered backoff. The owner marks a cluster
stale with ``StaleTracker``. ``watch_events`` (one watch request's decoded events, errors
raised) is shared with the launcher's watch of our pods (``adapters.kube.our_pods``).

Secrets: log lines and errors name the cluster, the HTTP status or the exception type only;
never a request, a header or the client's configuration.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import random
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Mapping
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import aiohttp

from adapters.kube.translate import (
    DEFAULT_GPU,
    GpuConfig,
    PodKeys,
    node_name,
    own_name,
    translate_node,
    translate_pod,
)
from broker.model import CapacityEvent, Node, NodeDeleted, NodeUpdated, PodBound, PodDeleted
from broker.ports import CapacitySink, CapacitySource, StatusSink, WatchError

if TYPE_CHECKING:
    from kubernetes.aio.client import ApiClient

log = logging.getLogger(__name__)

Sleep = Callable[[float], Awaitable[None]]
Kind = Literal["nodes", "pods"]
HTTP_GONE = 410


class Gone(WatchError):
    """410: the resourceVersion is too old; relist."""


@dataclass(slots=True)
class Backoff:
    """Exponential backoff with jitter: about 0.8 s, 1.6 s, ... up to 30 s."""

    base: float = 0.8
    cap: float = 30.0
    factor: float = 2.0
    jitter: float = 0.2
    rng: random.Random = field(default_factory=random.Random)

    def delay(self, attempt: int) -> float:
        raw = self.base * self.factor ** min(attempt, 64)
        spread = 1.0 + self.jitter * (2.0 * self.rng.random() - 1.0)
        return min(self.cap, raw * spread)


def is_stale(down_since: float | None, now: float, stale_after: float) -> bool:
    """A cluster is stale when its watch has been down for ``stale_after`` seconds or more."""
    return down_since is not None and now - down_since >= stale_after


class StaleTracker:
    """Remembers since when each cluster is down (from the watchers' status reports)."""

    def __init__(self, stale_after: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.stale_after = stale_after
        self._clock = clock
        self._down_since: dict[str, float | None] = {}

    def track(self, cluster: str) -> None:
        """A new member is down until its first list succeeds."""
        self._down_since.setdefault(cluster, self._clock())

    def on_status(self, cluster: str, connected: bool) -> None:
        if connected:
            self._down_since[cluster] = None
        elif self._down_since.get(cluster) is None:
            self._down_since[cluster] = self._clock()

    def is_stale(self, cluster: str) -> bool:
        return is_stale(self._down_since.get(cluster), self._clock(), self.stale_after)

    def stale_since(self, cluster: str) -> float | None:
        """When the cluster became stale (down since, plus ``stale_after``); None while
        it is not stale."""
        down = self._down_since.get(cluster)
        if down is None or not self.is_stale(cluster):
            return None
        return down + self.stale_after


class ClusterWatcher(CapacitySource):
    """Keeps one cluster's nodes and pods flowing into ``emit``."""

    def __init__(
        self,
        cluster: str,
        api: ApiClient,
        emit: CapacitySink,
        gpu: GpuConfig = DEFAULT_GPU,
        *,
        on_status: StatusSink | None = None,
        sleep: Sleep = asyncio.sleep,
        backoff: Backoff | None = None,
        inactivity_timeout: float = 90.0,
        server_timeout: int = 300,
        request_timeout: float = 30.0,
    ) -> None:
        # Imported here: kubernetes.aio costs most of a start, and a broker with no
        # Kubernetes member never builds a watcher (the staleness tracker above is shared).
        from kubernetes.aio.client import CoreV1Api

        self.cluster = cluster
        self._core = CoreV1Api(api)
        self._emit = emit
        self._gpu = gpu
        self._on_status = on_status
        self._sleep = sleep
        self._backoff = backoff or Backoff()
        self._inactivity = inactivity_timeout
        self._server_timeout = server_timeout
        self._request_timeout = request_timeout
        self._nodes: dict[str, Node] = {}
        # Bound pods by their own namespace/name, each as counted (under its key: _keys).
        self._pods: dict[str, PodBound] = {}
        self._keys = PodKeys()
        self._rv: dict[Kind, str] = {}
        self.connected = False
        self.lists = 0  # how many full relists (for tests and metrics)

    # -- one-shot -------------------------------------------------------------------------

    async def list_once(self) -> list[CapacityEvent]:
        """List nodes and pods; return the events that bring a consumer up to date,
        including deletions of what vanished since the previous list."""
        nodes_doc = await self._list("nodes")
        pods_doc = await self._list("pods")
        self.lists += 1
        events: list[CapacityEvent] = []
        nodes: dict[str, Node] = {}
        for obj in nodes_doc.get("items") or ():
            node = translate_node(obj, self._gpu)
            nodes[node.name] = node
            events.append(NodeUpdated(self.cluster, node))
        before, self._pods = self._pods, {}
        listed = [(own_name(o), o) for o in pods_doc.get("items") or ()]
        bound = {
            n: ev
            for n, o in listed
            if isinstance(ev := translate_pod(self.cluster, o, self._gpu), PodBound)
        }
        for name in before.keys() - bound.keys():
            self._keys.release(name)
        # Pods counted before keep their key first: a newcomer never takes it from them.
        for name, obj in sorted(listed, key=lambda item: item[0] not in before):
            if name in bound:
                self._pods[name] = self._keyed(bound[name], obj)
        pods = self._pods
        events.extend(
            PodDeleted(self.cluster, old.pod)
            for name, old in before.items()
            if name not in pods or pods[name].pod != old.pod
        )
        events.extend(pods.values())
        events.extend(NodeDeleted(self.cluster, name) for name in self._nodes if name not in nodes)
        self._nodes = nodes
        self._rv["nodes"] = resource_version(nodes_doc)
        self._rv["pods"] = resource_version(pods_doc)
        return events

    # -- the long run ---------------------------------------------------------------------

    async def run(self) -> None:
        """List, emit, watch; relist on 410, reconnect with backoff on failures. Runs until
        cancelled."""
        attempt = 0
        while True:
            try:
                events = await self.list_once()
                self._emit(events)
                self._set_connected(True)
                attempt = 0
                await self._watch_both()
            except Gone:
                log.info("cluster %s: watch expired (410), relisting", self.cluster)
            except (WatchError, aiohttp.ClientError, OSError, TimeoutError, ValueError) as exc:
                self._set_connected(False)
                delay = self._backoff.delay(attempt)
                attempt += 1
                log.warning("%s; reconnecting in %.1fs", _describe(exc, self.cluster), delay)
                await self._sleep(delay)

    def _set_connected(self, connected: bool) -> None:
        if connected != self.connected:
            self.connected = connected
            if self._on_status is not None:
                self._on_status(self.cluster, connected)

    async def _watch_both(self) -> None:
        tasks = [asyncio.create_task(self._watch(kind)) for kind in ("nodes", "pods")]
        try:
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
            for task in done:
                task.result()  # re-raise the first failure
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _watch(self, kind: Kind) -> None:
        """Watch ``kind`` from the last resourceVersion; re-watch when the server ends the
        stream or it goes quiet for the inactivity timeout; raise on failure."""
        what = f"cluster {self.cluster}: {kind} watch"
        while True:
            events = watch_events(lambda: self._call(kind, watch=True), what, self._inactivity)
            try:
                async with aclosing(events):  # closed (the response released) on any exit
                    async for event in events:
                        self._on_watch_event(kind, event)
            except TimeoutError:
                log.debug("cluster %s: %s watch inactive, re-watching", self.cluster, kind)

    def _on_watch_event(self, kind: Kind, event: Mapping[str, Any]) -> None:
        etype = event.get("type")
        obj: Mapping[str, Any] = event.get("object") or {}
        rv = resource_version(obj)
        if rv:
            self._rv[kind] = rv
        if etype == "BOOKMARK":
            return
        if kind == "nodes":
            self._emit(self._node_event(etype == "DELETED", obj))
        else:
            self._emit(self._pod_event(etype == "DELETED", obj))

    def _node_event(self, deleted: bool, obj: Mapping[str, Any]) -> list[CapacityEvent]:
        if deleted:
            name = node_name(obj)
            self._nodes.pop(name, None)
            return [NodeDeleted(self.cluster, name)]
        node = translate_node(obj, self._gpu)
        new = node.name not in self._nodes
        self._nodes[node.name] = node
        events: list[CapacityEvent] = [NodeUpdated(self.cluster, node)]
        if new:  # pods seen before their node was: bind them now that it is tracked
            events.extend(p for p in self._pods.values() if p.node == node.name)
        return events

    def _pod_event(self, deleted: bool, obj: Mapping[str, Any]) -> list[CapacityEvent]:
        ev = translate_pod(self.cluster, obj, self._gpu, deleted=deleted)
        name = own_name(obj)
        old = self._pods.pop(name, None)
        events: list[CapacityEvent] = []
        if isinstance(ev, PodBound):
            ev = self._pods[name] = self._keyed(ev, obj)
            if old is not None and old.pod != ev.pod:
                events.append(PodDeleted(self.cluster, old.pod))  # counted under a new key
            events.append(ev)
        elif old is not None:
            self._keys.release(name)
            events.append(PodDeleted(self.cluster, old.pod))  # the key it was counted under
        return events  # none for a pending or unknown pod

    def _keyed(self, ev: PodBound, obj: Mapping[str, Any]) -> PodBound:
        key = self._keys.hold(obj)
        return ev if key == ev.pod else dataclasses.replace(ev, pod=key)

    # -- HTTP -----------------------------------------------------------------------------

    async def _call(self, kind: Kind, *, watch: bool) -> aiohttp.ClientResponse:
        if watch:
            args: dict[str, Any] = {
                "watch": True,
                "allow_watch_bookmarks": True,
                "resource_version": self._rv.get(kind) or None,
                "timeout_seconds": self._server_timeout,
                "_request_timeout": float(self._server_timeout) + self._inactivity,
            }
        else:
            args = {"_request_timeout": self._request_timeout}
        if kind == "nodes":
            return await self._core.list_node_without_preload_content(**args)
        return await self._core.list_pod_for_all_namespaces_without_preload_content(**args)

    async def _list(self, kind: Kind) -> dict[str, Any]:
        resp = await self._call(kind, watch=False)
        return await list_document(resp, f"cluster {self.cluster}: {kind} list")


async def list_document(resp: aiohttp.ClientResponse, what: str) -> dict[str, Any]:
    """A LIST's answer read, and released: its document, or ``WatchError`` naming ``what``
    (the HTTP status, or that it is not a list object)."""
    try:
        if resp.status >= 300:
            raise WatchError(f"{what}: HTTP {resp.status}")
        doc = json.loads(await resp.read())
    finally:
        resp.release()
    if not isinstance(doc, dict):
        raise WatchError(f"{what}: not a list object")
    return doc


def resource_version(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata") or {}
    return str(meta.get("resourceVersion") or "")


async def watch_events(
    open_watch: Callable[[], Awaitable[aiohttp.ClientResponse]], what: str, inactivity: float
) -> AsyncGenerator[Mapping[str, Any], None]:
    """The decoded events of one watch request (``open_watch``), until the server ends the
    stream. ``Gone`` on a 410 (the status, or an ERROR event), ``WatchError`` on another
    error status or ERROR event or an event that is not an object, ``TimeoutError`` when
    the server sends nothing (not even headers or a bookmark) for ``inactivity`` seconds: a
    server that accepts and never answers (a black hole) fails the watch after it."""
    async with asyncio.timeout(inactivity):
        resp = await open_watch()
    try:
        if resp.status == HTTP_GONE:
            raise Gone(f"{what}: 410 Gone")
        if resp.status >= 300:
            raise WatchError(f"{what}: HTTP {resp.status}")
        async for line in _lines(resp, inactivity):
            event = json.loads(line)
            if not isinstance(event, dict):
                raise WatchError(f"{what}: an event that is not an object")
            if event.get("type") == "ERROR":
                code = (event.get("object") or {}).get("code")
                if code == HTTP_GONE:
                    raise Gone(f"{what}: 410 Gone")
                raise WatchError(f"{what}: error event {code}")
            yield event
    finally:
        resp.release()


async def _lines(resp: aiohttp.ClientResponse, inactivity: float) -> AsyncIterator[bytes]:
    """The stream's JSON lines; TimeoutError when nothing arrives for ``inactivity`` s (the
    timer is re-armed by every chunk, bookmarks included)."""
    buffer = b""
    while True:
        async with asyncio.timeout(inactivity):  # not wait_for: it can swallow a cancel
            chunk = await resp.content.readany()
        if not chunk:
            if buffer.strip():
                yield buffer
            return
        buffer += chunk
        *lines, buffer = buffer.split(b"\n")
        for line in lines:
            if line.strip():
                yield line


def _describe(exc: BaseException, cluster: str) -> str:
    """A log-safe description naming the cluster: our own messages (which name it), or the
    type (and status) of others."""
    if isinstance(exc, WatchError):
        return str(exc)
    status = getattr(exc, "status", None)
    return f"cluster {cluster}: {type(exc).__name__}" + (f" (HTTP {status})" if status else "")
