"""Retention (issue 13): finished jobs older than ``retention.finishedJobsSeconds`` are
purged from the store and from lists by the leader, on the service's injected clock;
active jobs never are, and a follower purges nothing. SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from builders import Clock
from services import postgres_database

from broker.config import parse_config
from broker.manifest import FederatedJob, parse_manifest
from broker.service.facade import Service
from broker.service.retention import BATCH, BATCH_PAUSE_SECONDS, MIN_PAUSE_SECONDS, Retention

DAY = 86_400.0
CONFIG = """
store: {{url: "{url}"}}
retention: {{finishedJobsSeconds: {retention}}}
clusters:
- name: one
  source:
    simulated: {{shapes: [{{gpuType: A100, gpus: 8, cpu: "96", memory: 1024Gi, count: 1}}]}}
queues: [{{name: training}}]
tenants:
- {{name: team-a, defaultQueue: training, token: {{value: tok-a-00000000000000000000000000}}}}
"""


def job(name: str, gpus: int = 1) -> FederatedJob:
    body = {
        "apiVersion": "fedbroker.io/v1alpha1", "kind": "FederatedJob",
        "metadata": {"name": name},
        "spec": {"podSets": [{"name": "w", "count": 1, "resources": {"nvidia.com/gpu": gpus}}]},
    }  # fmt: skip
    return parse_manifest(json.dumps(body).encode(), "application/json")


@pytest.fixture(params=["sqlite", "postgres"])
async def url(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'jobs.db'}"
        return
    async with postgres_database("fedbroker_retention") as pg_url:
        yield pg_url


def service_on(url: str, clock: Clock, retention: float = 7 * DAY) -> Service:
    config = parse_config(CONFIG.format(url=url, retention=retention), "test config")
    return Service(config, clock=clock)


async def test_old_finished_jobs_are_purged_and_active_ones_never(url: str) -> None:
    clock = Clock()
    service = service_on(url, clock)
    await service.start()
    try:
        for name in ("done", "old-active", "recent"):
            await service.submit("team-a", job(name))
        await service.cancel("team-a", "done")
        clock.now += 6 * DAY
        await service.cancel("team-a", "recent")
        assert await service.retention.purge_once() == 0  # nothing is 7 days old yet
        clock.now += 1.5 * DAY
        assert await service.retention.purge_once() == 1
        names = {r.name for r in await service.store.list_jobs(tenant="team-a")}
        assert names == {"old-active", "recent"}  # queued for 7.5 days: never purged
        assert await service.store.history("team-a", "done") == []
        clock.now += 7 * DAY
        assert await service.retention.purge_once() == 1
        assert [r.name for r in await service.store.list_jobs()] == ["old-active"]
        # a purged name is free again
        record, created = await service.submit("team-a", job("done", gpus=2))
        assert created and record.generation == 1
    finally:
        await service.close()


async def test_a_follower_purges_nothing(tmp_path: Path) -> None:
    clock = Clock()
    url = f"sqlite:///{tmp_path / 'jobs.db'}"
    leader, follower = service_on(url, clock), service_on(url, clock)
    await leader.start()
    await follower.start()
    try:
        await leader.submit("team-a", job("done"))
        await leader.cancel("team-a", "done")
        clock.now += 8 * DAY
        assert leader.shared.leading and not follower.shared.leading
        assert await follower.retention.purge_once() == 0
        assert await leader.store.get_job("team-a", "done") is not None
        assert await leader.retention.purge_once() == 1
    finally:
        await follower.close()
        await leader.close()


async def test_the_supervised_loop_purges_every_period(tmp_path: Path) -> None:
    clock = Clock()
    service = service_on(f"sqlite:///{tmp_path / 'jobs.db'}", clock)
    await service.start()
    slept: list[float] = []
    asleep = asyncio.Event()
    wake = asyncio.Event()

    async def sleep(seconds: float) -> None:
        slept.append(seconds)
        asleep.set()
        await wake.wait()
        wake.clear()

    # The loop's reading before the purge, the purge's own (one statement), the loop's
    # after it: the purge took 2.5 s, so the next starts 300 s after this one started.
    readings = iter([10.0, 10.0, 12.5])
    retention = Retention(service.shared, sleep, monotonic=lambda: next(readings))
    loop = asyncio.create_task(retention.run(), name="retention under test")
    try:
        await asyncio.wait_for(asleep.wait(), 10)
        await service.submit("team-a", job("done"))
        await service.cancel("team-a", "done")
        clock.now += 8 * DAY
        asleep.clear()
        wake.set()  # one period passes: the loop purges, then sleeps the rest of the next
        await asyncio.wait_for(asleep.wait(), 10)
        assert slept == [300.0, 297.5]
        assert await service.store.get_job("team-a", "done") is None
    finally:
        loop.cancel()
        await asyncio.gather(loop, return_exceptions=True)
        await service.close()


async def test_a_large_purge_comes_in_small_batches_paced_apart(tmp_path: Path) -> None:
    """Every other write shares a purge statement's commit: a purge of many jobs is spread
    out, one batch per BATCH_PAUSE_SECONDS from start to start (so the purge keeps its pace
    however long a statement waits for its commit), never two back to back."""
    clock = Clock()
    service = service_on(f"sqlite:///{tmp_path / 'jobs.db'}", clock)
    await service.start()
    slept: list[float] = []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)

    try:
        jobs = 2 * BATCH + 7
        for i in range(jobs):
            await service.submit("team-a", job(f"done-{i}"))
            await service.cancel("team-a", f"done-{i}")
        clock.now += 8 * DAY
        # Each statement's start and end: the first took 30 ms, the second longer than
        # the pause (the third purges the rest and ends the purge).
        readings = iter([0.0, 0.03, 1.0, 1.0 + 2 * BATCH_PAUSE_SECONDS, 5.0])
        retention = Retention(service.shared, sleep, monotonic=lambda: next(readings))
        assert await retention.purge_once() == jobs
        assert slept == [pytest.approx(BATCH_PAUSE_SECONDS - 0.03), MIN_PAUSE_SECONDS]
        assert await service.store.list_jobs(tenant="team-a") == []
    finally:
        await service.close()
