"""``fedbroker bench --cycle``: scheduling cycle time and memory with a huge backlog.

The federation is ``--clusters`` x ``--nodes-per-cluster`` nodes of 8 GPUs (default 100 x
500 = 50,000 nodes), pre-filled like ``fedbroker bench`` (a realistic mix, about 70 % of the
GPUs taken); ``--queued`` jobs (default 100,000) wait in one queue: single pods and 8x8
gangs in the proportions of ``fedbroker bench`` (512 : 64), each with a distinct name.
Then scheduling cycles run back to back, exactly as the service runs them
(``broker.core.scheduler.run_cycle``: order the queue, decide up to ``maxJobsPerCycle`` = 1,000
jobs on fresh snapshots, assume what fits), until the federation is full and the cycles only
find jobs that do not fit. Reported: each cycle's wall time (the first ones place, the last
ones are the steady state of a full federation with a backlog), and the process's peak RSS.

The store's writes are not part of it: ``fedbroker bench --e2e`` measures those (group
commits of the cycle's placements).
"""

from __future__ import annotations

import json
import random
import time
from typing import Any

from broker.bench.decisions import build_federation, gang_jobs, max_rss_mib, single_pod_jobs
from broker.config import SchedulerConfig
from broker.core.ledger import Ledger
from broker.core.queue import JobQueue, Pending, QueueSpec
from broker.core.scheduler import PolicyBook, SchedulerSettings, run_cycle
from broker.core.shapes import UnplaceableShapes
from broker.model import Job
from broker.process import release_heap, settle_heap

MAX_CYCLES = 400


def backlog(count: int, seed: int) -> list[Job]:
    """``count`` jobs: single pods and gangs in the ratio 512 : 64, distinct names."""
    rng = random.Random(seed)
    singles = single_pod_jobs(rng, 512)
    gangs = gang_jobs(rng, 64)
    shapes = singles + gangs
    return [
        Job(f"{shape.name}-{i:06d}", shape.pod_sets, gpu_types=shape.gpu_types,
            queue="default")
        for i, shape in ((i, shapes[i % len(shapes)]) for i in range(count))
    ]  # fmt: skip


def run_cycles(clusters: int, nodes_per_cluster: int, queued: int, seed: int) -> dict[str, Any]:
    federation = build_federation(clusters, nodes_per_cluster, seed)
    ledger = federation.ledger
    queue = JobQueue([QueueSpec("default", "auto")])
    started = time.perf_counter()
    for seq, job in enumerate(backlog(queued, seed)):
        queue.push(Pending(job, seq, 0.0))
    queued_s = time.perf_counter() - started
    policies = PolicyBook(queue, seed)
    settle_heap()  # as `fedbroker serve` does once its state is loaded
    defaults = SchedulerConfig()  # the service's: 1,000 decisions or 0.5 s a cycle
    settings = SchedulerSettings(
        max_jobs_per_cycle=defaults.max_jobs_per_cycle,
        max_cycle_seconds=defaults.max_cycle_seconds,
    )
    memo = UnplaceableShapes()  # as the service keeps it from cycle to cycle
    try:
        cycles = _run(queue, ledger, policies, settings, memo)
    finally:
        release_heap()  # a bench run inside a longer process (a test) leaves nothing frozen
    steady = [c["seconds"] for c in cycles if not c["placed"]] or [cycles[-1]["seconds"]]
    return {
        "clusters": clusters,
        "nodes": federation.nodes,
        "gpus": federation.gpus,
        "queued": queued,
        "prefill_gpu_alloc_pct": federation.gpu_alloc_pct,
        "queue_build_s": round(queued_s, 2),
        "cycles": cycles,
        "first_cycle_s": cycles[0]["seconds"],
        "max_cycle_s": max(c["seconds"] for c in cycles),
        "steady_cycle_s": round(sorted(steady)[len(steady) // 2], 4),
        "still_queued": len(queue.pending()),
        "max_rss_mib": round(max_rss_mib(), 1),
    }


def _run(
    queue: JobQueue,
    ledger: Ledger,
    policies: PolicyBook,
    settings: SchedulerSettings,
    memo: UnplaceableShapes,
) -> list[dict[str, Any]]:
    cycles: list[dict[str, Any]] = []
    for n in range(MAX_CYCLES):
        begin = time.perf_counter()
        result = run_cycle(queue, ledger, policies, float(n), settings, memo=memo)
        took = time.perf_counter() - begin
        cycles.append({
            "seconds": round(took, 4), "placed": len(result.admitted),
            "waiting": len(result.waiting), "decided": len(result.decisions),
            "cut_short": result.cut_short,
        })  # fmt: skip
        if not result.admitted and n >= 2:
            break  # full: from here on every cycle is alike
    return cycles


def main_cycle(args: Any) -> int:
    doc = run_cycles(args.clusters, args.nodes_per_cluster, args.queued, args.seed)
    if args.json:
        print(json.dumps(doc))
        return 0
    print(
        f"scheduling cycles: {doc['nodes']:,} nodes in {doc['clusters']} clusters "
        f"({doc['prefill_gpu_alloc_pct']} % of {doc['gpus']:,} GPUs taken), "
        f"{doc['queued']:,} jobs queued, up to 1,000 decisions or 0.5 s per cycle"
    )
    for i, c in enumerate(doc["cycles"]):
        print(f"  cycle {i:2d}: {c['seconds']:.3f} s, decided {c['decided']}, "
              f"placed {c['placed']}, waiting {c['waiting']}")  # fmt: skip
    print(f"  first cycle {doc['first_cycle_s']:.3f} s, slowest {doc['max_cycle_s']:.3f} s, "
          f"steady state (federation full) {doc['steady_cycle_s']:.3f} s")  # fmt: skip
    print(f"  peak RSS {doc['max_rss_mib']} MiB; still queued {doc['still_queued']:,}")
    return 0
