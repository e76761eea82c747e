"""Topology domains of a cluster: which nodes share a level's label value, and a cluster's
capacity seen through one domain's nodes, so a node chooser places inside a domain exactly
as it places in a cluster (``policies.topology`` uses both)."""

from __future__ import annotations

import bisect
from collections.abc import Collection, Iterable, Iterator

from broker.model import (
    MILLI_PER_GPU,
    Cluster,
    ClusterCapacity,
    GpuType,
    NodeGroup,
    NodeState,
)
from broker.taints import blocking


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
