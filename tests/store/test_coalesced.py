"""Both backends: concurrent submissions and plain transitions share statements (the
stores' coalescers), each with the outcome it would have had alone: a name submitted twice
at once is created once; a refused row fails its own write only; a transition whose
compare-and-set does not hold still says why."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from services import postgres_database
from test_store import query, refuse

from broker.store import JobNotFound, JobState, StateConflict, StoreError, open_store, sqlite_url
from broker.store.postgres import PostgresStore
from broker.store.sqlite import SqliteStore

QUEUED: tuple[JobState, ...] = ("Queued",)
RUNNING: tuple[JobState, ...] = ("Running",)

Coalescing = PostgresStore | SqliteStore


@pytest.fixture(params=["sqlite", "postgres"])
async def backend(
    request: pytest.FixtureRequest, tmp_path: Path
) -> AsyncIterator[tuple[str, Coalescing]]:
    async with contextlib.AsyncExitStack() as stack:
        if request.param == "sqlite":
            url = sqlite_url(str(tmp_path / "jobs.db"))
        else:
            url = await stack.enter_async_context(postgres_database())
        store = open_store(url)
        assert isinstance(store, PostgresStore | SqliteStore)
        await store.open()
        try:
            yield url, store
        finally:
            await store.close()


async def test_concurrent_writes_share_statements(backend: tuple[str, Coalescing]) -> None:
    url, store = backend
    names = [f"job-{i}" for i in range(200)]
    created = await asyncio.gather(
        *(store.create_job("t", n, "q", 0, {"n": n}, 1.0) for n in names)
    )
    assert all(new for _, new in created)
    assert [job.name for job, _ in created] == names
    assert store._inserts.writes == 200 and store._inserts.batches < 20
    moved = await asyncio.gather(
        *(store.transition("t", n, "Failed", "stopped", 2.0, expect=QUEUED) for n in names)
    )
    assert {(job.state, job.reason) for job in moved} == {("Failed", "stopped")}
    assert store._moves.writes == 200 and store._moves.batches < 20
    history = "SELECT state, count(*) FROM job_history GROUP BY state ORDER BY 1"
    assert await query(url, history) == [("Failed", 200), ("Queued", 200)]


async def test_a_coalesced_submission_returns_the_record_as_stored(
    backend: tuple[str, Coalescing],
) -> None:
    # Each record carries its caller's manifest (not decoded again from the row): the same
    # as a read of the row, but its own top-level mapping.
    _, store = backend
    manifests = {f"job-{i}": {"spec": {"n": i, "nested": [i, {"x": 1.5}]}} for i in range(50)}
    created = await asyncio.gather(
        *(store.create_job("t", n, "q", 0, m, 1.0) for n, m in manifests.items())
    )
    assert store._inserts.batches < 50  # some shared a statement
    for (record, new), (name, manifest) in zip(created, manifests.items(), strict=True):
        assert new and record.manifest == manifest and record.manifest is not manifest
        assert await store.get_job("t", name) == record


async def test_a_name_submitted_twice_at_once_is_created_once(
    backend: tuple[str, Coalescing],
) -> None:
    _, store = backend
    outcomes = await asyncio.gather(
        *(store.create_job("t", "same", "q", 0, {"try": i}, 1.0) for i in range(6))
    )
    assert sum(new for _, new in outcomes) == 1
    assert len({job.seq for job, _ in outcomes}) == 1  # the others got the stored job


async def test_a_refused_submission_fails_alone(backend: tuple[str, Coalescing]) -> None:
    url, store = backend
    await refuse(url, "NEW.name = 'bad'")
    names = ["a", "b", "bad", "c", "d"]
    outcomes = await asyncio.gather(
        *(store.create_job("t", n, "q", 0, {}, 1.0) for n in names), return_exceptions=True
    )
    assert isinstance(outcomes[2], StoreError) and "refused" in str(outcomes[2])
    assert [o[1] for i, o in enumerate(outcomes) if i != 2] == [True] * 4  # type: ignore[index]
    assert sorted(r[0] for r in await query(url, "SELECT name FROM jobs")) == ["a", "b", "c", "d"]


async def test_a_refused_transition_fails_alone(backend: tuple[str, Coalescing]) -> None:
    url, store = backend
    names = ["a", "b", "bad", "c"]
    for n in names:
        await store.create_job("t", n, "q", 0, {}, 1.0)
    await refuse(url, "NEW.name = 'bad' AND NEW.state = 'Running'")
    outcomes = await asyncio.gather(
        *(store.transition("t", n, "Running", "up", 2.0) for n in names), return_exceptions=True
    )
    assert isinstance(outcomes[2], StoreError) and "refused" in str(outcomes[2])
    states = dict(await query(url, "SELECT name, state FROM jobs"))
    assert states == {"a": "Running", "b": "Running", "bad": "Queued", "c": "Running"}


async def test_a_move_that_does_not_apply_says_why(backend: tuple[str, Coalescing]) -> None:
    _, store = backend
    await store.create_job("t", "a", "q", 0, {}, 1.0)
    outcomes = await asyncio.gather(
        store.transition("t", "a", "Succeeded", "done", 2.0, expect=RUNNING),
        store.transition("t", "gone", "Succeeded", "done", 2.0),
        return_exceptions=True,
    )
    assert isinstance(outcomes[0], StateConflict) and isinstance(outcomes[1], JobNotFound)
    job = await store.get_job("t", "a")
    assert job is not None and job.state == "Queued"


async def test_a_move_sets_attempts_and_not_before_as_transition_would(
    backend: tuple[str, Coalescing],
) -> None:
    # Twins: "a" moves through the coalescer with others, "b" alone through the statement
    # transition falls back to (a cluster given, the same as the one stored: not a move).
    _, store = backend
    for name in ("a", "b", "c"):
        await store.create_job("t", name, "q", 0, {}, 1.0)
    moved = await asyncio.gather(
        store.transition("t", "a", "Failed", "gave up", 2.0, attempts=3, not_before=9.0),
        store.transition("t", "c", "Running", "up", 2.0),
    )
    assert store._moves.writes == 2
    alone = await store.transition(
        "t", "b", "Failed", "gave up", 2.0, attempts=3, not_before=9.0, cluster="c1"
    )
    fields = [(j.state, j.attempts, j.not_before, j.reason) for j in (moved[0], alone)]
    assert fields[0] == fields[1] == ("Failed", 3, 9.0, "gave up")
    # Neither given: both stay as they were.
    assert (moved[1].attempts, moved[1].not_before) == (0, None)
    stored = await store.get_job("t", "a")
    assert stored is not None and (stored.attempts, stored.not_before) == (3, 9.0)
