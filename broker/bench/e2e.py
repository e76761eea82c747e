"""``fedbroker bench --e2e``: submissions through HTTP to placements, end to end.

One process runs the real service (store, scheduler loop, simulated clusters, aiohttp API on
a loopback port: ``broker.bench.serving``) and another an open-loop load generator that
POSTs single-GPU jobs at a fixed rate through a real HTTP client, so the figures include
JSON/YAML parsing, authentication, the store commit behind every 201, the scheduling cycle
and the store writes of each placement. Reported: sustained submissions/s, 201 latency
p50/p99, submit-to-placed latency p50/p99 from the service's own job events (creation ->
first Placed, on the server's clock: ``broker.bench.probes``), event-loop lag and GC
pauses, the broker's CPU per job and its RSS with every job live (nothing is read back
afterwards, so the figure is the service's, not the benchmark's). A benchmark, not a
test: nothing fails on a slow machine.
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import secrets
import tempfile
import time
from pathlib import Path
from typing import Any

from broker.bench.decisions import max_rss_mib
from broker.bench.probes import probing, rss_mib
from broker.bench.serving import BENCH_TENANT, bench_config, open_loop, percentile, serving
from broker.process import run_loop, settle_heap
from broker.service.facade import Service

# How long the run waits after the last answer for every acknowledged job to be placed.
PLACE_TIMEOUT_S = 120.0


def job_body(name: str) -> bytes:
    """A one-GPU FederatedJob as JSON, the API's usual content type for programs."""
    return json.dumps(
        {
            "apiVersion": "fedbroker.io/v1alpha1",
            "kind": "FederatedJob",
            "metadata": {"name": name},
            "spec": {
                "queue": BENCH_TENANT,
                "podSets": [
                    {
                        "name": "main",
                        "count": 1,
                        "resources": {"nvidia.com/gpu": 1, "cpu": "4", "memory": "16Gi"},
                    }
                ],
            },
        }
    ).encode()


async def run_e2e(jobs: int, rate: float, clusters: int, nodes_per_cluster: int) -> dict[str, Any]:
    token = secrets.token_urlsafe(32)  # 43 characters: at least 32 outside the demo
    with tempfile.TemporaryDirectory(prefix="fedbroker-bench-") as tmp:
        url = f"sqlite://{Path(tmp) / 'bench.db'}"
        config = bench_config(url, token, clusters, nodes_per_cluster)
        async with serving(config) as (service, base):
            return await _load(service, base, token, jobs, rate)


def _generate(base: str, token: str, jobs: int, rate: float, out: Any) -> None:
    """The load generator's process: its own interpreter and core, like a real client
    (its collector tuned as the broker's, so its own pauses do not count as latency)."""
    settle_heap()
    acked: list[float] = []
    failed = 0

    def answered(i: int, started: float, finished: float, ok: bool) -> None:
        nonlocal failed
        if ok:
            acked.append(finished - started)
        else:
            failed += 1

    submitted_in = run_loop(open_loop(base, token, jobs, rate, _body, answered))
    out.put((acked, failed, submitted_in))


def _body(i: int) -> bytes:
    return job_body(f"job-{i:06d}")


async def _load(service: Service, base: str, token: str, jobs: int, rate: float) -> dict[str, Any]:
    ctx = multiprocessing.get_context("spawn")
    results: Any = ctx.Queue()
    generator = ctx.Process(target=_generate, args=(base, token, jobs, rate, results))
    async with probing(service.bus) as probes:
        cpu_before = time.process_time()
        generator.start()
        try:
            # The broker keeps serving on this loop while the generator runs elsewhere.
            acked, failed, submitted_in = await asyncio.to_thread(results.get, True, 1800)
        finally:
            await asyncio.to_thread(generator.join, 30)
        # Wait (bounded) until the probe has seen every acknowledged job placed.
        await probes.placements.wait_placed(len(acked), PLACE_TIMEOUT_S)
        # CPU the broker process (all its threads) spent taking and placing the jobs: less
        # sensitive than latency to whatever else the machine runs, so comparable across
        # runs. RSS now, with every job live: nothing below reads them all back.
        cpu_s = time.process_time() - cpu_before
        rss_now = rss_mib()
        probes.check()
        placed = probes.placements.take()
        lag, pauses = probes.lag.take(), probes.pauses.take()
    return {
        "jobs": jobs,
        "target_rate_per_s": rate,
        "acknowledged": len(acked),
        "failed": failed,
        "placed": len(placed),
        "sustained_submissions_per_s": round(len(acked) / submitted_in, 1),
        "ack_p50_ms": round(1000 * percentile(acked, 50), 2),
        "ack_p99_ms": round(1000 * percentile(acked, 99), 2),
        # From the service's own job events (creation -> first Placed), on its clock.
        "submit_to_placed_p50_ms": round(1000 * percentile(placed, 50), 2),
        "submit_to_placed_p99_ms": round(1000 * percentile(placed, 99), 2),
        "loop_lag_p99_ms": round(1000 * percentile(lag, 99), 2),
        "gc_pause_p99_ms": round(1000 * percentile(pauses, 99), 2),
        "gc_pause_max_ms": round(1000 * max(pauses, default=0.0), 2),
        # The broker's process (service + API; the load generator runs in another one).
        "broker_rss_mib": round(rss_now, 1),
        "broker_max_rss_mib": round(max_rss_mib(), 1),
        "broker_cpu_ms_per_job": round(1000 * cpu_s / max(1, len(acked)), 3),
    }


def main_e2e(args: Any) -> int:
    """``fedbroker bench --e2e``: the clusters are ``--clusters`` x ``--nodes-per-cluster``
    8-GPU nodes (default 20 x 500, room for every job at once)."""
    doc = run_loop(run_e2e(args.jobs, float(args.rate), args.clusters, args.nodes_per_cluster))
    if args.json:
        print(json.dumps(doc))
        return 0
    print(
        f"end to end over HTTP: {doc['jobs']} single-GPU jobs offered at {args.rate}/s to "
        f"{args.clusters} simulated clusters x {args.nodes_per_cluster} nodes, SQLite store"
    )
    print(f"  sustained submissions/s   {doc['sustained_submissions_per_s']}")
    print(f"  201 latency p50 / p99    {doc['ack_p50_ms']} / {doc['ack_p99_ms']} ms")
    print(
        "  submit -> placed p50/p99 "
        f"{doc['submit_to_placed_p50_ms']} / {doc['submit_to_placed_p99_ms']} ms"
    )
    print(f"  loop lag p99 / GC p99/max {doc['loop_lag_p99_ms']} / {doc['gc_pause_p99_ms']}"
          f"/{doc['gc_pause_max_ms']} ms")  # fmt: skip
    print(f"  broker RSS / peak         {doc['broker_rss_mib']} / {doc['broker_max_rss_mib']} MiB")
    print(f"  broker CPU per job        {doc['broker_cpu_ms_per_job']} ms")
    print(f"  acknowledged {doc['acknowledged']}, failed {doc['failed']}, placed {doc['placed']}")
    return 0
