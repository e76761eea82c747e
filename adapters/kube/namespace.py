"""The launcher's requests for pods, rendezvous Services, PodGroups and workloads (batch
Job, JobSet, PyTorchJob, RayJob, RayCluster): read, created and deleted in the tenant
namespace an object names, listed across every namespace by our origin label; pods patched
(pin mode's slot grants) and Warning Events recorded on them.

Every request goes through ``adapters.kubeapi.calls.ApiCalls`` (bounded retries, a
per-request timeout; other failures raise ``KubeLaunchError`` with the HTTP status only,
never the client configuration). A body the client's typed model refuses (``model_of``: a
number where the API wants a quantity string, say) is never sent: it fails the launch as a
permanent refusal, naming the field. Listings span all namespaces (one LIST per kind, whatever
the number of tenants) and are filtered here by our origin label and by the namespace the
object's tenant maps to (``GangObjects.in_its_namespace``): an object labelled ours in any
other namespace is never read back nor deleted. One pod listing (and one listing per
workload kind) is shared by every caller waiting at the same time, but never joined by a
caller whose own create ended after that listing began (``listings_begun``): such a listing
may predate the object, and a launch must not read its absence as the object gone.

Workloads are deleted with ``propagationPolicy: Background``: a batch/v1 Job deleted
through the API without it orphans its pods.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar, cast

import aiohttp
from kubernetes.aio.client import (
    ApiClient,
    CoreV1Api,
    CoreV1Event,
    CustomObjectsApi,
    V1Pod,
    V1Service,
)
from kubernetes.aio.client.exceptions import ApiException
from pydantic import BaseModel, ValidationError

from adapters.kube.objects import (
    LABEL_JOB,
    LABEL_TENANT,
    GangObjects,
    KubeLaunchError,
    controlled,
    labels_of,
)
from adapters.kubeapi.calls import ApiCalls, describe
from broker.ports import WorkloadKind

Listing = list[dict[str, Any]]
MERGE_PATCH = "application/merge-patch+json"
HTTP_CONFLICT = 409
_Model = TypeVar("_Model", bound=BaseModel)


def model_of(model: type[_Model], body: Mapping[str, Any], what: str) -> _Model:
    """``body`` as the client's typed ``model``, or a permanent ``KubeLaunchError`` naming
    the first field it refuses: the same body would be refused on every attempt."""
    try:
        return cast(_Model, model.from_dict(dict(body)))  # type: ignore[attr-defined]
    except ValidationError as exc:
        first = exc.errors()[0]  # a ValidationError has one at least
        where = ".".join([exc.title, *(str(part) for part in first["loc"])])
        raise KubeLaunchError(
            f"{what}: the client refuses {where}: {first['msg']}", permanent=True
        ) from exc


class NamespaceApi:
    """Pods, Services and PodGroups of the tenant namespaces, as plain dicts (API JSON
    field names)."""

    def __init__(self, api_client: ApiClient, objects: GangObjects, calls: ApiCalls) -> None:
        self.core = CoreV1Api(api_client)
        self.custom = CustomObjectsApi(api_client)
        self.objects = objects
        self.calls = calls
        # key -> (when it began, by listings_begun's count; the listing in flight)
        self._listings: dict[str, tuple[int, asyncio.Future[Listing]]] = {}
        self._begun = 0

    def _dict(self, obj: object) -> dict[str, Any]:
        return cast(dict[str, Any], self.core.api_client.sanitize_for_serialization(obj))

    def _items(self, what: str, listed: object) -> list[dict[str, Any]]:
        """A listing's objects; an answer of another shape (the client hands back what it
        could not decode) is the member's failure, as an unreadable answer is."""
        doc = self._dict(listed) if listed is not None else None
        items = (doc.get("items") or []) if isinstance(doc, dict) else None
        if not isinstance(items, list):
            raise self.calls.error(f"{what}: the answer is not a list of objects")
        return [item for item in items if isinstance(item, dict)]

    # -- pods --------------------------------------------------------------------------------

    async def read_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        pod = await self.calls.maybe(
            f"read pod {namespace}/{name}", lambda: self.core.read_namespaced_pod(name, namespace)
        )
        return None if pod is None else self._dict(pod)

    async def create_pod(self, body: Mapping[str, Any]) -> None:
        """Create a pod in the namespace its body names; ``ApiException`` (409 AlreadyExists,
        404 for a namespace gone, among them) propagates."""
        meta = body["metadata"]
        what = f"create pod {meta['namespace']}/{meta['name']}"
        pod = model_of(V1Pod, body, what)
        await self.calls.call(what, lambda: self.core.create_namespaced_pod(meta["namespace"], pod))

    async def delete_pod(self, namespace: str, name: str) -> None:
        """Delete a pod; one already gone is fine."""
        await self.calls.maybe(
            f"delete pod {namespace}/{name}",
            lambda: self.core.delete_namespaced_pod(name, namespace),
        )

    async def our_pods(self) -> list[dict[str, Any]]:
        """Our pods in every tenant namespace (filtered here too, not only by the server),
        decoded from the JSON as sent, as the watcher reads its lists: the client's typed
        models cost 0.4 ms a pod to build and turn back into a dict, and every run poll and
        restart lists all of a member's pods of ours (5,000 on a member: 2 s a listing)."""
        pods, _ = await self.our_pod_list()
        return pods

    async def our_pod_list(self) -> tuple[list[dict[str, Any]], str]:
        """``our_pods`` and the list's resourceVersion (where a watch of them starts)."""
        doc = await self.calls.checked("list pods", self._pod_list)
        items = doc.get("items") or []
        pods = [p for p in items if isinstance(p, dict) and self.objects.in_its_namespace(p)]
        meta = doc.get("metadata")
        return pods, str((meta.get("resourceVersion") if isinstance(meta, dict) else "") or "")

    async def watch_our_pods(
        self, resource_version: str, server_timeout: int, request_timeout: float
    ) -> aiohttp.ClientResponse:
        """A watch of our pods in every namespace from ``resource_version``, with bookmarks,
        the response unread (``adapters.kube.watch.watch_events`` reads it)."""
        resp: aiohttp.ClientResponse = (
            await self.core.list_pod_for_all_namespaces_without_preload_content(
                label_selector=self.objects.selector,
                watch=True,
                allow_watch_bookmarks=True,
                resource_version=resource_version or None,
                timeout_seconds=server_timeout,
                _request_timeout=request_timeout,
            )
        )
        return resp

    async def _pod_list(self) -> dict[str, Any]:
        """One LIST of our pods, JSON decoded; an error status raised as the typed call
        raises it (``ApiException``: retried when transient, described by ``ApiCalls``)."""
        resp = await self.core.list_pod_for_all_namespaces_without_preload_content(
            label_selector=self.objects.selector
        )
        try:
            body = await resp.read()
        finally:
            resp.release()
        if resp.status >= 300:
            raise ApiException(resp.status, resp.reason, body=body.decode(errors="replace"))
        try:
            doc = json.loads(body)
        except ValueError:
            doc = None
        if not isinstance(doc, dict):
            raise ApiException(resp.status, "the pod list is not a JSON object")
        return doc

    def listings_begun(self) -> int:
        """How many shared listings have begun so far: a caller notes it once its own writes
        are done, and passes it as ``after`` so it joins only a listing that began later
        (one begun before could not show what it wrote)."""
        return self._begun

    async def shared_listing(self, after: int | None = None) -> Listing:
        """Our pods, listed once for every caller waiting at the same time: a thousand
        workloads polling their pods cost one LIST per poll, not a thousand (gangs of pods
        are followed by the watch of ``adapters.kube.our_pods`` instead). Always a fresh listing
        (the one in flight, or one started now), never a cached one; with ``after`` (a
        ``listings_begun`` mark), one that began after that mark."""
        return await self._shared("pods", self.our_pods, after)

    async def _shared(
        self, key: str, list_them: Callable[[], Awaitable[Listing]], after: int | None
    ) -> Listing:
        entry = self._listings.get(key)
        if entry is None or (after is not None and entry[0] <= after):
            self._begun += 1
            listing = asyncio.ensure_future(list_them())
            entry = self._listings[key] = (self._begun, listing)

            def done(future: asyncio.Future[Listing]) -> None:
                current = self._listings.get(key)
                if current is not None and current[1] is future:
                    del self._listings[key]
                if not future.cancelled():
                    future.exception()  # retrieved here, so an error nobody awaits is quiet

            listing.add_done_callback(done)
        return await asyncio.shield(entry[1])

    async def job_pods(self, namespace: str, tenant: str, job: str) -> Listing:
        """A fresh listing of one job's pods in its namespace (not shared: what a slot grant
        decides on must include the grants made before it). Filtered here too, not only by
        the server: another job's pod in this listing would be given this job's slots."""
        selector = f"{self.objects.selector},{LABEL_TENANT}={tenant},{LABEL_JOB}={job}"
        what = f"list pods of {tenant}/{job}"
        pods = await self.calls.checked(
            what, lambda: self.core.list_namespaced_pod(namespace, label_selector=selector)
        )
        items = self._items(what, pods)
        wanted = {LABEL_TENANT: tenant, LABEL_JOB: job}
        return [
            p for p in items
            if self.objects.in_its_namespace(p)
            and all(labels_of(p).get(k) == v for k, v in wanted.items())
        ]  # fmt: skip

    async def patch_pod(self, namespace: str, name: str, patch: Mapping[str, Any]) -> None:
        """Merge-patch a pod; ``ApiException`` (409 Conflict, 422 Invalid) propagates."""
        await self.calls.call(
            f"patch pod {namespace}/{name}",
            lambda: self.core.patch_namespaced_pod(
                name, namespace, dict(patch), _content_type=MERGE_PATCH
            ),
        )

    async def create_event(self, body: Mapping[str, Any]) -> None:
        """Record an Event; one of that name already there (409) is fine."""
        meta = body["metadata"]
        what = f"create event {meta['namespace']}/{meta['name']}"
        event = model_of(CoreV1Event, body, what)
        try:
            await self.calls.call(
                what, lambda: self.core.create_namespaced_event(meta["namespace"], event)
            )
        except ApiException as exc:
            if exc.status != HTTP_CONFLICT:
                raise self.calls.error(f"{what}: {describe(exc)}") from exc

    # -- rendezvous Services -----------------------------------------------------------------

    async def read_service(self, namespace: str, name: str) -> dict[str, Any] | None:
        svc = await self.calls.maybe(
            f"read service {namespace}/{name}",
            lambda: self.core.read_namespaced_service(name, namespace),
        )
        return None if svc is None else self._dict(svc)

    async def create_service(self, body: Mapping[str, Any]) -> None:
        """Create a Service in the namespace its body names; ``ApiException`` (409
        AlreadyExists, 404 for a namespace gone, among them) propagates."""
        meta = body["metadata"]
        what = f"create service {meta['namespace']}/{meta['name']}"
        service = model_of(V1Service, body, what)
        await self.calls.call(
            what, lambda: self.core.create_namespaced_service(meta["namespace"], service)
        )

    async def delete_service(self, namespace: str, name: str) -> None:
        """Delete a Service; one already gone is fine."""
        await self.calls.maybe(
            f"delete service {namespace}/{name}",
            lambda: self.core.delete_namespaced_service(name, namespace),
        )

    async def our_services(self) -> list[dict[str, Any]]:
        """Our Services in every tenant namespace (filtered here too, not only by the server)."""
        listed = await self.calls.checked(
            "list services",
            lambda: self.core.list_service_for_all_namespaces(label_selector=self.objects.selector),
        )
        items = self._items("list services", listed)
        return [s for s in items if self.objects.in_its_namespace(s)]

    # -- PodGroups ---------------------------------------------------------------------------

    async def read_pod_group(self, namespace: str, name: str) -> dict[str, Any] | None:
        kind = self.objects.kind
        obj = await self.calls.maybe(
            f"read PodGroup {namespace}/{name}",
            lambda: self.custom.get_namespaced_custom_object(
                kind.group, kind.version, namespace, kind.plural, name
            ),
        )
        return None if obj is None else cast(dict[str, Any], obj)

    async def create_pod_group(self, body: dict[str, Any]) -> None:
        """Create a PodGroup in the namespace its body names; ``ApiException`` (409
        AlreadyExists among them) propagates."""
        kind = self.objects.kind
        meta = body["metadata"]
        await self.calls.call(
            f"create PodGroup {meta['namespace']}/{meta['name']}",
            lambda: self.custom.create_namespaced_custom_object(
                kind.group, kind.version, meta["namespace"], kind.plural, body
            ),
        )

    async def patch_pod_group(self, namespace: str, name: str, patch: dict[str, Any]) -> None:
        """Merge-patch a PodGroup; ``ApiException`` (409 Conflict among them) propagates."""
        kind = self.objects.kind
        await self.calls.call(
            f"update PodGroup {namespace}/{name}",
            lambda: self.custom.patch_namespaced_custom_object(
                kind.group, kind.version, namespace, kind.plural, name, patch,
                _content_type="application/merge-patch+json",
            ),
        )  # fmt: skip

    async def delete_pod_group(self, namespace: str, name: str) -> None:
        """Delete a PodGroup; one already gone is fine."""
        kind = self.objects.kind
        await self.calls.maybe(
            f"delete PodGroup {namespace}/{name}",
            lambda: self.custom.delete_namespaced_custom_object(
                kind.group, kind.version, namespace, kind.plural, name
            ),
        )

    async def our_pod_groups(self) -> list[dict[str, Any]]:
        """Our PodGroups in every tenant namespace; none when the CRD is not installed (404)."""
        kind = self.objects.kind
        listed = await self.calls.maybe(
            "list PodGroups",
            lambda: self.custom.list_custom_object_for_all_namespaces(
                kind.group, kind.version, kind.plural, label_selector=self.objects.selector
            ),
        )
        if listed is None:
            return []
        items = self._items("list PodGroups", listed)
        return [g for g in items if self.objects.in_its_namespace(g)]

    async def shared_pod_groups(self) -> Listing:
        """``our_pod_groups()``, one listing for every caller waiting at the same time: a
        thousand delegated gangs asking whether their PodGroup runs cost one LIST a poll."""
        return await self._shared("PodGroup", self.our_pod_groups, None)

    # -- workloads ---------------------------------------------------------------------------

    async def read_workload(
        self, kind: WorkloadKind, namespace: str, name: str
    ) -> dict[str, Any] | None:
        obj = await self.calls.maybe(
            f"read {kind.kind} {namespace}/{name}",
            lambda: self.custom.get_namespaced_custom_object(
                kind.group, kind.version, namespace, kind.plural, name
            ),
        )
        return None if obj is None else cast(dict[str, Any], obj)

    async def create_workload(self, kind: WorkloadKind, body: dict[str, Any]) -> None:
        """Create a workload in the namespace its body names; ``ApiException`` (409
        AlreadyExists, 404 for a namespace gone, among them) propagates."""
        meta = body["metadata"]
        await self.calls.call(
            f"create {kind.kind} {meta['namespace']}/{meta['name']}",
            lambda: self.custom.create_namespaced_custom_object(
                kind.group, kind.version, meta["namespace"], kind.plural, body
            ),
        )

    async def delete_workload(self, kind: WorkloadKind, namespace: str, name: str) -> None:
        """Delete a workload and, in the background, what its controller made; one already
        gone is fine."""
        await self.calls.maybe(
            f"delete {kind.kind} {namespace}/{name}",
            lambda: self.custom.delete_namespaced_custom_object(
                kind.group, kind.version, namespace, kind.plural, name,
                propagation_policy="Background",
            ),
        )  # fmt: skip

    async def our_workloads(self, kind: WorkloadKind) -> Listing:
        """Our workloads of ``kind`` in every tenant namespace; none when the kind is not
        served (404: its CRD is not installed). One another controller made (``controlled``:
        a RayJob's RayCluster, carrying the RayJob's labels) is not ours."""
        listed = await self.calls.maybe(
            f"list {kind.plural}",
            lambda: self.custom.list_custom_object_for_all_namespaces(
                kind.group, kind.version, kind.plural, label_selector=self.objects.selector
            ),
        )
        if listed is None:
            return []
        items = self._items(f"list {kind.plural}", listed)
        return [w for w in items if self.objects.in_its_namespace(w) and not controlled(w)]

    async def shared_workloads(self, kind: WorkloadKind, after: int | None = None) -> Listing:
        """``our_workloads(kind)``, one listing for every caller waiting at the same time
        (``after``: as ``shared_listing``'s)."""
        return await self._shared(kind.plural, lambda: self.our_workloads(kind), after)
