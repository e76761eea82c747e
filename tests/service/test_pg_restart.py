"""PostgreSQL restarted under load (fault test, acceptance): the broker reports not-ready,
holds or retries writes, loses nothing acknowledged, and recovers by itself.

The broker (``fedbroker serve``, simulated clusters whose launches take LAUNCH_DELAY, so
gangs are starting when the database goes) runs on a private PostgreSQL server of this test
(tests/services.py), never the shared one: that one is stopped for real (``pg_ctl stop -m
fast``: open transactions rolled back, every connection closed), kept down DOWN_SECONDS and
started again, while a client submits a steady stream of single-GPU jobs over HTTP. The
client behaves as a real one: a 201 (or a 200 for a name whose earlier answer was a 503) is
an acknowledgement; a 503 must carry Retry-After, and the name is sent again after it.
Anything else (another 5xx, a 4xx, no connection) is a failure, collected and reported.

While the database is down /readyz answers 503 (polled until seen, bounded), /healthz
still answers 200 and a read answers 503 with Retry-After; after the start /readyz is 200
again within RECOVERY_BOUND without anything done to the broker, and the stream is accepted
again. At the end, once nothing is Queued: every acknowledged job exists exactly once (the
API's listing and the database itself), each is placed, none was placed twice, no node is
oversubscribed and the broker's ledger agrees with the stored placements; the broker's log
holds no traceback.

A write cut off by the restart is in doubt: it may have committed with its answer lost.
Whether the restart hits one is timing, so the broker's handling of both outcomes is also
tested deterministically, in process, on a store that fails chosen writes before or after
committing them: an in-doubt placement keeps its reservation until the store says whether it
was recorded (then it is launched) or not (then it is queued again), and a resubmitted job
whose creation's answer was lost is queued (no one else would queue it).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
import pytest
import yaml
from builders import Clock
from services import open_loop, private_postgres
from test_api import free_gpus, make_config
from test_api import manifest as gang_manifest
from test_crash_safety import (
    ADMIN_TOKEN,
    TENANT_TOKEN,
    Broker,
    admin_list,
    brokers,  # noqa: F401 (a fixture)
    check_outcome,
    gpus_in_use,
    job_name,
    manifest,
    settle,
    write_config,
)

from broker.manifest import FederatedJob, parse_manifest
from broker.service.facade import Service
from broker.store import JobRecord, Placing, StoreUnavailable
from broker.store.sqlite import SqliteStore

JOBS = 700
RATE = 40.0  # submissions per second (first attempts)
CONCURRENCY = 32
RESTART_AFTER = 160  # stop PostgreSQL once this many first attempts are out
# How long PostgreSQL stays down: a short restart, and one past the leader's
# stopAfterSeconds (10 s), which makes it stop placing, then lead again and rebuild.
DOWN_SECONDS = {"short": 3.0, "past-stop-after": 13.0}
LAUNCH_DELAY = 0.5  # seconds a simulated gang takes to start
NOT_READY_BOUND = 10.0  # stop -> /readyz 503
RECOVERY_BOUND = 30.0  # start -> /readyz 200, by itself
SUBMIT_DEADLINE = 60.0  # one name, through every retry
POLL = 0.1
REQUEST_TIMEOUT = aiohttp.ClientTimeout(total=10)


@dataclass
class Stream:
    """The submitting client: paced first attempts, each name retried after Retry-After."""

    session: aiohttp.ClientSession
    url: str
    acknowledged: dict[str, tuple[int, float]] = field(default_factory=dict)  # status, when
    rejected: Counter[str] = field(default_factory=Counter)  # name -> 503s it got
    retry_after: Counter[int] = field(default_factory=Counter)  # the hints given
    unexpected: list[str] = field(default_factory=list)
    sent: int = 0

    async def submit(self, name: str) -> None:
        headers = {"Authorization": f"Bearer {TENANT_TOKEN}"}
        started = time.monotonic()
        while time.monotonic() - started < SUBMIT_DEADLINE:
            try:
                async with self.session.post(
                    self.url + "/v1/jobs", json=manifest(name), headers=headers
                ) as response:
                    body, status = await response.text(), response.status
                    hint = response.headers.get("Retry-After")
            except (aiohttp.ClientError, TimeoutError) as exc:
                self.unexpected.append(f"{name}: {type(exc).__name__}: {exc}")
                await asyncio.sleep(1.0)
                continue
            if status == 201 or (status == 200 and self.rejected[name]):
                # A 200 is the stored job: only a name whose earlier answer was a 503 (a
                # commit whose acknowledgement the restart cut off) may get one.
                assert name not in self.acknowledged, f"{name} acknowledged twice"
                self.acknowledged[name] = (status, time.monotonic())
                return
            if status == 503 and hint is not None and hint.isdigit() and _is_error(body):
                self.rejected[name] += 1
                self.retry_after[int(hint)] += 1
                await asyncio.sleep(int(hint))
                continue
            self.unexpected.append(f"{name}: {status} (Retry-After {hint}): {body[:300]}")
            await asyncio.sleep(1.0)
        self.unexpected.append(f"{name}: not acknowledged within {SUBMIT_DEADLINE}s")

    async def run(self, names: list[str]) -> None:
        def sent() -> None:
            self.sent += 1

        await open_loop(names, RATE, CONCURRENCY, self.submit, sent)


def _is_error(body: str) -> bool:
    """A JSON error answer ({"error": ...}), not a traceback or an HTML page."""
    with contextlib.suppress(ValueError):
        doc = json.loads(body)
        return isinstance(doc, dict) and bool(doc.get("error")) and "Traceback" not in body
    return False


@dataclass
class Probes:
    """/readyz and /healthz, polled every POLL for the whole run: (when, ready, health);
    a status of 0 is no answer."""

    session: aiohttp.ClientSession
    url: str
    samples: list[tuple[float, int, int]] = field(default_factory=list)

    async def status(self, path: str) -> int:
        with contextlib.suppress(aiohttp.ClientError, TimeoutError):
            async with self.session.get(self.url + path) as response:
                await response.read()
                return response.status
        return 0

    async def run(self) -> None:
        while True:
            at = time.monotonic()
            ready, health = await asyncio.gather(self.status("/readyz"), self.status("/healthz"))
            self.samples.append((at, ready, health))
            await asyncio.sleep(POLL)

    async def until_ready(self, status: int, bound: float) -> float:
        """Poll /readyz until it answers ``status``; the monotonic time it did."""
        deadline = time.monotonic() + bound
        while time.monotonic() < deadline:
            if await self.status("/readyz") == status:
                return time.monotonic()
            await asyncio.sleep(POLL / 2)
        raise AssertionError(f"/readyz did not answer {status} within {bound}s")


async def read_during_outage(session: aiohttp.ClientSession, url: str) -> tuple[int, str | None]:
    """A read that needs the store: its status and Retry-After."""
    headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    async with session.get(url + "/v1/jobs?limit=10", headers=headers) as response:
        await response.read()
        return response.status, response.headers.get("Retry-After")


@pytest.mark.parametrize("kind", list(DOWN_SECONDS))
async def test_postgres_restart_under_load_loses_nothing_and_recovers(
    tmp_path: Path,
    brokers: list[Broker],  # noqa: F811
    kind: str,
) -> None:
    down = DOWN_SECONDS[kind]
    async with private_postgres() as pg:
        config = tmp_path / "fedbroker.yaml"
        write_config(config, pg.url)
        doc = yaml.safe_load(config.read_text(encoding="utf-8"))
        for cluster in doc["clusters"]:
            cluster["source"]["simulated"]["launchDelaySeconds"] = LAUNCH_DELAY
        config.write_text(yaml.safe_dump(doc), encoding="utf-8")
        broker = Broker(config, tmp_path)
        brokers.append(broker)
        connector = aiohttp.TCPConnector(limit=CONCURRENCY + 8)
        async with aiohttp.ClientSession(timeout=REQUEST_TIMEOUT, connector=connector) as s:
            broker.start()
            await broker.ready(s)
            probes = Probes(s, broker.url)
            probing = asyncio.create_task(probes.run())
            stream = Stream(s, broker.url)
            names = [job_name(i) for i in range(JOBS)]
            streaming = asyncio.create_task(stream.run(names))

            deadline = time.monotonic() + 2 * RESTART_AFTER / RATE + 10
            while stream.sent < RESTART_AFTER:
                assert time.monotonic() < deadline, f"only {stream.sent} sent"
                assert not streaming.done(), streaming
                await asyncio.sleep(0.01)
            stopping = time.monotonic()
            await pg.stop("fast")
            stopped = time.monotonic()
            not_ready = await probes.until_ready(503, NOT_READY_BOUND)
            read = await read_during_outage(s, broker.url)
            # The outage itself: the probes and the stream go on meanwhile.
            await asyncio.sleep(max(0.0, stopped + down - time.monotonic()))
            assert broker.proc is not None and broker.proc.poll() is None, broker.log_tail()
            starting = time.monotonic()
            await pg.start()
            started = time.monotonic()
            ready_again = await probes.until_ready(200, RECOVERY_BOUND)

            await asyncio.wait_for(streaming, timeout=2 * SUBMIT_DEADLINE)
            probing.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await probing
            assert not stream.unexpected, stream.unexpected[:10]
            assert set(stream.acknowledged) == set(names)
            settled = await settle(s, broker.url)
            listed = await admin_list(s, broker.url)
            in_use = await gpus_in_use(s, broker.url)
        broker.stop()

        # While down: not ready, alive, reads refused with a hint; writes refused likewise
        # (and retried by the client), not failed.
        assert read[0] == 503 and read[1] is not None, read
        outage = [(r, h) for at, r, h in probes.samples if not_ready <= at <= starting]
        assert outage and all(r == 503 for r, _ in outage), Counter(r for r, _ in outage)
        assert all(h == 200 for _, _, h in probes.samples), Counter(h for *_, h in probes.samples)
        assert stream.rejected, "no submission met the outage"
        # After the start: ready by itself, and the stream accepted again.
        assert ready_again - started < RECOVERY_BOUND
        after = [n for n, (_, at) in stream.acknowledged.items() if at > ready_again]
        assert after, "nothing acknowledged after the recovery"
        # Not-ready only around the outage: from the first 503 to the last one.
        unready = [at for at, r, _ in probes.samples if r != 200]
        assert unready and min(unready) >= stopping - POLL, (min(unready), stopping)

        # Nothing lost, nothing twice, placed once, no node oversubscribed.
        placed_again = await check_outcome(pg.url, listed, names, in_use)
        if down <= 10.0:
            assert placed_again == 0, f"{placed_again} jobs placed more than once"
        # else: a leader that stopped placing dropped its launches; leading again, it rebuilt
        # from the store and requeued the jobs of simulated members (their pods went with
        # the launches; a Kubernetes member's are read back instead). check_histories has
        # checked each was requeued in between: never two placements at once.

        log_text = (tmp_path / f"broker-{broker.starts}.log").read_text(encoding="utf-8")
        assert "Traceback" not in log_text, log_text[log_text.index("Traceback") - 2000 :][:6000]
        assert "internal error" not in log_text
        # Past stopAfterSeconds the leader stopped placing, and led again once it could.
        stepped_down = "stops placing: lease not renewed" in log_text
        assert stepped_down == (down > 10.0), log_text[-3000:]
        assert log_text.count("is the leader") == 1 + stepped_down

        statuses = Counter(status for status, _ in stream.acknowledged.values())
        report: dict[str, Any] = {
            "stop_s": round(stopped - stopping, 2), "start_s": round(started - starting, 2),
            "stop_to_not_ready_s": round(not_ready - stopping, 2),
            "not_ready_s": round(max(unready) - min(unready) + POLL, 2),
            "start_to_ready_s": round(ready_again - started, 2),
            "acknowledged": len(stream.acknowledged), "created_201": statuses[201],
            "existing_200": statuses[200], "rejected_503": sum(stream.rejected.values()),
            "names_retried": len(stream.rejected), "retry_after_s": dict(stream.retry_after),
            "acknowledged_after_recovery": len(after), "settle_s": round(settled, 2),
            "held_writes_retried": log_text.count("not recorded yet"),
            "placements_in_doubt": log_text.count("in doubt:"),
            "placements_not_recorded": log_text.count("could not record placement"),
            "down_s": down, "stepped_down": stepped_down, "placed_again": placed_again,
        }  # fmt: skip
        print(json.dumps(report))


# -- writes in doubt, deterministically ---------------------------------------------------------

T = TypeVar("T")


class CutOff(SqliteStore):
    """A store whose chosen writes fail with StoreUnavailable as a dropped connection makes
    them fail: ``before`` committing (nothing written) or ``after`` (the answer lost).
    ``fail`` maps ``create`` or a transition's target state to when; each fires once."""

    def __init__(self, path: str) -> None:
        super().__init__(path)
        self.fail: dict[str, str] = {}

    async def _cut(self, kind: str, write: Callable[[], Awaitable[T]]) -> T:
        when = self.fail.pop(kind, None)
        if when == "before":
            raise StoreUnavailable("connection lost (test)")
        result = await write()
        if when == "after":
            raise StoreUnavailable("connection lost before the answer (test)")
        return result

    async def create_job(self, *args: Any, **kwargs: Any) -> tuple[JobRecord, bool]:
        return await self._cut("create", functools.partial(super().create_job, *args, **kwargs))

    async def transition(self, *args: Any, **kwargs: Any) -> JobRecord:
        state = str(kwargs.get("state", args[2]))
        return await self._cut(state, functools.partial(super().transition, *args, **kwargs))

    async def place_many(self, placings: Sequence[Placing], now: float) -> list[JobRecord]:
        return await self._cut("Placed", functools.partial(super().place_many, placings, now))


def gang(name: str) -> FederatedJob:
    return parse_manifest(json.dumps(gang_manifest(name)).encode(), "application/json")


async def run_until(service: Service, clock: Clock, key: str, state: str) -> JobRecord:
    """Scheduling cycles (bounded) until the stored job is in ``state``."""
    tenant, _, name = key.partition("/")
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        await service.schedule_once(clock.now)
        await service.launches_done(timeout=5)
        record = await service.get(tenant, name)
        if record.state == state:
            return record
        await asyncio.sleep(0.05)
    raise AssertionError(f"{key} not {state} within 10s: {record}")


@pytest.mark.parametrize("when", ["after", "before"])
async def test_a_placement_in_doubt_is_settled_from_the_store(tmp_path: Path, when: str) -> None:
    store = CutOff(str(tmp_path / "jobs.db"))
    clock = Clock()
    service = Service(make_config(tmp_path), store=store, clock=clock)
    await service.start()
    try:
        await service.submit("team-a", gang("train"))
        store.fail["Placed"] = when
        await service.schedule_once(clock.now)
        # In doubt: the capacity stays reserved, nothing is launched yet.
        assert "team-a/train" in service.ledger.reservations()
        assert service.lifecycle.get("team-a/train") is None
        await run_until(service, clock, "team-a/train", "Running")
        history = [t.state for t in await store.history("team-a", "train")]
        assert history == ["Queued", "Placed", "Running"], history
        assert free_gpus(service, "small-a", "A100") == 8  # one 8-GPU pod of 16 GPUs
    finally:
        await service.close()


class CancelledBehind(SqliteStore):
    """A store in which the job is cancelled (by a user on another replica's API, say)
    between the cycle's decision and its write of the placements."""

    async def place_many(self, placings: Sequence[Placing], now: float) -> list[JobRecord]:
        await self.transition("team-a", "train", "Cancelled", "by the user", now)
        return await super().place_many(placings, now)


async def test_a_placement_of_a_job_cancelled_meanwhile_gives_its_capacity_back(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = CancelledBehind(str(tmp_path / "jobs.db"))
    clock = Clock()
    service = Service(make_config(tmp_path), store=store, clock=clock)
    await service.start()
    try:
        before = free_gpus(service, "small-a", "A100")
        await service.submit("team-a", gang("train"))
        await service.schedule_once(clock.now)
        assert "team-a/train" not in service.ledger.reservations()
        assert service.lifecycle.get("team-a/train") is None  # not launched
        assert service.queue.get("team-a/train") is None
        assert free_gpus(service, "small-a", "A100") == before
        assert (await service.get("team-a", "train")).state == "Cancelled"
        assert "no longer Queued" in caplog.text
    finally:
        await service.close()


async def test_a_resubmission_queues_a_job_whose_creation_answer_was_lost(tmp_path: Path) -> None:
    store = CutOff(str(tmp_path / "jobs.db"))
    clock = Clock()
    service = Service(make_config(tmp_path), store=store, clock=clock)
    await service.start()
    try:
        store.fail["create"] = "after"
        with pytest.raises(StoreUnavailable):
            await service.submit("team-a", gang("train"))
        assert service.queue.get("team-a/train") is None  # stored, but nobody queued it
        record, created = await service.submit("team-a", gang("train"))  # the client retries
        assert (record.state, created) == ("Queued", False)
        assert service.queue.get("team-a/train") is not None
        await run_until(service, clock, "team-a/train", "Running")
        await service.submit("team-a", gang("train"))  # once more: not queued a second time
        assert service.queue.get("team-a/train") is None
        assert free_gpus(service, "small-a", "A100") == 8
    finally:
        await service.close()
