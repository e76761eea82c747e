"""Memory per live job (issue 15): the broker's heap grows by at most 2 KB per running
single-GPU job. Measured with tracemalloc (bytes allocated and still held, not RSS, not
time) on the real Service with simulated clusters and SQLite: the heap with 1,500 jobs
running minus the heap with 500, per job, so start-up state cancels out."""

from __future__ import annotations

import gc
import tracemalloc
from pathlib import Path

from broker.bench.e2e import job_body
from broker.bench.serving import bench_config
from broker.manifest import parse_manifest
from broker.service.facade import Service

BOUND_BYTES = 2048


async def running(service: Service, tenant: str, start: int, count: int) -> None:
    """Submit ``count`` one-GPU jobs and let them all start (their writes settled)."""
    for i in range(start, start + count):
        await service.submit(tenant, parse_manifest(job_body(f"j{i}"), "application/json"))
    total = start + count
    for _ in range(1000):
        await service.schedule_once()
        await service.launches_done(timeout=30)
        launches = service.lifecycle.launches()
        if len(launches) == total and all(la.running for la in launches):
            break
    assert sum(1 for la in service.lifecycle.launches() if la.running) == total


async def test_the_heap_grows_by_at_most_2_kb_per_running_job(tmp_path: Path) -> None:
    config = bench_config(f"sqlite://{tmp_path / 'b.db'}", "t" * 43, 4, 100)
    tenant = config.tenants[0].name
    service = Service(config)
    await service.start()
    tracemalloc.start()
    try:
        await running(service, tenant, 0, 500)
        gc.collect()
        before = tracemalloc.get_traced_memory()[0]
        await running(service, tenant, 500, 1000)
        gc.collect()
        after = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
        await service.close()
    per_job = (after - before) / 1000
    assert 0 < per_job <= BOUND_BYTES, f"{per_job:.0f} bytes per running job"
