"""The batched compare-and-sets on both backends: ``Store.transition_many`` (a restart's
rebuild) and ``Store.place_many`` (a scheduling cycle's placements). Each job moves exactly
as ``transition(expect=...)`` would move it (fields and history row), a job whose state
changed meanwhile, or whose row is not the one read, is skipped, and a batch is all or
nothing.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from services import postgres_database
from test_store import query, refuse

from broker.store import (
    JobRecord,
    JobState,
    Placing,
    Store,
    StoreError,
    open_store,
    sqlite_url,
)


@pytest.fixture(params=["sqlite", "postgres"])
async def url(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[str]:
    if request.param == "sqlite":
        yield sqlite_url(str(tmp_path / "jobs.db"))
        return
    async with postgres_database() as pg_url:
        yield pg_url


@pytest.fixture
async def store(url: str) -> AsyncIterator[Store]:
    opened = open_store(url)
    await opened.open()
    yield opened
    await opened.close()


async def placed(store: Store, tenant: str, name: str, *, running: bool = False) -> JobRecord:
    await store.create_job(tenant, name, "q", 1, {"n": name}, 1.0)
    placement = {"pods": [{"pod": f"{name}-0", "node": "n1"}]}
    job = await store.transition(
        tenant, name, "Placed", "placed", 2.0, cluster="c1", placement=placement
    )
    if running:
        job = await store.transition(tenant, name, "Running", "running", 3.0)
    return job


async def test_each_job_moves_as_transition_would(store: Store) -> None:
    # Twins: "a-*" move through the batch, "b-*" one by one through transition.
    batch = []
    for prefix in ("a", "b"):
        batch.append(await placed(store, "t1", f"{prefix}-placed"))
        batch.append(await placed(store, "t2", f"{prefix}-running", running=True))
    batch = [job for job in batch if job.name.startswith("a-")]
    moved = await store.transition_many(batch, "Queued", "requeued after broker restart", 9.0)
    assert sorted(job.name for job in moved) == ["a-placed", "a-running"]
    for tenant, name, state in ((job.tenant, job.name, job.state) for job in batch):
        twin = name.replace("a-", "b-")
        single = await store.transition(
            tenant, twin, "Queued", "requeued after broker restart", 9.0, expect=(state,)
        )
        mine = await store.get_job(tenant, name)
        assert mine is not None and mine in moved  # what came back is what is stored
        assert mine.replace(name=twin, seq=single.seq, manifest=single.manifest) == single
        assert mine.cluster is None and mine.placement is None and mine.attempts == 1
        assert await store.history(tenant, name) == await store.history(tenant, twin)
    # To Placed: attempts grows by one, as transition's field rules say.
    queued = await store.get_job("t1", "a-placed")
    assert queued is not None
    again = await store.transition_many([queued], "Placed", "placed", 10.0)
    assert again == [await store.get_job("t1", "a-placed")]
    assert [job.attempts for job in again] == [2]


async def test_changed_and_missing_jobs_are_skipped(store: Store) -> None:
    moves = await placed(store, "t", "moves")
    read = await placed(store, "t", "changed")  # the caller read it as Placed...
    before = await store.transition("t", "changed", "Running", "running", 3.0)  # ...then this
    gone = moves.replace(name="gone", seq=moves.seq + 1000)
    moved = await store.transition_many([moves, read, gone], "Queued", "requeued", 9.0)
    assert [job.name for job in moved] == ["moves"]
    assert await store.get_job("t", "changed") == before
    assert [t.state for t in await store.history("t", "changed")] == ["Queued", "Placed", "Running"]
    assert await store.get_job("t", "gone") is None
    assert await store.transition_many([], "Queued", "requeued", 9.0) == []


async def test_a_job_submitted_again_is_not_the_row_read(store: Store) -> None:
    """Same name, same state, but a later generation (another row): not moved."""
    read = await placed(store, "t", "again")
    await store.transition("t", "again", "Succeeded", "done", 4.0)
    await store.create_job("t", "again", "q", 1, {"n": "again"}, 5.0, reuse_finished=True)
    now = await store.transition("t", "again", "Placed", "placed", 6.0, cluster="c1")
    assert now.seq != read.seq and now.state == read.state
    assert await store.transition_many([read], "Queued", "requeued", 9.0) == []
    assert await store.get_job("t", "again") == now


async def test_a_batch_is_all_or_nothing(url: str, store: Store) -> None:
    names = [f"job-{i}" for i in range(20)]
    batch = [await placed(store, "t", name) for name in names]
    await refuse(url, "NEW.name = 'job-13'")
    with pytest.raises(StoreError, match="refused"):
        await store.transition_many(batch, "Queued", "requeued", 9.0)
    assert {job.state for job in await store.active_jobs()} == {"Placed"}
    assert await query(url, "SELECT count(*) FROM job_history") == [(2 * len(names),)]
    # The store is still usable: the batch without the refused job goes through.
    moved = await store.transition_many(
        [job for job in batch if job.name != "job-13"], "Queued", "requeued", 9.0
    )
    assert len(moved) == len(names) - 1


async def test_moved_jobs_come_back_exact_and_undecoded(store: Store) -> None:
    # Times with all of a double's digits, and a backoff kept through the move: SQLite's
    # rows cross as one JSON text, whose numbers would keep 15 digits.
    now, until = 1764912345.1234567, 1764912999.9876543
    await store.create_job("t", "exact", "q", 1, {"n": "exact"}, 1.0)
    await store.transition("t", "exact", "Queued", "backoff", 1.5, expect=QUEUED,
                           not_before=until)  # fmt: skip
    read = await store.transition("t", "exact", "Placed", "placed", 2.0, cluster="c1",
                                  placement={"pods": [{"pod": "p", "node": "n"}]})  # fmt: skip
    (moved,) = await store.transition_many([read], "Running", "running", now)
    assert (moved.updated_at, moved.not_before, moved.placement) == (now, until, read.placement)
    assert moved.manifest_as_read() == read.manifest_as_read()  # passed on as it was read
    assert moved == await store.get_job("t", "exact")
    (page,) = await store.active_jobs()
    (again,) = await store.transition_many([page], "Queued", "requeued", now + 1)
    assert again.manifest_as_read()[0] is None  # a restart's page is never decoded
    assert again.spec_text == page.spec_text


# -- place_many ----------------------------------------------------------------------------------


QUEUED: tuple[JobState, ...] = ("Queued",)


def placing(job: JobRecord, cluster: str, attempts: int = 0) -> Placing:
    placement = {"cluster": cluster, "pods": [{"pod": f"{job.name}-0", "node": "n3"}]}
    return Placing(job.seq, cluster, placement, attempts, f"placed on {cluster} by binpack")


async def test_placements_move_as_transition_would(store: Store) -> None:
    # Twins: "a-*" placed through the batch, "b-*" one by one through transition.
    for prefix in ("a", "b"):
        for i, tenant in enumerate(("t1", "t2")):
            await store.create_job(tenant, f"{prefix}-{i}", "q", 1, {"n": i}, 1.0)
    queued = [job for job in await store.active_jobs() if job.name.startswith("a-")]
    batch = [placing(job, f"c{job.seq}", attempts=job.seq % 3) for job in queued]
    moved = await store.place_many(batch, 7.0)
    assert sorted(job.name for job in moved) == ["a-0", "a-1"]
    for job, move in zip(queued, batch, strict=True):
        twin = job.name.replace("a-", "b-")
        single = await store.transition(
            job.tenant, twin, "Placed", move.reason, 7.0, cluster=move.cluster,
            placement=move.placement, attempts=move.attempts, expect=QUEUED,
        )  # fmt: skip
        mine = await store.get_job(job.tenant, job.name)
        assert mine is not None and mine in moved  # what came back is what is stored
        assert mine.replace(name=twin, seq=single.seq) == single
        assert (mine.state, mine.cluster, mine.placement) == (
            "Placed",
            move.cluster,
            move.placement,
        )
        assert await store.history(job.tenant, job.name) == await store.history(job.tenant, twin)


async def test_placements_of_jobs_no_longer_queued_are_skipped(store: Store) -> None:
    jobs = [(await store.create_job("t", name, "q", 1, {}, 1.0))[0] for name in "abc"]
    cancelled = await store.transition("t", "b", "Cancelled", "by the user", 2.0)
    gone = jobs[2].replace(seq=jobs[2].seq + 1000)
    moved = await store.place_many([placing(jobs[0], "c1"), placing(jobs[1], "c1"),
                                    placing(gone, "c1")], 3.0)  # fmt: skip
    assert [job.name for job in moved] == ["a"]
    assert await store.get_job("t", "b") == cancelled
    job_c = await store.get_job("t", "c")
    assert job_c is not None and job_c.state == "Queued"
    assert await store.place_many([], 3.0) == []
    # Placed already: a second placement of the same job does not move it again.
    assert await store.place_many([placing(jobs[0], "c2")], 4.0) == []
    job_a = await store.get_job("t", "a")
    assert job_a is not None and job_a.cluster == "c1"


async def test_a_cycles_placements_are_all_or_nothing(url: str, store: Store) -> None:
    jobs = [(await store.create_job("t", f"job-{i}", "q", 1, {}, 1.0))[0] for i in range(20)]
    await refuse(url, "NEW.name = 'job-13'")
    with pytest.raises(StoreError, match="refused"):
        await store.place_many([placing(job, "c1") for job in jobs], 2.0)
    assert {job.state for job in await store.active_jobs()} == {"Queued"}
    assert await query(url, "SELECT count(*) FROM job_history") == [(len(jobs),)]
    moved = await store.place_many(
        [placing(job, "c1") for job in jobs if job.name != "job-13"], 2.0
    )
    assert len(moved) == len(jobs) - 1
