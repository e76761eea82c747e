"""Capacity as a decision reads it: indexed cluster views, snapshots, filtered snapshots.

A ``ClusterView`` is one cluster's nodes, indexed per node group (GPU type, blocking taints)
by free GPU milli and by whole free GPUs, so policies and the precheck answer "which nodes
have room for this pod" in O(buckets). The ledger writes views (its ``_put``/``_drop``/
``_copy``); a ``Snapshot`` freezes them, and the ledger copies a frozen view on its next
write to that cluster. ``without`` and ``only`` filter a snapshot by cluster: clusters held
for a starving gang hidden, or one cluster alone (preemption's what-if, ``explain``).
"""

from __future__ import annotations

import bisect
from collections.abc import Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass, field

from broker.model import (
    MILLI_PER_GPU,
    CapacitySnapshot,
    Cluster,
    ClusterCapacity,
    GpuType,
    Node,
    NodeGroup,
    NodeState,
)
from broker.taints import blocking


@dataclass(slots=True)
class _GroupIndex:
    """Per-group buckets: nodes by total free GPU milli, and by count of whole free GPUs.

    Buckets are copied on write, one by one: a copy shares every bucket with the frozen
    index it came from (``shared_*`` hold their keys) and copies a bucket the first time it
    changes it. The ledger's first write after a snapshot then costs O(buckets), not
    O(nodes), and the frozen index, which a snapshot may hold, never changes.
    """

    by_free: dict[int, dict[str, None]] = field(default_factory=dict)
    free_keys: list[int] = field(default_factory=list)
    by_whole: dict[int, dict[str, None]] = field(default_factory=dict)
    whole_keys: list[int] = field(default_factory=list)
    gpus_total: int = 0
    free_milli: int = 0
    nodes: int = 0
    shared_free: set[int] = field(default_factory=set)
    shared_whole: set[int] = field(default_factory=set)

    def copy(self) -> _GroupIndex:
        return _GroupIndex(
            dict(self.by_free),
            list(self.free_keys),
            dict(self.by_whole),
            list(self.whole_keys),
            self.gpus_total,
            self.free_milli,
            self.nodes,
            set(self.by_free),
            set(self.by_whole),
        )

    def add(self, state: NodeState) -> None:
        _bucket_add(self.by_free, self.free_keys, self.shared_free, state.free_milli, state.name)
        _bucket_add(self.by_whole, self.whole_keys, self.shared_whole, state.whole_free, state.name)
        self.gpus_total += len(state.gpu_free)
        self.free_milli += state.free_milli
        self.nodes += 1

    def remove(self, state: NodeState) -> None:
        _bucket_remove(self.by_free, self.free_keys, self.shared_free, state.free_milli, state.name)
        _bucket_remove(
            self.by_whole, self.whole_keys, self.shared_whole, state.whole_free, state.name
        )
        self.gpus_total -= len(state.gpu_free)
        self.free_milli -= state.free_milli
        self.nodes -= 1


def _bucket_add(
    buckets: dict[int, dict[str, None]], keys: list[int], shared: set[int], key: int, name: str
) -> None:
    bucket = buckets.get(key)
    if bucket is None:
        buckets[key] = bucket = {}
        bisect.insort(keys, key)
    elif key in shared:
        shared.discard(key)
        buckets[key] = bucket = dict(bucket)
    bucket[name] = None


def _bucket_remove(
    buckets: dict[int, dict[str, None]], keys: list[int], shared: set[int], key: int, name: str
) -> None:
    bucket = buckets[key]
    if key in shared:
        shared.discard(key)
        buckets[key] = bucket = dict(bucket)
    del bucket[name]
    if not bucket:
        del buckets[key]
        del keys[bisect.bisect_left(keys, key)]


def _at_least(
    buckets: dict[int, dict[str, None]], keys: list[int], least: int
) -> Iterator[tuple[int, Collection[str]]]:
    for i in range(bisect.bisect_left(keys, least), len(keys)):
        yield keys[i], buckets[keys[i]].keys()


def group_of(node: Node) -> NodeGroup:
    return (node.gpu_type, blocking(node.taints))


class ClusterView:
    """One cluster's capacity, indexed. Read-only once a snapshot holds it."""

    __slots__ = (
        "_free_milli", "_frozen", "_gpus_total", "_groups", "_memo", "cluster", "launchable",
        "nodes", "stale",
    )  # fmt: skip

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.stale = False
        # The job kinds its launcher creates (None: any); an agent-fed member's agent says.
        self.launchable: frozenset[str] | None = None
        self.nodes: dict[str, NodeState] = {}
        self._groups: dict[NodeGroup, _GroupIndex] = {}
        # Cluster-wide totals of the groups' own, kept so allocation() (which binpack's
        # cluster order asks of every cluster in every decision) is O(1).
        self._gpus_total = 0
        self._free_milli = 0
        self._frozen = False
        # What policies derived from the nodes of some groups (None: from every node), kept
        # for the next decision that reads them (see ``memo_for``).
        self._memo: dict[tuple[NodeGroup, ...] | None, dict[object, object]] = {}

    # -- reading (policies) -------------------------------------------------------------

    @property
    def name(self) -> str:
        return self.cluster.name

    def groups(self) -> Iterable[NodeGroup]:
        return self._groups.keys()

    def gpu_types(self) -> set[GpuType | None]:
        return {g[0] for g, idx in self._groups.items() if idx.nodes}

    def by_free_at_least(
        self, group: NodeGroup, milli: int
    ) -> Iterator[tuple[int, Collection[str]]]:
        """Buckets of schedulable nodes of ``group`` with at least ``milli`` free GPU milli
        in total, fullest first: (free milli, node names)."""
        idx = self._groups.get(group)
        return iter(()) if idx is None else _at_least(idx.by_free, idx.free_keys, milli)

    def by_whole_at_least(
        self, group: NodeGroup, whole: int
    ) -> Iterator[tuple[int, Collection[str]]]:
        """Buckets of schedulable nodes of ``group`` with at least ``whole`` completely free
        GPUs, fullest first: (whole free GPUs, node names)."""
        idx = self._groups.get(group)
        return iter(()) if idx is None else _at_least(idx.by_whole, idx.whole_keys, whole)

    def whole_histogram(self, group: NodeGroup) -> list[tuple[int, int]]:
        """(whole free GPUs, number of nodes) for each non-empty bucket: O(buckets)."""
        idx = self._groups.get(group)
        if idx is None:
            return []
        return [(k, len(idx.by_whole[k])) for k in idx.whole_keys]

    def gpus_total(self, group: NodeGroup | None = None) -> int:
        if group is not None:
            idx = self._groups.get(group)
            return idx.gpus_total if idx else 0
        return self._gpus_total

    def free_milli(self, group: NodeGroup | None = None) -> int:
        if group is not None:
            idx = self._groups.get(group)
            return idx.free_milli if idx else 0
        return self._free_milli

    def allocation(self) -> float:
        """Share of the cluster's schedulable GPU capacity taken (0..1)."""
        total = self.gpus_total() * MILLI_PER_GPU
        return 0.0 if total == 0 else 1.0 - self.free_milli() / total

    def memo_for(self, groups: tuple[NodeGroup, ...] | None) -> dict[object, object]:
        """A policy's memo of what it derived from the nodes of ``groups`` (None: of every
        node), such as topology domains and their room. It lives as long as those nodes
        stay as they are, bucket order included: a write forgets the memos of the groups
        it touches (and the every-node one), and a copy keeps the others, so a decision
        after an assumption in one group still reads the others' memos."""
        memo = self._memo.get(groups)
        if memo is None:
            memo = self._memo[groups] = {}
        return memo

    # -- writing (ledger only) ----------------------------------------------------------

    def _copy(self) -> ClusterView:
        view = ClusterView(self.cluster)
        view.stale = self.stale
        view.launchable = self.launchable
        view.nodes = dict(self.nodes)
        view._groups = {g: idx.copy() for g, idx in self._groups.items()}
        view._gpus_total = self._gpus_total
        view._free_milli = self._free_milli
        view._memo = dict(self._memo)
        return view

    def _forget(self, state: NodeState) -> None:
        """Drop the memos that depend on ``state``'s node (as it was or as it becomes)."""
        memo = self._memo
        memo.pop(None, None)
        if memo and state.node.schedulable:
            group = group_of(state.node)
            for key in [k for k in memo if k is not None and group in k]:
                del memo[key]

    def _put(self, state: NodeState) -> None:
        old = self.nodes.get(state.name)
        if self._memo:
            self._forget(state)
            if old is not None:
                self._forget(old)
        if old is not None:
            self._unindex(old)
        self.nodes[state.name] = state
        if state.node.schedulable:
            group = group_of(state.node)
            idx = self._groups.get(group)
            if idx is None:
                self._groups[group] = idx = _GroupIndex()
            idx.add(state)
            self._gpus_total += len(state.gpu_free)
            self._free_milli += state.free_milli

    def _drop(self, name: str) -> None:
        old = self.nodes.pop(name)
        if self._memo:
            self._forget(old)
        self._unindex(old)

    def _unindex(self, old: NodeState) -> None:
        if old.node.schedulable:
            self._groups[group_of(old.node)].remove(old)
            self._gpus_total -= len(old.gpu_free)
            self._free_milli -= old.free_milli


@dataclass(frozen=True, slots=True)
class Snapshot:
    """An immutable view of every cluster, taken in O(clusters)."""

    clusters: Mapping[str, ClusterView]
    version: int

    def node(self, cluster: str, node: str) -> NodeState:
        return self.clusters[cluster].nodes[node]


class Filtered:
    """A snapshot of the given cluster views (some of a snapshot's only, made by ``without``
    or ``only``; or wrapped, as the dry runs' budgeted views)."""

    __slots__ = ("_clusters", "_version")

    def __init__(self, clusters: Mapping[str, ClusterCapacity], version: int) -> None:
        self._clusters = clusters
        self._version = version

    @property
    def clusters(self) -> Mapping[str, ClusterCapacity]:
        return self._clusters

    @property
    def version(self) -> int:
        return self._version


def without(snapshot: CapacitySnapshot, hidden: Collection[str]) -> Filtered:
    """``snapshot`` with the clusters named in ``hidden`` left out."""
    clusters = {n: v for n, v in snapshot.clusters.items() if n not in hidden}
    return Filtered(clusters, snapshot.version)


def only(snapshot: CapacitySnapshot, cluster: str) -> Filtered:
    """``snapshot`` showing ``cluster`` alone (no cluster at all if it is not a member)."""
    view = snapshot.clusters.get(cluster)
    return Filtered({} if view is None else {cluster: view}, snapshot.version)
