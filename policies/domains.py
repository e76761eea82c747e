"""Topology domains of a cluster: which nodes share a level's label value, and a cluster's
capacity seen through one domain's nodes, so a node chooser places inside a domain exactly
as it places in a cluster (``policies.topology`` uses both)."""

from __future__ import annotations

import bisect
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass

from broker.model import (
    MILLI_PER_GPU,
    Cluster,
    ClusterCapacity,
    GpuType,
    Job,
    NodeGroup,
    NodeState,
    PodSet,
)
from broker.taints import blocking
from policies.framework import usable_groups


def domains(
    view: ClusterCapacity,
    key: str,
    within: Collection[str] | None = None,
    pool: Iterable[str] | None = None,
) -> list[tuple[str, list[str]]]:
    """(label value, node names in the cluster's order, or ``pool``'s) for each domain of
    level ``key``, by value; only nodes in ``within`` and ``pool`` when given. O(nodes, or
    the pool's)."""
    found: dict[str, list[str]] = {}
    nodes = view.nodes
    for name in nodes if pool is None else pool:
        value = nodes[name].node.labels.get(key)
        if value is not None and (within is None or name in within):
            found.setdefault(value, []).append(name)
    return sorted(found.items())


class DomainView:
    """A cluster's capacity seen through some of its nodes (as this decision left them):
    what a node chooser reads, so it places inside the domain exactly as in a cluster."""

    def __init__(self, base: ClusterCapacity, states: Iterable[NodeState]) -> None:
        self.cluster: Cluster = base.cluster
        self.stale = base.stale
        self.launchable = base.launchable
        self.nodes: dict[str, NodeState] = {}
        self._free: dict[NodeGroup, dict[int, list[str]]] = {}
        self._whole: dict[NodeGroup, dict[int, list[str]]] = {}
        self._total: dict[NodeGroup, int] = {}
        self._milli: dict[NodeGroup, int] = {}
        for state in states:
            self.nodes[state.name] = state
            node = state.node
            if not node.schedulable:
                continue
            group = (node.gpu_type, blocking(node.taints))
            self._free.setdefault(group, {}).setdefault(state.free_milli, []).append(state.name)
            self._whole.setdefault(group, {}).setdefault(state.whole_free, []).append(state.name)
            self._total[group] = self._total.get(group, 0) + len(state.gpu_free)
            self._milli[group] = self._milli.get(group, 0) + state.free_milli

    @property
    def name(self) -> str:
        return self.cluster.name

    def groups(self) -> Iterable[NodeGroup]:
        return self._free.keys()

    def gpu_types(self) -> set[GpuType | None]:
        return {g[0] for g in self._free}

    def by_free_at_least(
        self, group: NodeGroup, milli: int
    ) -> Iterator[tuple[int, Collection[str]]]:
        return _at_least(self._free.get(group, {}), milli)

    def by_whole_at_least(
        self, group: NodeGroup, whole: int
    ) -> Iterator[tuple[int, Collection[str]]]:
        return _at_least(self._whole.get(group, {}), whole)

    def whole_histogram(self, group: NodeGroup) -> list[tuple[int, int]]:
        return [(k, len(v)) for k, v in sorted(self._whole.get(group, {}).items())]

    def gpus_total(self, group: NodeGroup | None = None) -> int:
        return sum(self._total.values()) if group is None else self._total.get(group, 0)

    def free_milli(self, group: NodeGroup | None = None) -> int:
        return sum(self._milli.values()) if group is None else self._milli.get(group, 0)

    def allocation(self) -> float:
        total = self.gpus_total() * MILLI_PER_GPU
        return 0.0 if total == 0 else 1.0 - self.free_milli() / total


def _at_least(buckets: dict[int, list[str]], least: int) -> Iterator[tuple[int, Collection[str]]]:
    keys = sorted(buckets)
    for k in keys[bisect.bisect_left(keys, least) :]:
        yield k, buckets[k]


# -- the domains a pod set could go to, and their room --------------------------------


def labelled(view: ClusterCapacity, level: str) -> bool:
    """Whether any node of the cluster carries the level's label (remembered by the view:
    labels change only with the nodes, which make a new view)."""
    memo = memo_of(view, None)
    key = ("labelled", level)
    if memo is not None and key in memo:
        return bool(memo[key])
    found = any(level in s.node.labels for s in view.nodes.values())
    if memo is not None:
        memo[key] = found
    return found


def memo_of(
    view: ClusterCapacity, groups: tuple[NodeGroup, ...] | None
) -> dict[object, object] | None:
    """The view's memo of what decisions derive from the nodes of ``groups`` (None: every
    node; ``ClusterView.memo_for``); None for views without one (a decision's own
    ``DomainView``, wrapped views)."""
    memo_for = getattr(view, "memo_for", None)
    return None if memo_for is None else memo_for(groups)


def pool_of(
    view: ClusterCapacity, changed: Mapping[str, NodeState], ps: PodSet, groups: Sequence[NodeGroup]
) -> list[str] | None:
    """For pods of whole GPUs, the only nodes that could take one: those with that many
    whole free GPUs, read off the index (the changed ones first, as a chooser sees them),
    so that a domain costs what it has room in, not its size. None (every node) else."""
    per_pod = ps.resources.gpus
    if not per_pod:
        return None
    allowed = set(groups)
    names = [
        n
        for n, s in changed.items()
        if s.whole_free >= per_pod
        and s.node.schedulable
        and (s.node.gpu_type, blocking(s.node.taints)) in allowed
    ]
    for group in groups:
        for _, bucket in view.by_whole_at_least(group, per_pod):
            names.extend(n for n in bucket if n not in changed)
    return names


Room = Callable[[NodeState], int]


def room_of(ps: PodSet, usable: Sequence[NodeGroup]) -> Room | None:
    """How many of the pod set's whole-GPU pods a node could take by its whole free GPUs
    (CPU and memory aside: a necessary condition) in the ``usable`` groups; None for pods
    of shared or no GPUs."""
    per_pod = ps.resources.gpus
    if not per_pod:
        return None
    groups = set(usable)

    def room(state: NodeState) -> int:
        node = state.node
        usable = node.schedulable and (node.gpu_type, blocking(node.taints)) in groups
        return state.whole_free // per_pod if usable else 0

    return room


@dataclass(frozen=True, slots=True)
class Most:
    best: int
    where: str


# Each domain of a level: (label value, node names, pods of the pod set its nodes together
# could take by whole free GPUs, or None when that is not counted).
Domains = list[tuple[str, list[str], int | None]]


class DomainRooms:
    """The domains of a level as one pod set sees them: only the nodes of its ``pool_of``,
    with their room for its pods. While the decision has changed nothing in the cluster
    (its first pod set with a request, most often its only one) they depend on the view
    and the pod set's shape alone, and are remembered in the view's memo, so the next
    decision on an unchanged cluster reads them instead of walking the pool."""

    def __init__(
        self, view: ClusterCapacity, changed: Mapping[str, NodeState], job: Job, ps: PodSet
    ) -> None:
        self.view, self.changed = view, changed
        groups = tuple(usable_groups(view, job, ps))
        self.room = room_of(ps, groups)
        self.memo = memo_of(view, groups) if not changed and ps.resources.gpus else None
        self.shape = (ps.resources.gpus, groups)
        self._ps = ps
        self._pool: list[str] | None = None
        self._pooled = False

    def state(self, name: str) -> NodeState:
        return self.changed.get(name) or self.view.nodes[name]

    def pool(self) -> list[str] | None:
        if not self._pooled:
            self._pool = pool_of(self.view, self.changed, self._ps, self.shape[1])
            self._pooled = True
        return self._pool

    def of(self, level: str, within: Sequence[str] | None) -> tuple[Domains, Most]:
        """The domains of ``level`` inside ``within``, and the first with the most room."""
        if within is not None or self.room is None:
            room, state = self.room, self.state
            found: Domains = [
                (value, names, None if room is None else sum(room(state(n)) for n in names))
                for value, names in domains(self.view, level, within, self.pool())
            ]
            return found, first_most(found)
        key = ("domains", level, self.shape)
        memo = self.memo
        if memo is None or key not in memo:
            levels = self.view.cluster.topology_levels
            every = {lv: ("domains", lv, self.shape) for lv in {*levels, level}}
            made = {every[lv]: with_most(d) for lv, d in self._all_levels(every).items()}
            if memo is None:
                return made[key]
            for made_key, value in made.items():
                memo[made_key] = value
        return memo[key]  # type: ignore[return-value]

    def _all_levels(self, levels: Iterable[str]) -> dict[str, Domains]:
        """Every level's domains over the pool in one pass. A pool node has room for
        ``whole_free // per_pod`` pods: the pool holds only schedulable nodes of usable
        groups with room for one."""
        per_pod = self._ps.resources.gpus
        state_of = self.state
        found: dict[str, dict[str, tuple[list[str], list[int]]]] = {lv: {} for lv in levels}
        keyed = list(found.items())
        for name in self.pool() or ():
            state = state_of(name)
            room = state.whole_free // per_pod
            labels = state.node.labels
            for lv, by_value in keyed:
                value = labels.get(lv)
                if value is not None:
                    entry = by_value.get(value)
                    if entry is None:
                        entry = by_value[value] = ([], [0])
                    entry[0].append(name)
                    entry[1][0] += room
        return {
            lv: [(v, names, fits[0]) for v, (names, fits) in sorted(by_value.items())]
            for lv, by_value in found.items()
        }


def first_most(found: Domains) -> Most:
    most = Most(0, "")
    for value, _, fits in found:
        if fits is not None and (fits > most.best or not most.where):
            most = Most(fits, value)
    return most


def with_most(found: Domains) -> tuple[Domains, Most]:
    return found, first_most(found)
