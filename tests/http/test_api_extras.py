"""The API's extras: per-tenant rate limit, /v1/events (SSE), /metrics, /openapi.json.

Same harness as tests/http/test_api.py (real Service, SQLite in tmp_path, simulated clusters,
fake clocks); no sleeps: the rate limiter's clock is injected, the SSE stream is read line
by line as the scheduler is driven with ``schedule_once``.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer
from builders import Clock
from prometheus_client import REGISTRY, CollectorRegistry
from test_api import (
    ADMIN,
    CONFIG,
    TOKENS,
    A,
    B,
    make_config,
    manifest,
    settle,
    submit,
)

from broker.config import Config, RateLimit, parse_config
from broker.http.app import make_app
from broker.http.ratelimit import RateLimiter
from broker.service.events import EventBus
from broker.service.facade import Service

Client = TestClient[Any, Any]


class Monotonic:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Stack:
    def __init__(self, tmp_path: Path, rate: str = "") -> None:
        self.config = _with_rate(tmp_path, rate) if rate else make_config(tmp_path)
        self.clock = Clock()
        self.mono = Monotonic()
        self.registry = CollectorRegistry()
        self.service = Service(self.config, clock=self.clock)
        self.app = make_app(self.service, self.config, registry=self.registry, clock=self.mono)


def _with_rate(tmp_path: Path, rate: str) -> Config:
    text = CONFIG.format(db=tmp_path / "jobs.db").replace(
        "api: {bodyLimitBytes: 4096}", f"api: {{bodyLimitBytes: 4096, rateLimitPerTenant: {rate}}}"
    )
    return parse_config(text, "test config")


@pytest.fixture
async def stack(tmp_path: Path) -> AsyncIterator[tuple[Client, Stack]]:
    s = Stack(tmp_path)
    await s.service.start()
    client: Client = TestClient(TestServer(s.app))
    await client.start_server()
    yield client, s
    await client.close()
    await s.service.close()


# --- rate limit ----------------------------------------------------------------------------


def test_token_bucket_refills_at_the_rate() -> None:
    clock = Monotonic()
    limiter = RateLimiter(RateLimit.model_validate({"requestsPerSecond": 2.0, "burst": 3}), clock)
    assert [limiter.retry_after("t") for _ in range(3)] == [None, None, None]
    assert limiter.retry_after("t") == 1  # 0.5 s to the next token, rounded up to 1
    assert limiter.retry_after("other") is None  # per tenant
    clock.now += 0.5
    assert limiter.retry_after("t") is None
    assert limiter.retry_after("t") == 1
    clock.now += 100  # refills to the burst, never beyond
    assert [limiter.retry_after("t") for _ in range(4)] == [None, None, None, 1]


def test_retry_after_is_whole_seconds_at_least_one() -> None:
    clock = Monotonic()
    limiter = RateLimiter(RateLimit.model_validate({"requestsPerSecond": 0.25, "burst": 1}), clock)
    assert limiter.retry_after("t") is None
    assert limiter.retry_after("t") == 4
    clock.now += 3.5
    assert limiter.retry_after("t") == 1


async def test_429_with_retry_after_per_tenant(tmp_path: Path) -> None:
    s = Stack(tmp_path, rate="{requestsPerSecond: 1.0, burst: 2}")
    await s.service.start()
    async with TestClient(TestServer(s.app)) as client:
        for _ in range(2):
            assert (await client.get("/v1/queues", headers=A)).status == 200
        resp = await client.get("/v1/queues", headers=A)
        assert resp.status == 429
        assert resp.headers["Retry-After"] == "1"
        error = (await resp.json())["error"]
        assert error.startswith("rate limit:") and "team-a" in error
        assert TOKENS["team-a"] not in error
        assert (await client.get("/v1/queues", headers=B)).status == 200  # B has its own
        s.mono.now += 1.0
        assert (await client.get("/v1/queues", headers=A)).status == 200
        assert (await client.get("/v1/queues", headers=A)).status == 429
    await s.service.close()


# --- events --------------------------------------------------------------------------------


async def _next_event(resp: Any) -> tuple[str, dict[str, Any]]:
    """The next SSE event (kind, data), skipping comments; bounded so a bug fails, not hangs."""
    kind, data = "", ""
    while True:
        line = (await asyncio.wait_for(resp.content.readline(), 10)).decode().rstrip("\n")
        if line.startswith("event: "):
            kind = line[len("event: ") :]
        elif line.startswith("data: "):
            data = line[len("data: ") :]
        elif line == "" and kind:
            return kind, json.loads(data)


async def _job_events(resp: Any, count: int) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    while len(out) < count:
        kind, data = await _next_event(resp)
        if kind == "job":
            out.append(data)
    return out


async def test_events_stream_queued_then_running(stack: tuple[Client, Stack]) -> None:
    client, s = stack
    resp = await client.get("/v1/events", headers=A)  # subscribed once the headers are back
    assert resp.status == 200
    assert resp.headers["Content-Type"].startswith("text/event-stream")
    assert (await submit(client, manifest("train", pods=2), A)).status == 201
    await s.service.schedule_once(s.clock.now)
    await settle(s.service)
    events = await _job_events(resp, 3)
    assert [(e["name"], e["state"]) for e in events] == [
        ("train", "Queued"), ("train", "Placed"), ("train", "Running"),
    ]  # fmt: skip
    assert events[2]["cluster"] == "small-a" and events[2]["tenant"] == "team-a"
    resp.close()


async def test_events_are_per_tenant_and_admin_sees_all(stack: tuple[Client, Stack]) -> None:
    client, s = stack
    as_b = await client.get("/v1/events", headers=B)
    as_admin = await client.get("/v1/events", headers=ADMIN)
    assert (await submit(client, manifest("secret-a", gpus=1), A)).status == 201
    assert (await submit(client, manifest("mine-b", gpus=1), B)).status == 201
    seen_by_b = await _job_events(as_b, 1)
    assert [e["name"] for e in seen_by_b] == ["mine-b"]  # never team-a's job
    seen_by_admin = await _job_events(as_admin, 2)
    assert [e["name"] for e in seen_by_admin] == ["secret-a", "mine-b"]
    await s.service.schedule_once(s.clock.now)
    await settle(s.service)
    # B's stream next shows capacity and B's own job only
    kinds: list[tuple[str, str]] = []
    while ("job", "Running") not in kinds:
        kind, data = await _next_event(as_b)
        assert data.get("tenant", "team-b") == "team-b"
        kinds.append((kind, data.get("state", "")))
    assert ("capacity", "") in kinds
    as_b.close()
    as_admin.close()


async def test_events_need_a_token(stack: tuple[Client, Stack]) -> None:
    client, _ = stack
    resp = await client.get("/v1/events")
    assert resp.status == 401
    assert (await resp.json())["error"].startswith("Authorization:")


async def test_slow_subscriber_drops_oldest_and_counts() -> None:
    bus = EventBus(queue_size=2)
    slow = bus.subscribe(None)
    other = bus.subscribe("team-b")
    for i in range(5):
        bus.publish("job", "team-a", {"i": i})  # never blocks
    assert slow.dropped == 3 and bus.dropped == 3
    assert other.dropped == 0 and other.queue.empty()  # not its tenant
    got = [await slow.next(0) for _ in range(2)]
    assert [e.data["i"] for e in got if e is not None] == [3, 4]  # the newest kept
    assert await slow.next(0) is None and not slow.closed  # timed out, still open
    bus.close()
    assert await slow.next() is None and slow.closed


# --- metrics -------------------------------------------------------------------------------


async def test_metrics_after_a_submission(stack: tuple[Client, Stack]) -> None:
    client, s = stack
    assert (await submit(client, manifest("very-secret-job-name", gpus=8), A)).status == 201
    assert (await client.get("/v1/jobs/very-secret-job-name", headers=A)).status == 200
    assert (await client.get("/v1/jobs/nope", headers=A)).status == 404
    resp = await client.get("/metrics")
    assert resp.status == 200
    text = await resp.text()
    assert 'fedbroker_jobs_submitted_total{queue="training"} 1.0' in text
    assert 'fedbroker_http_requests_total{route="/v1/jobs",status="201"} 1.0' in text
    assert 'fedbroker_http_requests_total{route="/v1/jobs/{name}",status="200"} 1.0' in text
    assert 'fedbroker_http_requests_total{route="/v1/jobs/{name}",status="404"} 1.0' in text
    assert 'fedbroker_pending_jobs{queue="training"} 1.0' in text
    assert 'fedbroker_gpus{cluster="small-a",gpu_type="A100",state="free"} 16.0' in text
    await s.service.schedule_once(s.clock.now)
    await settle(s.service)
    text = await (await client.get("/metrics")).text()
    assert 'fedbroker_pending_jobs{queue="training"} 0.0' in text
    assert 'fedbroker_gpus{cluster="small-a",gpu_type="A100",state="free"} 8.0' in text
    assert 'fedbroker_gpus{cluster="small-a",gpu_type="A100",state="allocated"} 8.0' in text
    assert "very-secret-job-name" not in text and "nope" not in text
    assert all(token not in text for token in TOKENS.values())
    # the injected registry, never the process-global one
    assert (
        REGISTRY.get_sample_value("fedbroker_jobs_submitted_total", {"queue": "training"}) is None
    )


# --- openapi -------------------------------------------------------------------------------


async def test_openapi_served_without_auth(stack: tuple[Client, Stack]) -> None:
    client, _ = stack
    resp = await client.get("/openapi.json")
    assert resp.status == 200
    doc = await resp.json()
    assert doc["openapi"].startswith("3.1")
    assert "/v1/events" in doc["paths"] and "/v1/jobs/{name}/explain" in doc["paths"]
