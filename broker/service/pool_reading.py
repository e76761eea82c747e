"""Reading a Cluster API burst pool until it can be read, and saying meanwhile that it cannot.

A Cluster API pool joins the burst controller only once its MachineDeployment or
MachinePool has been read (its replicas, and its node shape where the config leaves it
out). ``CapiReader`` makes one such read: the kubeconfig loaded afresh (a renewed token or
a repaired kubeconfig is picked up by the next read), the object read through
``adapters.capi.CapiPool`` with its own bounded retries, the shape taken from the config
or the annotations. A read that fails raises ``Unreadable``: ``reason`` is a few words
(the HTTP status, "connection failed", "timed out", ...) safe for ``/readyz``, the
metric and explain; the message, for the log, names the pool and the object, never the
kubeconfig or a token. ``PoolRetry`` is how often the reads are repeated: exponential
backoff with jitter (tenacity), which a test replaces with its own wait and sleep.
``Availability`` is one configured pool as readiness and the metric report it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tenacity import wait_exponential_jitter
from tenacity.wait import wait_base

from broker.config import BurstPoolConfig, KubeSource
from broker.manifest import cpu_millicores, memory_mebibytes
from broker.model import Resources
from broker.ports import KubeconfigError

if TYPE_CHECKING:
    from kubernetes.aio.client import ApiClient

    from adapters.capi import CapiPool, PoolShape


def node_of(pc: BurstPoolConfig) -> Resources:
    """The node shape the config gives (0 where it leaves a field out)."""
    return Resources(
        gpus=pc.gpus or 0,
        cpu_milli=cpu_millicores(pc.cpu) if pc.cpu is not None else 0,
        memory_mib=memory_mebibytes(pc.memory) if pc.memory is not None else 0,
    )


@dataclass(frozen=True, slots=True)
class Shape:
    """A pool's node shape, GPU type, bounds and current size, as configured or read."""

    node: Resources
    gpu_type: str | None
    min_nodes: int | None
    max_nodes: int | None
    replicas: int


def _default_wait() -> wait_base:
    # A management cluster away for a restart is back within seconds to minutes: the
    # first read again after about 5 s, doubling, never more than 5 minutes apart.
    return wait_exponential_jitter(multiplier=5.0, max=300.0, jitter=5.0)


@dataclass(frozen=True, slots=True)
class PoolRetry:
    """How an unreadable pool is read again: ``wait`` (a tenacity strategy) between reads,
    ``sleep`` to wait them out; each read retries its own requests ``attempts`` times
    (429, 5xx, connection errors), ``request_wait`` apart (None: the port's default), each
    attempt given ``request_timeout`` seconds (as a member's ``requestTimeoutSeconds``: a
    management cluster that accepts and never answers is away, not slow). The broker's
    start waits ``first_read_seconds`` at most for the first reads."""

    wait: wait_base = field(default_factory=_default_wait)
    sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep
    attempts: int = 6
    request_wait: wait_base | None = None
    request_timeout: float | None = 30.0
    first_read_seconds: float = 30.0


class Unreadable(Exception):
    """A pool could not be read: ``reason`` in a few public words; the message for the log."""

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class Availability:
    """One configured pool: joined the burst controller (``available``), or why not yet:
    ``reason``, since when (the broker began reading it: its start), reads failed so far,
    the next read."""

    pool: str
    available: bool
    reason: str | None = None
    since: float | None = None
    attempts: int = 0
    retry_at: float | None = None

    def as_json(self) -> dict[str, object]:
        return {
            "pool": self.pool, "available": self.available, "reason": self.reason,
            "since": self.since, "attempts": self.attempts, "retryAt": self.retry_at,
        }  # fmt: skip


class CapiReader:
    """One read of a Cluster API pool: its port (holding the client made for it) and
    shape, or ``Unreadable``. The client of a failed read is closed before it raises."""

    def __init__(
        self,
        pc: BurstPoolConfig,
        member: KubeSource | None,
        workload: ApiClient | None,
        retry: PoolRetry,
    ) -> None:
        self.pc = pc
        self._member = member
        self._workload = workload
        self._retry = retry

    async def read(self) -> tuple[CapiPool, ApiClient, Shape]:
        # Imported here, with the first Cluster API pool: kubernetes.aio is most of a
        # start's imports, and simulated pools never need it.
        from adapters.capi import CapiPool, CapiPoolError, unreadable
        from adapters.capi.objects import DEFAULT_GPU_TYPE_LABEL
        from adapters.kubeapi.kubeconfig import load_clients

        source = self.pc.source.capi
        assert source is not None
        try:
            clients, _ = await load_clients(source.kubeconfig_source(), [source.context])
        except KubeconfigError as exc:
            raise Unreadable(str(exc), "kubeconfig cannot be loaded") from None
        client = clients[source.context]
        try:
            port = CapiPool(
                client, source.namespace, source.name, kind=source.kind,
                workload=self._workload, attempts=self._retry.attempts,
                retry_wait=self._retry.request_wait, timeout=self._retry.request_timeout,
                gpu_type_label=self._member.gpu_type_label if self._member
                else DEFAULT_GPU_TYPE_LABEL,
            )  # fmt: skip
            try:
                status = await port.status()
            except CapiPoolError as exc:
                raise Unreadable(str(exc), unreadable(exc)) from None
            shape = self._shape(status.replicas, status.shape)
            if not (shape.node.gpus and shape.gpu_type and shape.max_nodes is not None):
                raise Unreadable(
                    f"GPU count, GPU type and maximum size are neither configured nor "
                    f"annotated on {port.key}", "node shape unknown",
                )  # fmt: skip
        except BaseException:
            await client.close()  # type: ignore[no-untyped-call]
            raise
        return port, client, shape

    def _shape(self, replicas: int, read: PoolShape) -> Shape:
        """The config's shape and bounds, else the annotations'."""
        pc, node = self.pc, node_of(self.pc)
        return Shape(
            Resources(
                gpus=node.gpus or read.gpus or 0,
                cpu_milli=node.cpu_milli or read.cpu_milli or 0,
                memory_mib=node.memory_mib or read.memory_mib or 0,
            ),
            pc.gpu_type or read.gpu_type,
            read.min_size if pc.min_nodes is None else pc.min_nodes,
            read.max_size if pc.max_nodes is None else pc.max_nodes,
            replicas,
        )


__all__ = ["Availability", "CapiReader", "PoolRetry", "Shape", "Unreadable", "node_of"]
