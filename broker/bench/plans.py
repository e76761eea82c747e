"""``fedbroker bench --plans``: one tenant's read latency while others ask for dry runs.

One process runs the real service (store, scheduler loop, simulated clusters, aiohttp API
on a loopback port: ``broker.bench.serving``); another runs the clients, as ``--e2e``
does. A reader tenant reads ``GET /v1/clusters`` at a steady 200/s (open loop), first alone
(``quiet``), then while four clients of another tenant, holding a read-only token, each
send a maximum-size ``POST /v1/plan`` (four pod sets of 1,024 one-GPU pods, on a binpack
queue: the costliest "no" a policy gives) at most every ``PLAN_PACE_S`` seconds, well
inside their rate limit (``busy``). Reported: the reader's p50, p99 and maximum in both
phases (and the reads not answered), and what the plans were answered (200, 429 because
the planner was busy, 429 because a plan ran out of its time budget). A benchmark, not a
test: nothing fails on a slow machine.
"""

from __future__ import annotations

import asyncio
import json
import math
import multiprocessing
import queue
import secrets
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import aiohttp

from broker.bench.serving import BENCH_TENANT, bench_document, percentile, serving
from broker.config import parse_config
from broker.manifest.fields import MAX_PODS, MAX_PODS_PER_SET
from broker.process import run_loop, settle_heap

PLANNERS = 4
PLANNER_TENANT = "planners"
# Each planner client sends a plan at most this often (5/s: well inside the default rate
# limit of 100 requests/s per tenant, and a 429 is not asked again sooner either). The
# bench config's rate limit is higher than the default, for the reader's sake.
PLAN_PACE_S = 0.2
# The reader's pace: one read every 5 ms, each on its own (open loop).
READ_RATE = 200.0


def plans_document(
    store_url: str, reader: str, planner: str, clusters: int, nodes_per_cluster: int
) -> dict[str, Any]:
    """The bench federation with its one binpack queue, the reader tenant (``bench``) and
    the planners' tenant, whose only token may read (and so plan) and nothing else."""
    doc = bench_document(store_url, reader, clusters, nodes_per_cluster)
    doc["tenants"].append(
        {"name": PLANNER_TENANT, "defaultQueue": BENCH_TENANT,
         "tokens": [{"name": "read-only", "value": planner, "roles": ["read"]}]}
    )  # fmt: skip
    return doc


def plan_body() -> bytes:
    """The largest FederatedJob a tenant may plan: MAX_PODS one-GPU pods in sets of
    MAX_PODS_PER_SET."""
    sets = MAX_PODS // MAX_PODS_PER_SET
    pod_sets = [
        {"name": f"w{i}", "count": MAX_PODS_PER_SET,
         "resources": {"nvidia.com/gpu": 1, "cpu": "1", "memory": "1Gi"}}
        for i in range(sets)
    ]  # fmt: skip
    return json.dumps(
        {"apiVersion": "fedbroker.io/v1alpha1", "kind": "FederatedJob",
         "metadata": {"name": "largest"}, "spec": {"podSets": pod_sets}}
    ).encode()  # fmt: skip


async def run_plans(reads: int, clusters: int, nodes_per_cluster: int) -> dict[str, Any]:
    reader, planner = secrets.token_urlsafe(32), secrets.token_urlsafe(32)
    with tempfile.TemporaryDirectory(prefix="fedbroker-bench-") as tmp:
        url = f"sqlite://{Path(tmp) / 'bench.db'}"
        doc = plans_document(url, reader, planner, clusters, nodes_per_cluster)
        config = parse_config(json.dumps(doc), "bench config", {})
        async with serving(config) as (_, base):
            ctx = multiprocessing.get_context("spawn")
            results: Any = ctx.Queue()
            clients = ctx.Process(target=_clients, args=(base, reader, planner, reads, results))
            clients.start()
            try:
                measured: dict[str, Any] = await asyncio.to_thread(_result, clients, results)
            finally:
                await asyncio.to_thread(clients.join, 30)
    return {"clusters": clusters, "nodes": clusters * nodes_per_cluster, **measured}


def _result(clients: Any, results: Any) -> dict[str, Any]:
    """The clients' figures, or RuntimeError once their process ended without any."""
    while True:
        try:
            found: dict[str, Any] = results.get(True, 1.0)
            return found
        except queue.Empty:
            if not clients.is_alive():
                raise RuntimeError(f"the clients' process ended ({clients.exitcode})") from None


def _clients(base: str, reader: str, planner: str, reads: int, out: Any) -> None:
    """The clients' process: its own interpreter and core, like real clients."""
    settle_heap()
    out.put(run_loop(_measure(base, reader, planner, reads)))


async def _measure(base: str, reader: str, planner: str, reads: int) -> dict[str, Any]:
    answers: Counter[str] = Counter()
    plan_seconds: list[float] = []
    async with aiohttp.ClientSession() as reading, aiohttp.ClientSession() as planning:
        quiet = await _reads(reading, base, reader, reads, answers)
        stop = asyncio.Event()
        planners = [
            asyncio.create_task(_planner(planning, base, planner, stop, answers, plan_seconds))
            for _ in range(PLANNERS)
        ]
        try:
            busy = await _reads(reading, base, reader, reads, answers)
        finally:
            stop.set()
            await asyncio.gather(*planners)
    return {
        "reads": reads,
        "planners": PLANNERS,
        "quiet_p50_ms": _ms(percentile(quiet, 50)),
        "quiet_p99_ms": _ms(percentile(quiet, 99)),
        "quiet_max_ms": _ms(max(quiet, default=math.nan)),
        "busy_p50_ms": _ms(percentile(busy, 50)),
        "busy_p99_ms": _ms(percentile(busy, 99)),
        "busy_max_ms": _ms(max(busy, default=math.nan)),
        "reads_failed": answers["reads"],
        "plans_answered": answers["200"],
        "plans_refused_busy": answers["busy"],
        "plans_refused_budget": answers["budget"],
        "plans_other": answers["other"],
        "plan_p50_ms": _ms(percentile(plan_seconds, 50)),
    }


def _ms(seconds: float) -> float:
    return round(1000 * seconds, 2)


async def _reads(
    session: aiohttp.ClientSession, base: str, token: str, count: int, failed: Counter[str]
) -> list[float]:
    """``count`` reads of ``/v1/clusters`` at READ_RATE, open loop: each sent at its time
    whatever the answers, its latency counted from that time, so that a stalled broker
    counts for every read it holds up (a reader that waits for each answer would take one
    slow sample per stall and many fast ones between). The seconds of each answered one;
    the others (not a 200, or no answer within aiohttp's 5 minutes) counted in ``failed``."""
    headers = {"Authorization": f"Bearer {token}"}
    took: list[float] = []

    async def read(due: float) -> None:
        try:
            async with session.get(f"{base}/v1/clusters", headers=headers) as resp:
                await resp.read()
                ok = resp.status == 200
        except (aiohttp.ClientError, TimeoutError):
            ok = False
        if ok:
            took.append(time.perf_counter() - due)
        else:
            failed["reads"] += 1

    begin = time.perf_counter()
    async with asyncio.TaskGroup() as group:
        for i in range(count):
            due = begin + i / READ_RATE
            delay = due - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            group.create_task(read(due))
    return took


async def _planner(
    session: aiohttp.ClientSession,
    base: str,
    token: str,
    stop: asyncio.Event,
    answers: Counter[str],
    plan_seconds: list[float],
) -> None:
    """One planner client: a maximum-size plan every PLAN_PACE_S seconds at most (or as
    soon as the last one is answered, if that took longer) until ``stop``."""
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    body = plan_body()
    while not stop.is_set():
        started = time.perf_counter()
        try:
            async with session.post(f"{base}/v1/plan", data=body, headers=headers) as resp:
                status, text = resp.status, await resp.text()
        except (aiohttp.ClientError, TimeoutError):
            status, text = 0, ""
        took = time.perf_counter() - started
        if status == 200:
            answers["200"] += 1
            plan_seconds.append(took)
        elif status == 429:
            answers["budget" if "budget" in text else "busy"] += 1
        else:
            answers["other"] += 1
        try:
            async with asyncio.timeout(max(0.0, PLAN_PACE_S - took)):
                await stop.wait()
        except TimeoutError:
            pass


def main_plans(args: Any) -> int:
    """``fedbroker bench --plans``: ``--clusters`` x ``--nodes-per-cluster`` 8-GPU nodes
    (default 2 x 100), ``--reads`` reads in each phase."""
    doc = run_loop(run_plans(args.reads, args.clusters, args.nodes_per_cluster))
    if args.json:
        print(json.dumps(doc))
        return 0
    print(
        f"GET /v1/clusters by one tenant, {doc['reads']} at {READ_RATE:g}/s, alone and while "
        f"{PLANNERS} clients of another tenant (read-only token) send {MAX_PODS}-pod plans; "
        f"{args.clusters} simulated clusters x {args.nodes_per_cluster} nodes"
    )
    print(f"  alone        p50 / p99 / max  {doc['quiet_p50_ms']} / {doc['quiet_p99_ms']} / "
          f"{doc['quiet_max_ms']} ms")  # fmt: skip
    print(f"  with plans   p50 / p99 / max  {doc['busy_p50_ms']} / {doc['busy_p99_ms']} / "
          f"{doc['busy_max_ms']} ms")  # fmt: skip
    print(f"  reads not answered (not a 200, or not within 5 minutes): {doc['reads_failed']}")
    print(
        f"  plans: {doc['plans_answered']} answered (p50 {doc['plan_p50_ms']} ms), "
        f"{doc['plans_refused_busy']} refused busy, {doc['plans_refused_budget']} over budget, "
        f"{doc['plans_other']} other"
    )
    return 0


__all__ = ["main_plans", "plan_body", "plans_document", "run_plans"]
