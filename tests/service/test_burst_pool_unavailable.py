"""A Cluster API pool whose management cluster does not answer when the broker starts,
against kmock over real HTTP: the broker is ready anyway; ``/readyz`` details, the
``fedbroker_burst_pool_available`` gauge and explain say the pool is unavailable and why
(the HTTP status, or "connection failed"); it is read again with backoff (the wait and
the sleep injected: each pause is recorded and ends when the test says so), and once the
management cluster answers the pool joins, with no restart, and a gang that was waiting
bursts onto it. Logs name the pool and the status, never the token."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import kmock as kmocklib
import pytest
from aiohttp.test_utils import TestClient, TestServer
from builders import Clock, until
from kmock_namespaces import NamespacedEmulator
from tcp_proxy import TcpProxy
from tenacity import AsyncRetrying, RetryCallState, wait_exponential, wait_none
from test_burst_capi import capi_member
from test_capi import MD, NAME, NS, SCALE, UNAVAILABLE, replicas
from test_kube_service import CANARY, kubeconfig_doc, manifest

from broker.cli.render import render
from broker.config import parse_config
from broker.http.app import make_app
from broker.service.facade import Service
from broker.service.pool_reading import Availability, PoolRetry

Emulator = kmocklib.KubernetesEmulator
TOKEN = "tok-a-00000000000000000000000000"
A = {"Authorization": f"Bearer {TOKEN}"}
POOL = "west-a100"
START = 1_000.0

pytestmark = pytest.mark.kmock(cls=NamespacedEmulator)

CONFIG = """
store: {{url: "sqlite:///{db}"}}
scheduler: {{cycleSeconds: 10, burstAfterSeconds: 0}}
clusters:
- name: west
  kind: cloud
  source:
    kube: {{kubeconfig: "{member}", context: east, launchMode: pin, podPollSeconds: 0.02}}
burstPools:
- name: {pool}
  cluster: west
  costPerNodeHour: 32.77
  source:
    capi: {{kubeconfig: "{management}", context: east, namespace: {ns}, name: {name}}}
queues:
- {{name: training, policy: gang}}
tenants:
- {{name: team-a, defaultQueue: training, token: {{value: {token}}}}}
"""


class Pauses:
    """The retry's sleep: each pause is recorded and ends only when the test ends it."""

    def __init__(self) -> None:
        self.seconds: list[float] = []
        self._ends: asyncio.Queue[None] = asyncio.Queue()

    async def __call__(self, seconds: float) -> None:
        self.seconds.append(seconds)
        await self._ends.get()

    def end(self) -> None:
        """End the pause under way: the next read is made."""
        self._ends.put_nowait(None)

    async def end_one(self) -> None:
        """End the pause under way and wait until the read after it has failed too."""
        paused = len(self.seconds)
        self.end()
        await until(lambda: len(self.seconds) > paused)


@pytest.fixture
def k8s(kmock: Emulator) -> Emulator:
    return capi_member(kmock)


@dataclass
class Management:
    """The management cluster as the pool's kubeconfig reaches it, and how it fails."""

    url: str
    reason: str  # what the broker says while it fails
    down: asyncio.Event  # set: the MachineDeployment answers 503
    proxy: TcpProxy | None  # refusing connections until it listens again

    async def answer(self) -> None:
        self.down.clear()
        if self.proxy is not None:
            await self.proxy.start()


@pytest.fixture(params=["503", "connection refused"])
async def management(request: Any, k8s: Emulator) -> AsyncIterator[Management]:
    down = asyncio.Event()
    k8s["get"][MD][down] << 503 << UNAVAILABLE
    if request.param == "503":
        down.set()
        yield Management(str(k8s.url).rstrip("/"), "HTTP 503", down, None)
        return
    proxy = TcpProxy(int(k8s.url.port or 0))
    await proxy.start()
    await proxy.refuse()  # its port is known, and refuses connections
    try:
        yield Management(proxy.url, "connection failed", down, proxy)
    finally:
        await proxy.close()


def config_text(tmp_path: Path, member: str, management: str) -> str:
    paths = {}
    for name, server in (("member", member), ("management", management)):
        paths[name] = tmp_path / f"{name}.kubeconfig"
        paths[name].write_text(json.dumps(kubeconfig_doc(server)))
    return CONFIG.format(
        db=tmp_path / "jobs.db", member=paths["member"], management=paths["management"],
        pool=POOL, ns=NS, name=NAME, token=TOKEN,
    )  # fmt: skip


async def ready(client: TestClient[Any, Any]) -> dict[str, Any]:
    resp = await client.get("/readyz")
    assert resp.status == 200  # never unready for a pool: placing on the members goes on
    doc: dict[str, Any] = await resp.json()
    assert doc["status"] == "ready"
    return doc


async def available_gauge(client: TestClient[Any, Any]) -> float:
    text = await (await client.get("/metrics")).text()
    [line] = [x for x in text.splitlines() if x.startswith("fedbroker_burst_pool_available{")]
    assert line.startswith(f'fedbroker_burst_pool_available{{pool="{POOL}"}} ')
    return float(line.rsplit(" ", 1)[1])


async def burst_option(client: TestClient[Any, Any]) -> dict[str, Any]:
    resp = await client.get("/v1/jobs/big/explain", headers=A)
    assert resp.status == 200
    doc: dict[str, Any] = await resp.json()
    return doc


async def test_an_unreadable_pool_is_reported_retried_and_joins_without_a_restart(
    k8s: Emulator, management: Management, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "broker.service.pools")
    text = config_text(tmp_path, str(k8s.url).rstrip("/"), management.url)
    config = parse_config(text, "test config")
    clock, pauses = Clock(START), Pauses()
    retry = PoolRetry(wait_exponential(multiplier=5, max=20), pauses, 2, wait_none())
    service = Service(config, clock=clock, pool_retry=retry)
    await service.start()
    client = TestClient(TestServer(make_app(service, config)))
    await client.start_server()
    try:
        # Started and ready; the pool is out of the controller, and every report says why.
        assert service.ready and service.pools.rows() == []
        unavailable = Availability(POOL, False, management.reason, START, 1, START + 5)
        assert service.pools.availability() == [unavailable]
        assert (await ready(client))["burstPools"] == [unavailable.as_json()]
        assert await available_gauge(client) == 0.0
        burst = {"allowBurst": True, "gpuTypes": ["A100"]}
        await service.submit("team-a", manifest("big", gpus=8, count=3, placement=burst))
        await service.schedule_once()
        doc = await burst_option(client)
        assert doc["state"] == "Queued" and doc["burst"]["status"] == "none"
        [refusal] = doc["burst"]["refusals"]  # not "no-pools": the pool is named
        assert (refusal["pool"], refusal["code"], refusal["until"]) == (
            POOL, "unavailable", START + 5,
        )  # fmt: skip
        assert f"({management.reason})" in refusal["message"]
        assert f"{POOL}: the pool cannot be read" in render("explain", doc)

        # Read again with backoff: doubling from 5 s, capped at 20 s (the injected wait).
        for now in (START + 5, START + 15, START + 35):
            clock.now = now
            await pauses.end_one()
        assert pauses.seconds == [5, 10, 20, 20]
        assert service.pools.availability() == [
            Availability(POOL, False, management.reason, START, 4, START + 35 + 20)
        ]
        assert service.pools.rows() == [] and len(k8s["put"][MD][SCALE]) == 0

        # The management cluster answers: the next read joins the pool, no restart.
        await management.answer()
        clock.now = START + 55
        pauses.end()
        await until(lambda: bool(service.pools.rows()))
        [pool] = service.pools.rows()
        assert (pool.pool, pool.gpu_type, pool.max_nodes, pool.replicas) == (POOL, "A100", 4, 0)
        assert (await ready(client))["burstPools"] == [Availability(POOL, True).as_json()]
        assert await available_gauge(client) == 1.0
        assert len(pauses.seconds) == 4  # no read after the one that succeeded

        # The gang that waited bursts onto it at the next cycle: exactly its nodes.
        await service.schedule_once()
        await service.pools.drain()
        assert replicas(k8s) == 3
        requested = (await burst_option(client))["burst"]
        assert (requested["status"], requested["pool"], requested["nodes"]) == (
            "requested", POOL, 3,
        )  # fmt: skip
        logged = caplog.text
        assert f"burst pool {POOL} unavailable: " in logged
        assert f"burst pool {POOL} available after 4 failed reads" in logged
        assert CANARY not in logged
    finally:
        await client.close()
        await service.close()


def test_the_default_backoff_starts_near_5_seconds_and_never_exceeds_5_minutes() -> None:
    wait = PoolRetry().wait
    state = RetryCallState(AsyncRetrying(), None, (), {})
    pauses = []
    for attempt in range(1, 12):
        state.attempt_number = attempt
        pauses.append(wait(state))
    assert 5 <= pauses[0] <= 10 and 10 <= pauses[1] <= 15  # 5 s doubling, up to 5 s jitter
    assert all(p <= 300 for p in pauses) and pauses[-1] == 300


async def test_a_management_cluster_that_never_answers_does_not_hold_the_start(
    k8s: Emulator, tmp_path: Path
) -> None:
    proxy = TcpProxy(int(k8s.url.port or 0))
    await proxy.start()
    proxy.mode = "blackhole"  # accepts connections, never answers
    text = config_text(tmp_path, str(k8s.url).rstrip("/"), proxy.url)
    # The start waits 0.1 s for the first read; the read's request gives up after 3 s.
    retry = PoolRetry(sleep=Pauses(), attempts=1, request_timeout=3.0, first_read_seconds=0.1)
    service = Service(parse_config(text, "test config"), clock=Clock(START), pool_retry=retry)
    try:
        await service.start()
        assert service.ready and service.pools.rows() == []
        assert service.pools.availability() == [Availability(POOL, False, "not read yet", START)]
        await until(lambda: service.pools.availability()[0].attempts == 1)
        [timed_out] = service.pools.availability()
        assert (timed_out.reason, timed_out.since) == ("timed out", START)
    finally:
        await service.close()
        await proxy.close()
