"""Leader election (broker/leader.py): the lease on PostgreSQL, the stepping down, and the
service's follower mode behind the API.

The lease tests run against the PostgreSQL at FEDBROKER_TEST_POSTGRES_URL (one fresh
database per test; unreachable skips, or fails under FEDBROKER_REQUIRE_SERVICES=1). Lease
expiry is made to happen by setting ``expires_at`` in the past (the database's clock is the
one that counts); ``Leadership``'s own timing runs on an injected clock: no sleeps.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from aiohttp.test_utils import TestClient, TestServer
from builders import Clock
from services import postgres_database

from broker.config import Config, ConfigError, parse_config
from broker.http.app import make_app
from broker.service.facade import Service
from broker.service.leader import (
    LEASE_NAME,
    AlwaysLeader,
    FileLock,
    Leadership,
    PostgresLease,
    Timings,
    default_identity,
)
from broker.store import LeaseLost, Placing, StoreUnavailable
from broker.store.batch import NewJob, insert_new_jobs
from broker.store.postgres import PostgresStore

TOKEN = {"Authorization": "Bearer tok-a-00000000000000000000000000"}
CONFIG = """
store: {{url: "{url}"}}
clusters:
- name: c1
  source:
    simulated: {{shapes: [{{gpuType: A100, gpus: 8, cpu: "96", memory: 1024Gi, count: 2}}]}}
queues:
- {{name: batch, policy: binpack}}
tenants:
- {{name: team-a, defaultQueue: batch, token: {{value: tok-a-00000000000000000000000000}}}}
"""


def manifest(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "fedbroker.io/v1alpha1",
        "kind": "FederatedJob",
        "metadata": {"name": name},
        "spec": {"podSets": [{"name": "w", "count": 1,
                              "resources": {"nvidia.com/gpu": 1, "cpu": "1", "memory": "1Gi"}}]},
    }  # fmt: skip


@pytest.fixture
async def pg_url() -> AsyncIterator[str]:
    async with postgres_database("fedbroker_leader") as url:
        yield url


@pytest.fixture
async def stores(pg_url: str) -> AsyncIterator[list[PostgresStore]]:
    """Two replicas' stores (two pools) on one database."""
    opened = [PostgresStore(pg_url), PostgresStore(pg_url)]
    for store in opened:
        await store.open()
    yield opened
    for store in opened:
        await store.close()


async def sql(url: str, statement: str, *args: Any) -> Any:
    conn = await asyncpg.connect(url)
    try:
        return await conn.fetch(statement, *args)
    finally:
        await conn.close()


async def expire(url: str) -> None:
    """The lease ran out (by the database's clock)."""
    await sql(url, "UPDATE leases SET expires_at = now() - interval '1 second'")


# -- the lease row ------------------------------------------------------------------------------


async def test_exactly_one_holds_and_the_holder_renews(
    pg_url: str, stores: list[PostgresStore]
) -> None:
    a = PostgresLease(stores[0], "host-a:8080", 15)
    b = PostgresLease(stores[1], "host-b:8080", 15)
    assert await a.acquire()
    assert not await b.acquire()
    assert b.holder == "host-a:8080"  # a follower knows whom to send writes to
    before = (await sql(pg_url, "SELECT expires_at FROM leases"))[0][0]
    assert await a.renew()
    after = (await sql(pg_url, "SELECT expires_at FROM leases"))[0][0]
    assert after >= before
    assert not await b.acquire() and not await b.renew()
    rows = await sql(pg_url, "SELECT name, holder FROM leases")
    assert [tuple(r) for r in rows] == [(LEASE_NAME, "host-a:8080")]


async def test_the_other_takes_over_only_after_expiry(
    pg_url: str, stores: list[PostgresStore]
) -> None:
    a = PostgresLease(stores[0], "host-a:8080", 15)
    b = PostgresLease(stores[1], "host-b:8080", 15)
    assert await a.acquire()
    for _ in range(3):  # a stopped renewing, but the lease still runs
        assert not await b.acquire()
    await expire(pg_url)
    assert await b.acquire()
    assert b.holder == "host-b:8080"
    # The old holder can neither renew nor take it back while b's lease runs.
    assert not await a.renew()
    assert a.holder == "host-b:8080"
    assert not await a.acquire()
    # An expired lease is never renewed, even by its own holder: it must campaign again.
    await expire(pg_url)
    assert not await b.renew()
    assert await b.acquire()


async def test_release_hands_over_at_once_and_a_restart_keeps_its_lease(
    stores: list[PostgresStore],
) -> None:
    a = PostgresLease(stores[0], "host-a:8080", 15)
    b = PostgresLease(stores[1], "host-b:8080", 15)
    assert await a.acquire()
    # The same replica restarted (same identity, new process): takes its own lease back.
    again = PostgresLease(stores[1], "host-a:8080", 15)
    assert await again.acquire()
    await again.release()
    assert await b.acquire()


# -- stepping down --------------------------------------------------------------------------------


class Events:
    def __init__(self) -> None:
        self.log: list[str] = []

    async def elected(self) -> None:
        self.log.append("elected")

    async def deposed(self, why: str) -> None:
        self.log.append(f"deposed: {why}")


def leadership(elector: Any, clock: Clock, events: Events) -> Leadership:
    return Leadership(elector, Timings(15, 2, 10), events.elected, events.deposed, clock=clock)


async def test_a_leader_whose_store_breaks_stops_within_stop_after(
    pg_url: str, stores: list[PostgresStore]
) -> None:
    clock, events = Clock(100.0), Events()
    lead = leadership(PostgresLease(stores[0], "host-a:8080", 15), clock, events)
    await lead.step()
    assert lead.held and lead.valid() and events.log == ["elected"]
    clock.now += 2
    await lead.step()  # renewed: the 10 s count restarts here
    await stores[0].close()  # its database connection is gone
    with pytest.raises(StoreUnavailable):
        await stores[0].renew_lease(LEASE_NAME, "host-a:8080", 15)
    for _ in range(4):  # renewals fail every 2 s; still within 10 s of the last success
        clock.now += 2
        await lead.step()
        assert lead.held and lead.valid()
        assert lead.next_delay() <= 2
    clock.now += 2  # 10 s since the last renewal started: stop placing
    assert not lead.valid()  # even before the loop notices
    await lead.step()
    assert not lead.held
    assert events.log == ["elected", "deposed: lease not renewed within 10s"]
    # Meanwhile (by the database's clock, 15 s) nobody else could have taken it: it is
    # still held; only its expiry lets another replica in.
    b = PostgresLease(stores[1], "host-b:8080", 15)
    assert not await b.acquire()
    await expire(pg_url)
    assert await b.acquire()


async def test_a_leader_whose_lease_was_taken_stops_at_once(
    pg_url: str, stores: list[PostgresStore]
) -> None:
    clock, events = Clock(100.0), Events()
    lead = leadership(PostgresLease(stores[0], "host-a:8080", 15), clock, events)
    await lead.step()
    assert lead.held
    await sql(
        pg_url, "UPDATE leases SET holder = 'host-b:8080', expires_at = now() + interval '1 hour'"
    )
    clock.now += 2
    await lead.step()
    assert not lead.held and not lead.valid()
    assert events.log == ["elected", "deposed: lease lost to host-b:8080"]
    assert lead.holder == "host-b:8080"


class FlakyElector:
    """Renewal raises (a hung or broken store) until told otherwise."""

    expires = True

    def __init__(self) -> None:
        self.identity = "me:1"
        self.holder: str | None = None
        self.broken = False

    async def acquire(self) -> bool:
        if self.broken:
            raise OSError("connection refused")
        self.holder = self.identity
        return True

    async def renew(self) -> bool:
        return await self.acquire()

    async def release(self) -> None:
        self.holder = None


async def test_a_leader_that_renews_again_in_time_keeps_leading() -> None:
    clock, events, elector = Clock(100.0), Events(), FlakyElector()
    lead = leadership(elector, clock, events)
    await lead.step()
    elector.broken = True
    clock.now += 9
    await lead.step()
    assert lead.valid()
    elector.broken = False
    clock.now += 0.5
    await lead.step()  # renewed at 9.5 s: good for 10 s more
    clock.now += 9
    assert lead.valid()
    assert events.log == ["elected"]
    # A candidate that cannot reach the store stays a follower, without raising.
    follower = leadership(FlakyElector(), Clock(100.0), Events())
    follower.elector.broken = True  # type: ignore[attr-defined]
    await follower.step()
    assert not follower.held


async def test_a_takeover_longer_than_stop_after_keeps_the_lease() -> None:
    """A rebuild of 30 s (by the injected clock, in pages that hand the loop back, as the
    service's does) against a stop-after of 10 s: the lease is renewed meanwhile, so the new
    leader is still leading when it is ready, and the next step renews instead of stepping
    down (which it did, and then took over again, for ever). A renewal that finds the lease
    taken still ends the lead at the next step."""
    clock, events, elector = Clock(100.0), Events(), FlakyElector()
    renewals: list[float] = []

    async def renew() -> bool:
        renewals.append(clock.now)
        return elector.holder == elector.identity

    elector.renew = renew  # type: ignore[method-assign]

    async def sleep(seconds: float) -> None:  # until the work has moved the clock so far
        until = clock.now + seconds
        while clock.now < until:
            await asyncio.sleep(0)

    async def rebuild() -> None:
        for _ in range(15):  # 2 s of work a page
            clock.now += 2
            await asyncio.sleep(0)
        events.log.append("elected")

    lead = Leadership(
        elector, Timings(15, 2, 10), rebuild, events.deposed, clock=clock, sleep=sleep
    )
    await lead.step()
    assert lead.held and lead.valid() and len(renewals) >= 10
    await lead.step()
    assert lead.held and events.log == ["elected"]
    elector.holder = "other:2"  # taken meanwhile: the next renewal says so
    await lead.step()
    assert not lead.held and events.log == ["elected", "deposed: lease lost to other:2"]


async def test_sqlite_file_lock_lets_one_process_lead(tmp_path: Path) -> None:
    path = str(tmp_path / "jobs.db.leader")
    a, b = FileLock(path, "host-a:1"), FileLock(path, "host-b:2")
    assert await a.acquire() and await a.renew()
    assert not await b.acquire()
    assert b.holder == "host-a:1"
    await a.release()  # as the kernel does when the process dies
    assert await b.acquire()
    assert not await a.renew()


def test_config_timings_are_ordered() -> None:
    base = CONFIG.format(url="postgresql://u@h/db")
    config = parse_config(base, "c")
    election = config.leader_election
    assert (election.lease_seconds, election.renew_seconds, election.stop_after_seconds) == (
        15,
        2,
        10,
    )
    with pytest.raises(ConfigError, match=r"leaderElection\.stopAfterSeconds"):
        parse_config(base + "leaderElection: {stopAfterSeconds: 20}\n", "c")


# -- followers behind the API ---------------------------------------------------------------------


def config_for(url: str, extra: str = "") -> Config:
    return parse_config(CONFIG.format(url=url) + extra, "test config")


class Replica:
    def __init__(self, config: Config, identity: str) -> None:
        self.config = config
        self.service = Service(config, identity=identity)
        self.client: TestClient[Any, Any] | None = None

    async def __aenter__(self) -> Replica:
        await self.service.start()
        self.client = TestClient(TestServer(make_app(self.service, self.config)))
        await self.client.start_server()
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.client is not None
        await self.client.close()
        await self.service.close()

    @property
    def http(self) -> TestClient[Any, Any]:
        assert self.client is not None
        return self.client


async def check_follower(follower: Replica, leader: str) -> None:
    http = follower.http
    response = await http.post("/v1/jobs", json=manifest("j2"), headers=TOKEN)
    assert response.status == 503
    assert response.headers["Retry-After"] == "2"
    assert response.headers["X-Fedbroker-Leader"] == leader
    error = (await response.json())["error"]
    assert leader in error and "\n" not in error and "Traceback" not in error
    response = await http.delete("/v1/jobs/j1", headers=TOKEN)
    assert response.status == 503 and "Retry-After" in response.headers
    # Reads are served from the store.
    response = await http.get("/v1/jobs/j1", headers=TOKEN)
    assert response.status == 200, await response.text()
    assert (await response.json())["metadata"]["name"] == "j1"
    response = await http.get("/v1/jobs", headers=TOKEN)
    assert [j["metadata"]["name"] for j in (await response.json())["items"]] == ["j1"]
    assert (await http.get("/v1/clusters", headers=TOKEN)).status == 200
    assert (await http.get("/readyz")).status == 200  # a follower is ready: it serves reads
    health = await (await http.get("/healthz")).json()
    assert health["role"] == "follower" and health["leader"] == leader
    assert "fedbroker_leader 0.0" in await (await http.get("/metrics")).text()


@pytest.mark.parametrize("backend", ["postgresql", "sqlite"])
async def test_follower_rejects_writes_serves_reads_and_takes_over(
    backend: str, tmp_path: Path
) -> None:
    # The identities are names, not reachable replicas: no forwarding (test_forwarding.py).
    no_forward = "leaderElection: {forwardWrites: false}\n"
    if backend == "sqlite":
        await _takeover(config_for(f"sqlite://{tmp_path / 'jobs.db'}", no_forward), pg_url=None)
    else:
        async with postgres_database("fedbroker_leader") as url:
            await _takeover(config_for(url, no_forward), pg_url=url)


async def _takeover(config: Config, pg_url: str | None) -> None:
    async with Replica(config, "host-a:8080") as a, Replica(config, "host-b:8080") as b:
        assert a.service.leading and not b.service.leading
        response = await a.http.post("/v1/jobs", json=manifest("j1"), headers=TOKEN)
        assert response.status == 201, await response.text()
        assert "fedbroker_leader 1.0" in await (await a.http.get("/metrics")).text()
        await check_follower(b, "host-a:8080")
        assert len(b.service.queue) == 0  # a follower holds no queue

        # The leader goes away: its lease expires (or, on SQLite, its lock is dropped).
        if pg_url is not None:
            await expire(pg_url)
            await a.service.leadership.step()  # the old leader notices it lost the lease
        else:
            await a.service.leadership.elector.release()
            await a.service.leadership.step()
        assert not a.service.leading
        assert len(a.service.queue) == 0 and not a.service.ledger.reservations()
        await b.service.leadership.step()
        assert b.service.leading
        assert [p.job.key for p in b.service.queue.pending()] == ["team-a/j1"]  # rebuilt
        await b.service.schedule_once()
        record = await b.service.store.get_job("team-a", "j1")
        assert record is not None and record.state in ("Placed", "Running")
        response = await b.http.post("/v1/jobs", json=manifest("j3"), headers=TOKEN)
        assert response.status == 201
        await a.service.leadership.step()  # a candidate again: it learns the new holder
        assert not a.service.leading
        response = await a.http.post("/v1/jobs", json=manifest("j4"), headers=TOKEN)
        assert response.status == 503
        assert response.headers["X-Fedbroker-Leader"] == "host-b:8080"
        await a.service.schedule_once()  # a deposed leader places nothing
        record = await a.service.store.get_job("team-a", "j3")
        assert record is not None
        await b.service.launches_done(timeout=10)


async def test_single_replica_is_always_leader() -> None:
    config = config_for("sqlite://:memory:")
    service = Service(config)
    assert isinstance(service.leadership.elector, AlwaysLeader)
    await service.start()
    try:
        assert service.leading
    finally:
        await service.close()


def test_the_advertised_host_names_the_replica(monkeypatch: pytest.MonkeyPatch) -> None:
    # In a pod the hostname does not resolve from the other replicas; its IP does.
    monkeypatch.setenv("FEDBROKER_ADVERTISE_HOST", "10.1.2.3")
    assert default_identity(8080) == "10.1.2.3:8080"
    monkeypatch.delenv("FEDBROKER_ADVERTISE_HOST")
    assert default_identity(8080) == f"{socket.gethostname()}:8080"


# -- fencing: a replica's job writes land only while its lease holds -----------------------------


async def test_job_writes_are_fenced_by_the_lease(pg_url: str, stores: list[PostgresStore]) -> None:
    a = PostgresLease(stores[0], "host-a:8080", 15)
    b = PostgresLease(stores[1], "host-b:8080", 15)
    assert await a.acquire()  # fences stores[0] with host-a's lease
    _, created = await stores[0].create_job("t", "j1", "q", 0, {"k": 1}, 1.0)
    assert created
    j0, _ = await stores[0].create_job("t", "j0", "q", 0, {"k": 0}, 1.0)
    held = await stores[0].place_many([Placing(j0.seq, "c1", {"pods": []}, 0, "placed")], 1.5)
    assert [job.name for job in held] == ["j0"]  # the fenced statement, lease held
    await expire(pg_url)  # a paused longer than its lease: its writes must not land
    with pytest.raises(LeaseLost, match="host-a:8080 no longer holds"):
        await stores[0].create_job("t", "j2", "q", 0, {"k": 2}, 2.0)
    with pytest.raises(LeaseLost):
        await stores[0].transition("t", "j1", "Failed", "late", 3.0)
    assert await stores[1].get_job("t", "j2") is None
    j1 = await stores[1].get_job("t", "j1")
    assert j1 is not None and j1.state == "Queued"
    with pytest.raises(LeaseLost):
        await stores[0].place_many([Placing(j1.seq, "c1", {"pods": []}, 0, "late")], 3.0)
    assert (await stores[1].get_job("t", "j1")) == j1
    assert await b.acquire()
    with pytest.raises(LeaseLost):  # taken over: still refused
        await stores[0].transition("t", "j1", "Failed", "late", 4.0)
    placed = await stores[1].transition("t", "j1", "Failed", "by the new leader", 5.0)
    assert placed.state == "Failed"


@asynccontextmanager
async def write_in_flight(store: PostgresStore, how: str) -> AsyncIterator[None]:
    """An uncommitted job write of the fenced replica: the general transaction (its fence
    checked first), or the one-statement fenced insert of create_job's common case (the
    coalesced statement, here carrying one submission)."""
    if how == "transaction":
        async with store._txn("test write") as conn:  # fence checked, lease row locked
            await conn.execute(
                "INSERT INTO jobs (tenant, name, queue, priority, manifest, state, attempts, "
                "reason, created_at, updated_at) VALUES ('t', 'late', 'q', 0, '{}', 'Queued', "
                "0, 'Submitted', 1, 1)"
            )
            yield
        return
    assert store._fence is not None
    fenced = insert_new_jobs("postgres", [NewJob("t", "late", "q", 0, "{}", 1.0)], store._fence)
    async with store._require().acquire() as conn, conn.transaction():
        assert await conn.fetchrow(fenced.sql, *fenced.args) is not None  # inserted, locked
        yield


@pytest.mark.parametrize("how", ["transaction", "fenced statement"])
async def test_a_takeover_waits_for_the_old_leaders_write_in_flight(
    pg_url: str, stores: list[PostgresStore], how: str
) -> None:
    a = PostgresLease(stores[0], "host-a:8080", 15)
    b = PostgresLease(stores[1], "host-b:8080", 15)
    assert await a.acquire()
    async with write_in_flight(stores[0], how):
        # The holder's own renewal does not wait for its writes (under load, a stream of
        # them starved renewals held behind a share lock) ...
        async with asyncio.timeout(10):
            assert await a.renew()
            await expire(pg_url)  # ... nor does time running out
        taking_over = asyncio.create_task(b.acquire())  # a key update of the lease row
        deadline = asyncio.get_running_loop().time() + 10
        while not await sql(
            pg_url, "SELECT 1 FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
            "AND query LIKE 'INSERT INTO leases%'",
        ):  # fmt: skip
            assert asyncio.get_running_loop().time() < deadline, "the takeover never waited"
            await asyncio.sleep(0.01)
        assert not taking_over.done()  # blocked behind the write's key-share lock
    assert await taking_over  # the write committed; only now did the lease change hands
    assert await stores[1].get_job("t", "late") is not None
