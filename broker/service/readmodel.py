"""The read model: typed rows of clusters, capacity, queues, nodes and burst pools.

Built once per read from the ledger, the queue and the burst controller, and consumed alike
by the HTTP API (``as_json()``: the bodies of ``/v1/clusters``, ``/v1/queues``,
``/v1/nodes``, ``/v1/pools``), the Prometheus collector, MQTT's capacity messages, the
dashboard and the demo's table. GPU amounts are in GPUs. Reserved GPUs (placements whose
pods are not bound yet) are summed in one place, per node (``reserved_milli``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from broker.core.burst import POOL_LABEL
from broker.core.burst_rows import PoolRow
from broker.core.ledger import Ledger
from broker.core.queue import JobQueue
from broker.model import MILLI_PER_GPU, ClusterCapacity
from broker.service.domain_rows import GANG_GPUS, DomainRows, LevelRow
from broker.service.members import KubeMembers
from broker.service.pool_reading import Availability
from broker.service.pools import BurstPools
from policies.stranded import stranded_gpus

AgentConnected = Callable[[str], bool | None]  # an agent-fed cluster's link (None: not one)


@dataclass(frozen=True, slots=True)
class GpuTypeRow:
    gpu_type: str
    total: int
    free: float
    reserved: float
    allocated: float
    largest_gang: int  # pods of GANG_GPUS whole GPUs (per topology level: domain_rows)
    # Free GPUs where no pod of any pending job fits; None where not asked for (it costs a
    # walk of the nodes per pending shape, too much for every capacity event of a stream).
    stranded: float | None = None

    def as_json(self) -> dict[str, Any]:
        # The keys are the glossary's fields (broker.figures).
        row = {
            "gpuType": self.gpu_type, "total": self.total, "free": self.free,
            "reserved": self.reserved, "allocated": self.allocated,
            "largestGang": self.largest_gang, "gangGpusPerPod": GANG_GPUS,
        }  # fmt: skip
        return row if self.stranded is None else {**row, "stranded": self.stranded}


@dataclass(frozen=True, slots=True)
class ClusterRow:
    cluster: str
    kind: str
    stale: bool
    labels: Mapping[str, str]
    gpu_types: tuple[GpuTypeRow, ...]
    connected: bool  # its watch or agent is heard from (simulated clusters: always)
    relists: int  # full relists of a Kubernetes member
    topology: tuple[LevelRow, ...] = ()  # its declared levels' domains, widest first

    def as_json(self) -> dict[str, Any]:
        return {
            "cluster": self.cluster, "kind": self.kind, "stale": self.stale,
            "labels": dict(self.labels), "gpuTypes": [t.as_json() for t in self.gpu_types],
            "connected": self.connected, "relists": self.relists,
            "topology": [level.as_json() for level in self.topology],
        }  # fmt: skip


@dataclass(frozen=True, slots=True)
class CapacityRow:
    """Per cluster and GPU type: total GPUs, GPUs of the largest gang of GANG_GPUS-GPU pods
    placeable now, and stranded GPUs (free where no pod of any pending job fits)."""

    cluster: str
    gpu_type: str
    total: int
    largest_gang_gpus: int
    stranded: float


@dataclass(frozen=True, slots=True)
class QueueRow:
    name: str
    policy: str
    priority: int
    weight: float
    quota: Mapping[str, int]
    borrow: bool
    reclaimable: bool
    pending: int
    usage: Mapping[str, float]  # GPUs per type held by the queue's jobs
    pending_gpus: float  # what its pending jobs ask for
    oldest_gang_seconds: float  # since its oldest pending gang was submitted (0: none)
    oldest_seconds: float  # since its longest-waiting pending job was queued (0: none)

    def as_json(self) -> dict[str, Any]:
        return {
            "name": self.name, "policy": self.policy, "priority": self.priority,
            "weight": self.weight, "quota": dict(self.quota), "borrow": self.borrow,
            "reclaimable": self.reclaimable, "pending": self.pending, "usage": dict(self.usage),
            "oldestWaitSeconds": round(self.oldest_seconds, 3),
        }  # fmt: skip


@dataclass(frozen=True, slots=True)
class NodeRow:
    name: str
    gpu_type: str
    gpus: int
    used: float  # bound pods
    reserved: float  # placements not running yet
    free: float
    burst: bool  # added by a burst pool
    schedulable: bool
    reserved_for: tuple[str, ...]  # the reader's own jobs holding a reservation here

    def as_json(self) -> dict[str, Any]:
        return {
            "name": self.name, "gpuType": self.gpu_type, "gpus": self.gpus, "used": self.used,
            "reserved": self.reserved, "free": self.free, "burst": self.burst,
            "schedulable": self.schedulable, "reservedFor": list(self.reserved_for),
        }  # fmt: skip


@dataclass(frozen=True, slots=True)
class NodeClusterRow:
    cluster: str
    kind: str
    stale: bool
    nodes: tuple[NodeRow, ...]

    def as_json(self) -> dict[str, Any]:
        return {
            "cluster": self.cluster, "kind": self.kind, "stale": self.stale,
            "nodes": [n.as_json() for n in self.nodes],
        }  # fmt: skip


def reserved_milli(ledger: Ledger) -> dict[tuple[str, str], int]:
    """GPU milli the broker's placements hold per (cluster, node)."""
    held: dict[tuple[str, str], int] = {}
    for placement in ledger.reservations().values():
        for pod in placement.pods:
            key = (placement.cluster, pod.node)
            held[key] = held.get(key, 0) + pod.resources.gpu_request_milli
    return held


def _gpu_types(
    view: ClusterCapacity,
    held: Mapping[tuple[str, str], int],
    stranded: Mapping[tuple[str, str], float] | None,
) -> list[GpuTypeRow]:
    reserved: dict[str, int] = {}
    for (cluster, node), milli in held.items():
        if cluster == view.name and node in view.nodes:
            gpu_type = str(view.nodes[node].node.gpu_type or "")
            reserved[gpu_type] = reserved.get(gpu_type, 0) + milli
    totals: dict[str, tuple[int, float, int]] = {}  # type -> total, free, largest gang
    for group in view.groups():
        gpu_type = str(group[0] or "")
        if not gpu_type:
            continue
        total, free, gang = totals.get(gpu_type, (0, 0.0, 0))
        total += view.gpus_total(group)
        free += view.free_milli(group) / 1000
        gang += sum(count * (whole // GANG_GPUS) for whole, count in view.whole_histogram(group))
        totals[gpu_type] = (total, free, gang)
    rows = []
    for gpu_type, (total, free, gang) in sorted(totals.items()):
        held_gpus = reserved.get(gpu_type, 0) / 1000
        rows.append(GpuTypeRow(
            gpu_type, total, free, held_gpus, total - free - held_gpus, gang,
            None if stranded is None else stranded.get((view.name, gpu_type), 0.0),
        ))  # fmt: skip
    return rows


class ReadModel:
    """The typed rows of one service, computed when read."""

    def __init__(
        self,
        ledger: Ledger,
        queue: JobQueue,
        pools: BurstPools,
        kube: KubeMembers,
        clock: Callable[[], float],
    ) -> None:
        self._ledger = ledger
        self._queue = queue
        self._pools = pools
        self._kube = kube
        self._clock = clock
        self.agents: list[AgentConnected] = []  # MQTT's agent-fed clusters (compose adds)
        self._domains = DomainRows()

    def _connected(self, name: str) -> bool:
        for agent in self.agents:
            connected = agent(name)
            if connected is not None:
                return connected
        return self._kube.connected(name)

    def clusters(self, *, stranded_gpus_too: bool = False) -> list[ClusterRow]:
        """Per cluster its GPU types' figures; stranded GPUs only when asked for."""
        snapshot = self._ledger.snapshot()
        held = reserved_milli(self._ledger)
        stranded = stranded_gpus(snapshot, self._queue.fit_shapes()) if stranded_gpus_too else None
        rows = []
        for name in sorted(snapshot.clusters):
            view = snapshot.clusters[name]
            rows.append(ClusterRow(
                name, view.cluster.kind, view.stale, dict(view.cluster.labels),
                tuple(_gpu_types(view, held, stranded)), self._connected(name),
                self._kube.relists(name), self._domains.of(view),
            ))  # fmt: skip
        return rows

    def capacity(self, clusters: list[ClusterRow]) -> list[CapacityRow]:
        """Per cluster and GPU type of ``clusters``: totals, largest gang, stranded GPUs
        (none while nothing waits)."""
        return [
            CapacityRow(c.cluster, t.gpu_type, t.total, t.largest_gang * GANG_GPUS,
                        t.stranded or 0.0)
            for c in clusters
            for t in c.gpu_types
        ]  # fmt: skip

    def queues(self) -> list[QueueRow]:
        """O(queues), whatever waits in them (the queue keeps the sums: JobQueue.waits)."""
        now = self._clock()
        rows = []
        for q in self._queue.queues():
            waits = self._queue.waits(q.name, now)
            rows.append(QueueRow(
                q.name, q.policy, q.priority, q.weight, dict(q.quota or {}), q.borrow,
                q.reclaimable, waits.pending,
                {t: m / 1000 for t, m in self._queue.usage(q.name).items()},
                waits.demand_gpus, waits.oldest_gang_wait, waits.longest_wait,
            ))  # fmt: skip
        return rows

    def nodes(self, tenant: str | None) -> list[NodeClusterRow]:
        """Per cluster (sorted) its nodes (sorted) with GPU occupancy; ``tenant``: whose
        reservations to name (None: everyone's, for an admin)."""
        snapshot = self._ledger.snapshot()
        held = reserved_milli(self._ledger)
        holders: dict[tuple[str, str], set[str]] = {}
        for placement in self._ledger.reservations().values():
            owner, _, name = placement.job.partition("/")
            if tenant is None or owner == tenant:
                for pod in placement.pods:
                    holders.setdefault((placement.cluster, pod.node), set()).add(
                        placement.job if tenant is None else name
                    )
        added = self._pools.controller.added_nodes()
        out = []
        for name in sorted(snapshot.clusters):
            view = snapshot.clusters[name]
            ours = added.get(name, set())
            nodes = []
            for node_name in sorted(view.nodes):
                state = view.nodes[node_name]
                total = len(state.gpu_free) * MILLI_PER_GPU
                # Bound + assumed never exceed allocatable (the ledger's invariant), except
                # where reality overfilled a node: there the clamp keeps used >= 0.
                reserved = min(held.get((name, node_name), 0), total - state.free_milli)
                nodes.append(NodeRow(
                    node_name, str(state.node.gpu_type or ""), len(state.gpu_free),
                    (total - state.free_milli - reserved) / MILLI_PER_GPU,
                    reserved / MILLI_PER_GPU, state.free_milli / MILLI_PER_GPU,
                    node_name in ours or POOL_LABEL in state.node.labels,
                    state.node.schedulable, tuple(sorted(holders.get((name, node_name), ()))),
                ))  # fmt: skip
            out.append(NodeClusterRow(name, view.cluster.kind, view.stale, tuple(nodes)))
        return out

    def pools(self) -> list[PoolRow]:
        """Burst pools as the controller counts them (``/v1/pools``' ``pools``)."""
        return self._pools.rows()

    def availability(self) -> list[Availability]:
        """Every configured burst pool: joined the controller, or why not yet (``/readyz``
        and the ``fedbroker_burst_pool_available`` gauge)."""
        return self._pools.availability()

    def burst(self, tenant: str | None) -> dict[str, Any]:
        """Burst pools, gangs waiting for burst nodes and burst cost per job (the body of
        ``/v1/pools``); ``tenant`` limits the jobs to one tenant's (None: all)."""
        controller = self._pools.controller

        def mine(job: str) -> bool:
            return tenant is None or job.partition("/")[0] == tenant

        return {
            "pools": [row.as_json() for row in self.pools()],
            "requests": [r.as_json() for r in controller.requests() if mine(r.job)],
            "jobs": [
                {"job": job, "nodeHours": round(seconds / 3600.0, 4),
                 "cost": round(controller.job_cost.get(job, 0.0), 4)}
                for job, seconds in sorted(controller.job_node_seconds.items())
                if mine(job)
            ],
        }  # fmt: skip


__all__ = [
    "GANG_GPUS",
    "Availability",
    "CapacityRow",
    "ClusterRow",
    "GpuTypeRow",
    "LevelRow",
    "NodeClusterRow",
    "NodeRow",
    "PoolRow",
    "QueueRow",
    "ReadModel",
    "reserved_milli",
]
