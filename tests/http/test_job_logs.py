"""Pods and logs back (issue 14, item 3; acceptance 5) through the HTTP API over a real
Service with simulated clusters: the pods table, logs of the simulated pods, tenant B's 404
on A's job, the parameters' 400s naming them, the byte bound, the cap of followed logs per
tenant (429), and a followed log streaming lines as the member writes them and ending
(member side closed) when the client goes away."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer
from builders import Clock
from test_api import CONFIG, A, B, manifest, settle, submit

from adapters.simulated import SimulatedLauncher, simulated_log_line
from broker.config import parse_config
from broker.http.app import make_app
from broker.http.podlogs import OPEN_FOLLOWS, ParamError, log_params, truncated_line
from broker.service.facade import Service

Client = TestClient[Any, Any]


class Ticks:
    """The simulated member's sleep: each call waits until the test lets one line out."""

    def __init__(self) -> None:
        self.allowed = asyncio.Semaphore(0)
        self.waiting = 0

    async def sleep(self, _: float) -> None:
        self.waiting += 1
        try:
            await self.allowed.acquire()
        finally:
            self.waiting -= 1


class Stack:
    def __init__(self, tmp_path: Path) -> None:
        text = CONFIG.format(db=tmp_path / "jobs.db").replace(
            "api: {bodyLimitBytes: 4096}", "api: {bodyLimitBytes: 4096, logLimitBytes: 1024}"
        ).replace(
            "token: {value: tok-a-00000000000000000000000000}}",
            "token: {value: tok-a-00000000000000000000000000}, maxLogFollows: 1}",
        )  # fmt: skip
        self.config = parse_config(text, "test config")
        self.clock = Clock()
        self.ticks = Ticks()
        self.launcher = SimulatedLauncher(sleep=self.ticks.sleep)
        self.service = Service(self.config, clock=self.clock, launcher=self.launcher)
        self.app = make_app(self.service, self.config)


@pytest.fixture
async def stack(tmp_path: Path) -> AsyncIterator[tuple[Client, Stack]]:
    s = Stack(tmp_path)
    await s.service.start()
    client: Client = TestClient(TestServer(s.app))
    await client.start_server()
    yield client, s
    await client.close()
    await s.service.close()


async def running_job(client: Client, s: Stack, name: str = "train", pods: int = 2) -> None:
    assert (await submit(client, manifest(name, pods=pods), A)).status == 201
    await s.service.schedule_once(s.clock.now)
    await settle(s.service)
    assert (await s.service.get("team-a", name)).state == "Running"


async def eventually(condition: Any, timeout: float = 5.0) -> None:
    async with asyncio.timeout(timeout):
        while not condition():
            await asyncio.sleep(0.01)


async def test_pods_of_a_running_job(stack: tuple[Client, Stack]) -> None:
    client, s = stack
    await running_job(client, s)
    resp = await client.get("/v1/jobs/train/pods", headers=A)
    assert resp.status == 200
    body = await resp.json()
    placement = s.launcher.running["team-a/train"]
    assert body["job"] == "train"
    assert [(p["name"], p["podSet"], p["node"], p["phase"], p["slot"]) for p in body["pods"]] == [
        (f"train-worker-{i}", "worker", placement.pods[i].node, "Running", f"worker-{i}")
        for i in range(2)
    ]
    assert {p["cluster"] for p in body["pods"]} == {placement.cluster}


async def test_simulated_logs_through_the_api(stack: tuple[Client, Stack]) -> None:
    client, s = stack
    await running_job(client, s)
    resp = await client.get("/v1/jobs/train/logs?pod=train-worker-1&tailLines=2", headers=A)
    assert resp.status == 200 and resp.content_type == "text/plain"
    assert await resp.read() == b"".join(simulated_log_line("train-worker-1", i) for i in (3, 4))
    first = await client.get("/v1/jobs/train/logs", headers=A)  # the first pod by name
    assert (await first.read()).startswith(simulated_log_line("train-worker-0", 0))


async def test_tenant_b_gets_404_on_as_job_and_nothing_for_a_queued_one(
    stack: tuple[Client, Stack],
) -> None:
    client, s = stack
    await running_job(client, s)
    for path in ("/v1/jobs/train/pods", "/v1/jobs/train/logs?pod=train-worker-0"):
        resp = await client.get(path, headers=B)
        assert resp.status == 404, path
        assert "train-worker" not in (await resp.json())["error"]
    other = await client.get("/v1/jobs/train/logs?pod=nope-0", headers=A)
    assert other.status == 404 and (await other.json())["error"].startswith("pod: ")
    container = await client.get("/v1/jobs/train/logs?pod=train-worker-0&container=x", headers=A)
    assert container.status == 404
    assert (await container.json())["error"] == (
        "container: pod 'train-worker-0' has no container 'x' (its containers: main)"
    )
    assert (await submit(client, manifest("later", gpus=8, pods=9), A)).status == 201
    queued = await client.get("/v1/jobs/later/pods", headers=A)
    assert queued.status == 409 and "Queued" in (await queued.json())["error"]


@pytest.mark.parametrize(
    ("query", "param"),
    [
        ("pod=Bad_Name", "pod"), ("pod=" + "a" * 254, "pod"), ("container=a.b", "container"),
        ("tailLines=0", "tailLines"), ("tailLines=100001", "tailLines"),
        ("tailLines=x", "tailLines"), ("tailLines=-1", "tailLines"), ("follow=yes", "follow"),
        ("follow=2", "follow"), ("timestamps=yes", "timestamps"), ("previous=x", "previous"),
    ],
)  # fmt: skip
async def test_bad_params_are_400_naming_the_parameter(
    stack: tuple[Client, Stack], query: str, param: str
) -> None:
    client, s = stack
    await running_job(client, s)
    resp = await client.get(f"/v1/jobs/train/logs?{query}", headers=A)
    assert resp.status == 400
    assert (await resp.json())["error"].startswith(f"{param}: ")


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ({}, (None, None, None, False, False, False)),
        ({"pod": "p-0", "container": "main", "tailLines": "100000", "follow": "true"},
         ("p-0", "main", 100000, True, False, False)),
        ({"tailLines": "1", "follow": "0"}, (None, None, 1, False, False, False)),
        ({"timestamps": "true", "previous": "1"}, (None, None, None, False, True, True)),
    ],
)  # fmt: skip
def test_log_params_table(query: dict[str, str], expected: tuple[Any, ...]) -> None:
    p = log_params(query)
    assert (p.pod, p.container, p.tail_lines, p.follow, p.timestamps, p.previous) == expected


def test_log_params_refuse_unicode_digits() -> None:
    with pytest.raises(ParamError, match=r"^tailLines: "):
        log_params({"tailLines": "²"})


async def test_the_byte_bound_holds(stack: tuple[Client, Stack]) -> None:
    client, s = stack
    s.launcher.log_lines = 200  # far more than the 1024 bytes of the config
    await running_job(client, s)
    resp = await client.get("/v1/jobs/train/logs?pod=train-worker-0", headers=A)
    body = await resp.read()
    assert body.endswith(truncated_line(1024))
    assert len(body) == 1024 + len(truncated_line(1024))


async def test_follow_streams_as_written_and_stops_when_the_client_goes(
    stack: tuple[Client, Stack],
) -> None:
    client, s = stack
    await running_job(client, s)
    resp = await client.get("/v1/jobs/train/logs?pod=train-worker-0&follow=true", headers=A)
    assert resp.status == 200
    for step in range(5):  # what was there already
        assert await resp.content.readline() == simulated_log_line("train-worker-0", step)
    await eventually(lambda: s.ticks.waiting == 1)  # the member waits to write more
    s.ticks.allowed.release()
    assert await resp.content.readline() == simulated_log_line("train-worker-0", 5)
    # A second follow of the tenant is over its cap of 1; a plain read is not.
    over = await client.get("/v1/jobs/train/logs?pod=train-worker-1&follow=true", headers=A)
    assert over.status == 429 and "maxLogFollows" in (await over.json())["error"]
    assert over.headers["Retry-After"]
    assert (await client.get("/v1/jobs/train/logs?pod=train-worker-1", headers=A)).status == 200
    # The client goes away: the follow ends and the member's stream is closed.
    await eventually(lambda: s.ticks.waiting == 1)
    resp.close()
    await eventually(lambda: not s.app[OPEN_FOLLOWS])
    assert s.ticks.waiting == 0  # the member's generator was closed, not left waiting
