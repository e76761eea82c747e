"""The replay's synthetic topology: racks (and blocks) laid over each member cluster's
nodes, the rack-level requests given to the gangs, and how many domains each gang spans.

No public trace says which rack a node sits in, so the simulator lays one: each cluster's
nodes (after the round-robin split, so a rack never straddles two clusters) are grouped by
``adapters.simulated.lay_topology`` into racks of ``nodes_per_rack`` alike nodes (same GPU
type and size, as real racks hold one kind of node), and racks into blocks of
``racks_per_block``; every cluster declares the levels ``[block, rack]`` (or ``[rack]``).
Label values repeat from cluster to cluster (``b0-r0`` in each): domains are per cluster.
The burst pool's nodes, when there is one, join one block and one rack of their own
(``burst``, ``burst-r0``), as a cloud pool in one placement group would, and its cluster
declares the same levels, so a rack-level gang may burst there.

Requests: with ``request`` ``required`` or ``preferred``, every job of more than one pod (a
gang, as the report counts them) gets ``TopologyRequest(required=rack)`` or
``(preferred=rack)`` on each pod set; single pods get none. ``none`` lays the topology but
requests nothing, which is the control: the same gangs placed node by node as without a
topology, whose spans the report measures all the same.

Report, per policy, over the gangs that started (first start): how many racks and blocks
each spans (distinct label values of the nodes its pods run on; mean, p95, max), and the
wait of all gangs (p50, p95; a gang never started counts with its wait so far).
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from adapters.simulated import lay_topology
from broker.model import Cluster, Node, Placement, TopologyRequest
from broker.sim.arrivals import Arrival, Workload

RACK_LEVEL = "cloud.provider.com/topology-rack"
BLOCK_LEVEL = "cloud.provider.com/topology-block"
BURST_LABELS = {BLOCK_LEVEL: "burst", RACK_LEVEL: "burst-r0"}

# The replay's percentile: (values, pct) -> a value that occurred, or None when empty.
PercentileFn = Callable[[Sequence[float], float], float | None]

RequestMode = Literal["none", "required", "preferred"]
REQUEST_MODES: tuple[RequestMode, ...] = ("none", "required", "preferred")


@dataclass(frozen=True, slots=True)
class TopologyConfig:
    """Racks of ``nodes_per_rack`` nodes, blocks of ``racks_per_block`` racks (0: no block
    level), and the request the gangs carry."""

    nodes_per_rack: int
    racks_per_block: int = 0
    request: RequestMode = "none"

    def __post_init__(self) -> None:
        if self.nodes_per_rack < 1 or self.racks_per_block < 0:
            raise ValueError("nodes_per_rack must be at least 1, racks_per_block at least 0")
        if self.request not in REQUEST_MODES:
            raise ValueError(f"request must be one of {', '.join(REQUEST_MODES)}")

    @property
    def levels(self) -> tuple[str, ...]:
        return (BLOCK_LEVEL, RACK_LEVEL) if self.racks_per_block else (RACK_LEVEL,)

    def lay(self, nodes: Sequence[Node]) -> list[Node]:
        return lay_topology(nodes, self.levels, self.nodes_per_rack, self.racks_per_block)

    def burst_labels(self) -> dict[str, str]:
        return {key: BURST_LABELS[key] for key in self.levels}

    def as_doc(self) -> dict[str, object]:
        return {
            "levels": list(self.levels),
            "nodes_per_rack": self.nodes_per_rack,
            "racks_per_block": self.racks_per_block,
            "request": self.request,
        }


def topology_config(args: argparse.Namespace) -> TopologyConfig | None:
    """The CLI's topology: None without ``--racks-of``."""
    racks = getattr(args, "racks_of", None)
    if racks is None:
        return None
    blocks = getattr(args, "blocks_of", None) or 0
    return TopologyConfig(racks, blocks, getattr(args, "topology_request", "none"))


def cluster(name: str, config: TopologyConfig | None) -> Cluster:
    return Cluster(name, topology_levels=config.levels if config is not None else ())


def with_requests(workload: Workload, config: TopologyConfig | None) -> Workload:
    """The workload with every gang's pod sets asking for the config's rack request."""
    if config is None or config.request == "none":
        return workload
    if config.request == "required":
        topo = TopologyRequest(required=RACK_LEVEL)
    else:
        topo = TopologyRequest(preferred=RACK_LEVEL)

    def ask(a: Arrival) -> Arrival:
        if not a.gang:
            return a
        sets = tuple(dataclasses.replace(ps, topology=topo) for ps in a.job.pod_sets)
        return dataclasses.replace(a, job=dataclasses.replace(a.job, pod_sets=sets))

    return dataclasses.replace(workload, arrivals=tuple(ask(a) for a in workload.arrivals))


@dataclass(slots=True)
class Spans:
    """Per started gang, the distinct domains of each level its pods run on (first start).
    ``labels``: each known node's labels by (cluster, node); ``other``: the labels of nodes
    not known at the start (the burst pool's)."""

    levels: tuple[str, ...]
    labels: dict[tuple[str, str], Mapping[str, str]]
    other: Mapping[str, str] = field(default_factory=dict)
    spans: dict[str, tuple[int, ...]] = field(default_factory=dict)

    @staticmethod
    def of(
        levels: tuple[str, ...], clusters: Iterable[tuple[str, Sequence[Node]]],
        other: Mapping[str, str],
    ) -> Spans:  # fmt: skip
        labels = {(name, n.name): n.labels for name, nodes in clusters for n in nodes}
        return Spans(levels, labels, other)

    def record(self, placement: Placement) -> None:
        if placement.job in self.spans or len(placement.pods) < 2:
            return
        seen: list[set[str | None]] = [set() for _ in self.levels]
        for pod in placement.pods:
            labels = self.labels.get((placement.cluster, pod.node), self.other)
            for i, key in enumerate(self.levels):
                seen[i].add(labels.get(key))
        self.spans[placement.job] = tuple(len(s) for s in seen)


def span_fields(
    spans: Spans | None, gang_waits: Sequence[float], percentile: PercentileFn
) -> dict[str, object]:
    """The result's topology fields: racks and blocks spanned (mean, p95, max) over the
    started gangs, and the gangs' waits (p50, p95). All None without a topology."""
    out: dict[str, object] = dict.fromkeys(TOPOLOGY_FIELDS)
    if spans is None:
        return out
    out["topology_gangs"] = len(spans.spans)
    out["topology_gang_wait_p50_s"] = percentile(gang_waits, 50)
    out["topology_gang_wait_p95_s"] = percentile(gang_waits, 95)
    for i, key in enumerate(spans.levels):
        name = "racks" if key == RACK_LEVEL else "blocks"
        values = [float(s[i]) for s in spans.spans.values()]
        if values:
            out[f"{name}_spanned_mean"] = round(sum(values) / len(values), 3)
            out[f"{name}_spanned_p95"] = percentile(values, 95)
            out[f"{name}_spanned_max"] = max(values)
    return out


TOPOLOGY_FIELDS = (
    "topology_gangs",
    "racks_spanned_mean",
    "racks_spanned_p95",
    "racks_spanned_max",
    "blocks_spanned_mean",
    "blocks_spanned_p95",
    "blocks_spanned_max",
    "topology_gang_wait_p50_s",
    "topology_gang_wait_p95_s",
)

_COLUMNS = (
    ("gangs", "topology_gangs"),
    ("racks mean", "racks_spanned_mean"),
    ("racks p95", "racks_spanned_p95"),
    ("racks max", "racks_spanned_max"),
    ("blocks mean", "blocks_spanned_mean"),
    ("blocks p95", "blocks_spanned_p95"),
    ("blocks max", "blocks_spanned_max"),
    ("wait p50", "topology_gang_wait_p50_s"),
    ("wait p95", "topology_gang_wait_p95_s"),
)


def print_table(rows: Sequence[Mapping[str, object]], config: TopologyConfig) -> None:
    blocks = f", blocks of {config.racks_per_block} racks" if config.racks_per_block else ""
    print(
        f"topology: racks of {config.nodes_per_rack} alike nodes{blocks} in each cluster; "
        f"gangs (more than one pod) request: {config.request} rack; domains spanned by the "
        "gangs started, waits of all gangs"
    )
    print(f"{'policy':<10}" + "".join(f"{head:>12}" for head, _ in _COLUMNS))
    for row in rows:
        cells = "".join(f"{_cell(row.get(key)):>12}" for _, key in _COLUMNS)
        print(f"{row['policy']!s:<10}{cells}")


def _cell(value: object) -> str:
    if isinstance(value, float):
        return f"{value:.2f}" if not value.is_integer() else f"{value:.0f}"
    return "-" if value is None else str(value)
