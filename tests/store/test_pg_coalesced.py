"""PostgreSQL: concurrent submissions and plain transitions share statements (the store's
coalescers), each with the outcome it would have had alone: a name submitted twice at once
is created once; a refused row fails its own write only; a transition whose compare-and-set
does not hold still says why."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import asyncpg
import pytest
from services import postgres_database
from test_store import query

from broker.store import JobNotFound, JobState, StateConflict, StoreError
from broker.store.postgres import PostgresStore

QUEUED: tuple[JobState, ...] = ("Queued",)
RUNNING: tuple[JobState, ...] = ("Running",)


@pytest.fixture
async def pg() -> AsyncIterator[tuple[str, PostgresStore]]:
    async with postgres_database() as url:
        store = PostgresStore(url)
        await store.open()
        try:
            yield url, store
        finally:
            await store.close()


async def refuse(url: str, when: str) -> None:
    """A trigger on jobs that fails a row matching ``when`` (SQL on NEW), behind the store."""
    conn = await asyncpg.connect(url)
    try:
        await conn.execute(
            "CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
            f"IF {when} THEN RAISE EXCEPTION 'refused'; END IF; RETURN NEW; END $$"
        )
        await conn.execute(
            "CREATE TRIGGER refuse BEFORE INSERT OR UPDATE ON jobs FOR EACH ROW "
            "EXECUTE FUNCTION refuse()"
        )
    finally:
        await conn.close()


async def test_concurrent_writes_share_statements(pg: tuple[str, PostgresStore]) -> None:
    url, store = pg
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


async def test_a_name_submitted_twice_at_once_is_created_once(
    pg: tuple[str, PostgresStore],
) -> None:
    _, store = pg
    outcomes = await asyncio.gather(
        *(store.create_job("t", "same", "q", 0, {"try": i}, 1.0) for i in range(6))
    )
    assert sum(new for _, new in outcomes) == 1
    assert len({job.seq for job, _ in outcomes}) == 1  # the others got the stored job


async def test_a_refused_submission_fails_alone(pg: tuple[str, PostgresStore]) -> None:
    url, store = pg
    await refuse(url, "NEW.name = 'bad'")
    names = ["a", "b", "bad", "c", "d"]
    outcomes = await asyncio.gather(
        *(store.create_job("t", n, "q", 0, {}, 1.0) for n in names), return_exceptions=True
    )
    assert isinstance(outcomes[2], StoreError) and "refused" in str(outcomes[2])
    assert [o[1] for i, o in enumerate(outcomes) if i != 2] == [True] * 4  # type: ignore[index]
    assert sorted(r[0] for r in await query(url, "SELECT name FROM jobs")) == ["a", "b", "c", "d"]


async def test_a_refused_transition_fails_alone(pg: tuple[str, PostgresStore]) -> None:
    url, store = pg
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


async def test_a_move_that_does_not_apply_says_why(pg: tuple[str, PostgresStore]) -> None:
    _, store = pg
    await store.create_job("t", "a", "q", 0, {}, 1.0)
    outcomes = await asyncio.gather(
        store.transition("t", "a", "Succeeded", "done", 2.0, expect=RUNNING),
        store.transition("t", "gone", "Succeeded", "done", 2.0),
        return_exceptions=True,
    )
    assert isinstance(outcomes[0], StateConflict) and isinstance(outcomes[1], JobNotFound)
    job = await store.get_job("t", "a")
    assert job is not None and job.state == "Queued"
