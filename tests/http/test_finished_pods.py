"""A finished job's pods and logs, through the HTTP API over a real Service with simulated
clusters: readable while its pods are kept (``retention.finishedPodsSeconds``), a clear 404
once they were deleted or the job was cancelled, its pods deleted before a resubmission of
its name runs, and a retention of 0 deleting them at the next sweep."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer
from builders import Clock, until
from test_api import CONFIG, A, manifest, settle, submit

from adapters.simulated import SimulatedLauncher, simulated_log_line
from broker.config import parse_config
from broker.http.app import make_app
from broker.service.facade import Service

Client = TestClient[Any, Any]
KEY = "team-a/train"


class Runs:
    """The simulated member's sleep: a run ends when the test lets it."""

    def __init__(self) -> None:
        self.allowed = asyncio.Semaphore(0)

    async def sleep(self, _: float) -> None:
        await self.allowed.acquire()


class Stack:
    def __init__(self, tmp_path: Path, keep: float | None) -> None:
        text = CONFIG.format(db=tmp_path / "jobs.db")
        if keep is not None:
            text += f"retention: {{finishedPodsSeconds: {keep}}}\n"
        self.config = parse_config(text, "test config")
        self.clock = Clock()
        self.runs = Runs()
        self.launcher = SimulatedLauncher(sleep=self.runs.sleep, run_seconds=lambda _: 60.0)
        self.service = Service(self.config, clock=self.clock, launcher=self.launcher)

    async def finished_job(self, client: Client, name: str = "train") -> None:
        """Submit, run and end ``name``; Succeeded in the store."""
        assert (await submit(client, manifest(name, pods=2), A)).status in (200, 201)
        await self.service.schedule_once(self.clock.now)
        await settle(self.service)
        assert (await self.service.get("team-a", name)).state == "Running"
        self.runs.allowed.release()
        await self.service.runs_done(timeout=10)
        assert (await self.service.get("team-a", name)).state == "Succeeded"

    async def sweep(self) -> int:
        """What the supervised task does every minute."""
        return await self.service.shared.finished_pods.sweep(self.service.binding.delete)


@pytest.fixture
async def stack(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[
    tuple[Client, Stack]
]:  # fmt: skip
    s = Stack(tmp_path, getattr(request, "param", None))
    await s.service.start()
    client: Client = TestClient(TestServer(make_app(s.service, s.config)))
    await client.start_server()
    yield client, s
    await client.close()
    await s.service.close()


async def error(client: Client, path: str) -> tuple[int, str]:
    resp = await client.get(path, headers=A)
    return resp.status, (await resp.json())["error"]


async def test_a_finished_jobs_pods_and_logs_are_read_while_kept(
    stack: tuple[Client, Stack],
) -> None:
    client, s = stack
    await s.finished_job(client)
    placement = s.launcher.ended[KEY]
    resp = await client.get("/v1/jobs/train/pods", headers=A)
    assert resp.status == 200, await resp.text()
    pods = (await resp.json())["pods"]
    assert [(p["name"], p["phase"], p["cluster"]) for p in pods] == [
        (f"train-worker-{i}", "Succeeded", placement.cluster) for i in range(2)
    ]
    logs = await client.get("/v1/jobs/train/logs?pod=train-worker-1&tailLines=1", headers=A)
    assert logs.status == 200
    assert await logs.read() == simulated_log_line("train-worker-1", 4)
    # kept: neither the sweep nor a member's garbage collection takes them before the end
    s.clock.now += 599
    assert await s.sweep() == 0
    assert s.service.shared.finished_pods.live(placement.cluster) == {KEY}
    assert (await client.get("/v1/jobs/train/pods", headers=A)).status == 200


async def test_pods_deleted_after_the_retention_are_said_to_be(
    stack: tuple[Client, Stack],
) -> None:
    client, s = stack
    await s.finished_job(client)
    cluster = s.launcher.ended[KEY].cluster
    s.clock.now += 600
    assert s.service.shared.finished_pods.live(cluster) == set()  # garbage for a member's GC
    assert await s.sweep() == 1
    assert KEY not in s.launcher.ended and KEY in s.launcher.deleted
    said = (  # the API's errors start with the field they are about
        f"name: job 'train' succeeded 10m ago on {cluster}; its pods were deleted 10m after it "
        "finished (retention.finishedPodsSeconds)"
    )
    assert await error(client, "/v1/jobs/train/pods") == (404, said)
    assert await error(client, "/v1/jobs/train/logs") == (404, said)


@pytest.mark.parametrize("stack", [0], indirect=True)
async def test_a_retention_of_0_deletes_them_at_the_next_sweep(
    stack: tuple[Client, Stack],
) -> None:
    client, s = stack
    await s.finished_job(client)
    assert await s.sweep() == 1
    assert KEY not in s.launcher.ended
    status, said = await error(client, "/v1/jobs/train/pods")
    assert status == 404 and "were deleted 0s after it finished" in said


async def test_a_resubmission_deletes_the_last_runs_pods_first(
    stack: tuple[Client, Stack],
) -> None:
    client, s = stack
    await s.finished_job(client)
    second = manifest("train", pods=1)
    assert (await submit(client, second, A)).status == 201  # the name's next generation
    assert KEY not in s.launcher.ended and list(s.launcher.deleted) == [KEY]
    assert s.service.shared.finished_pods.get(KEY) is None
    await s.service.schedule_once(s.clock.now)
    await settle(s.service)
    resp = await client.get("/v1/jobs/train/pods", headers=A)
    assert [p["phase"] for p in (await resp.json())["pods"]] == ["Running"]


async def test_a_cancelled_jobs_pods_were_deleted_then(stack: tuple[Client, Stack]) -> None:
    client, s = stack
    assert (await submit(client, manifest("train", pods=1), A)).status == 201
    await s.service.schedule_once(s.clock.now)
    await settle(s.service)
    await s.service.cancel("team-a", "train")
    said = "name: job 'train' was cancelled; its pods were deleted then"
    assert await error(client, "/v1/jobs/train/pods") == (404, said)


async def test_the_sweep_runs_as_a_supervised_task_while_leading(
    stack: tuple[Client, Stack],
) -> None:
    """``run`` on an injected sleep: one turn deletes what is past the retention."""
    client, s = stack
    await s.finished_job(client)
    s.clock.now += 600
    turns = asyncio.Semaphore(0)
    kept = s.service.shared.finished_pods
    task = asyncio.ensure_future(
        kept.run(s.service.binding.delete, lambda: s.service.leading, lambda _: turns.acquire())
    )
    try:
        turns.release()
        await until(lambda: KEY not in s.launcher.ended)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
