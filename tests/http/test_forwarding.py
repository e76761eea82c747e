"""A follower forwards writes to the leader (leaderElection.forwardWrites, broker/api.py).

Two in-process replicas (Service + the real API on aiohttp's TestServer, real HTTP between
them) share one store: PostgreSQL at FEDBROKER_TEST_POSTGRES_URL (skips when unreachable,
fails under FEDBROKER_REQUIRE_SERVICES=1) or one SQLite file (the OS file lock elects).
The leader's identity is its real address (127.0.0.1:<port>), so the follower can reach it.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from aiohttp import ClientSession
from aiohttp.test_utils import TestServer
from services import postgres_database
from test_leader import CONFIG as LEADER_CONFIG
from test_leader import manifest

from broker.config import Config, parse_config
from broker.http.app import make_app
from broker.http.forwarding import FORWARDED_BY
from broker.service.facade import Service

A = {"Authorization": "Bearer tok-a-00000000000000000000000000"}
ADMIN = {"Authorization": "Bearer tok-admin-0000000000000000000000"}
SECRETS = ("tok-a-00000000000000000000000000", "tok-admin-0000000000000000000000")
# test_leader's federation, and an admin to see every tenant's jobs.
CONFIG = (
    LEADER_CONFIG
    + """\
- {{name: admin, defaultQueue: batch, admin: true,
   token: {{value: tok-admin-0000000000000000000000}}}}
"""
)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class Replica:
    """A Service behind the real API on 127.0.0.1:<port>; its identity is that address."""

    def __init__(self, config: Config, identity: str | None = None) -> None:
        self.port = free_port()
        self.identity = identity or f"127.0.0.1:{self.port}"
        self.service = Service(config, identity=self.identity)
        self.server = TestServer(make_app(self.service, config), host="127.0.0.1", port=self.port)
        self.open = False

    async def start(self) -> None:
        await self.service.start()
        await self.server.start_server()
        self.open = True

    async def stop_listening(self) -> None:
        if self.open:
            await self.server.close()
            self.open = False

    async def close(self) -> None:
        await self.service.launches_done(timeout=10)
        await self.stop_listening()
        await self.service.close()

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"


@asynccontextmanager
async def pair(
    config: Config, leader_identity: str | None = None
) -> AsyncIterator[tuple[Replica, Replica]]:
    leader, follower = Replica(config, leader_identity), Replica(config)
    await leader.start()
    await follower.start()
    try:
        assert leader.service.leading and not follower.service.leading
        assert follower.service.leadership.holder == leader.identity
        yield leader, follower
    finally:
        await follower.close()
        await leader.close()


@pytest.fixture(params=["sqlite", "postgresql"])
async def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[str]:
    if request.param == "sqlite":
        yield f"sqlite://{tmp_path / 'jobs.db'}"
    else:
        async with postgres_database("fedbroker_forward") as url:
            yield url


def config_for(url: str, extra: str = "") -> Config:
    return parse_config(CONFIG.format(url=url) + extra, "test config")


async def test_a_follower_forwards_writes_and_serves_reads(
    store_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    async with pair(config_for(store_url)) as (leader, follower), ClientSession() as http:
        me = follower.identity
        # submit: committed by the leader, answered through the follower
        async with http.post(follower.url("/v1/jobs"), json=manifest("j1"), headers=A) as r:
            assert r.status == 201, await r.text()
            assert r.headers[FORWARDED_BY] == me
            assert r.headers["Content-Type"].startswith("application/json")
            doc = await r.json()
        assert doc["metadata"] == {"name": "j1", "namespace": "team-a"}  # the caller's tenant
        assert [j.name for j in await leader.service.store.list_jobs()] == ["j1"]
        assert len(leader.service.queue) == 1 and len(follower.service.queue) == 0
        # a resubmission is forwarded too, and answered with the stored job
        async with http.post(follower.url("/v1/jobs"), json=manifest("j1"), headers=A) as r:
            assert r.status == 200 and r.headers[FORWARDED_BY] == me
        # the query goes along: an admin cancels team-a's job by ?tenant=
        async with http.delete(follower.url("/v1/jobs/j1?tenant=team-a"), headers=ADMIN) as r:
            assert r.status == 200, await r.text()
            assert r.headers[FORWARDED_BY] == me
            assert (await r.json())["status"]["state"] == "Cancelled"
        # the leader's errors come back as they are
        async with http.delete(follower.url("/v1/jobs/nope"), headers=A) as r:
            assert r.status == 404 and r.headers[FORWARDED_BY] == me
            assert (await r.json()) == {"error": "name: job 'nope' not found"}
        # reads are the follower's own; a bad token never leaves it
        async with http.get(follower.url("/v1/jobs/j1"), headers=A) as r:
            assert r.status == 200 and FORWARDED_BY not in r.headers
        async with http.post(
            follower.url("/v1/jobs"), json=manifest("j2"), headers={"Authorization": "Bearer x"}
        ) as r:
            assert r.status == 401 and FORWARDED_BY not in r.headers
        assert "POST /v1/jobs forwarded to the leader" in caplog.text
    for secret in SECRETS:
        assert secret not in caplog.text


async def test_no_forward_loops_and_a_forwarding_switch(tmp_path: Path) -> None:
    url = f"sqlite://{tmp_path / 'jobs.db'}"
    async with pair(config_for(url)) as (leader, follower), ClientSession() as http:
        # Already forwarded once: answered here (503 naming the leader), never sent on.
        headers = {**A, FORWARDED_BY: "somebody:1"}
        async with http.post(follower.url("/v1/jobs"), json=manifest("j1"), headers=headers) as r:
            assert r.status == 503
            assert r.headers["X-Fedbroker-Leader"] == leader.identity
            assert r.headers["Retry-After"] == "2"
            assert FORWARDED_BY not in r.headers
        assert await leader.service.store.list_jobs() == []
    config = config_for(f"sqlite://{tmp_path / 'off.db'}", "leaderElection: {forwardWrites: false}")
    async with pair(config) as (leader, follower), ClientSession() as http:
        async with http.post(follower.url("/v1/jobs"), json=manifest("j1"), headers=A) as r:
            assert r.status == 503 and FORWARDED_BY not in r.headers
            assert r.headers["X-Fedbroker-Leader"] == leader.identity
        assert await leader.service.store.list_jobs() == []


async def test_a_leader_that_is_no_address_is_not_forwarded_to(tmp_path: Path) -> None:
    config = config_for(f"sqlite://{tmp_path / 'jobs.db'}")
    async with pair(config, leader_identity="broker-0") as (_, follower), ClientSession() as http:
        r = await http.post(follower.url("/v1/jobs"), json=manifest("j1"), headers=A)
        assert r.status == 503 and FORWARDED_BY not in r.headers
        assert r.headers["X-Fedbroker-Leader"] == "broker-0"
        r.release()


async def test_an_unreachable_leader_falls_back_to_503(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    config = config_for(f"sqlite://{tmp_path / 'jobs.db'}")
    async with pair(config) as (leader, follower), ClientSession() as http:
        await leader.stop_listening()  # still holds the lease, answers nothing: refused
        async with http.post(follower.url("/v1/jobs"), json=manifest("j1"), headers=A) as r:
            assert r.status == 503, await r.text()
            assert r.headers["Retry-After"] == "2"
            assert r.headers["X-Fedbroker-Leader"] == leader.identity
            assert FORWARDED_BY not in r.headers
            error = (await r.json())["error"]
        assert leader.identity in error and "\n" not in error
        assert f"not forwarded to the leader {leader.identity}" in caplog.text
        assert await leader.service.store.list_jobs() == []
    for secret in SECRETS:
        assert secret not in caplog.text


async def test_views_that_disagree_during_a_handover_do_not_loop(tmp_path: Path) -> None:
    """The follower still sends writes to the old leader, which has stepped down and
    already names the follower as the leader: the old leader must not send the write back
    (it came with X-Fedbroker-Forwarded-By); its 503 is relayed to the client."""
    config = config_for(f"sqlite://{tmp_path / 'jobs.db'}")
    async with pair(config) as (old, follower), ClientSession() as http:
        await old.service.leadership.elector.release()
        await old.service.leadership.step()
        assert not old.service.leading
        old.service.leadership.elector.holder = follower.identity  # its view: the follower leads
        assert follower.service.leadership.holder == old.identity  # the follower's: old leads
        async with http.post(follower.url("/v1/jobs"), json=manifest("j1"), headers=A) as r:
            assert r.status == 503, await r.text()
            assert r.headers[FORWARDED_BY] == follower.identity  # relayed from the old leader
            assert r.headers["X-Fedbroker-Leader"] == follower.identity
            assert "Retry-After" in r.headers
        assert await old.service.store.list_jobs() == []
