"""A cluster's topology domains as read-model rows: per declared level (a node label key,
widest first), its domains with their free whole nodes and GPUs, and per GPU type the
largest gang of ``GANG_GPUS``-GPU pods that fits inside one domain (``largestGang`` of
``/v1/clusters``, per level: the figure a topology-required gang of whole-node pods
compares against).

One pass over the cluster's nodes per level, so it costs O(nodes x levels) and nothing on a
cluster that declares no level; ``DomainRows`` keeps each cluster's rows until its view
changes (the ledger copies a view on write), so repeated reads (``/metrics``, the event
stream, the dashboard) of an unchanged cluster are free. At most ``DOMAINS_SHOWN`` domains
of a level are listed (by label value, digits compared as numbers); the rest are counted.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from broker.model import MILLI_PER_GPU, ClusterCapacity

GANG_GPUS = 8  # the read model's gangs are of pods of this many whole GPUs
DOMAINS_SHOWN = 64  # per level; a cluster of thousands of racks lists these, counts the rest
_DIGITS = re.compile(r"(\d+)")


def natural_key(value: str) -> tuple[tuple[int, str], ...]:
    """Sort key where runs of digits compare as numbers: ``r2`` before ``r10``."""
    return tuple((int(part), "") if part.isdigit() else (-1, part) for part in _DIGITS.split(value))


def short_name(key: str) -> str:
    """A level's short name for a view: ``rack`` for ``cloud.provider.com/topology-rack``,
    ``hostname`` for ``kubernetes.io/hostname`` (the last path segment, after its last dash)."""
    return key.rsplit("/", 1)[-1].rsplit("-", 1)[-1] or key


@dataclass(frozen=True, slots=True)
class DomainRow:
    """One domain (label value): its schedulable GPU nodes, those with every GPU free, and
    their GPUs (free: milli-GPUs free, in GPUs)."""

    domain: str
    nodes: int
    free_nodes: int
    gpus: int
    free_gpus: float

    def as_json(self) -> dict[str, Any]:
        return {
            "domain": self.domain, "nodes": self.nodes, "freeNodes": self.free_nodes,
            "gpus": self.gpus, "freeGpus": self.free_gpus,
        }  # fmt: skip


@dataclass(frozen=True, slots=True)
class DomainGang:
    """Per GPU type: the largest gang of GANG_GPUS-GPU pods placeable inside one domain of
    the level now, and the domain ("" when none takes one pod)."""

    gpu_type: str
    largest_gang: int
    domain: str

    def as_json(self) -> dict[str, Any]:
        return {"gpuType": self.gpu_type, "largestGang": self.largest_gang, "domain": self.domain}


@dataclass(frozen=True, slots=True)
class LevelRow:
    """One declared level: its listed domains, how many more there are, how many
    schedulable GPU nodes carry no value for it, and the largest gang per GPU type."""

    level: str
    name: str
    domains: tuple[DomainRow, ...]
    more: int
    unlabelled: int
    largest_gangs: tuple[DomainGang, ...]

    def as_json(self) -> dict[str, Any]:
        return {
            "level": self.level, "name": self.name,
            "domains": [d.as_json() for d in self.domains], "more": self.more,
            "unlabelled": self.unlabelled,
            "largestGangs": [g.as_json() for g in self.largest_gangs],
            "gangGpusPerPod": GANG_GPUS,
        }  # fmt: skip


def level_rows(view: ClusterCapacity, shown: int = DOMAINS_SHOWN) -> tuple[LevelRow, ...]:
    """The rows of every level ``view``'s cluster declares (none: ``()``)."""
    return tuple(_level(view, key, shown) for key in view.cluster.topology_levels)


def _level(view: ClusterCapacity, key: str, shown: int) -> LevelRow:
    # value -> [nodes, free nodes, gpus, free milli]; (value, type) -> pods of GANG_GPUS
    sums: dict[str, list[int]] = {}
    gangs: dict[tuple[str, str], int] = {}
    types: set[str] = set()
    unlabelled = 0
    for state in view.nodes.values():
        node = state.node
        if not node.schedulable or not state.gpu_free:
            continue
        gpu_type = str(node.gpu_type or "")
        if gpu_type:
            types.add(gpu_type)
        value = node.labels.get(key)
        if value is None:
            unlabelled += 1
            continue
        s = sums.setdefault(value, [0, 0, 0, 0])
        s[0] += 1
        s[1] += state.whole_free == len(state.gpu_free)
        s[2] += len(state.gpu_free)
        s[3] += state.free_milli
        if gpu_type:
            k = (value, gpu_type)
            gangs[k] = gangs.get(k, 0) + state.whole_free // GANG_GPUS
    order = sorted(sums, key=natural_key)
    rows = tuple(
        DomainRow(v, s[0], s[1], s[2], s[3] / MILLI_PER_GPU)
        for v in order[:shown]
        for s in (sums[v],)
    )
    return LevelRow(
        key, short_name(key), rows, max(0, len(order) - shown), unlabelled,
        _largest(order, gangs, types),
    )  # fmt: skip


def _largest(
    order: list[str], gangs: Mapping[tuple[str, str], int], types: set[str]
) -> tuple[DomainGang, ...]:
    """Per GPU type (every type the cluster has, 0 where no domain takes a pod), the domain
    with the most pods; the first in ``order`` among equals."""
    best: dict[str, DomainGang] = {t: DomainGang(t, 0, "") for t in types}
    rank = {v: i for i, v in enumerate(order)}
    for (value, gpu_type), pods in gangs.items():
        have = best[gpu_type]
        if pods > have.largest_gang or (
            pods == have.largest_gang and pods and rank[value] < rank[have.domain]
        ):
            best[gpu_type] = DomainGang(gpu_type, pods, value)
    return tuple(best[t] for t in sorted(best))


class DomainRows:
    """``level_rows`` per cluster, kept while the cluster's view is the same object (the
    ledger never changes a view it handed out in a snapshot: it writes a copy)."""

    def __init__(self) -> None:
        self._kept: dict[str, tuple[ClusterCapacity, tuple[LevelRow, ...]]] = {}

    def of(self, view: ClusterCapacity) -> tuple[LevelRow, ...]:
        if not view.cluster.topology_levels:
            self._kept.pop(view.name, None)
            return ()
        kept = self._kept.get(view.name)
        if kept is not None and kept[0] is view:
            return kept[1]
        rows = level_rows(view)
        self._kept[view.name] = (view, rows)
        return rows
