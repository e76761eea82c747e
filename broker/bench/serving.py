"""What the end-to-end benchmarks (``--e2e``, ``--soak``) share: the real service on a
loopback port (store, scheduler loop, simulated clusters, aiohttp API) with a bench config,
and an open-loop HTTP load generator meant to run in a process of its own, so that the
broker's process holds only the broker. Benchmarks, not tests: nothing here fails on a slow
machine.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any, Unpack

import aiohttp
from aiohttp import web

from broker.config import Config, parse_config
from broker.http.app import make_app
from broker.process import release_heap, settle_heap
from broker.service.compose import Options
from broker.service.facade import Service

BENCH_TENANT = "bench"
# (index, started, finished, acknowledged): one answered submission, on perf_counter.
Answered = Callable[[int, float, float, bool], None]


def bench_document(
    store_url: str,
    token: str,
    clusters: int,
    nodes_per_cluster: int,
    queues: Mapping[str, str] | None = None,
    retention_seconds: float | None = None,
) -> dict[str, Any]:
    """The benchmarks' config document: ``clusters`` x ``nodes_per_cluster`` simulated
    nodes of 8 A100s; one tenant with ``queues`` (name -> policy; default one binpack queue
    ``bench``), its first the default, and no rate limit or active-job cap that the offered
    load would hit; finished jobs kept ``retention_seconds`` (default: the service's)."""
    queues = dict(queues or {BENCH_TENANT: "binpack"})
    shape = {"gpuType": "A100", "gpus": 8, "cpu": "96", "memory": "768Gi",
             "count": nodes_per_cluster}  # fmt: skip
    cluster_list = [
        {"name": f"sim-{i:03d}", "source": {"simulated": {"shapes": [shape]}}}
        for i in range(clusters)
    ]
    retention = {}
    if retention_seconds is not None:
        retention = {"finishedJobsSeconds": retention_seconds,
                     "purgeEverySeconds": min(60.0, retention_seconds)}  # fmt: skip
    return {
        "store": {"url": store_url},
        "retention": retention,
        "api": {"rateLimitPerTenant": {"requestsPerSecond": 100000.0, "burst": 100000}},
        "scheduler": {"cycleSeconds": 0.05},
        "clusters": cluster_list,
        "queues": [{"name": name, "policy": policy} for name, policy in queues.items()],
        "tenants": [{"name": BENCH_TENANT, "defaultQueue": next(iter(queues)),
                     "queues": list(queues), "maxActiveJobs": 10_000_000,
                     "token": {"value": token}}],
    }  # fmt: skip


def bench_config(
    store_url: str,
    token: str,
    clusters: int,
    nodes_per_cluster: int,
    queues: Mapping[str, str] | None = None,
    *,
    retention_seconds: float | None = None,
) -> Config:
    """``bench_document`` parsed as ``fedbroker serve`` would."""
    doc = bench_document(store_url, token, clusters, nodes_per_cluster, queues, retention_seconds)
    return parse_config(json.dumps(doc), "bench config", {})


@asynccontextmanager
async def serving(config: Config, **options: Unpack[Options]) -> AsyncIterator[tuple[Service, str]]:
    """The started service (scheduler loop running) and the base URL of its API."""
    service = Service(config, **options)
    await service.start()
    settle_heap()  # as `fedbroker serve` does once started
    service.spawn_loop()
    runner = web.AppRunner(make_app(service, config), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield service, f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()
        await service.close()
        release_heap()


async def open_loop(
    base: str, token: str, count: int, rate: float, body: Callable[[int], bytes], answered: Answered
) -> float:
    """POST ``body(i)`` for i in range(count) to ``/v1/jobs``, the i-th at i / rate whatever
    the server does (open loop), calling ``answered`` as each answer arrives; the seconds
    from the first request to the last answer."""
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    connector = aiohttp.TCPConnector(limit=64)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def submit(i: int) -> None:
            data = body(i)
            started = time.perf_counter()
            async with session.post(f"{base}/v1/jobs", data=data, headers=headers) as resp:
                await resp.read()
                answered(i, started, time.perf_counter(), resp.status == 201)

        begin = time.perf_counter()
        async with asyncio.TaskGroup() as group:
            for i in range(count):
                delay = begin + i / rate - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
                group.create_task(submit(i))
        return time.perf_counter() - begin


def percentile(values: Sequence[float], pct: float) -> float:
    """Nearest rank (a value that occurred); NaN when there is none."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(pct / 100 * (len(ordered) - 1))))
    return ordered[index]


__all__ = ["BENCH_TENANT", "Answered", "bench_config", "open_loop", "percentile", "serving"]
