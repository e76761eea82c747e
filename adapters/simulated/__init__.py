"""Simulated member clusters: the embedded default for the demo, the simulator and tests.

Clusters are built from node lists (the trace inventories) or generated from node shapes and
counts, and driven by a virtual clock: a launched pod is bound at once and deleted when its
run time is over. They speak to the ledger in the same capacity events a real adapter emits.

Ports (``broker.ports``): ``SimulatedFederation`` is the simulator's ``NodeInventory`` and
``VirtualLauncher``; ``SimulatedLauncher`` (``adapters.simulated.launcher``, re-exported) the
live broker's ``Launcher``, ``RunWatcher``/``RunNotifier`` and ``PodReader`` (a running
job's pods, and a few deterministic log lines per pod);
``SimulatedPool`` is driven synchronously on the caller's clock (the service wraps it as a
``ScalePool``). Failures raise the ports' ``LaunchError`` and ``ScaleError``.
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from adapters.simulated.launcher import (
    SimulatedLauncher as SimulatedLauncher,
)
from adapters.simulated.launcher import (
    seeded_run_seconds as seeded_run_seconds,
)
from adapters.simulated.launcher import (
    simulated_log_line as simulated_log_line,
)
from broker.model import (
    CapacityEvent,
    Cluster,
    GpuType,
    Node,
    NodeDeleted,
    NodeUpdated,
    Placement,
    PodBound,
    PodDeleted,
    Resources,
)
from broker.ports import (
    NodeInventory,
    ScaleError,
    VirtualLauncher,
)


@dataclass(frozen=True, slots=True)
class NodeShape:
    gpu_type: str
    gpus: int
    cpu_milli: int
    memory_mib: int
    count: int
    labels: tuple[tuple[str, str], ...] = ()  # every node of the shape carries them


# The six largest node shapes of the openb production cluster (Weng et al., ATC'23; counts
# and sizes from openb_node_list_gpu_node.csv): 1,155 of its 1,213 GPU nodes.
OPENB_MIX: tuple[NodeShape, ...] = (
    NodeShape("G2", 8, 96_000, 393_216, 549),
    NodeShape("T4", 2, 104_000, 524_288, 387),
    NodeShape("P100", 2, 16_000, 122_880, 131),
    NodeShape("G3", 8, 128_000, 786_432, 39),
    NodeShape("V100M16", 4, 32_000, 131_072, 28),
    NodeShape("V100M32", 8, 96_000, 786_432, 21),
)


def generate_nodes(
    shapes: Iterable[NodeShape], prefix: str = "node", scale: float = 1.0
) -> list[Node]:
    """Nodes of the given shapes, interleaved so any round-robin split keeps the mix.
    ``scale`` multiplies every count (at least one node of each shape remains)."""
    pools = [[s] * max(1, round(s.count * scale)) for s in shapes]
    order: list[NodeShape] = []
    while any(pools):
        for pool in pools:
            if pool:
                order.append(pool.pop())
    width = max(4, len(str(len(order))))
    return [
        Node(
            f"{prefix}-{i:0{width}d}",
            GpuType(s.gpu_type),
            Resources(gpus=s.gpus, cpu_milli=s.cpu_milli, memory_mib=s.memory_mib),
            labels={**dict(s.labels), "gpu-type": s.gpu_type},
        )
        for i, s in enumerate(order)
    ]


def lay_topology(
    nodes: Sequence[Node], levels: Sequence[str], nodes_per_rack: int, racks_per_block: int = 0
) -> list[Node]:
    """The nodes labelled with racks of ``nodes_per_rack`` nodes (and blocks of
    ``racks_per_block`` racks): ``levels`` are the label keys, widest first, either
    ``[rack]`` (values ``r0``, ``r1``, ...) or ``[block, rack]`` (values ``b0`` and
    ``b0-r0``, ``b0-r1``, ...: a rack's value names its block, so it is unique). Racks are
    filled in node order, and alike nodes (same GPU type and size) fill racks of their own,
    as real racks hold one kind of node; blocks take consecutive racks."""
    if not 1 <= len(levels) <= 2 or nodes_per_rack < 1 or racks_per_block < 0:
        raise ValueError("levels: [rack] or [block, rack]; nodesPerRack >= 1")
    if len(levels) == 2 and racks_per_block < 1:
        raise ValueError("racksPerBlock >= 1 with a block level")
    kinds: dict[tuple[object, Resources], list[int]] = {}
    for i, n in enumerate(nodes):
        kinds.setdefault((n.gpu_type, n.allocatable), []).append(i)
    out = list(nodes)
    rack = 0
    for members in kinds.values():
        for start in range(0, len(members), nodes_per_rack):
            block, within = divmod(rack, racks_per_block or 1)
            if len(levels) == 2:
                labels = {levels[0]: f"b{block}", levels[1]: f"b{block}-r{within}"}
            else:
                labels = {levels[0]: f"r{rack}"}
            for i in members[start : start + nodes_per_rack]:
                node = out[i]
                out[i] = replace(node, labels={**node.labels, **labels})
            rack += 1
    return out


def split_round_robin(nodes: Sequence[Node], clusters: int) -> list[list[Node]]:
    """Deal the nodes out to ``clusters`` member clusters, node by node."""
    if clusters < 1:
        raise ValueError("clusters must be at least 1")
    return [list(nodes[i::clusters]) for i in range(clusters)]


@dataclass(order=True, slots=True)
class _Ending:
    at: float
    cluster: str = field(compare=False)
    pod: str = field(compare=False)


class SimulatedFederation(NodeInventory, VirtualLauncher):
    """In-process clusters on a virtual clock: launch binds pods at once; ``advance`` ends
    the pods whose run time is over and returns the events to feed the ledger."""

    def __init__(self) -> None:
        self.clusters: dict[str, tuple[Cluster, list[Node]]] = {}
        self.now = 0.0
        self._endings: list[_Ending] = []
        self._running: dict[tuple[str, str], Placement] = {}

    def add(self, cluster: Cluster, nodes: Sequence[Node]) -> None:
        self.clusters[cluster.name] = (cluster, list(nodes))

    def node_events(self) -> list[CapacityEvent]:
        return [NodeUpdated(name, n) for name, (_, nodes) in self.clusters.items() for n in nodes]

    def launch(self, placement: Placement, run_seconds: float) -> list[CapacityEvent]:
        events: list[CapacityEvent] = []
        for pod in placement.pods:
            events.append(PodBound(placement.cluster, pod.pod, pod.node, pod.resources, pod.gpus))
            heapq.heappush(
                self._endings, _Ending(self.now + run_seconds, placement.cluster, pod.pod)
            )
        return events

    def next_ending(self) -> float | None:
        return self._endings[0].at if self._endings else None

    def advance(self, to: float) -> list[CapacityEvent]:
        """Move the clock to ``to``; the pods that ended meanwhile are deleted."""
        self.now = max(self.now, to)
        events: list[CapacityEvent] = []
        while self._endings and self._endings[0].at <= self.now:
            ending = heapq.heappop(self._endings)
            events.append(PodDeleted(ending.cluster, ending.pod))
        return events


# Each generated gang pod asks 8 cores and 32 GiB per GPU: the ratio of openb's tightest
# common GPU nodes (V100M16: 4 GPUs, 32 cores, 128 GiB; its 8-GPU variant likewise), so a
# whole-node pod fits every 8-GPU node shape of the trace and CPU or memory never decide alone.
GANG_CPU_MILLI_PER_GPU = 8_000
GANG_MEMORY_MIB_PER_GPU = 32_768


@dataclass(frozen=True, slots=True)
class GangShape:
    pods: int
    gpus_per_pod: int
    weight: float

    def pod_resources(self) -> Resources:
        return Resources(
            gpus=self.gpus_per_pod,
            cpu_milli=self.gpus_per_pod * GANG_CPU_MILLI_PER_GPU,
            memory_mib=self.gpus_per_pod * GANG_MEMORY_MIB_PER_GPU,
        )


# The generated gang workload (no public trace has multi-pod gangs; see traces/README.md).
# Sizes follow the shape of published training-job mixes: most jobs are one pod, a long tail
# of data-parallel gangs of whole 8-GPU nodes. Seeded; the whole distribution (with arrival
# and run times) is documented in broker/sim/arrivals.py, its one user. Mean 2.5 pods and 15.5 GPUs
# per job; 42 % of jobs are gangs (more than one pod), holding 94 % of the GPUs asked for.
GANG_MIX: tuple[GangShape, ...] = (
    GangShape(1, 1, 0.40),
    GangShape(1, 2, 0.10),
    GangShape(1, 4, 0.08),
    GangShape(2, 4, 0.10),
    GangShape(2, 8, 0.10),
    GangShape(4, 8, 0.12),
    GangShape(8, 8, 0.07),
    GangShape(16, 8, 0.03),
)


def draw_gang(rng: random.Random, mix: Sequence[GangShape] = GANG_MIX) -> GangShape:
    return rng.choices(list(mix), weights=[g.weight for g in mix])[0]


def generated_pod_mix(rng: random.Random) -> Resources:
    """A single pod drawn like the openb default list: 48 % one whole GPU, 38 % a share of
    one GPU, 13 % CPU-only, 1 % 2-8 GPUs (shares of the 8,152 pods of the trace), with CPU
    requests up to 32 cores on GPU pods and 64 on CPU-only ones, so CPU strands GPUs too."""
    roll = rng.random()
    if roll < 0.48:
        return Resources(
            gpus=1,
            cpu_milli=rng.choice((4000, 8000, 12000, 16000, 32000)),
            memory_mib=rng.choice((16384, 32768)),
        )
    if roll < 0.86:
        milli = rng.choice((100, 200, 250, 300, 400, 500, 600, 700, 750))
        return Resources(
            gpu_milli=milli,
            cpu_milli=rng.choice((1000, 2000, 4000, 6000, 8000)),
            memory_mib=rng.choice((8192, 12288)),
        )
    if roll < 0.99:
        return Resources(
            cpu_milli=rng.choice((8000, 16000, 32000, 64000)), memory_mib=rng.choice((8192, 30517))
        )
    gpus = rng.choice((2, 4, 8))
    return Resources(gpus=gpus, cpu_milli=gpus * 8000, memory_mib=gpus * 32768)


class SimulatedPool:
    """A simulated Cluster API node pool on a clock the caller passes in (wall time in the
    demo, virtual time in the replay): ``scale_to`` more replicas and each new node comes
    up ``provision_seconds`` later, or never (``failure_rate``, seeded: the machine fails to
    provision and sits there until scaled away); fewer replicas remove nodes, those marked
    by ``remove_node`` first. ``due(now)`` hands out the capacity events of what happened
    up to ``now``, as a workload cluster's watch would.
    """

    def __init__(
        self,
        cluster: str,
        gpu_type: str,
        node: Resources,
        *,
        name: str = "pool",
        provision_seconds: float = 60.0,
        failure_rate: float = 0.0,
        seed: int = 0,
        labels: Mapping[str, str] | None = None,
    ) -> None:
        self.cluster = cluster
        self.node_labels = dict(labels or {})  # every node of the pool: its topology domains
        self.gpu_type = GpuType(gpu_type)
        self.node = node
        self.name = name
        self.provision_seconds = provision_seconds
        self.failure_rate = failure_rate
        self._rng = random.Random(f"{seed}:{name}")
        self.replicas = 0
        self._serial = 0
        self._coming: list[tuple[float, str]] = []  # (ready at, node name); failed: at inf
        self.ready: set[str] = set()
        self._marked: set[str] = set()
        self._events: list[CapacityEvent] = []
        self._labels: dict[str, dict[str, str]] = {}
        self.scale_calls = 0

    def _new_node(self, now: float) -> None:
        self._serial += 1
        name = f"{self.name}-{self._serial:04d}"
        failed = self.failure_rate > 0 and self._rng.random() < self.failure_rate
        heapq.heappush(
            self._coming, (float("inf") if failed else now + self.provision_seconds, name)
        )

    def scale_to(self, replicas: int, now: float) -> int:
        """Set the desired node count; returns it."""
        if replicas < 0:
            raise ScaleError(f"pool {self.name}: replicas must not be negative")
        self.scale_calls += 1
        while self.replicas < replicas:
            self._new_node(now)
            self.replicas += 1
        while self.replicas > replicas:
            self._remove_one()
            self.replicas -= 1
        return self.replicas

    def _remove_one(self) -> None:
        """Cluster API deletes machines marked for deletion first, then ones not yet
        ready (newest first), then the newest ready node."""
        if self._marked:
            name = min(self._marked)
            self._marked.discard(name)
        elif self._coming:
            name = max(self._coming, key=lambda c: (c[0], c[1]))[1]
        else:
            name = max(self.ready)
        self._coming = [c for c in self._coming if c[1] != name]
        heapq.heapify(self._coming)
        if name in self.ready:
            self.ready.discard(name)
            self._events.append(NodeDeleted(self.cluster, name))

    def cancel_coming(self, count: int, now: float) -> int:
        """Lower the replicas by up to ``count`` nodes not up yet; returns how many."""
        cancelled = min(count, len(self._coming))
        if cancelled > 0:
            self.scale_to(self.replicas - cancelled, now)
        return cancelled

    def remove_node(self, node: str, now: float) -> int:
        """Cordon ``node``, mark its machine for deletion, lower the replicas by one (what
        the Cluster API adapter does); returns the new replica count."""
        if node not in self.ready:
            raise ScaleError(f"pool {self.name}: no ready node {node}")
        self._marked.add(node)
        return self.scale_to(self.replicas - 1, now)

    def label_node(self, node: str, labels: Mapping[str, str]) -> None:
        """Merge ``labels`` into a ready node's labels (a NodeUpdated follows)."""
        if node not in self.ready:
            raise ScaleError(f"pool {self.name}: no ready node {node}")
        self._labels.setdefault(node, {}).update(labels)
        self._events.append(NodeUpdated(self.cluster, self._node(node)))

    def _node(self, name: str) -> Node:
        labels = {"gpu-type": str(self.gpu_type), **self.node_labels, **self._labels.get(name, {})}
        return Node(name, self.gpu_type, self.node, labels=labels)

    def next_due(self) -> float | None:
        """When the next node comes up (None: nothing is on its way)."""
        at = self._coming[0][0] if self._coming else float("inf")
        return at if at != float("inf") else None

    def due(self, now: float) -> list[CapacityEvent]:
        """The capacity events up to ``now``: nodes that came up, nodes that went away."""
        while self._coming and self._coming[0][0] <= now:
            _, name = heapq.heappop(self._coming)
            self.ready.add(name)
            self._events.append(NodeUpdated(self.cluster, self._node(name)))
        events, self._events = self._events, []
        return events
