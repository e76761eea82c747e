"""The runtimes of one member cluster that shape some workload kinds' pods (Kubeflow
Trainer v2's cluster-scoped ClusterTrainingRuntimes and namespaced TrainingRuntimes: the
resources the kinds' ``reads`` name, ``broker.ports.MemberResource``), read through its API
and kept in a cache that admission looks a workload's runtime reference up in.

``RuntimeCache.run`` lists each resource, then watches it from the list's resourceVersion;
a 410 relists at once, any other failure relists after an exponential, jittered backoff.
A resource the member does not serve (404: the Trainer's CRDs are not installed) holds no
runtimes, and is listed again after the backoff's longest wait (the CRDs may come). A member
whose runtimes cannot be read (another error, or not listed yet) has none: ``problem`` says
why, for the refusal or explain. Log lines name the cluster and the HTTP status only.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from contextlib import aclosing
from functools import partial
from typing import TYPE_CHECKING, Any

import aiohttp

from adapters.kube.watch import Backoff, Gone, list_document, resource_version, watch_events
from broker.ports import MemberResource, WatchError

if TYPE_CHECKING:
    from kubernetes.aio.client import ApiClient

log = logging.getLogger(__name__)

HTTP_NOT_FOUND = 404
Key = tuple[str, str]  # (namespace, name); namespace "" for a cluster-scoped runtime


class _NotServed(WatchError):
    """404: the member serves no such resource."""


class RuntimeCache:
    """One member's runtimes of ``resources``, by kind and (namespace, name)."""

    def __init__(
        self,
        cluster: str,
        api: ApiClient,
        resources: Sequence[MemberResource],
        *,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        backoff: Backoff | None = None,
        inactivity_timeout: float = 90.0,
        server_timeout: int = 300,
        request_timeout: float = 30.0,
    ) -> None:
        from kubernetes.aio.client import CustomObjectsApi

        self.cluster = cluster
        self._kinds = {r.kind: r for r in resources}
        self._api = CustomObjectsApi(api)
        self._sleep = sleep
        self._backoff = backoff or Backoff()
        self._inactivity = inactivity_timeout
        self._server_timeout = server_timeout
        self._request_timeout = request_timeout
        self._found: dict[str, dict[Key, Mapping[str, Any]]] = {k: {} for k in self._kinds}
        self._problem: dict[str, str] = {k: "not listed yet" for k in self._kinds}
        self.lists = 0  # successful lists, both kinds (tests wait on it)

    def lookup(self, kind: str, namespace: str, name: str) -> Mapping[str, Any] | None:
        """The runtime ``kind``/``name`` (a TrainingRuntime in ``namespace``), or None."""
        resource = self._kinds.get(kind)
        if resource is None:
            return None
        return self._found[kind].get((namespace if resource.namespaced else "", name))

    def problem(self, kind: str) -> str | None:
        """Why this member's runtimes of ``kind`` cannot be read now, or None."""
        return self._problem.get(kind) if kind in self._kinds else f"no runtime kind {kind}"

    async def run(self) -> None:
        """Keep every kind up to date until cancelled."""
        async with asyncio.TaskGroup() as group:
            for kind in self._kinds:
                group.create_task(self._follow(kind))

    async def list_once(self, kind: str) -> str:
        """List ``kind`` into the cache; its resourceVersion."""
        try:
            doc = await self._list(kind)
        except _NotServed:
            self._found[kind] = {}  # not served: readable, and none there
            self._problem.pop(kind, None)
            self.lists += 1
            raise
        self._found[kind] = {_key(o): o for o in doc.get("items") or () if isinstance(o, dict)}
        self._problem.pop(kind, None)
        self.lists += 1
        return resource_version(doc)

    async def _follow(self, kind: str) -> None:
        attempt = 0
        while True:
            try:
                rv = await self.list_once(kind)
                attempt = 0
                await self._watch(kind, rv)
            except Gone:
                log.info("cluster %s: %s watch expired (410), relisting", self.cluster, kind)
            except _NotServed:
                await self._sleep(self._backoff.cap)
            except (WatchError, aiohttp.ClientError, OSError, TimeoutError, ValueError) as exc:
                self._found[kind] = {}
                self._problem[kind] = _describe(exc, self.cluster, kind)
                delay = self._backoff.delay(attempt)
                attempt += 1
                log.warning("%s; retrying in %.1fs", self._problem[kind], delay)
                await self._sleep(delay)

    async def _watch(self, kind: str, rv: str) -> None:
        what = f"cluster {self.cluster}: {kind} watch"
        while True:
            events = watch_events(partial(self._call, kind, rv), what, self._inactivity)
            try:
                async with aclosing(events):
                    async for event in events:
                        obj = event.get("object") or {}
                        rv = resource_version(obj) or rv
                        if event.get("type") == "DELETED":
                            self._found[kind].pop(_key(obj), None)
                        elif event.get("type") in ("ADDED", "MODIFIED"):
                            self._found[kind][_key(obj)] = obj
            except TimeoutError:
                continue

    async def _call(self, kind: str, rv: str | None) -> aiohttp.ClientResponse:
        resource = self._kinds[kind]
        if rv is None:
            args: dict[str, Any] = {"_request_timeout": self._request_timeout}
        else:
            args = {
                "watch": True,
                "allow_watch_bookmarks": True,
                "resource_version": rv or None,
                "timeout_seconds": self._server_timeout,
                "_request_timeout": float(self._server_timeout) + self._inactivity,
            }
        # Every namespace's TrainingRuntimes in one list: lookups pick the tenant's.
        call = self._api.list_cluster_custom_object_without_preload_content
        return await call(resource.group, resource.version, resource.plural, **args)

    async def _list(self, kind: str) -> dict[str, Any]:
        resp = await self._call(kind, None)
        if resp.status == HTTP_NOT_FOUND:
            resp.release()
            raise _NotServed(f"cluster {self.cluster}: {kind} not served")
        return await list_document(resp, f"cluster {self.cluster}: {kind} list")


def _key(obj: Mapping[str, Any]) -> Key:
    meta = obj.get("metadata") or {}
    return str(meta.get("namespace") or ""), str(meta.get("name") or "")


def _describe(exc: BaseException, cluster: str, kind: str) -> str:
    if isinstance(exc, WatchError):
        return f"{exc} (its {kind}s cannot be read)"
    status = getattr(exc, "status", None)
    where = f" (HTTP {status})" if status else ""
    return f"cluster {cluster}: {kind}s cannot be read: {type(exc).__name__}{where}"
