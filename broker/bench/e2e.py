"""``fedbroker bench --e2e``: submissions through HTTP to placements, end to end.

One process runs the real service (store, scheduler loop, simulated clusters, aiohttp API on
a loopback port) and an open-loop load generator that POSTs single-GPU jobs at a fixed rate
through a real HTTP client, so the figures include JSON/YAML parsing, authentication, the
store commit behind every 201, the scheduling cycle and the store writes of each placement.
Reported: sustained submissions/s, 201 latency p50/p99, and submit-to-placed latency
p50/p99 read from each job's stored history (Queued -> Placed), on the server's clock.
A benchmark, not a test: nothing fails on a slow machine.
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import secrets
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from broker.bench.decisions import max_rss_mib
from broker.config import Config, parse_config
from broker.http.app import make_app
from broker.process import run_loop, settle_heap
from broker.service.facade import Service


def job_body(name: str) -> bytes:
    """A one-GPU FederatedJob as JSON, the API's usual content type for programs."""
    return json.dumps(
        {
            "apiVersion": "fedbroker.io/v1alpha1",
            "kind": "FederatedJob",
            "metadata": {"name": name},
            "spec": {
                "queue": "bench",
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


def bench_config(data_dir: Path, token: str, clusters: int, nodes_per_cluster: int) -> Config:
    store = f"sqlite://{data_dir / 'bench.db'}"
    doc = bench_document(store, token, clusters, nodes_per_cluster)
    return parse_config(json.dumps(doc), "bench config", {})


def bench_document(
    store_url: str, token: str, clusters: int, nodes_per_cluster: int
) -> dict[str, Any]:
    """The benchmarks' config document: one tenant ``bench`` with a binpack queue ``bench``
    on simulated clusters of 8-GPU nodes."""
    cluster_list = [
        {
            "name": f"sim-{i:03d}",
            "source": {
                "simulated": {
                    "shapes": [
                        {
                            "gpuType": "A100",
                            "gpus": 8,
                            "cpu": "96",
                            "memory": "768Gi",
                            "count": nodes_per_cluster,
                        }
                    ]
                }
            },
        }
        for i in range(clusters)
    ]
    return {
        "store": {"url": store_url},
        "api": {"rateLimitPerTenant": {"requestsPerSecond": 100000.0, "burst": 100000}},
        "scheduler": {"cycleSeconds": 0.05},
        "clusters": cluster_list,
        "queues": [{"name": "bench", "policy": "binpack"}],
        "tenants": [{"name": "bench", "defaultQueue": "bench", "queues": ["bench"],
                     "token": {"value": token}}],
    }  # fmt: skip


def percentile(values: Sequence[float], pct: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(pct / 100 * (len(ordered) - 1))))
    return ordered[index]


async def run_e2e(jobs: int, rate: float, clusters: int, nodes_per_cluster: int) -> dict[str, Any]:
    token = secrets.token_urlsafe(32)  # 43 characters: at least 32 outside the demo
    with tempfile.TemporaryDirectory(prefix="fedbroker-bench-") as tmp:
        config = bench_config(Path(tmp), token, clusters, nodes_per_cluster)
        service = Service(config)
        await service.start()
        settle_heap()  # as `fedbroker serve` does once started
        service.spawn_loop()
        runner = web.AppRunner(make_app(service, config), access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        try:
            return await _load(service, f"http://127.0.0.1:{port}", token, jobs, rate)
        finally:
            await runner.cleanup()
            await service.close()


def _generate(base: str, token: str, jobs: int, rate: float, out: Any) -> None:
    """The load generator's process: its own interpreter and core, like a real client
    (its collector tuned as the broker's, so its own pauses do not count as latency)."""
    settle_heap()
    out.put(run_loop(_submit_all(base, token, jobs, rate)))


async def _submit_all(
    base: str, token: str, jobs: int, rate: float
) -> tuple[list[float], int, float]:
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    acked: list[float] = []
    failed = 0
    connector = aiohttp.TCPConnector(limit=64)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def submit(i: int) -> None:
            nonlocal failed
            body = job_body(f"job-{i:06d}")
            started = time.perf_counter()
            async with session.post(f"{base}/v1/jobs", data=body, headers=headers) as resp:
                await resp.read()
                if resp.status == 201:
                    acked.append(time.perf_counter() - started)
                else:
                    failed += 1

        begin = time.perf_counter()
        async with asyncio.TaskGroup() as group:
            for i in range(jobs):
                # Open loop: the i-th request leaves at i / rate, whatever the server does.
                delay = begin + i / rate - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
                group.create_task(submit(i))
        return acked, failed, time.perf_counter() - begin


async def _load(service: Service, base: str, token: str, jobs: int, rate: float) -> dict[str, Any]:
    ctx = multiprocessing.get_context("spawn")
    results: Any = ctx.Queue()
    generator = ctx.Process(target=_generate, args=(base, token, jobs, rate, results))
    cpu_before = time.process_time()
    generator.start()
    try:
        # The broker keeps serving on this loop while the generator runs elsewhere.
        acked, failed, submitted_in = await asyncio.to_thread(results.get, True, 600)
    finally:
        await asyncio.to_thread(generator.join, 30)
    # Wait (bounded) for the scheduler to place every acknowledged job.
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if not await service.store.list_jobs(state="Queued", limit=1):
            break
        await asyncio.sleep(0.05)
    # CPU the broker process (all its threads) spent taking and placing the jobs: less
    # sensitive than latency to whatever else the machine runs, so comparable across runs.
    cpu_s = time.process_time() - cpu_before
    placed_latency: list[float] = []
    placed_at: list[float] = []
    for record in await service.store.list_jobs(limit=jobs + 1):
        history = await service.store.history(record.tenant, record.name)
        queued = next((t.at for t in history if t.state == "Queued"), None)
        placed = next((t.at for t in history if t.state == "Placed"), None)
        if queued is not None and placed is not None:
            placed_latency.append(placed - queued)
            placed_at.append(placed)
    span = (max(placed_at) - min(placed_at)) if len(placed_at) > 1 else 0.0
    return {
        "jobs": jobs,
        "target_rate_per_s": rate,
        "acknowledged": len(acked),
        "failed": failed,
        "placed": len(placed_latency),
        "sustained_submissions_per_s": round(len(acked) / submitted_in, 1),
        "ack_p50_ms": round(1000 * percentile(acked, 50), 2),
        "ack_p99_ms": round(1000 * percentile(acked, 99), 2),
        "submit_to_placed_p50_ms": round(1000 * percentile(placed_latency, 50), 2),
        "submit_to_placed_p99_ms": round(1000 * percentile(placed_latency, 99), 2),
        # Placements over the span from the first to the last, as the service recorded them.
        "placements_per_s": round(len(placed_at) / span, 1) if span > 0 else None,
        # The broker's process (service + API; the load generator runs in another one).
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
    print(f"  placements/s              {doc['placements_per_s']}")
    print(f"  broker peak RSS           {doc['broker_max_rss_mib']} MiB")
    print(f"  broker CPU per job        {doc['broker_cpu_ms_per_job']} ms")
    print(f"  acknowledged {doc['acknowledged']}, failed {doc['failed']}, placed {doc['placed']}")
    return 0
