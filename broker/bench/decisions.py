"""``fedbroker bench``: placement decisions per second of the core, and how they scale.

This module owns the benchmark: it generates a synthetic federation (clusters of 8-GPU nodes
of mixed types with realistic CPU and memory), pre-fills it through the real
``Ledger.assume`` to about 60 % GPU allocation with a seeded mix of whole-GPU, multi-GPU and
shared-GPU pods, and then times the core exactly as the scheduler drives it: one decision is
``ledger.snapshot()`` + ``decide()`` + ``ledger.assume()`` + ``ledger.forget()``, so
every decision sees the same federation. Single pods go through binpack, gangs of 8 pods x
8 GPUs through the gang policy, on one thread (one CPU core). Building, measuring and the
state fingerprint are separate functions so tests can check that the loop leaves no residue.
Figures are printed, never asserted: a slow machine is not a failure.
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import resource
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from broker.core.decide import decide
from broker.core.ledger import Ledger
from broker.core.views import Snapshot
from broker.model import (
    MILLI_PER_GPU,
    Cluster,
    GpuType,
    Job,
    Node,
    NodeState,
    Placement,
    PodPlacement,
    PodSet,
    Resources,
)
from broker.taints import Taint
from policies import make_policy
from policies.framework import Policy

GPUS_PER_NODE = 8
PREFILL_TARGET = 0.60
SCALING_NODES = (2_000, 50_000)
ROUNDS = 3
# The acceptance floor at 10,000 nodes (kube-scheduler's CI floor is 680-810 pods/s
# at 5,000 nodes; Armada claims about 1,000 pods/s).
TARGET_NODES = 10_000
TARGET_SINGLE_PER_S = 5_000
TARGET_GANG_PER_S = 1_000
GiB = 1024  # MiB


@dataclass(frozen=True, slots=True)
class NodeKind:
    gpu_type: str
    cpu_milli: int
    memory_mib: int
    weight: float


# Common 8-GPU servers (DGX H100, DGX A100, 8 x L40S, 8 x V100 like p3.16xlarge), in the
# proportions of a fleet that still runs its older generation.
NODE_KINDS: tuple[NodeKind, ...] = (
    NodeKind("H100", 224_000, 2048 * GiB, 0.25),
    NodeKind("A100", 256_000, 1024 * GiB, 0.35),
    NodeKind("L40S", 192_000, 1536 * GiB, 0.20),
    NodeKind("V100", 64_000, 488 * GiB, 0.20),
)
REGIONS = ("eu", "us", "ap")


@dataclass(frozen=True, slots=True)
class Federation:
    ledger: Ledger
    clusters: int
    nodes: int
    gpus: int
    build_s: float
    prefill_s: float
    gpu_alloc_pct: float


@dataclass(frozen=True, slots=True)
class Measurement:
    decisions: int
    per_s: float
    cpu_seconds: float
    unplaceable: int

    @property
    def per_cpu_s(self) -> float:
        """Decisions per second of this process's CPU time, all rounds together: less
        sensitive than ``per_s`` to other processes sharing the machine."""
        return self.decisions / max(self.cpu_seconds, 1e-9)


@dataclass(frozen=True, slots=True)
class Point:
    """One size of federation and its figures (one row of the table, one JSON object)."""

    clusters: int
    nodes_per_cluster: int
    nodes: int
    gpus: int
    gpu_alloc_pct: float
    build_s: float
    prefill_s: float
    single_pod_decisions_per_s: float
    gang_decisions_per_s: float
    single_pod_decisions_per_cpu_s: float
    gang_decisions_per_cpu_s: float
    single_pod_unplaceable: int
    gang_unplaceable: int
    max_rss_mib: float


# -- building the federation ---------------------------------------------------------------


def generate_cluster_nodes(cluster: int, count: int, rng: random.Random) -> list[Node]:
    kinds = rng.choices(NODE_KINDS, weights=[k.weight for k in NODE_KINDS], k=count)
    return [
        Node(
            f"c{cluster:03d}-n{i:05d}",
            GpuType(kind.gpu_type),
            Resources(gpus=GPUS_PER_NODE, cpu_milli=kind.cpu_milli, memory_mib=kind.memory_mib),
            labels={"gpu-type": kind.gpu_type},
        )
        for i, kind in enumerate(kinds)
    ]


def build_federation(
    clusters: int, nodes_per_cluster: int, seed: int, target: float = PREFILL_TARGET
) -> Federation:
    """``clusters`` x ``nodes_per_cluster`` nodes, pre-filled to about ``target``."""
    rng = random.Random(seed)
    started = time.perf_counter()
    ledger = Ledger()
    for c in range(clusters):
        cluster = Cluster(f"cluster-{c:03d}", labels={"region": REGIONS[c % len(REGIONS)]})
        ledger.add_cluster(cluster, generate_cluster_nodes(c, nodes_per_cluster, rng))
    built = time.perf_counter()
    prefill(ledger, rng, target)
    filled = time.perf_counter()
    snapshot = ledger.snapshot()
    total = sum(v.gpus_total() for v in snapshot.clusters.values())
    free = sum(v.free_milli() for v in snapshot.clusters.values())
    alloc = 0.0 if total == 0 else 100.0 * (1 - free / (total * MILLI_PER_GPU))
    return Federation(
        ledger,
        clusters,
        clusters * nodes_per_cluster,
        total,
        built - started,
        filled - built,
        round(alloc, 2),
    )


def prefill(ledger: Ledger, rng: random.Random, target: float = PREFILL_TARGET) -> None:
    """Fill each node to a drawn level through ``ledger.assume`` + ``confirm`` (running pods).

    Levels are bimodal, as binpacking leaves a fleet: about a third of the nodes full, some
    empty, the rest anywhere between, averaging ``target``. Pods are a realistic mix (whole
    single GPUs, 2/4/8-GPU pods, shares of one GPU), so the indexes get varied buckets.
    """
    full = target / 2
    partial_levels = range(1, GPUS_PER_NODE)
    partial_mean = sum(partial_levels) / len(partial_levels)
    # The partial share that brings the mean level to ``target``; the rest stay empty.
    partial = (target - full) * GPUS_PER_NODE / partial_mean
    empty = max(0.0, 1 - full - partial)
    snapshot = ledger.snapshot()
    for cluster, view in snapshot.clusters.items():
        for name, state in view.nodes.items():
            roll = rng.random()
            if roll < full:
                level = GPUS_PER_NODE * MILLI_PER_GPU
            elif roll < full + empty:
                continue
            else:
                level = rng.choice(partial_levels) * MILLI_PER_GPU
            pods = _fill_node(state, level, rng)
            if pods:
                job = f"prefill-{name}"
                placed = tuple(
                    PodPlacement(f"{job}-{i}", name, gpus, res)
                    for i, (res, gpus) in enumerate(pods)
                )
                ledger.assume(Placement(job, cluster, placed, "prefill"))
                ledger.confirm(job)


def _fill_node(
    state: NodeState, level: int, rng: random.Random
) -> list[tuple[Resources, tuple[int, ...]]]:
    alloc = state.node.allocatable
    cpu_per_gpu = alloc.cpu_milli // GPUS_PER_NODE
    mem_per_gpu = alloc.memory_mib // GPUS_PER_NODE
    pods: list[tuple[Resources, tuple[int, ...]]] = []
    used = 0
    while level - used > 0:
        room = level - used
        roll = rng.random()
        if roll < 0.25 or room < MILLI_PER_GPU:
            milli = min(room, rng.choice((250, 500, 750)))
            res = Resources(
                gpu_milli=milli,
                cpu_milli=cpu_per_gpu * milli // MILLI_PER_GPU // 2,
                memory_mib=mem_per_gpu * milli // MILLI_PER_GPU // 2,
            )
        else:
            want = rng.choice((1, 1, 1, 2, 2, 4, 8))
            gpus = max(1, min(want, room // MILLI_PER_GPU))
            res = Resources(
                gpus=gpus, cpu_milli=cpu_per_gpu * gpus * 3 // 4, memory_mib=mem_per_gpu * gpus // 2
            )
        taken = state.gpus_for(res)
        if taken is None:
            break  # the rest of the level is fragments no pod of the mix fits
        state = state.take(res, taken)
        pods.append((res, taken))
        used += res.gpu_request_milli
    return pods


# -- the jobs measured ---------------------------------------------------------------------


def single_pod_jobs(rng: random.Random, count: int = 512) -> list[Job]:
    """Single pods of 1, 2 or 4 GPUs or a share of one; a fifth ask for A100 or H100."""
    jobs = []
    for i in range(count):
        roll = rng.random()
        if roll < 0.25:
            milli = rng.choice((250, 500))
            res = Resources(gpu_milli=milli, cpu_milli=4_000, memory_mib=16 * GiB)
        else:
            gpus = 1 if roll < 0.6 else (2 if roll < 0.85 else 4)
            res = Resources(gpus=gpus, cpu_milli=gpus * 6_000, memory_mib=gpus * 48 * GiB)
        types = frozenset({GpuType("A100"), GpuType("H100")}) if rng.random() < 0.2 else frozenset()
        jobs.append(Job(f"bench-pod-{i}", (PodSet("main", 1, res),), gpu_types=types))
    return jobs


def gang_jobs(rng: random.Random, count: int = 64) -> list[Job]:
    """Gangs of 8 pods x 8 whole GPUs; a fifth ask for A100 or H100."""
    res = Resources(gpus=8, cpu_milli=48_000, memory_mib=384 * GiB)
    jobs = []
    for i in range(count):
        types = frozenset({GpuType("A100"), GpuType("H100")}) if rng.random() < 0.2 else frozenset()
        jobs.append(Job(f"bench-gang-{i}", (PodSet("worker", 8, res),), gpu_types=types))
    return jobs


# -- measuring -------------------------------------------------------------------------------


def measure(
    ledger: Ledger,
    policy: Policy,
    jobs: Sequence[Job],
    decisions: int,
    warmup: int = 0,
    rounds: int = ROUNDS,
) -> Measurement:
    """Time ``decisions`` decisions (snapshot + decide + assume + forget) after ``warmup``
    untimed ones, cycling through ``jobs``. The decisions are timed in ``rounds`` equal
    rounds and the median round's rate is reported, so one burst of noise from another
    process on the machine does not make the figure."""
    rounds = max(1, min(rounds, decisions))
    per_round = decisions // rounds
    n = len(jobs)
    for i in range(warmup):
        _decide_once(ledger, policy, jobs[i % n])
    gc.collect()  # start from a clean heap, not from the build's garbage
    unplaceable = 0
    rates = []
    cpu_start = time.process_time()
    i = 0
    for r in range(rounds):
        count = per_round if r < rounds - 1 else decisions - per_round * (rounds - 1)
        start = time.perf_counter()
        for _ in range(count):
            if not _decide_once(ledger, policy, jobs[i % n]):
                unplaceable += 1
            i += 1
        elapsed = time.perf_counter() - start
        rates.append(count / max(elapsed, 1e-9))
    cpu_seconds = time.process_time() - cpu_start
    return Measurement(decisions, statistics.median(rates), cpu_seconds, unplaceable)


def _decide_once(ledger: Ledger, policy: Policy, job: Job) -> bool:
    """One decision through the core's path (``decide``: precheck, then the policy), then
    assume and forget."""
    decision = decide(job, ledger.snapshot(), policy).decision
    if not isinstance(decision, Placement):
        return False
    ledger.assume(decision)
    ledger.forget(decision.job)
    return True


def _taint_keys(taints: frozenset[Taint]) -> list[str]:
    return sorted(f"{t.key}={t.value}:{t.effect}" for t in taints)


def snapshot_state(snapshot: Snapshot) -> dict[str, object]:
    """What a decision can see in a snapshot, as a comparable value: node states, index
    buckets and totals. Bucket members are sorted: assume + forget moves a node to the end
    of its bucket, which changes which of equally full nodes is named first, not capacity."""
    clusters: dict[str, object] = {}
    for name, view in snapshot.clusters.items():
        groups: dict[str, object] = {}
        for group in sorted(view.groups(), key=lambda g: (str(g[0]), _taint_keys(g[1]))):
            by_free = [(k, sorted(names)) for k, names in view.by_free_at_least(group, 0)]
            by_whole = [(k, sorted(names)) for k, names in view.by_whole_at_least(group, 0)]
            key = f"{group[0]}|{','.join(_taint_keys(group[1]))}"
            groups[key] = (by_free, by_whole, view.gpus_total(group), view.free_milli(group))
        totals = (view.gpus_total(), view.free_milli())
        clusters[name] = (view.stale, dict(view.nodes), groups, totals)
    return clusters


def ledger_state(ledger: Ledger) -> dict[str, object]:
    """The ledger's capacity (as snapshot_state) and its reservations."""
    return {
        "clusters": snapshot_state(ledger.snapshot()),
        "reservations": dict(ledger.reservations()),
    }


def measure_point(
    clusters: int, nodes_per_cluster: int, decisions: int, seed: int, single_policy: str = "binpack"
) -> Point:
    """Build one federation, time both kinds of decision on it, and let it go."""
    fed = build_federation(clusters, nodes_per_cluster, seed)
    jobs_rng = random.Random(seed + 1)
    singles, gangs = single_pod_jobs(jobs_rng), gang_jobs(jobs_rng)
    warmup = min(500, max(1, decisions // 10))
    single = measure(fed.ledger, make_policy(single_policy, seed), singles, decisions, warmup)
    gang = measure(fed.ledger, make_policy("gang", seed), gangs, decisions, warmup)
    return Point(
        clusters,
        nodes_per_cluster,
        fed.nodes,
        fed.gpus,
        fed.gpu_alloc_pct,
        round(fed.build_s, 3),
        round(fed.prefill_s, 3),
        round(single.per_s, 1),
        round(gang.per_s, 1),
        round(single.per_cpu_s, 1),
        round(gang.per_cpu_s, 1),
        single.unplaceable,
        gang.unplaceable,
        round(max_rss_mib(), 1),
    )


def max_rss_mib() -> float:
    # ru_maxrss is the process's high-water mark, in KiB on Linux and bytes on macOS.
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss / (1024 * 1024) if sys.platform == "darwin" else rss / 1024


# -- the command -----------------------------------------------------------------------------


def run_bench(args: argparse.Namespace) -> int:
    npc: int = args.nodes_per_cluster
    sizes = [(args.clusters, npc)]
    if args.scaling:
        # Scale by adding clusters of the same size (the federation grows by members).
        sizes += [(max(1, nodes // npc), npc) for nodes in SCALING_NODES]
    # Ascending, so each point's peak RSS is that federation's, not a larger earlier one's.
    sizes = sorted(set(sizes), key=lambda s: s[0] * s[1])
    points = [
        measure_point(c, per_cluster, args.decisions, args.seed, args.single_policy)
        for c, per_cluster in sizes
    ]
    main = points[sizes.index((args.clusters, npc))]
    if args.json:
        # The main point's figures (the Point's fields), then how they were measured.
        doc: dict[str, object] = {
            **asdict(main),
            "single_pod_policy": args.single_policy,
            "decisions": args.decisions,
            "rounds": ROUNDS,
            "seed": args.seed,
        }
        if args.scaling:
            doc["scaling"] = [asdict(p) for p in points]
        print(json.dumps(doc))
    else:
        _print_table(points, main, args.decisions, args.seed, args.single_policy)
    return 0


def _print_table(
    points: Sequence[Point], main: Point, decisions: int, seed: int, single_policy: str
) -> None:
    print(
        f"placement core on one CPU core: {decisions} decisions of each kind per row "
        f"(snapshot + decide + assume + forget), median of {ROUNDS} rounds, seed {seed}"
    )
    print(
        f"{'nodes':>7}{'clusters':>9}{'alloc %':>8}{'build s':>9}{'prefill s':>10}"
        f"{'single/s':>10}{'gang/s':>9}{'unplaced':>9}{'max RSS MiB':>12}"
    )
    for p in points:
        print(
            f"{p.nodes:>7}{p.clusters:>9}{p.gpu_alloc_pct:>8.1f}{p.build_s:>9.2f}"
            f"{p.prefill_s:>10.2f}{p.single_pod_decisions_per_s:>10.0f}"
            f"{p.gang_decisions_per_s:>9.0f}"
            f"{p.single_pod_unplaceable + p.gang_unplaceable:>9}{p.max_rss_mib:>12.0f}"
        )
    print(
        f"single: one pod (1/2/4 GPUs or a share) by {single_policy}; gang: 8 pods x 8 GPUs by gang"
    )
    if len(points) > 1:
        print(f"scaling: the federation grows by clusters of {main.nodes_per_cluster} nodes")
    print(
        f"per second of CPU time at {main.nodes} nodes: single "
        f"{main.single_pod_decisions_per_cpu_s:.0f}, gang {main.gang_decisions_per_cpu_s:.0f}"
    )
    if main.nodes != TARGET_NODES:
        return
    print(
        f"against the issue's floor at 10,000 nodes: single "
        f"{main.single_pod_decisions_per_s / TARGET_SINGLE_PER_S:.2f} x {TARGET_SINGLE_PER_S:,}/s, "
        f"gang {main.gang_decisions_per_s / TARGET_GANG_PER_S:.2f} x {TARGET_GANG_PER_S:,}/s"
    )
