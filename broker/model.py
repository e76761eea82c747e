"""The federation's vocabulary: resources, nodes, clusters, jobs, placements and reasons.

Everything here is a frozen dataclass with no I/O and no third-party imports, so the
placement core (ledger snapshots and policies) can be replayed, compared and property-tested
as plain values. Capacity arithmetic is in integers: GPUs are counted in milli-GPUs
(1000 = one whole GPU), CPU in millicores and memory in MiB.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass, field, fields
from typing import Any, Literal, NewType, Protocol, cast

from broker.reasons import Reason as Reason  # noqa: PLC0414 (re-exported: the vocabulary is one import)
from broker.reasons import ReasonCode as ReasonCode  # noqa: PLC0414 (re-exported: the vocabulary is one import)
from broker.taints import Taint, Toleration
from broker.topology import TopologyRequest as TopologyRequest  # noqa: PLC0414 (re-exported: the vocabulary is one import)

MILLI_PER_GPU = 1000

GpuType = NewType("GpuType", str)
ClusterKind = Literal["onprem", "cloud"]


@dataclass(frozen=True, slots=True)
class Resources:
    """What one pod asks for (or one node offers, with ``gpus`` as its GPU count).

    A pod asks either for ``gpus`` whole GPUs or for ``gpu_milli`` (1..999) of one shared GPU,
    as in the Alibaba traces' ``gpu_milli`` column; never both.
    """

    gpus: int = 0
    gpu_milli: int = 0
    cpu_milli: int = 0
    memory_mib: int = 0

    def __post_init__(self) -> None:
        for name in ("gpus", "gpu_milli", "cpu_milli", "memory_mib"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must not be negative")
        if self.gpu_milli >= MILLI_PER_GPU:
            raise ValueError("gpu_milli is a share of one GPU and must be below 1000")
        if self.gpus and self.gpu_milli:
            raise ValueError("ask for whole gpus or a gpu_milli share, not both")

    @property
    def shared(self) -> bool:
        return self.gpu_milli > 0

    @property
    def gpu_request_milli(self) -> int:
        """The GPU request in milli-GPUs, as the FGD paper counts load."""
        return self.gpus * MILLI_PER_GPU + self.gpu_milli

    @property
    def per_gpu_milli(self) -> int:
        """Milli needed on each GPU the pod takes (1000 for whole GPUs)."""
        return self.gpu_milli if self.gpu_milli else (MILLI_PER_GPU if self.gpus else 0)

    @property
    def gpu_count(self) -> int:
        """How many distinct GPUs the pod touches."""
        return 1 if self.gpu_milli else self.gpus


@dataclass(frozen=True, slots=True)
class Node:
    """A node's description as its cluster reports it (what it has, not what is used)."""

    name: str
    gpu_type: GpuType | None
    allocatable: Resources
    labels: Mapping[str, str] = field(default_factory=dict)
    taints: tuple[Taint, ...] = ()
    unschedulable: bool = False
    ready: bool = True

    @property
    def schedulable(self) -> bool:
        return self.ready and not self.unschedulable


@dataclass(frozen=True, slots=True)
class NodeState:
    """A node plus what is taken on it right now (bound and assumed pods together).

    ``gpu_free`` holds the free milli of each GPU by index, so shared pods can pack onto one
    GPU. The derived fields are kept because every policy reads them in its hot loop.
    """

    node: Node
    cpu_free: int
    memory_free: int
    gpu_free: tuple[int, ...]
    free_milli: int
    whole_free: int

    @staticmethod
    def of(node: Node, cpu_free: int, memory_free: int, gpu_free: tuple[int, ...]) -> NodeState:
        return NodeState(
            node,
            cpu_free,
            memory_free,
            gpu_free,
            sum(gpu_free),
            sum(1 for f in gpu_free if f == MILLI_PER_GPU),
        )

    @staticmethod
    def empty(node: Node) -> NodeState:
        alloc = node.allocatable
        return NodeState.of(node, alloc.cpu_milli, alloc.memory_mib, (MILLI_PER_GPU,) * alloc.gpus)

    @property
    def name(self) -> str:
        return self.node.name

    def gpus_for(self, request: Resources) -> tuple[int, ...] | None:
        """The GPUs a pod would take here by best fit, or None when it does not fit.

        Whole GPUs: the lowest-indexed completely free ones. A shared pod: the GPU with the
        least free milli that still fits (the fullest), lowest index among equals.
        """
        if request.cpu_milli > self.cpu_free or request.memory_mib > self.memory_free:
            return None
        if request.gpu_milli:
            best = -1
            for i, free in enumerate(self.gpu_free):
                if free >= request.gpu_milli and (best < 0 or free < self.gpu_free[best]):
                    best = i
            return None if best < 0 else (best,)
        if request.gpus > self.whole_free:
            return None
        if not request.gpus:
            return ()
        picked = [i for i, free in enumerate(self.gpu_free) if free == MILLI_PER_GPU]
        return tuple(picked[: request.gpus])

    def take(self, request: Resources, gpus: tuple[int, ...]) -> NodeState:
        """This node with ``request`` placed on ``gpus``; raises if it does not fit."""
        per_gpu = request.per_gpu_milli
        frees = list(self.gpu_free)
        for i in gpus:
            if frees[i] < per_gpu:
                raise ValueError(f"GPU {i} of node {self.name} lacks {per_gpu} free milli")
            frees[i] -= per_gpu
        cpu = self.cpu_free - request.cpu_milli
        mem = self.memory_free - request.memory_mib
        if cpu < 0 or mem < 0 or len(gpus) != request.gpu_count:
            raise ValueError(f"pod does not fit node {self.name}")
        return NodeState.of(self.node, cpu, mem, tuple(frees))

    def give_back(self, request: Resources, gpus: tuple[int, ...]) -> NodeState:
        per_gpu = request.per_gpu_milli
        frees = list(self.gpu_free)
        for i in gpus:
            frees[i] = min(MILLI_PER_GPU, frees[i] + per_gpu)
        alloc = self.node.allocatable
        return NodeState.of(
            self.node,
            min(alloc.cpu_milli, self.cpu_free + request.cpu_milli),
            min(alloc.memory_mib, self.memory_free + request.memory_mib),
            tuple(frees),
        )


@dataclass(frozen=True, slots=True)
class Cluster:
    name: str
    labels: Mapping[str, str] = field(default_factory=dict)
    kind: ClusterKind = "onprem"
    cost_per_gpu_hour: float = 0.0
    # Node label keys of its topology domains, widest first (block, rack, host): a node
    # without a level's label belongs to no domain of that level.
    topology_levels: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class PodSet:
    """``count`` identical pods of a job."""

    name: str
    count: int
    resources: Resources
    # What its pods tolerate (``broker.taints``: Kubernetes' matching), shared by equal sets.
    tolerations: frozenset[Toleration] = frozenset()
    topology: TopologyRequest | None = None

    def __post_init__(self) -> None:
        if self.count < 1:
            raise ValueError(f"pod set {self.name}: count must be at least 1")
        if self.topology is not None:
            self.topology.check(self.name, self.count)


PolicyName = Literal[
    "auto", "gang", "binpack", "spread", "firstfit", "random", "fgd", "fgd-cpu", "fgd-lp"
]


@dataclass(frozen=True, slots=True)
class Job:
    """A federated job: one or more pod sets placed together on one cluster."""

    name: str
    pod_sets: tuple[PodSet, ...]
    tenant: str = "default"
    queue: str = "default"
    priority: int = 0
    gpu_types: frozenset[GpuType] = frozenset()
    cluster_selector: Mapping[str, str] = field(default_factory=dict)
    min_member: int = 0
    schedule_timeout_seconds: int = 600
    policy: PolicyName = "auto"
    allow_burst: bool = False  # may cloud nodes be added for it when nothing local fits
    # Only these clusters may take it (empty: any), e.g. the members that have the runtime
    # a TrainJob names; ``clusters_missing`` says what the others lack, for explain.
    clusters: frozenset[str] = frozenset()
    clusters_missing: str = ""
    # The kind of Kubernetes object its launch creates ("" for a gang of pods, else its
    # workload's kind): an agent-fed member only takes the kinds its agent launches.
    kind: str = ""

    def __post_init__(self) -> None:
        if not self.pod_sets:
            raise ValueError(f"job {self.name}: needs at least one pod set")
        if self.min_member < 0 or self.min_member > self.total_pods:
            raise ValueError(f"job {self.name}: minMember must be within 0..{self.total_pods}")

    @property
    def key(self) -> str:
        return f"{self.tenant}/{self.name}"

    @property
    def total_pods(self) -> int:
        return sum(ps.count for ps in self.pod_sets)

    @property
    def required_pods(self) -> int:
        """Pods that must be placed together: minMember, or all of them."""
        return self.min_member or self.total_pods

    @property
    def elastic(self) -> bool:
        return self.required_pods < self.total_pods

    @property
    def gpu_request_milli(self) -> int:
        return sum(ps.count * ps.resources.gpu_request_milli for ps in self.pod_sets)

    @property
    def launch_kind(self) -> str:
        """What a member's launcher creates for it: ``Pod`` for a gang of pods."""
        return self.kind or "Pod"

    def allows_gpu_type(self, gpu_type: GpuType | None) -> bool:
        return not self.gpu_types or gpu_type in self.gpu_types

    def pods(self) -> list[tuple[str, PodSet]]:
        """Deterministic pod names ``<job>-<podset>-<index>`` with their pod set."""
        return [(f"{self.name}-{ps.name}-{i}", ps) for ps in self.pod_sets for i in range(ps.count)]

    def renamed(self, name: str) -> Job:
        """This job under ``name``, the rest as it is, without ``__init__`` (its checks held
        when this job was made; a restart renames every live job): filled in as _JobSlots,
        then made a Job (``__class__``: the same slots), 0.4 us against 2.2 through them."""
        job: Any = object.__new__(_JobSlots)
        job.name, job.pod_sets, job.tenant = name, self.pod_sets, self.tenant
        job.queue, job.priority, job.gpu_types = self.queue, self.priority, self.gpu_types
        job.cluster_selector, job.min_member = self.cluster_selector, self.min_member
        job.schedule_timeout_seconds, job.policy = self.schedule_timeout_seconds, self.policy
        job.allow_burst, job.clusters = self.allow_burst, self.clusters
        job.clusters_missing, job.kind = self.clusters_missing, self.kind
        job.__class__ = Job
        return cast(Job, job)


class _JobSlots:  # Job's slots, open: what Job.renamed fills in before it becomes a Job
    __slots__ = tuple(f.name for f in fields(Job))


@dataclass(frozen=True, slots=True)
class PodPlacement:
    pod: str
    node: str
    gpus: tuple[int, ...]
    resources: Resources


@dataclass(frozen=True, slots=True)
class Placement:
    """A whole decision for one job: one cluster and a node (and GPUs) for each pod."""

    job: str
    cluster: str
    pods: tuple[PodPlacement, ...]
    policy: str = ""

    @property
    def gpu_milli(self) -> int:
        return sum(p.resources.gpu_request_milli for p in self.pods)


@dataclass(frozen=True, slots=True)
class BurstPool:
    """A cloud node pool that grows a member cluster (a Cluster API MachineDeployment or a
    simulated one): every node it adds is alike, ``node`` being what each offers, and joins
    the domains ``topology_labels`` names (level key -> value) of the levels its cluster
    declares (``topology_levels``)."""

    name: str
    cluster: str
    gpu_type: GpuType
    node: Resources
    min_nodes: int = 0
    max_nodes: int = 0
    cost_per_node_hour: float = 0.0
    provision_seconds: float = 0.0
    cluster_labels: Mapping[str, str] = field(default_factory=dict)
    topology_levels: tuple[str, ...] = ()
    topology_labels: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class PoolState:
    """A pool as the burst planner sees it: its desired size now (ready and coming up),
    nodes coming up that no gang has claimed, and whether it is backing off after a
    failure."""

    pool: BurstPool
    nodes: int
    unclaimed: int = 0
    failing: bool = False


@dataclass(frozen=True, slots=True)
class BurstPlan:
    """Grow ``pool`` by ``nodes`` for ``job`` (``claimed`` of the gang's nodes are already
    coming up unclaimed, so only ``nodes`` are new)."""

    job: str
    pool: str
    cluster: str
    nodes: int
    claimed: int
    cost_per_hour: float

    @property
    def total(self) -> int:
        """Nodes the gang needs from the pool, new and claimed."""
        return self.nodes + self.claimed


@dataclass(frozen=True, slots=True)
class Unplaceable:
    """Why a job does not fit now: the reasons for each cluster, and the largest gang
    (in pods) each cluster could take at node level."""

    job: str
    reasons: tuple[Reason, ...]
    largest_fit: Mapping[str, int] = field(default_factory=dict)

    def for_cluster(self, cluster: str) -> tuple[Reason, ...]:
        return tuple(r for r in self.reasons if r.cluster == cluster)


Decision = Placement | Unplaceable


# Capacity events: what adapters (simulated, Kubernetes, MQTT agents) tell the ledger.


@dataclass(frozen=True, slots=True)
class NodeUpdated:
    cluster: str
    node: Node


@dataclass(frozen=True, slots=True)
class NodeDeleted:
    cluster: str
    node: str


@dataclass(frozen=True, slots=True)
class PodBound:
    """A non-terminal pod bound to a node: its requests count as used, whoever made it.
    ``gpus`` is known for pods the broker placed; the ledger picks GPUs for the others."""

    cluster: str
    pod: str
    node: str
    resources: Resources
    gpus: tuple[int, ...] | None = None


@dataclass(frozen=True, slots=True)
class PodDeleted:
    cluster: str
    pod: str


CapacityEvent = NodeUpdated | NodeDeleted | PodBound | PodDeleted


# What a policy sees of capacity. The ledger's snapshot implements these; policies depend on
# the shape only, so they import nothing but this module.

NodeGroup = tuple[GpuType | None, frozenset[Taint]]
"""Nodes are indexed by group: GPU type and the taints that block untolerating pods."""


class ClusterCapacity(Protocol):
    @property
    def cluster(self) -> Cluster: ...
    @property
    def name(self) -> str: ...
    @property
    def stale(self) -> bool: ...
    @property
    def launchable(self) -> frozenset[str] | None: ...
    @property
    def nodes(self) -> Mapping[str, NodeState]: ...
    def groups(self) -> Iterable[NodeGroup]: ...
    def gpu_types(self) -> set[GpuType | None]: ...
    def by_free_at_least(
        self, group: NodeGroup, milli: int
    ) -> Iterator[tuple[int, Collection[str]]]: ...
    def by_whole_at_least(
        self, group: NodeGroup, whole: int
    ) -> Iterator[tuple[int, Collection[str]]]: ...
    def whole_histogram(self, group: NodeGroup) -> list[tuple[int, int]]: ...
    def gpus_total(self, group: NodeGroup | None = None) -> int: ...
    def free_milli(self, group: NodeGroup | None = None) -> int: ...
    def allocation(self) -> float: ...


class CapacitySnapshot(Protocol):
    @property
    def clusters(self) -> Mapping[str, ClusterCapacity]: ...
    @property
    def version(self) -> int: ...
