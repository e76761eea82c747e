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
"""

from __future__ import annotations

import re
from typing import Any

import aiohttp.web
import kmock as kmocklib

NAMESPACES = kmocklib.resource("", "v1", "namespaces")
PODS = kmocklib.resource("", "v1", "pods")
_PATH = re.compile(r"/api/v1/namespaces(?:/([^/]+))?/?")
_NAMESPACED_COLLECTION = re.compile(r"/(?:api/v1|apis/[^/]+/[^/]+)/namespaces/([^/]+)/[^/]+/?")


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

    def stored_namespace(self, name: str) -> dict[str, Any] | None:
        """The stored Namespace ``name`` (None when absent or deleted)."""
        for (res, _, obj_name), obj in list(self.objects.items()):
            if res == NAMESPACES and obj_name == name and not obj.deleted:
                return dict(obj.raw)
        return None

    async def run_pods(self, node: str, phase: str = "Running", only: str | None = None) -> None:
        """The kubelet: every stored pod (or the one named ``only``) bound to ``node`` in
        ``phase``, through the API as a kubelet's status update goes, so that watches hear
        it (a change made to ``objects`` directly is seen by lists only)."""
        for (res, namespace, name), obj in list(self.objects.items()):
            if res == PODS and not obj.deleted and (only is None or name == only):
                await self.patch_pod(str(namespace), name, {"spec": {"nodeName": node},
                                                      "status": {"phase": phase}})  # fmt: skip

    async def patch_pod(self, namespace: str, name: str, patch: dict[str, Any]) -> None:
        """A merge patch of one pod through the API (a watch hears it)."""
        async with self.patch(f"/api/v1/namespaces/{namespace}/pods/{name}", json=patch) as r:
            assert r.status < 300, f"PATCH pod {namespace}/{name}: {r.status}"

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
