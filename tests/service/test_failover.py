"""Failover (leader election, acceptance): two ``fedbroker serve`` replicas on one PostgreSQL.

A steady stream of single-GPU submissions goes to whichever replica accepts: a client that
gets 503 (a follower, or no leader yet) or no connection tries the other replica, until the
job is acknowledged (201, or 200 for a name whose earlier answer was lost). The leader is
killed with SIGKILL mid-stream; the follower must place again within 20 s of the kill
(measured to the first placement the store records after it), with the issue's timings
(lease 15 s, renewal every 2 s). The killed replica is restarted on its address and must
come back as a follower. At the end the crash-safety audit holds: every acknowledged job
exists once and is placed, none was placed twice without a requeue in between, no node is
oversubscribed and the leader's ledger agrees with the stored placements.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg
import pytest
from services import open_loop, postgres_database
from test_crash_safety import (
    TENANT_TOKEN,
    Broker,
    admin_list,
    check_outcome,
    gpus_in_use,
    job_name,
    manifest,
    settle,
    write_config,
)

JOBS = 900
RATE = 40.0  # submissions per second (first attempts)
CONCURRENCY = 16
KILL_AFTER = 200  # SIGKILL the leader once this many first attempts are out
TAKEOVER_BOUND = 20.0  # seconds, the bound: kill -> first placement by the new leader
RETRY_PAUSE = 0.1
SUBMIT_DEADLINE = 60.0  # one name, through every retry
REQUEST_TIMEOUT = aiohttp.ClientTimeout(total=10)


@pytest.fixture
def replicas() -> Iterator[list[Broker]]:
    started: list[Broker] = []
    yield started
    for broker in started:
        broker.stop()


async def role(session: aiohttp.ClientSession, broker: Broker) -> str | None:
    """``leader``/``follower`` from /healthz; None when it does not answer."""
    with contextlib.suppress(aiohttp.ClientError, TimeoutError):
        async with session.get(broker.url + "/healthz") as response:
            if response.status == 200:
                return str((await response.json())["role"])
    return None


class Stream:
    """Submissions to whichever replica accepts."""

    def __init__(self, session: aiohttp.ClientSession, urls: list[str]) -> None:
        self.session = session
        self.urls = urls
        self.preferred = 0
        self.acknowledged: dict[str, int] = {}
        self.outcomes: Counter[str] = Counter()
        self.sent = 0

    async def submit(self, name: str) -> None:
        headers = {"Authorization": f"Bearer {TENANT_TOKEN}"}
        started = time.monotonic()
        while time.monotonic() - started < SUBMIT_DEADLINE:
            index = self.preferred
            try:
                async with self.session.post(
                    self.urls[index] + "/v1/jobs", json=manifest(name), headers=headers
                ) as response:
                    body = await response.text()
                    status = response.status
            except (aiohttp.ClientError, TimeoutError) as exc:
                self.outcomes[type(exc).__name__] += 1
                self.preferred = 1 - index  # the other replica
                await asyncio.sleep(RETRY_PAUSE)
                continue
            self.outcomes[str(status)] += 1
            if status in (200, 201):
                assert name not in self.acknowledged, f"{name} acknowledged twice"
                self.acknowledged[name] = status
                return
            if status == 503:
                assert "Traceback" not in body and json.loads(body)["error"], body
                assert "Retry-After" in response.headers, response.headers
                self.preferred = 1 - index
                await asyncio.sleep(RETRY_PAUSE)
                continue
            raise AssertionError(f"submitting {name}: unexpected {status}: {body}")
        raise AssertionError(f"{name} not acknowledged within {SUBMIT_DEADLINE}s")

    async def run(self, names: list[str]) -> None:
        def sent() -> None:
            self.sent += 1

        await open_loop(names, RATE, CONCURRENCY, self.submit, sent)


async def first_placement_after(url: str, since: float, deadline: float) -> float:
    """Seconds from ``since`` (epoch) to the first Placed transition recorded after it."""
    conn = await asyncpg.connect(url)
    try:
        while time.time() < since + deadline:
            at = await conn.fetchval(
                "SELECT min(at) FROM job_history WHERE state = 'Placed' AND at > $1", since
            )
            if at is not None:
                return float(at) - since
            await asyncio.sleep(0.05)
    finally:
        await conn.close()
    raise AssertionError(f"no placement within {deadline}s of the leader's death")


async def test_follower_takes_over_within_20s_of_the_leader_being_killed(
    tmp_path: Path, replicas: list[Broker]
) -> None:
    async with postgres_database("fedbroker_failover") as url:
        config = tmp_path / "fedbroker.yaml"
        write_config(config, url)
        brokers = []
        for label in ("a", "b"):
            (tmp_path / label).mkdir()
            brokers.append(Broker(config, tmp_path / label))
        replicas.extend(brokers)
        connector = aiohttp.TCPConnector(limit=CONCURRENCY + 8)
        async with aiohttp.ClientSession(timeout=REQUEST_TIMEOUT, connector=connector) as s:
            for broker in brokers:  # one after the other: the first one leads
                broker.start()
                await broker.ready(s)
            roles = [await role(s, b) for b in brokers]
            assert roles == ["leader", "follower"], roles
            leader, follower = brokers
            stream = Stream(s, [b.url for b in brokers])
            names = [job_name(i) for i in range(JOBS)]
            streaming = asyncio.create_task(stream.run(names))

            while stream.sent < KILL_AFTER:
                await asyncio.sleep(0.01)
                assert not streaming.done() or streaming.exception() is None
            assert [await role(s, b) for b in brokers] == ["leader", "follower"]
            killed_at = time.time()
            leader.sigkill()
            takeover = await first_placement_after(url, killed_at, 2 * TAKEOVER_BOUND)
            assert await role(s, follower) == "leader"
            # The killed replica comes back on its address: it must follow, not lead.
            leader.start()
            await leader.ready(s)
            assert await role(s, leader) == "follower"

            await asyncio.wait_for(streaming, timeout=4 * SUBMIT_DEADLINE)
            assert set(stream.acknowledged) == set(names)
            assert stream.outcomes.get("500", 0) == 0, stream.outcomes
            settled = await settle(s, follower.url)
            listed = await admin_list(s, follower.url)
            in_use = await gpus_in_use(s, follower.url)
            assert [await role(s, b) for b in brokers] == ["follower", "leader"]

        assert takeover < TAKEOVER_BOUND, f"took {takeover:.1f}s to place again"
        placed_again = await check_outcome(url, listed, names, in_use)

        report: dict[str, Any] = {
            "takeover_s": round(takeover, 2), "settle_s": round(settled, 2),
            "created": sum(1 for v in stream.acknowledged.values() if v == 201),
            "outcomes": dict(stream.outcomes), "placed_more_than_once": placed_again,
        }  # fmt: skip
        print(json.dumps(report))
