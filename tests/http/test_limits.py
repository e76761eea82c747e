"""Issue 13's caps: a tenant's active jobs (403 past ``maxActiveJobs``, a resubmission
still answered) and open event streams (429 past ``maxEventStreams``), requests without a
valid token limited per source address (429 instead of 401 once its bucket is empty), the
256 KiB manifest default, and lists without pod templates unless ``?view=full``."""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer
from builders import Clock
from test_api import CONFIG, A, B, manifest, submit
from test_api_extras import Monotonic

from broker.config import ApiConfig, TenantConfig, parse_config
from broker.http.app import make_app
from broker.http.limits import OPEN_STREAMS, stream_slot
from broker.service.facade import Service

Client = TestClient[Any, Any]


class Stack:
    def __init__(self, tmp_path: Path) -> None:
        text = CONFIG.format(db=tmp_path / "jobs.db").replace(
            "defaultQueue: training, token: {value: tok-a-00000000000000000000000000}}",
            "defaultQueue: training, token: {value: tok-a-00000000000000000000000000}, "
            "maxActiveJobs: 2, "
            "maxEventStreams: 2}",
        ).replace(
            "api: {bodyLimitBytes: 4096}",
            "api: {bodyLimitBytes: 4096, rateLimitUnauthenticated: "
            "{requestsPerSecond: 1.0, burst: 3}}",
        )  # fmt: skip
        self.config = parse_config(text, "test config")
        self.clock = Clock()
        self.mono = Monotonic()
        self.service = Service(self.config, clock=self.clock)
        self.app = make_app(self.service, self.config, clock=self.mono)


@pytest.fixture
async def stack(tmp_path: Path) -> AsyncIterator[tuple[Client, Stack]]:
    s = Stack(tmp_path)
    await s.service.start()
    client: Client = TestClient(TestServer(s.app))
    await client.start_server()
    yield client, s
    await client.close()
    await s.service.close()


def test_defaults() -> None:
    api = ApiConfig()
    assert api.body_limit_bytes == 256 * 1024
    tenant = TenantConfig.model_validate(
        {"name": "t", "defaultQueue": "q", "token": {"value": "x" * 32}}
    )
    assert (tenant.max_active_jobs, tenant.max_event_streams) == (10_000, 8)


async def test_active_jobs_are_capped_per_tenant(stack: tuple[Client, Stack]) -> None:
    client, s = stack
    for name in ("one", "two"):
        assert (await submit(client, manifest(name, gpus=1), A)).status == 201
    over = await submit(client, manifest("three", gpus=1), A)
    assert over.status == 403
    error = (await over.json())["error"]
    assert error.startswith("limit: ") and "maxActiveJobs" in error and "2" in error
    assert await s.service.store.get_job("team-a", "three") is None  # nothing stored
    # a resubmission of an active job is still answered; another tenant has its own cap
    assert (await submit(client, manifest("one", gpus=1), A)).status == 200
    assert (await submit(client, manifest("three", gpus=1), B)).status == 201
    # a finished job frees its place
    assert (await client.delete("/v1/jobs/one", headers=A)).status == 200
    assert (await submit(client, manifest("three", gpus=1), A)).status == 201


async def test_event_streams_are_capped_per_tenant(stack: tuple[Client, Stack]) -> None:
    client, _ = stack
    streams = [await client.get("/v1/events", headers=A) for _ in range(2)]
    assert [r.status for r in streams] == [200, 200]
    over = await client.get("/v1/events", headers=A)
    assert over.status == 429
    assert "maxEventStreams" in (await over.json())["error"]
    assert over.headers["Retry-After"] == "15"
    other = await client.get("/v1/events", headers=B)  # team-b has its own 8
    assert other.status == 200
    for r in [*streams, other]:
        r.close()


def test_a_stream_slot_is_given_back() -> None:
    app = make_app_state()
    tenant = TenantConfig.model_validate(
        {"name": "t", "defaultQueue": "q", "token": {"value": "x" * 32}, "maxEventStreams": 1}
    )
    request: Any = type("R", (), {"app": app})()
    with stream_slot(request, tenant):
        assert app[OPEN_STREAMS]["t"] == 1
        with pytest.raises(Exception, match="maxEventStreams"), stream_slot(request, tenant):
            pass
    assert app[OPEN_STREAMS]["t"] == 0
    with stream_slot(request, tenant):  # free again
        assert app[OPEN_STREAMS]["t"] == 1


def make_app_state() -> Any:
    return {OPEN_STREAMS: Counter()}


async def test_requests_without_a_token_are_limited_per_address(
    stack: tuple[Client, Stack],
) -> None:
    client, s = stack
    statuses = [(await client.get("/openapi.json")).status for _ in range(3)]
    assert statuses == [200, 200, 200]
    over = await client.get("/openapi.json")
    assert over.status == 429
    assert (await over.json())["error"].startswith("rate limit: ")
    # a wrong token counts too: 429 instead of 401 while the bucket is empty
    wrong = await client.get("/v1/jobs", headers={"Authorization": "Bearer nope"})
    assert wrong.status == 429
    # a valid token is not limited by the address's bucket, nor are the probes and scrapes
    assert (await client.get("/v1/jobs", headers=A)).status == 200
    exempt = ("/healthz", "/readyz", "/metrics") * 3
    assert [(await client.get(p)).status for p in exempt] == [200] * 9
    s.mono.now += 1.0
    assert (await client.get("/v1/jobs", headers={"Authorization": "Bearer nope"})).status == 401


async def test_lists_leave_out_pod_templates_unless_full(stack: tuple[Client, Stack]) -> None:
    client, _ = stack
    body = manifest("big", gpus=1)
    body["spec"]["podSets"][0]["template"] = {"spec": {"containers": [{"name": "m", "image": "t"}]}}
    assert (await submit(client, body, A)).status == 201
    summary = (await (await client.get("/v1/jobs", headers=A)).json())["items"][0]
    assert "template" not in summary["spec"]["podSets"][0]
    assert summary["spec"]["podSets"][0]["resources"] == {
        "nvidia.com/gpu": 1, "cpu": "8", "memory": "32Gi"
    }  # fmt: skip
    full = (await (await client.get("/v1/jobs?view=full", headers=A)).json())["items"][0]
    template = body["spec"]["podSets"][0]["template"]
    assert full["spec"]["podSets"][0]["template"] == template
    one = await (await client.get("/v1/jobs/big", headers=A)).json()
    assert one["spec"] == full["spec"]  # GET of one job: the whole manifest
    bad = await client.get("/v1/jobs?view=everything", headers=A)
    assert bad.status == 400
    assert (await bad.json())["error"].startswith("view: ")
