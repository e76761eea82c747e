"""``fedbroker bench --topology``: gang decisions per second with topology requests, against
the same decisions without them, on the same jobs and the same federation. The federation is
``fedbroker bench``'s (8-GPU nodes of mixed types, pre-filled to about 60 % through the real
ledger) with the simulator's topology laid over each cluster's nodes
(``adapters.simulated.lay_topology``): racks of ``rack_nodes`` alike nodes, blocks of
``block_racks`` racks, both levels declared (block, then rack). The gangs are the
benchmark's gangs (8 pods x 8 GPUs, a fifth asking for A100 or H100) decided by the gang
policy three ways: without a request, with a required rack and with a preferred rack. Each
figure is timed as ``fedbroker bench`` times its own (snapshot + decide + assume + forget,
median of its rounds), and the ratio of the figure without requests to each figure with them
is what the issue bounds (1.5).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass

from adapters.simulated import lay_topology
from broker.bench.decisions import (
    GPUS_PER_NODE,
    gang_jobs,
    generate_cluster_nodes,
    measure,
    prefill,
)
from broker.core.ledger import Ledger
from broker.model import MILLI_PER_GPU, Cluster, Job, PodSet, TopologyRequest
from policies import make_policy

BLOCK = "bench.fedbroker.io/topology-block"
RACK = "bench.fedbroker.io/topology-rack"
RACK_NODES = 16
BLOCK_RACKS = 8


@dataclass(frozen=True, slots=True)
class TopologyPoint:
    """One federation's figures: decisions/s (and unplaceable) per kind of request."""

    clusters: int
    nodes: int
    rack_nodes: int
    block_racks: int
    gpu_alloc_pct: float
    per_s: dict[str, float]
    per_cpu_s: dict[str, float]
    unplaceable: dict[str, int]

    def ratio(self, kind: str) -> float:
        """How many times slower ``kind`` decides than the same gangs without a request."""
        return self.per_s["none"] / max(self.per_s[kind], 1e-9)


def build_topology_federation(
    clusters: int, nodes_per_cluster: int, seed: int, rack_nodes: int, block_racks: int
) -> Ledger:
    """``fedbroker bench``'s federation (same seed, same nodes and fill) with the topology
    laid over it and its levels declared."""
    rng = random.Random(seed)
    ledger = Ledger()
    for c in range(clusters):
        cluster = Cluster(f"cluster-{c:03d}", topology_levels=(BLOCK, RACK))
        nodes = generate_cluster_nodes(c, nodes_per_cluster, rng)
        ledger.add_cluster(cluster, lay_topology(nodes, (BLOCK, RACK), rack_nodes, block_racks))
    prefill(ledger, rng)
    return ledger


def with_request(jobs: Sequence[Job], request: TopologyRequest | None) -> list[Job]:
    return [
        dataclasses.replace(
            j, pod_sets=tuple(PodSet(p.name, p.count, p.resources, p.tolerations, request)
                              for p in j.pod_sets)
        )
        for j in jobs
    ]  # fmt: skip


KINDS: dict[str, TopologyRequest | None] = {
    "none": None,
    "required_rack": TopologyRequest(required=RACK),
    "preferred_rack": TopologyRequest(preferred=RACK),
}


def measure_topology(
    clusters: int, nodes_per_cluster: int, decisions: int, seed: int,
    rack_nodes: int = RACK_NODES, block_racks: int = BLOCK_RACKS,
) -> TopologyPoint:  # fmt: skip
    ledger = build_topology_federation(clusters, nodes_per_cluster, seed, rack_nodes, block_racks)
    gangs = gang_jobs(random.Random(seed + 1))
    warmup = min(500, max(1, decisions // 10))
    per_s, per_cpu_s, unplaced = {}, {}, {}
    for kind, request in KINDS.items():
        m = measure(ledger, make_policy("gang", seed), with_request(gangs, request), decisions,
                    warmup)  # fmt: skip
        per_s[kind], per_cpu_s[kind] = round(m.per_s, 1), round(m.per_cpu_s, 1)
        unplaced[kind] = m.unplaceable
    snapshot = ledger.snapshot()
    total = sum(v.gpus_total() for v in snapshot.clusters.values())
    free = sum(v.free_milli() for v in snapshot.clusters.values())
    alloc = round(100.0 * (1 - free / max(1, total * MILLI_PER_GPU)), 2)
    return TopologyPoint(
        clusters, clusters * nodes_per_cluster, rack_nodes, block_racks, alloc, per_s,
        per_cpu_s, unplaced,
    )  # fmt: skip


def main_topology(args: argparse.Namespace) -> int:
    started = time.perf_counter()
    p = measure_topology(
        args.clusters, args.nodes_per_cluster, args.decisions, args.seed, args.rack_nodes,
        args.block_racks,
    )  # fmt: skip
    if args.json:
        doc = {**dataclasses.asdict(p), "decisions": args.decisions, "seed": args.seed}
        doc["ratio"] = {k: round(p.ratio(k), 2) for k in KINDS if k != "none"}
        print(json.dumps(doc))
        return 0
    print(
        f"gangs of 8 pods x {GPUS_PER_NODE} GPUs by gang on {p.nodes} nodes ({p.clusters} "
        f"clusters, {p.gpu_alloc_pct:.1f} % allocated), racks of {p.rack_nodes} nodes, blocks "
        f"of {p.block_racks} racks: {args.decisions} decisions of each kind, seed {args.seed}"
    )
    print(f"{'request':<16}{'decisions/s':>12}{'per CPU s':>11}{'unplaced':>10}{'x slower':>10}")
    for kind in KINDS:
        print(
            f"{kind:<16}{p.per_s[kind]:>12.0f}{p.per_cpu_s[kind]:>11.0f}"
            f"{p.unplaceable[kind]:>10}{p.ratio(kind):>10.2f}"
        )
    print(f"({time.perf_counter() - started:.0f} s in all)")
    return 0
