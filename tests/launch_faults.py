"""A member that fails on cue, for the launch fault tests: kmock with Namespaces
(``tests/kmock_namespaces.py``, real HTTP, the real client) whose answers to one step of a
launch are replaced by one class of fault until the test calls ``recover``.

Steps (only the broker's requests, told by the client's User-Agent: the test's own kubelet
patches through kmock's client pass):

* ``namespace``: the create of a tenant namespace (``POST /api/v1/namespaces``);
* ``create``: a create in a namespace (pods, the rendezvous Service, PodGroups, workloads;
  Events, which the broker records best effort, pass);
* ``list``: a listing of our objects across namespaces (our pods, a workload kind), not a
  watch;
* ``patch``: a patch of a pod (a workload pod's slot grant);
* ``delete``: any delete;
* ``watch``: a watch of our objects across namespaces (not a launch step: what follows
  running gangs).

Faults: ``garbage`` (a 200/201 answer whose body is an HTML page: the client cannot
handle it; to a watch, an event whose object is not an object), ``dropped`` (the
connection closed without an answer), ``refused`` (a 4xx Status: 422 Invalid for a create
or patch, 403 Forbidden otherwise, or the ``status`` given), ``unavailable`` (503) and
``timeout`` (no answer until the client gives up, or ``recover``).

``books`` is the invariant the tests check (DESIGN.md invariant 9): per node, the GPUs the
ledger holds are those of the pods that exist there (any owner, non-terminal, bound) plus
the reservations of the jobs being launched, and every reservation belongs to such a job.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
from collections import Counter
from collections.abc import Mapping
from http import HTTPStatus
from typing import Any, Literal, get_args

import aiohttp.web
import kmock as kmocklib
from kmock_namespaces import NamespacedEmulator

from broker.model import MILLI_PER_GPU
from broker.service.facade import Service

Step = Literal["namespace", "create", "list", "patch", "delete", "watch"]
Fault = Literal["garbage", "dropped", "refused", "unavailable", "timeout"]
STEPS: tuple[Step, ...] = ("namespace", "create", "list", "patch", "delete")
FAULTS: tuple[Fault, ...] = get_args(Fault)
PODS = kmocklib.resource("", "v1", "pods")
OUR_CLIENT = "OpenAPI-Generator/"  # the kubernetes client's User-Agent, the broker's
REFUSAL = 'Pod "train-worker-0" is invalid: spec.restartPolicy: Unsupported value: "Always"'
FORBIDDEN = 'pods is forbidden: User "system:serviceaccount:fedbroker:broker" cannot do that'
HELD_SECONDS = 60.0  # a timeout's answer is held at most this long (the test recovers first)

_NAMESPACES = re.compile(r"/api/v1/namespaces/?")
_IN_NAMESPACE = re.compile(r"/(?:api/v1|apis/[^/]+/[^/]+)/namespaces/[^/]+/([^/]+)(?:/[^/]+)?/?")
_ACROSS = re.compile(r"/(?:api/v1|apis/[^/]+/[^/]+)/([^/]+)/?")


def step_of(request: aiohttp.web.BaseRequest) -> Step | None:
    """Which step of a launch a request of the broker's is (None: none of them)."""
    method, path = request.method, request.path
    if not request.headers.get("User-Agent", "").startswith(OUR_CLIENT):
        return None
    if method == "POST" and _NAMESPACES.fullmatch(path):
        return "namespace"
    inside = _IN_NAMESPACE.fullmatch(path)
    if method == "POST" and inside is not None and inside.group(1) != "events":
        return "create"
    if method == "PATCH" and inside is not None and inside.group(1) == "pods":
        return "patch"
    if method == "DELETE" and inside is not None:
        return "delete"
    ours = "fedbroker.io/origin" in request.query.get("labelSelector", "")
    if method != "GET" or not ours or inside is not None or not _ACROSS.fullmatch(path):
        return None
    return "watch" if request.query.get("watch") == "true" else "list"


def _status(code: int, reason: str, message: str) -> aiohttp.web.Response:
    body = {"apiVersion": "v1", "kind": "Status", "status": "Failure", "code": code,
            "reason": reason, "message": message}  # fmt: skip
    return aiohttp.web.json_response(body, status=code)


class FaultyMember(NamespacedEmulator):
    """kmock with Namespaces, failing the broker's requests of one step on cue."""

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        self.fault: tuple[Step, Fault] | None = None
        self.status: int | None = None  # a refusal's status, when not the usual one
        self.hits: Counter[Step] = Counter()  # faulted requests, per step
        self._recovered = asyncio.Event()

    def inject(self, step: Step, fault: Fault, status: int | None = None) -> None:
        self.fault, self.status = (step, fault), status
        self._recovered.clear()

    def recover(self) -> None:
        """Answer as a healthy member again (answers held by a timeout are let go)."""
        self.fault = None
        self._recovered.set()

    async def __call__(self, raw_request: aiohttp.web.BaseRequest) -> aiohttp.web.StreamResponse:
        step = step_of(raw_request)
        if self.fault is None or step != self.fault[0]:
            return await super().__call__(raw_request)
        self.hits[step] += 1
        await raw_request.read()
        return await self._fail(raw_request, step, self.fault[1])

    async def _fail(
        self, request: aiohttp.web.BaseRequest, step: Step, fault: Fault
    ) -> aiohttp.web.StreamResponse:
        match fault:
            case "garbage" if step == "watch":
                event = {"type": "ADDED", "object": "not an object"}
                return aiohttp.web.Response(text=json.dumps(event) + "\n",
                                            content_type="application/json")  # fmt: skip
            case "garbage":
                status = 201 if request.method == "POST" else 200
                return aiohttp.web.Response(status=status, text="<html>proxy</html>",
                                            content_type="text/html")  # fmt: skip
            case "dropped":
                if request.transport is not None:
                    request.transport.close()
                return aiohttp.web.Response(status=500)  # never reaches the client
            case "refused" if self.status is not None:
                return _status(self.status, HTTPStatus(self.status).phrase, REFUSAL)
            case "refused" if step in ("namespace", "create", "patch"):
                return _status(422, "Invalid", REFUSAL)
            case "refused":
                return _status(403, "Forbidden", FORBIDDEN)
            case "unavailable":
                return _status(503, "ServiceUnavailable", "the server is currently unable")
            case "timeout":
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(HELD_SECONDS):
                        await self._recovered.wait()
                return _status(504, "Timeout", "the server was too slow")


# -- the books ----------------------------------------------------------------------------


def _gpu_milli(pod: Mapping[str, Any]) -> int:
    """A pod's GPU request in milli (whole GPUs only: what these tests ask)."""
    total = 0
    for container in (pod.get("spec") or {}).get("containers") or ():
        requests = (container.get("resources") or {}).get("requests") or {}
        limits = (container.get("resources") or {}).get("limits") or {}
        total += int(str(requests.get("nvidia.com/gpu", limits.get("nvidia.com/gpu", 0))))
    return total * MILLI_PER_GPU


def _pod_ref(pod: Mapping[str, Any]) -> str:
    """The ledger's name of a pod: the broker's annotation on its own, else ns/name."""
    meta = pod.get("metadata") or {}
    own = (meta.get("annotations") or {}).get("fedbroker.io/pod")
    return str(own or f"{meta.get('namespace')}/{meta.get('name')}")


def books(service: Service, k8s: kmocklib.KubernetesEmulator, cluster: str = "east") -> list[str]:
    """Where the ledger disagrees with the member and the launches (empty: it agrees).
    Per node: the GPU milli the ledger holds == the pods that exist there, bound and not
    ended, plus the reservations of jobs being launched (a reservation's pod that exists
    bound counted once); and the reservations are exactly the launches not yet running."""
    wrong: list[str] = []
    launching = {la.placement.job for la in service.lifecycle.launches() if not la.running}
    reserved = service.ledger.reservations()
    if set(reserved) != launching:
        wrong.append(f"reservations {sorted(reserved)} != launching {sorted(launching)}")
    held: dict[str, dict[str, int]] = {}  # node -> pod -> GPU milli
    for (res, _, _), obj in list(k8s.objects.items()):
        if res != PODS or obj.deleted:
            continue
        pod = obj.raw
        node = (pod.get("spec") or {}).get("nodeName")
        if node and (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed"):
            held.setdefault(node, {})[_pod_ref(pod)] = _gpu_milli(pod)
    for placement in reserved.values():
        for slot in placement.pods:
            held.setdefault(slot.node, {}).setdefault(slot.pod, slot.resources.gpu_request_milli)
    for name, state in service.ledger.snapshot().clusters[cluster].nodes.items():
        ledger = state.node.allocatable.gpus * MILLI_PER_GPU - state.free_milli
        expected = sum(held.get(name, {}).values())
        if ledger != expected:
            wrong.append(f"node {name}: ledger holds {ledger} GPU milli, expected {expected}")
    return wrong


__all__ = ["FAULTS", "STEPS", "Fault", "FaultyMember", "Step", "books", "step_of"]
