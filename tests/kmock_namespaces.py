"""kmock with Namespaces: the Kubernetes emulator the launcher's tests run, plus the
cluster-scoped ``/api/v1/namespaces`` endpoints the launcher calls (get, create, merge-patch).

kmock 0.8 cannot route those itself: its path parser takes the segment after ``namespaces``
for a namespace, so ``POST /api/v1/namespaces`` fails inside it (500) and
``GET /api/v1/namespaces/<name>`` is read as a list of nothing. This subclass answers just
those paths, over the same real HTTP server, and stores the Namespaces in kmock's own object
array (``k8s.objects[NAMESPACES, None, name]``) so tests read them like every other object;
and, as an API server does, it refuses (404) to create anything in a namespace that is not
there. Everything else is kmock's. Select it with ``pytestmark = pytest.mark.kmock(cls=...)``.

``namespace_calls`` records each request as ``(method, name)``; ``refused`` the paths of
creates refused for a missing namespace; ``racing`` names namespaces that another client
creates between our GET (404) and our POST (so the POST answers 409).

It is also a kube-apiserver where it matters to the broker: every create and patch of a
Pod, a batch/v1 Job, a workload custom resource or a PodGroup goes through
``kube_admission`` (decoding, defaults, the server's validation, the CRDs' schemas with
structural pruning) and is stored as the server stores it or refused as the server refuses
it (400 ``BadRequest``, 422 ``Invalid`` with ``details.causes``). Pods are bound through
their ``binding`` subresource (409 when already bound or still gated) and their status
changes through ``/status``, as a scheduler and a kubelet do (``bind_pod``,
``patch_pod_status``; ``patch_pod`` and ``run_pods`` split their patch that way); a
controller the test plays creates through ``controller_create``. Every refusal goes to
``refusals`` and every field the server dropped to ``pruned``; tests/conftest.py fails a
test that leaves either non-empty (a test expecting them takes them: ``take_refusals``,
``take_pruned``).

Deleting an object collects its dependents as kube-controller-manager's garbage collector
does (``kube_gc``: by ``ownerReferences`` uid, honouring the request's propagation policy);
``collected`` lists what went that way. A controller the test plays makes what no watch
would hear otherwise heard with ``announce`` and writes its status through ``write_status``.
"""

from __future__ import annotations

import copy
import re
import uuid
from dataclasses import dataclass
from typing import Any

import aiohttp.web
import kmock as kmocklib
import kube_admission
import kube_gc
from kmock._internal import dicts as kmock_dicts
from kube_admission import Kind, Review

NAMESPACES = kmocklib.resource("", "v1", "namespaces")
PODS = kmocklib.resource("", "v1", "pods")
_PATH = re.compile(r"/api/v1/namespaces(?:/([^/]+))?/?")
_NAMESPACED_COLLECTION = re.compile(r"/(?:api/v1|apis/[^/]+/[^/]+)/namespaces/([^/]+)/[^/]+/?")


# Every NamespacedEmulator of the running test, for tests/conftest.py's check.
LIVE: list[NamespacedEmulator] = []


def member_problems() -> list[str]:
    """What the members of the running test refused or pruned and no test took (what
    tests/conftest.py fails a test for)."""
    return [line for member in LIVE for line in member.unexpected()]


@dataclass(frozen=True, slots=True)
class Refusal:
    """One write the member refused: its method and path, and the ``Status`` answered."""

    method: str
    path: str
    status: dict[str, Any]

    @property
    def fields(self) -> list[str]:
        return [c["field"] for c in (self.status.get("details") or {}).get("causes") or ()]

    def line(self) -> str:
        return f"{self.method} {self.path}: {self.status['code']} {self.status['message']}"


def _status(code: int, reason: str, message: str) -> aiohttp.web.Response:
    body = {"apiVersion": "v1", "kind": "Status", "status": "Failure", "code": code,
            "reason": reason, "message": message}  # fmt: skip
    return aiohttp.web.json_response(body, status=code)


class NamespacedEmulator(kmocklib.KubernetesEmulator):
    """kmock's emulator that also serves Namespaces (see the module's docstring)."""

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        self.namespace_calls: list[tuple[str, str]] = []
        self.racing: set[str] = set()
        self.refused: list[str] = []
        self.refusals: list[Refusal] = []
        self.pruned: list[str] = []
        self.collected: list[str] = []  # "plural namespace/name" deleted by garbage collection
        LIVE.append(self)

    def take_refusals(self) -> list[Refusal]:
        """The refusals so far, which the test expected (they no longer fail it)."""
        taken, self.refusals = self.refusals, []
        return taken

    def take_pruned(self) -> list[str]:
        """The pruned fields so far, which the test expected (they no longer fail it)."""
        taken, self.pruned = self.pruned, []
        return taken

    def unexpected(self) -> list[str]:
        """What a real server would have refused or dropped, and no test took."""
        return [r.line() for r in self.refusals] + [f"pruned {p}" for p in self.pruned]

    def stored_namespace(self, name: str) -> dict[str, Any] | None:
        """The stored Namespace ``name`` (None when absent or deleted)."""
        for (res, _, obj_name), obj in list(self.objects.items()):
            if res == NAMESPACES and obj_name == name and not obj.deleted:
                return dict(obj.raw)
        return None

    async def run_pods(self, node: str, phase: str = "Running", only: str | None = None) -> None:
        """The scheduler and kubelet: every stored pod (or the one named ``only``) bound to
        ``node`` in ``phase``, through the API as their binding and status updates go, so
        that watches hear it (a change made to ``objects`` directly is seen by lists only)."""
        for (res, namespace, name), obj in list(self.objects.items()):
            if res == PODS and not obj.deleted and (only is None or name == only):
                await self.patch_pod(str(namespace), name, {"spec": {"nodeName": node},
                                                      "status": {"phase": phase}})  # fmt: skip

    async def patch_pod(self, namespace: str, name: str, patch: dict[str, Any]) -> None:
        """One pod changed through the API (a watch hears it), each part as upstream
        changes it: ``spec.nodeName`` by a binding (the scheduler; skipped when the pod is
        already on that node), ``status`` through ``/status`` (the kubelet), the rest by a
        merge patch of the pod."""
        rest = copy.deepcopy(patch)
        node = (rest.get("spec") or {}).pop("nodeName", None)
        pod_status = rest.pop("status", None)
        if not rest.get("spec"):
            rest.pop("spec", None)
        if node is not None:
            found = self.objects[PODS, namespace, name]
            if found.deleted or found.raw.get("spec", {}).get("nodeName") != node:
                await self.bind_pod(namespace, name, node)
        if pod_status is not None:
            await self.patch_pod_status(namespace, name, pod_status)
        if rest:
            await self._patch_ok(f"/api/v1/namespaces/{namespace}/pods/{name}", rest)

    async def bind_pod(self, namespace: str, name: str, node: str) -> None:
        """The scheduler's binding of one pod to ``node`` (``pods/<name>/binding``)."""
        body = {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": name},
                "target": {"apiVersion": "v1", "kind": "Node", "name": node}}  # fmt: skip
        path = f"/api/v1/namespaces/{namespace}/pods/{name}/binding"
        async with self.post(path, json=body) as r:
            assert r.status < 300, f"POST {path}: {r.status} {await r.text()}"

    async def patch_pod_status(self, namespace: str, name: str, pod_status: dict[str, Any]) -> None:
        """The kubelet's status update of one pod (``pods/<name>/status``)."""
        await self._patch_ok(f"/api/v1/namespaces/{namespace}/pods/{name}/status",
                             {"status": pod_status})  # fmt: skip

    async def _patch_ok(self, path: str, patch: dict[str, Any]) -> None:
        async with self.patch(path, json=patch) as r:
            assert r.status < 300, f"PATCH {path}: {r.status} {await r.text()}"

    def calls(self, method: str) -> list[str]:
        """The namespaces named by each request of ``method`` so far, in order."""
        return [name for m, name in self.namespace_calls if m == method]

    async def __call__(self, raw_request: aiohttp.web.BaseRequest) -> aiohttp.web.StreamResponse:
        match = _PATH.fullmatch(raw_request.path)
        if match is None:
            into = _NAMESPACED_COLLECTION.fullmatch(raw_request.path)
            missing = into is not None and self.stored_namespace(into.group(1)) is None
            if raw_request.method == "POST" and into is not None and missing:
                # As an API server does: nothing is created in a namespace that is not there.
                self.refused.append(raw_request.path)
                return _status(404, "NotFound", f'namespaces "{into.group(1)}" not found')
            return await super().__call__(raw_request)
        name = match.group(1) or ""
        body = await raw_request.json() if raw_request.can_read_body else None
        self.namespace_calls.append(
            (raw_request.method, name or str((body or {})["metadata"]["name"]))
        )
        if raw_request.method == "POST" and not name:
            return self._create(body)
        found = self.stored_namespace(name)
        if raw_request.method == "GET" and found is not None:
            return aiohttp.web.json_response(found)
        if raw_request.method == "PATCH" and found is not None:
            self.objects[NAMESPACES, None, name].patch(body)
            return aiohttp.web.json_response(self.stored_namespace(name))
        return _status(404, "NotFound", f'namespaces "{name}" not found')

    def _create(self, body: Any) -> aiohttp.web.Response:
        name = str(body["metadata"]["name"])
        if name in self.racing:  # the other client's namespace, made just before ours
            self.racing.discard(name)
            self.objects[NAMESPACES, None, name] = {"metadata": {"name": name}}
        if self.stored_namespace(name) is not None:
            return _status(409, "AlreadyExists", f'namespaces "{name}" already exists')
        self.objects[NAMESPACES, None, name] = {**body, "status": {"phase": "Active"}}
        return aiohttp.web.json_response(self.stored_namespace(name), status=201)

    # -- the API server's admission of writes ------------------------------------------------

    def controller_create(self, resource: Any, namespace: str | None, body: dict[str, Any]) -> str:
        """Store ``body`` as a create by a controller the test plays would (validated,
        defaulted; no watch event); a refusal is recorded, and fails the test at once:
        the controller of a real cluster could never make the object. Returns its name."""
        kind = Kind(resource.group, resource.version, resource.plural)
        name = str((body.get("metadata") or {}).get("name"))
        if not kind.validated:  # a kind the member stores as given (a Service, say)
            stored = copy.deepcopy(body)
            meta = stored.setdefault("metadata", {})
            meta.update(namespace=namespace, uid=meta.get("uid") or str(uuid.uuid4()))
            self.objects[resource, namespace, name] = stored
            return name
        review = kube_admission.create(kind, namespace, body)
        self._record(kind, namespace, name, review, "POST", f"(controller) {resource.plural}")
        assert review.obj is not None, self.refusals[-1].line()
        self.objects[resource, namespace, name] = review.obj
        return name

    async def announce(self, resource: Any, namespace: str, name: str) -> None:
        """The ADDED event of an object a controller made (``controller_create``), so that
        watches hear it as they hear a create through the API."""
        found = self.objects[resource, namespace, name]
        async with self._lock:
            await self._buses[resource].put({"type": "ADDED", "object": found.raw})

    async def write_status(
        self, resource: Any, namespace: str, name: str, status: dict[str, Any]
    ) -> None:
        """A controller's status update of one object, through its ``/status`` subresource."""
        prefix = f"/apis/{resource.group}/{resource.version}" if resource.group else "/api/v1"
        path = f"{prefix}/namespaces/{namespace}/{resource.plural}/{name}/status"
        await self._patch_ok(path, {"status": status})

    async def _delete(self, request: kmocklib.Request) -> aiohttp.web.StreamResponse:
        """A DELETE, then the garbage collection of the deleted object's dependents."""
        res = request.resource
        assert res is not None
        key = (res, request.namespace, str(request.name))
        before = self.objects[key] if key in self.objects else None  # noqa: SIM401
        uid = "" if before is None or before.deleted else str(before.raw["metadata"].get("uid", ""))
        response = await super()._handle(request)
        if uid and self.objects[key].deleted:
            query = dict(request.url.query)
            policy = kube_gc.policy_of(res.group or "", res.plural or "", query, request.data)
            await self._collect(uid, policy)
        return response

    async def _collect(self, uid: str, policy: str) -> None:
        """Delete (or orphan) the dependents of the deleted ``uid``, recursively."""
        gone = [(uid, policy)]
        while gone:
            owner, how = gone.pop()
            live = [
                kube_gc.Stored(key, obj.raw)
                for key, obj in list(self.objects.items())
                if not obj.deleted
            ]
            for step in kube_gc.steps(owner, how, live):
                found = self.objects[step.key]
                async with self._lock:
                    if step.delete:
                        raw = found.raw
                        found.delete()
                        event = {"type": "DELETED", "object": raw}
                    else:
                        found.patch({"metadata": {"ownerReferences": step.owners or None}})
                        event = {"type": "MODIFIED", "object": found.raw}
                    await self._buses[step.key[0]].put(event)
                if step.delete:
                    res, namespace, name = step.key
                    self.collected.append(f"{res.plural} {namespace}/{name}")
                    gone.append((step.uid, kube_gc.BACKGROUND))

    def _record(self, kind: Kind, namespace: str | None, name: str, review: Review,
                method: str, path: str) -> None:  # fmt: skip
        self.pruned += [f"{kind.plural} {namespace}/{name}: {p}" for p in review.pruned]
        if review.status is not None:
            self.refusals.append(Refusal(method, path, review.status))

    async def _handle(self, request: kmocklib.Request) -> aiohttp.web.StreamResponse:
        """kmock's step between parsing and storage: writes of the kinds the member
        validates go through ``kube_admission`` first (see the module's docstring)."""
        res = request.resource
        if res is not None and request.action == kmocklib.action.DELETE and request.name:
            return await self._delete(request)
        kind = None if res is None else Kind(res.group or "", res.version or "", res.plural or "")
        if kind is None or not kind.validated:
            return await super()._handle(request)
        if kind.plural == "pods" and request.subresource == "binding":
            return await self._bind(request)
        old: dict[str, Any] | None = None
        if request.action == kmocklib.action.CREATE and request.subresource is None:
            review = kube_admission.create(kind, request.namespace, request.data)
            name = str(((request.data or {}).get("metadata") or {}).get("name"))
        elif request.action == kmocklib.action.UPDATE and request.subresource in (None, "status"):
            found = self.objects[res, request.namespace, str(request.name)]  # type: ignore[index]
            if found.deleted:
                return await super()._handle(request)
            old = copy.deepcopy(found.raw)
            merged = kmock_dicts.patch_dict(copy.deepcopy(old), request.data)
            review = kube_admission.update(kind, old, merged, request.subresource)
            name = str(request.name)
        else:
            return await super()._handle(request)
        method = str(request.method.value)
        self._record(kind, request.namespace, name, review, method, request.url.path)
        if review.obj is None:
            return aiohttp.web.json_response(review.status, status=review.code)
        # kmock stores the request's data and serves only the requests it recorded: the
        # recorded request carries what the server stores instead of what was sent
        if old is None:
            object.__setattr__(request, "data", review.obj)
            return await super()._handle(request)
        data = kube_admission.merge_patch_from(old, review.obj)
        if request.subresource is None:
            object.__setattr__(request, "data", data)
            return await super()._handle(request)
        # kmock serves no subresource: store the status update as it stores an update
        return aiohttp.web.json_response(await self._store(request, data))

    async def _store(self, request: kmocklib.Request, patch: dict[str, Any]) -> dict[str, Any]:
        """Apply ``patch`` to the request's object as kmock stores an update: a new version
        and a MODIFIED watch event."""
        assert request.resource is not None
        found = self.objects[request.resource, request.namespace, str(request.name)]
        async with self._lock:
            found.patch(patch)
            await self._buses[request.resource].put({"type": "MODIFIED", "object": found.raw})
        return found.raw

    async def _bind(self, request: kmocklib.Request) -> aiohttp.web.StreamResponse:
        """``POST pods/<name>/binding`` (``pkg/registry/core/pod/storage``: a pod already
        on a node, or still gated, cannot be bound)."""
        found = self.objects[PODS, request.namespace, str(request.name)]
        if found.deleted:
            return _status(404, "NotFound", f'pods "{request.name}" not found')
        spec = found.raw.get("spec") or {}
        node = ((request.data or {}).get("target") or {}).get("name")
        problem = (
            f'pod {request.name} is already assigned to node "{spec["nodeName"]}"'
            if spec.get("nodeName")
            else f"pod {request.name} has non-empty .spec.schedulingGates"
            if spec.get("schedulingGates")
            else None
        )
        if problem is not None:
            message = f'Operation cannot be fulfilled on pods/binding "{request.name}": {problem}'
            body = kube_admission.status(409, "Conflict", message)
            self.refusals.append(Refusal("POST", request.url.path, body))
            return aiohttp.web.json_response(body, status=409)
        scheduled = {"type": "PodScheduled", "status": "True"}
        given = (found.raw.get("status") or {}).get("conditions") or ()
        conditions = [c for c in given if c.get("type") != "PodScheduled"]
        bound = {"spec": {"nodeName": node}, "status": {"conditions": [*conditions, scheduled]}}
        await self._store(request, bound)
        return _status_ok()


def _status_ok() -> aiohttp.web.Response:
    body = {"apiVersion": "v1", "kind": "Status", "metadata": {}, "status": "Success", "code": 201}
    return aiohttp.web.json_response(body, status=201)
