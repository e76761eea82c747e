"""Node pools of a Kubernetes member cluster managed by Cluster API: the ``ScalePool`` port.

``CapiPool`` implements ``broker.ports.ScalePool`` for one MachineDeployment or MachinePool
(``cluster.x-k8s.io/v1beta2``, or ``v1beta1`` where only that is served) in a namespace
of the *management* cluster with the official client's asyncio API (``kubernetes.aio``):

* ``status()`` reads the pool object: desired and ready replicas, and its shape from the
  cluster-autoscaler scale-from-zero annotations (``adapters.capi.objects``);
* ``scale_to(n)`` / ``scale_by(d)`` read-modify-write the ``/scale`` subresource: GET the
  Scale, PUT it back with the ``metadata.resourceVersion`` read, so a concurrent change
  answers 409 Conflict and the change is re-computed from a fresh read (bounded);
* ``remove_node(node)`` cordons a workload-cluster Node, marks its Machine with
  ``cluster.x-k8s.io/delete-machine: "yes"`` (so it is the one deleted when the replicas go
  down) and lowers the replicas by one (``adapters.capi.machines`` sends those requests).

429, 5xx and connection errors are retried with exponential backoff and jitter (bounded by
``attempts``); other failures raise ``CapiPoolError`` (a ``broker.ports.ScaleError``). Logs
and errors name objects and HTTP statuses only, never the client configuration (tokens,
keys) or headers; ``unreadable`` says why ``status()`` failed in a few words for answers
that anyone may read (readiness) or a tenant does (explain).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any, cast

import aiohttp
from kubernetes.aio.client import ApiClient, CoreV1Api, CustomObjectsApi
from kubernetes.aio.client.exceptions import ApiException
from tenacity.wait import wait_base

from adapters.capi.machines import PoolMachines, ServedVersion
from adapters.capi.objects import (
    ANNOTATION_DELETE_MACHINE,
    ANNOTATION_MACHINE,
    DEFAULT_GPU_TYPE_LABEL,
    GROUP,
    LABEL_DEPLOYMENT,
    PLURALS,
    CapiPoolError,
    PoolKind,
    PoolStatus,
    as_int,
    meta,
    shape_of,
)
from adapters.kubeapi.calls import ApiCalls, describe
from broker.ports import ScalePool

log = logging.getLogger(__name__)

HTTP_NOT_FOUND = 404
HTTP_CONFLICT = 409


def ready_replicas(status: Mapping[str, Any]) -> Any:
    """``status.readyReplicas`` (at v1beta2: Machines whose Ready condition is true; at
    v1beta1: Machines whose Node is ready); at v1beta2, while a controller still writes only
    the old field, ``status.deprecated.v1beta1.readyReplicas``."""
    if status.get("readyReplicas") is not None:
        return status["readyReplicas"]
    deprecated = (status.get("deprecated") or {}).get("v1beta1") or {}
    return deprecated.get("readyReplicas")


def unreadable(exc: CapiPoolError) -> str:
    """Why ``CapiPool.status`` failed, in a few words fit for an unauthenticated answer
    (readiness) or a tenant (explain): the HTTP status of the answer, "timed out",
    "connection failed" (refused, reset, no route), or "invalid annotations" (read, but
    its scale-from-zero annotations do not parse). Never the message: that is for the log."""
    cause = exc.__cause__
    status = exc.status
    if status is None and isinstance(cause, ApiException):
        status = cause.status
    if status:
        return f"HTTP {status}"
    if isinstance(cause, TimeoutError):  # first: aiohttp's ServerTimeoutError is both
        return "timed out"
    if isinstance(cause, aiohttp.ClientConnectionError):
        return "connection failed"
    return "invalid annotations" if cause is None else type(cause).__name__


class CapiPool(ScalePool):
    """One MachineDeployment or MachinePool ``namespace/name`` of a management cluster.

    ``workload`` is the client of the cluster whose Nodes the pool makes (needed only by
    ``remove_node`` and ``label_node``). ``attempts`` bounds both the retries of one request
    (429/5xx/connection errors) and the re-reads after 409 Conflicts. ``retry_wait`` (a
    tenacity wait strategy) is injected so tests run without delays. ``timeout``: seconds
    per attempt of a request (None: the client's own), so a server that never answers
    counts as a failed attempt."""

    def __init__(
        self,
        management: ApiClient,
        namespace: str,
        name: str,
        *,
        kind: PoolKind = "MachineDeployment",
        workload: ApiClient | None = None,
        gpu_type_label: str = DEFAULT_GPU_TYPE_LABEL,
        attempts: int = 6,
        retry_wait: wait_base | None = None,
        timeout: float | None = None,
    ) -> None:
        if kind not in PLURALS:
            raise ValueError(f"unknown pool kind {kind!r}")
        self.calls = ApiCalls(
            attempts=attempts, error=CapiPoolError, log=log, wait=retry_wait, timeout=timeout
        )
        self.custom = CustomObjectsApi(management)
        self.workload = CoreV1Api(workload) if workload is not None else None
        self.served = ServedVersion(self.custom, self.calls)
        self.machines = PoolMachines(self.custom, self.workload, namespace, self.calls, self.served)
        self.gpu_type_label = gpu_type_label
        self.namespace = namespace
        self.name = name
        self.kind: PoolKind = kind
        self.plural = PLURALS[kind]
        self.attempts = attempts

    def __repr__(self) -> str:  # never the clients (their configuration holds credentials)
        return f"CapiPool({self.kind} {self.namespace}/{self.name})"

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    # -- status ------------------------------------------------------------------------------

    async def status(self) -> PoolStatus:
        """Desired and ready replicas and the node shape from the annotations."""
        version = await self.served.get()
        obj = await self.calls.maybe(
            f"read {self.kind} {self.key}",
            lambda: self.custom.get_namespaced_custom_object(
                GROUP, version, self.namespace, self.plural, self.name
            ),
        )
        if obj is None:
            raise CapiPoolError(f"no {self.kind} {self.key}", status=HTTP_NOT_FOUND)
        pool = cast(dict[str, Any], obj)
        spec = pool.get("spec") or {}
        status = pool.get("status") or {}
        annotations = cast(Mapping[str, Any], meta(pool).get("annotations") or {})
        return PoolStatus(
            replicas=as_int(spec.get("replicas")),
            ready_replicas=as_int(ready_replicas(status)),
            shape=shape_of(annotations, f"{self.kind} {self.key}", self.gpu_type_label),
        )

    # -- scaling -----------------------------------------------------------------------------

    async def scale_to(self, replicas: int) -> int:
        """Set the desired replicas; returns them. No write when they already are ``replicas``."""
        if replicas < 0:
            raise ValueError(f"replicas must not be negative, not {replicas}")
        return await self._scale(f"to {replicas}", lambda _current: replicas)

    async def scale_by(self, delta: int) -> int:
        """Change the desired replicas by ``delta`` (re-computed from every fresh read, so a
        retry after a conflict never counts twice); returns the replicas written. Refuses
        (``CapiPoolError``) to go below 0."""
        return await self._scale(f"by {delta:+d}", lambda current: current + delta)

    async def _scale(self, how: str, target_of: Callable[[int], int]) -> int:
        what = f"scale {self.kind.lower()} {self.key} {how}"
        for round_ in range(1, self.attempts + 1):
            scale = await self._read_scale(what)
            current = as_int((scale.get("spec") or {}).get("replicas"))
            target = target_of(current)
            if target < 0:
                raise CapiPoolError(f"{what}: would go below 0 replicas (now {current})")
            if target == current:
                log.info("%s: already %d replicas; nothing to write", what, current)
                return current
            if await self._write_scale(what, scale, target):
                log.info("%s: replicas %d -> %d", what, current, target)
                return target
            log.info("%s: changed meanwhile (HTTP 409 Conflict, round %d of %d); re-reading",
                     what, round_, self.attempts)  # fmt: skip
        raise CapiPoolError(f"{what}: HTTP 409 Conflict after {self.attempts} attempts")

    async def _read_scale(self, what: str) -> dict[str, Any]:
        version = await self.served.get()
        scale = await self.calls.maybe(
            what,
            lambda: self.custom.get_namespaced_custom_object_scale(
                GROUP, version, self.namespace, self.plural, self.name
            ),
        )
        if scale is None:
            raise CapiPoolError(f"{what}: no {self.kind} {self.key}")
        return cast(dict[str, Any], scale)

    async def _write_scale(self, what: str, scale: Mapping[str, Any], target: int) -> bool:
        """PUT the Scale read with ``target`` replicas; False when it changed since (409)."""
        scale_meta = meta(scale)
        body: dict[str, Any] = {
            "apiVersion": scale.get("apiVersion") or "autoscaling/v1",
            "kind": scale.get("kind") or "Scale",
            "metadata": {
                "name": scale_meta.get("name") or self.name,
                "namespace": scale_meta.get("namespace") or self.namespace,
                # the precondition: a change since our read answers 409 Conflict
                "resourceVersion": scale_meta.get("resourceVersion"),
            },
            "spec": {"replicas": target},
        }
        version = await self.served.get()
        try:
            await self.calls.call(
                what,
                lambda: self.custom.replace_namespaced_custom_object_scale(
                    GROUP, version, self.namespace, self.plural, self.name, body
                ),
            )
        except ApiException as exc:
            if exc.status == HTTP_NOT_FOUND:
                raise CapiPoolError(f"{what}: no {self.kind} {self.key}") from None
            if exc.status != HTTP_CONFLICT:
                raise CapiPoolError(f"{what}: {describe(exc)}") from exc
            return False
        return True

    # -- removing nodes ----------------------------------------------------------------------

    async def remove_node(self, node: str) -> None:
        """Remove one workload Node from the pool: cordon it, mark its Machine for deletion
        first, and lower the replicas by exactly one.

        Idempotent: when the Machine already carries ``delete-machine: "yes"`` and the Node is
        cordoned or gone, an earlier call did the work (we cordon before marking), so the
        replicas are *not* lowered again. The price: a call interrupted between marking the
        Machine and scaling leaves the replicas unlowered on a retry; lowering them twice would
        delete an innocent Machine, which is worse. A Node without the ``cluster.x-k8s.io/
        machine`` annotation, or whose Machine does not exist, changes nothing and raises
        ``CapiPoolError``; a Node gone from the workload cluster is found through the
        Machines' ``status.nodeRef``."""
        if self.workload is None:
            raise CapiPoolError(f"remove node {node}: no workload cluster client given")
        what = f"remove node {node} from {self.kind.lower()} {self.key}"
        machine, cordoned = await self._machine_of(node, what)
        name = str(meta(machine).get("name"))
        marked = (meta(machine).get("annotations") or {}).get(ANNOTATION_DELETE_MACHINE) == "yes"
        if marked and cordoned:
            log.info("%s: Machine %s already marked for deletion; not scaling again", what, name)
            return
        if not cordoned:
            await self.machines.cordon(node, what)
        if not marked:
            await self.machines.mark(name, what)
        await self.scale_by(-1)
        log.info("%s: Node cordoned, Machine %s marked, replicas lowered by one", what, name)

    async def _machine_of(self, node: str, what: str) -> tuple[dict[str, Any], bool]:
        """The Node's Machine, and whether the Node is cordoned (a gone Node takes no pods)."""
        found = await self.machines.read_node(node, what)
        if found is None:
            return await self.machines.of_gone_node(node, what), True
        annotations = cast(Mapping[str, Any], meta(found).get("annotations") or {})
        machine_name = annotations.get(ANNOTATION_MACHINE)
        if not machine_name:
            raise CapiPoolError(f"{what}: node {node} has no {ANNOTATION_MACHINE} annotation")
        machine = await self.machines.read_machine(str(machine_name), what)
        if machine is None:
            raise CapiPoolError(
                f"{what}: node {node} names Machine {self.namespace}/{machine_name}, "
                "which does not exist"
            )
        return machine, bool((found.get("spec") or {}).get("unschedulable"))

    async def label_node(self, node: str, labels: Mapping[str, str]) -> None:
        """Merge ``labels`` into a workload Node's labels (the broker marks the nodes it
        added, so it still knows them after a restart)."""
        if self.workload is None:
            raise CapiPoolError(f"label node {node}: no workload cluster client given")
        await self.machines.label_node(
            node, labels, f"label node {node} of {self.kind.lower()} {self.key}"
        )

    async def cancel_coming(self, count: int) -> int:
        """Lower the replicas by up to ``count`` Machines that have no Node yet: each is
        marked ``delete-machine`` first, so the MachineSet deletes those and never a node
        that may run pods (its default delete policy is Random). Returns how many were
        cancelled: fewer than ``count`` when fewer are still provisioning. A MachinePool
        has no Machines to mark, so nothing is cancelled there."""
        what = f"cancel {count} provisioning machines of {self.kind.lower()} {self.key}"
        if count <= 0 or self.kind != "MachineDeployment":
            return 0
        machines = await self.machines.list(what, f"{LABEL_DEPLOYMENT}={self.name}")
        coming = [
            m for m in machines
            if (meta(m).get("labels") or {}).get(LABEL_DEPLOYMENT) == self.name
            and not ((m.get("status") or {}).get("nodeRef") or {}).get("name")
        ]  # fmt: skip
        # Newest first: the least far along.
        coming.sort(key=lambda m: str(meta(m).get("creationTimestamp") or ""), reverse=True)
        chosen = coming[:count]
        for machine in chosen:
            if (meta(machine).get("annotations") or {}).get(ANNOTATION_DELETE_MACHINE) != "yes":
                await self.machines.mark(str(meta(machine).get("name")), what)
        if chosen:
            await self.scale_by(-len(chosen))
        return len(chosen)
