"""Node pools of a Kubernetes member cluster managed by Cluster API.

``CapiPool`` drives one MachineDeployment or MachinePool (``cluster.x-k8s.io/v1beta1``) in a
namespace of the *management* cluster with the official client's asyncio API
(``kubernetes.aio``):

* ``status()`` reads the pool object: desired and ready replicas, and its shape from the
  cluster-autoscaler scale-from-zero annotations (``capacity.cluster-autoscaler.kubernetes.io/
  gpu-count``, ``gpu-type``, ``cpu``, ``memory``) and size bounds
  (``cluster.x-k8s.io/cluster-api-autoscaler-node-group-min-size`` / ``-max-size``);
* ``scale_to(n)`` / ``scale_by(d)`` read-modify-write the ``/scale`` subresource: GET the
  Scale, PUT it back with the ``metadata.resourceVersion`` read, so a concurrent change
  answers 409 Conflict and the change is re-computed from a fresh read (bounded);
* ``remove_node(node)`` cordons a workload-cluster Node, marks its Machine with
  ``cluster.x-k8s.io/delete-machine: "yes"`` (so it is the one deleted when the replicas go
  down) and lowers the replicas by one.

429, 5xx and connection errors are retried with exponential backoff and jitter (bounded by
``attempts``); other failures raise ``CapiPoolError``. Logs and errors name objects and HTTP
statuses only, never the client configuration (tokens, keys) or headers.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any, Literal, TypeVar, cast

from kubernetes.aio.client import ApiClient, CoreV1Api, CustomObjectsApi
from kubernetes.aio.client.exceptions import ApiException
from tenacity import (
    wait_exponential_jitter,
)
from tenacity.wait import wait_base

from adapters.kube import retry

log = logging.getLogger(__name__)

PoolKind = Literal["MachineDeployment", "MachinePool"]

GROUP = "cluster.x-k8s.io"
VERSION = "v1beta1"
PLURALS: Mapping[PoolKind, str] = {
    "MachineDeployment": "machinedeployments",
    "MachinePool": "machinepools",
}
MACHINES = "machines"

CAPACITY = "capacity.cluster-autoscaler.kubernetes.io/"
ANNOTATION_GPU_COUNT = CAPACITY + "gpu-count"
ANNOTATION_GPU_TYPE = CAPACITY + "gpu-type"
ANNOTATION_CPU = CAPACITY + "cpu"
ANNOTATION_MEMORY = CAPACITY + "memory"
ANNOTATION_MIN_SIZE = "cluster.x-k8s.io/cluster-api-autoscaler-node-group-min-size"
ANNOTATION_MAX_SIZE = "cluster.x-k8s.io/cluster-api-autoscaler-node-group-max-size"
ANNOTATION_MACHINE = "cluster.x-k8s.io/machine"  # on a workload Node: its Machine's name
ANNOTATION_DELETE_MACHINE = "cluster.x-k8s.io/delete-machine"  # on a Machine: delete it first
LABEL_DEPLOYMENT = "cluster.x-k8s.io/deployment-name"  # on a Machine: its MachineDeployment

_MERGE_PATCH = "application/merge-patch+json"
_T = TypeVar("_T")


@dataclass(frozen=True, slots=True)
class PoolShape:
    """One node of the pool, from the scale-from-zero annotations; None = not annotated."""

    gpus: int | None = None
    gpu_type: str | None = None
    cpu_milli: int | None = None
    memory_mib: int | None = None
    min_size: int | None = None
    max_size: int | None = None


@dataclass(frozen=True, slots=True)
class PoolStatus:
    replicas: int  # spec.replicas (desired)
    ready_replicas: int  # status.readyReplicas (0 when absent)
    shape: PoolShape


class CapiPoolError(Exception):
    """A pool operation failed: a one-line message naming the pool or node and the HTTP
    status; never the client configuration."""


# -- helpers ---------------------------------------------------------------------------------


_QUANTITY = re.compile(r"^([0-9]+(?:\.[0-9]+)?|\.[0-9]+)(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?$")
_SUFFIX: Mapping[str, Decimal] = {
    "": Decimal(1),
    "m": Decimal("0.001"),
    "k": Decimal(10**3),
    "M": Decimal(10**6),
    "G": Decimal(10**9),
    "T": Decimal(10**12),
    "P": Decimal(10**15),
    "E": Decimal(10**18),
    "Ki": Decimal(2**10),
    "Mi": Decimal(2**20),
    "Gi": Decimal(2**30),
    "Ti": Decimal(2**40),
    "Pi": Decimal(2**50),
    "Ei": Decimal(2**60),
}


def parse_quantity(text: str) -> Decimal:
    """A Kubernetes quantity ("96", "500m", "1152Gi", "1.5k") as an exact Decimal.
    Raises ValueError for anything else (signs and exponents are not accepted)."""
    match = _QUANTITY.match(text.strip())
    if match is None:
        raise ValueError(f"not a quantity: {text!r}")
    try:
        number = Decimal(match.group(1))
    except InvalidOperation as exc:  # pragma: no cover - the pattern admits only decimals
        raise ValueError(f"not a quantity: {text!r}") from exc
    return number * _SUFFIX[match.group(2) or ""]


def _whole(value: Decimal, text: str) -> int:
    if value != value.to_integral_value():
        raise ValueError(f"not a whole number: {text!r}")
    return int(value)


def _shape(annotations: Mapping[str, Any], pool: str) -> PoolShape:
    def parsed(key: str, convert: Callable[[str], int]) -> int | None:
        raw = annotations.get(key)
        if raw is None:
            return None
        try:
            return convert(str(raw))
        except ValueError as exc:
            raise CapiPoolError(f"{pool}: invalid annotation {key}: {exc}") from None

    def count(text: str) -> int:
        if not text.strip().isdigit():
            raise ValueError(f"not a non-negative integer: {text!r}")
        return int(text)

    def gpus(text: str) -> int:
        return _whole(parse_quantity(text), text)

    def cpu_milli(text: str) -> int:
        return _whole(parse_quantity(text) * 1000, text)

    def memory_mib(text: str) -> int:
        # whole MiB, rounded down: never promise more memory than a node has
        return int(parse_quantity(text) / _SUFFIX["Mi"])

    gpu_type = annotations.get(ANNOTATION_GPU_TYPE)
    return PoolShape(
        gpus=parsed(ANNOTATION_GPU_COUNT, gpus),
        gpu_type=(str(gpu_type).strip() or None) if gpu_type is not None else None,
        cpu_milli=parsed(ANNOTATION_CPU, cpu_milli),
        memory_mib=parsed(ANNOTATION_MEMORY, memory_mib),
        min_size=parsed(ANNOTATION_MIN_SIZE, count),
        max_size=parsed(ANNOTATION_MAX_SIZE, count),
    )


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return cast(Mapping[str, Any], obj.get("metadata") or {})


def _int(value: Any) -> int:
    return int(value) if isinstance(value, int | str) and str(value).strip() else 0


# -- the pool --------------------------------------------------------------------------------


class CapiPool:
    """One MachineDeployment or MachinePool ``namespace/name`` of a management cluster.

    ``workload`` is the client of the cluster whose Nodes the pool makes (needed only by
    ``remove_node``). ``attempts`` bounds both the retries of one request (429/5xx/connection
    errors) and the re-reads after 409 Conflicts. ``retry_wait`` (a tenacity wait strategy)
    is injected so tests run without delays."""

    def __init__(
        self,
        management: ApiClient,
        namespace: str,
        name: str,
        *,
        kind: PoolKind = "MachineDeployment",
        workload: ApiClient | None = None,
        attempts: int = 6,
        retry_wait: wait_base | None = None,
    ) -> None:
        if kind not in PLURALS:
            raise ValueError(f"unknown pool kind {kind!r}")
        if attempts < 1:
            raise ValueError("attempts must be at least 1")
        self.custom = CustomObjectsApi(management)
        self.workload = CoreV1Api(workload) if workload is not None else None
        self.namespace = namespace
        self.name = name
        self.kind: PoolKind = kind
        self.plural = PLURALS[kind]
        self.attempts = attempts
        self._wait: wait_base = retry_wait or wait_exponential_jitter(
            multiplier=0.2, max=10, jitter=1
        )

    def __repr__(self) -> str:  # never the clients (their configuration holds credentials)
        return f"CapiPool({self.kind} {self.namespace}/{self.name})"

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    # -- status ------------------------------------------------------------------------------

    async def status(self) -> PoolStatus:
        """Desired and ready replicas and the node shape from the annotations."""
        what = f"read {self.kind} {self.key}"
        try:
            obj = cast(
                dict[str, Any],
                await self._call(
                    what,
                    lambda: self.custom.get_namespaced_custom_object(
                        GROUP, VERSION, self.namespace, self.plural, self.name
                    ),
                ),
            )
        except ApiException as exc:
            if exc.status == 404:
                raise CapiPoolError(f"no {self.kind} {self.key}") from None
            raise CapiPoolError(f"{what}: {retry.describe(exc)}") from exc
        spec = obj.get("spec") or {}
        status = obj.get("status") or {}
        annotations = cast(Mapping[str, Any], _meta(obj).get("annotations") or {})
        return PoolStatus(
            replicas=_int(spec.get("replicas")),
            ready_replicas=_int(status.get("readyReplicas")),
            shape=_shape(annotations, f"{self.kind} {self.key}"),
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
            current = _int((scale.get("spec") or {}).get("replicas"))
            target = target_of(current)
            if target < 0:
                raise CapiPoolError(f"{what}: would go below 0 replicas (now {current})")
            if target == current:
                log.info("%s: already %d replicas; nothing to write", what, current)
                return current
            meta = _meta(scale)
            body: dict[str, Any] = {
                "apiVersion": scale.get("apiVersion") or "autoscaling/v1",
                "kind": scale.get("kind") or "Scale",
                "metadata": {
                    "name": meta.get("name") or self.name,
                    "namespace": meta.get("namespace") or self.namespace,
                    # the precondition: a change since our read answers 409 Conflict
                    "resourceVersion": meta.get("resourceVersion"),
                },
                "spec": {"replicas": target},
            }
            try:
                await self._call(
                    what,
                    lambda body=body: self.custom.replace_namespaced_custom_object_scale(  # type: ignore[misc]
                        GROUP, VERSION, self.namespace, self.plural, self.name, body
                    ),
                )
            except ApiException as exc:
                if exc.status == 404:
                    raise CapiPoolError(f"{what}: no {self.kind} {self.key}") from None
                if exc.status != 409:
                    raise CapiPoolError(f"{what}: {retry.describe(exc)}") from exc
                log.info(
                    "%s: changed meanwhile (HTTP 409 Conflict, round %d of %d); re-reading",
                    what,
                    round_,
                    self.attempts,
                )
                continue
            log.info("%s: replicas %d -> %d", what, current, target)
            return target
        raise CapiPoolError(f"{what}: HTTP 409 Conflict after {self.attempts} attempts")

    async def _read_scale(self, what: str) -> dict[str, Any]:
        try:
            return cast(
                dict[str, Any],
                await self._call(
                    what,
                    lambda: self.custom.get_namespaced_custom_object_scale(
                        GROUP, VERSION, self.namespace, self.plural, self.name
                    ),
                ),
            )
        except ApiException as exc:
            if exc.status == 404:
                raise CapiPoolError(f"{what}: no {self.kind} {self.key}") from None
            raise CapiPoolError(f"{what}: {retry.describe(exc)}") from exc

    # -- removing one node -------------------------------------------------------------------

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
        found = await self._read_node(node, what)
        if found is not None:
            annotations = cast(Mapping[str, Any], _meta(found).get("annotations") or {})
            machine_name = annotations.get(ANNOTATION_MACHINE)
            if not machine_name:
                raise CapiPoolError(f"{what}: node {node} has no {ANNOTATION_MACHINE} annotation")
            machine = await self._read_machine(str(machine_name), what)
            if machine is None:
                raise CapiPoolError(
                    f"{what}: node {node} names Machine {self.namespace}/{machine_name}, "
                    "which does not exist"
                )
            cordoned = bool((found.get("spec") or {}).get("unschedulable"))
        else:
            machine = await self._machine_of_gone_node(node, what)
            cordoned = True  # a gone Node takes no pods
        name = str(_meta(machine).get("name"))
        marked = (_meta(machine).get("annotations") or {}).get(ANNOTATION_DELETE_MACHINE) == "yes"
        if marked and cordoned:
            log.info("%s: Machine %s already marked for deletion; not scaling again", what, name)
            return
        if not cordoned:
            await self._cordon(node, what)
        if not marked:
            await self._mark(name, what)
        await self.scale_by(-1)
        log.info("%s: Node cordoned, Machine %s marked, replicas lowered by one", what, name)

    async def label_node(self, node: str, labels: Mapping[str, str]) -> None:
        """Merge ``labels`` into a workload Node's labels (the broker marks the nodes it
        added, so it still knows them after a restart)."""
        core = self.workload
        if core is None:
            raise CapiPoolError(f"label node {node}: no workload cluster client given")
        step = f"label node {node} of {self.kind.lower()} {self.key}"
        patch = {"metadata": {"labels": dict(labels)}}
        try:
            await self._call(step, lambda: core.patch_node(node, patch, _content_type=_MERGE_PATCH))
        except ApiException as exc:
            raise CapiPoolError(f"{step}: {retry.describe(exc)}") from exc

    async def _read_node(self, node: str, what: str) -> dict[str, Any] | None:
        core = self.workload
        assert core is not None
        step = f"{what}: read Node"
        try:
            found = await self._call(step, lambda: core.read_node(node))
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise CapiPoolError(f"{step}: {retry.describe(exc)}") from exc
        return cast(dict[str, Any], core.api_client.sanitize_for_serialization(found))

    async def _cordon(self, node: str, what: str) -> None:
        core = self.workload
        assert core is not None
        step = f"{what}: cordon"
        try:
            await self._call(
                step,
                lambda: core.patch_node(
                    node, {"spec": {"unschedulable": True}}, _content_type=_MERGE_PATCH
                ),
            )
        except ApiException as exc:
            raise CapiPoolError(f"{step}: {retry.describe(exc)}") from exc
        log.info("%s: cordoned", what)

    async def _read_machine(self, machine: str, what: str) -> dict[str, Any] | None:
        step = f"{what}: read Machine {machine}"
        try:
            return cast(
                dict[str, Any],
                await self._call(
                    step,
                    lambda: self.custom.get_namespaced_custom_object(
                        GROUP, VERSION, self.namespace, MACHINES, machine
                    ),
                ),
            )
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise CapiPoolError(f"{step}: {retry.describe(exc)}") from exc

    async def _list_machines(self, what: str, selector: str | None = None) -> list[Any]:
        """Machines in the pool's namespace (``selector``: a label selector, also checked
        by the caller, since not every server applies it)."""
        step = f"{what}: list Machines"
        try:
            listing = cast(
                dict[str, Any],
                await self._call(
                    step,
                    lambda: self.custom.list_namespaced_custom_object(
                        GROUP, VERSION, self.namespace, MACHINES, label_selector=selector or ""
                    ),
                ),
            )
        except ApiException as exc:
            raise CapiPoolError(f"{step}: {retry.describe(exc)}") from exc
        return list(listing.get("items") or [])

    async def _machine_of_gone_node(self, node: str, what: str) -> dict[str, Any]:
        for machine in await self._list_machines(what):
            node_ref = (machine.get("status") or {}).get("nodeRef") or {}
            if node_ref.get("name") == node:
                return cast(dict[str, Any], machine)
        raise CapiPoolError(
            f"{what}: no Node {node} in the workload cluster and no Machine in "
            f"{self.namespace} refers to it"
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
        machines = await self._list_machines(what, f"{LABEL_DEPLOYMENT}={self.name}")
        coming = [
            m for m in machines
            if (_meta(m).get("labels") or {}).get(LABEL_DEPLOYMENT) == self.name
            and not ((m.get("status") or {}).get("nodeRef") or {}).get("name")
        ]  # fmt: skip
        # Newest first: the least far along.
        coming.sort(key=lambda m: str(_meta(m).get("creationTimestamp") or ""), reverse=True)
        chosen = coming[:count]
        for machine in chosen:
            annotations = _meta(machine).get("annotations") or {}
            if annotations.get(ANNOTATION_DELETE_MACHINE) != "yes":
                await self._mark(str(_meta(machine).get("name")), what)
        if chosen:
            await self.scale_by(-len(chosen))
        return len(chosen)

    async def _mark(self, machine: str, what: str) -> None:
        patch = {"metadata": {"annotations": {ANNOTATION_DELETE_MACHINE: "yes"}}}
        step = f"{what}: mark Machine {machine}"
        try:
            await self._call(
                step,
                lambda: self.custom.patch_namespaced_custom_object(
                    GROUP,
                    VERSION,
                    self.namespace,
                    MACHINES,
                    machine,
                    patch,
                    _content_type=_MERGE_PATCH,
                ),
            )
        except ApiException as exc:
            raise CapiPoolError(f"{step}: {retry.describe(exc)}") from exc
        log.info("%s: Machine %s marked %s", what, machine, ANNOTATION_DELETE_MACHINE)

    # -- retries -----------------------------------------------------------------------------

    async def _call(self, what: str, op: Callable[[], Awaitable[_T]]) -> _T:
        """``op`` with 429/5xx/connection errors retried (bounded, exponential with jitter).
        Other API errors propagate as ``ApiException``; exhausting the retries raises
        ``CapiPoolError`` with the last status."""
        return await retry.call(
            what, op, attempts=self.attempts, wait=self._wait, error=CapiPoolError, log=log
        )
