"""The trace simulator's fill protocol: the FGD paper's experiment, on the broker's own core.

Each pod of the (tuned, shuffled) list arrives once and is placed at once through the same
``ledger.snapshot() -> decide() -> ledger.assume()`` path the service uses, or fails
for good; nothing departs. The protocol is spelled out in ../shared/traces/README.md and
followed to the letter (tuning to 130 %, recording points, tie-breaking).
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass
from typing import IO

from adapters.simulated import split_round_robin
from broker.core.decide import decide
from broker.core.ledger import Ledger
from broker.model import MILLI_PER_GPU, Cluster, Job, Node, Placement, PodSet
from broker.sim.traces import TracePod
from policies import make_policy
from policies.fgd import PodShape, popular_shapes

DEFAULT_LOADS = (80, 90, 100, 110, 130)
TUNE_TARGET_PCT = 130


@dataclass(frozen=True, slots=True)
class FillResult:
    policy: str
    load_pct: int
    gpu_alloc_pct: float
    placed: int
    failed: int
    seed: int = 0


def tune(pods: Sequence[TracePod], total_milli: int, rng: random.Random) -> list[TracePod]:
    """Grow (random copies) or shrink (random removals) the list to 130 % of the GPUs, then
    shuffle it. Copies are named ``<pod>#k`` for the k-th copy."""
    if not any(p.resources.gpu_request_milli for p in pods):
        raise ValueError("no pod asks for a GPU: there is nothing to tune the list by")
    target = total_milli * TUNE_TARGET_PCT // 100
    tuned = list(pods)
    load = sum(p.resources.gpu_request_milli for p in tuned)
    copies: dict[str, int] = {}
    if load < target:
        while True:
            pod = pods[rng.randrange(len(pods))]
            if load + pod.resources.gpu_request_milli > target:
                break
            copies[pod.name] = copies.get(pod.name, 0) + 1
            tuned.append(
                TracePod(
                    f"{pod.name}#{copies[pod.name]}",
                    pod.resources,
                    pod.gpu_types,
                    pod.creation_time,
                    pod.deletion_time,
                )
            )
            load += pod.resources.gpu_request_milli
    else:
        while load > target:
            pod = tuned.pop(rng.randrange(len(tuned)))
            load -= pod.resources.gpu_request_milli
    rng.shuffle(tuned)
    return tuned


def federation(nodes: Sequence[Node], clusters: int) -> Ledger:
    ledger = Ledger()
    for i, part in enumerate(split_round_robin(nodes, clusters)):
        ledger.add_cluster(Cluster(f"cluster-{i}"), part)
    return ledger


DumpSink = Callable[[TracePod, Placement], None]


def fill_once(
    nodes: Sequence[Node],
    tuned: Sequence[TracePod],
    policy_name: str,
    clusters: int,
    seed: int,
    loads: Sequence[int] = DEFAULT_LOADS,
    dump: DumpSink | None = None,
) -> list[FillResult]:
    """Run one policy over one tuned list; a result at each recording point."""
    total = sum(n.allocatable.gpus for n in nodes) * MILLI_PER_GPU
    workload = popular_shapes(PodShape.of(p.resources, p.gpu_types) for p in tuned)
    policy = make_policy(policy_name, seed=seed, workload=workload)
    ledger = federation(nodes, clusters)
    pending = sorted(set(loads))
    results: list[FillResult] = []
    arrived = allocated = placed = failed = 0
    for pod in tuned:
        job = Job(pod.name, (PodSet("pod", 1, pod.resources),), gpu_types=pod.gpu_types)
        decision = decide(job, ledger.snapshot(), policy).decision
        if isinstance(decision, Placement):
            ledger.assume(decision)
            ledger.confirm(decision.job)
            allocated += pod.resources.gpu_request_milli
            placed += 1
            if dump is not None:
                dump(pod, decision)
        else:
            failed += 1
        arrived += pod.resources.gpu_request_milli
        while pending and pending[0] < TUNE_TARGET_PCT and arrived * 100 >= pending[0] * total:
            results.append(
                FillResult(
                    policy_name, pending.pop(0), _pct(allocated, total), placed, failed, seed
                )
            )
    results.extend(
        FillResult(policy_name, load, _pct(allocated, total), placed, failed, seed)
        for load in pending
    )
    return results


def _pct(milli: int, total: int) -> float:
    return round(100.0 * milli / total, 2)


def fill(
    nodes: Sequence[Node],
    pods: Sequence[TracePod],
    policies: Sequence[str],
    clusters: int,
    seeds: Sequence[int],
    loads: Sequence[int] = DEFAULT_LOADS,
    dump: IO[str] | None = None,
    workers: int = 1,
) -> list[FillResult]:
    """The fill protocol for every seed and policy (the same tuned list for every policy).

    Runs are independent, so with ``workers`` > 1 they go to a process pool (results keep
    the order of seeds, then policies). Dumping placements runs in this process.
    """
    total = sum(n.allocatable.gpus for n in nodes) * MILLI_PER_GPU
    runs = [
        (tuned, name, seed)
        for seed in seeds
        for tuned in [tune(pods, total, random.Random(seed))]
        for name in policies
    ]
    if workers > 1 and dump is None and len(runs) > 1:
        with ProcessPoolExecutor(max_workers=workers) as pool:
            futures = [
                pool.submit(fill_once, nodes, tuned, name, clusters, seed, loads)
                for tuned, name, seed in runs
            ]
            return [r for f in futures for r in f.result()]
    results: list[FillResult] = []
    for tuned, name, seed in runs:
        sink = _dump_sink(dump) if dump is not None else None
        results.extend(fill_once(nodes, tuned, name, clusters, seed, loads, sink))
    return results


def _dump_sink(out: IO[str]) -> DumpSink:
    def write(pod: TracePod, placement: Placement) -> None:
        for p in placement.pods:
            res = p.resources
            out.write(
                json.dumps(
                    {
                        "pod": pod.name,
                        "cluster": placement.cluster,
                        "node": p.node,
                        "gpu_index": p.gpus[0] if res.shared else None,
                        "num_gpu": res.gpu_count,
                        "gpu_milli": res.per_gpu_milli,
                        "cpu_milli": res.cpu_milli,
                        "memory_mib": res.memory_mib,
                    }
                )
                + "\n"
            )

    return write


def mean_by_policy_and_load(results: Sequence[FillResult]) -> list[dict[str, object]]:
    """Average the per-seed results: one row per (policy, load), in first-seen order."""
    groups: dict[tuple[str, int], list[FillResult]] = {}
    for r in results:
        groups.setdefault((r.policy, r.load_pct), []).append(r)
    rows = []
    for (policy, load), rs in groups.items():
        n = len(rs)
        rows.append(
            {
                "policy": policy,
                "load_pct": load,
                "gpu_alloc_pct": round(sum(r.gpu_alloc_pct for r in rs) / n, 2),
                "placed": round(sum(r.placed for r in rs) / n),
                "failed": round(sum(r.failed for r in rs) / n),
            }
        )
    return rows


def as_dict(result: FillResult) -> dict[str, object]:
    return asdict(result)
