"""A finished job's name submitted again is its next generation (the finished one kept in
``generations``), an active one is never replaced; retention purges finished jobs and old
generations before a cutoff and never an active job. Both backends (test_store's fixtures:
SQLite in tmp_path, PostgreSQL on 127.0.0.1:5432)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from test_store import MANIFEST, OpenStore, opened, store, url

from broker.store import ACTIVE_STATES, FINAL_STATES, JobState, Store

__all__ = ["opened", "store", "url"]  # test_store's fixtures (both backends), used here

OTHER: dict[str, Any] = {**MANIFEST, "spec": {"priority": 1, "podSets": []}}


async def _finish(store: Store, name: str, state: JobState, now: float) -> None:
    if state != "Cancelled":
        await store.transition("team-a", name, "Placed", "placed", now - 1, cluster="c")
    await store.transition("team-a", name, state, "done", now)


@pytest.mark.parametrize("final", sorted(FINAL_STATES))
async def test_a_finished_name_is_reused_as_the_next_generation(
    store: Store, final: JobState
) -> None:
    first, _ = await store.create_job("team-a", "llama", "training", 100, MANIFEST, 10.0)
    await _finish(store, "llama", final, 20.0)
    second, created = await store.create_job(
        "team-a", "llama", "inference", 1, OTHER, 30.0, reuse_finished=True
    )
    assert created
    assert (second.generation, second.state, second.queue, second.manifest) == (
        2, "Queued", "inference", OTHER
    )  # fmt: skip
    assert second.seq > first.seq  # behind everything submitted before it (FIFO)
    assert await store.get_job("team-a", "llama") == second  # GET by name: the newest
    assert [t.state for t in await store.history("team-a", "llama")] == ["Queued"]
    [old] = await store.generations("team-a", "llama")
    assert (old.generation, old.record["state"], old.record["manifest"]) == (1, final, MANIFEST)
    assert [h["state"] for h in old.history][-1] == final
    assert old.history[0]["state"] == "Queued"
    # And once more: generation 3, two kept.
    await _finish(store, "llama", "Succeeded", 40.0)
    third, created = await store.create_job(
        "team-a", "llama", "training", 1, MANIFEST, 50.0, reuse_finished=True
    )
    assert created and third.generation == 3
    assert [g.generation for g in await store.generations("team-a", "llama")] == [1, 2]


@pytest.mark.parametrize("active", ACTIVE_STATES)
async def test_an_active_name_is_never_replaced(store: Store, active: JobState) -> None:
    first, _ = await store.create_job("team-a", "llama", "training", 100, MANIFEST, 10.0)
    if active != "Queued":
        first = await store.transition("team-a", "llama", active, "x", 11.0, cluster="c")
    again, created = await store.create_job(
        "team-a", "llama", "other", 1, OTHER, 20.0, reuse_finished=True
    )
    assert not created and again == first
    assert await store.generations("team-a", "llama") == []


async def test_without_reuse_a_finished_job_answers_as_before(store: Store) -> None:
    await store.create_job("team-a", "llama", "training", 100, MANIFEST, 10.0)
    await _finish(store, "llama", "Cancelled", 20.0)
    again, created = await store.create_job("team-a", "llama", "training", 100, MANIFEST, 30.0)
    assert not created and again.state == "Cancelled" and again.generation == 1


async def test_concurrent_reuse_makes_one_next_generation(opened: OpenStore) -> None:
    first, second = await opened(), await opened()
    await first.create_job("team-a", "dup", "q", 1, MANIFEST, 1.0)
    await _finish(first, "dup", "Failed", 2.0)
    results = await asyncio.gather(*(
        s.create_job("team-a", "dup", "q", 1, {"n": i}, 10.0 + i, reuse_finished=True)
        for i, s in enumerate([first, second] * 3)
    ))  # fmt: skip
    assert sum(created for _, created in results) == 1
    assert {job.generation for job, _ in results} == {2}
    assert len(await first.generations("team-a", "dup")) == 1


async def test_retention_purges_old_finished_jobs_only(store: Store) -> None:
    for i, state in enumerate(["Succeeded", "Failed", "Cancelled"]):
        await store.create_job("team-a", f"old-{i}", "q", 1, MANIFEST, 10.0)
        await _finish(store, f"old-{i}", state, 20.0)  # type: ignore[arg-type]
    await store.create_job("team-a", "recent", "q", 1, MANIFEST, 10.0)
    await _finish(store, "recent", "Succeeded", 200.0)
    for i, state in enumerate(ACTIVE_STATES):  # active ones, however old, stay
        await store.create_job("team-a", f"active-{i}", "q", 1, MANIFEST, 1.0)
        if state != "Queued":
            await store.transition("team-a", f"active-{i}", state, "x", 2.0, cluster="c")
    # an old generation behind a live one is purged too
    await store.create_job("team-a", "again", "q", 1, MANIFEST, 1.0)
    await _finish(store, "again", "Failed", 5.0)
    await store.create_job("team-a", "again", "q", 1, OTHER, 6.0, reuse_finished=True)

    assert await store.purge_finished(before=100.0, limit=2) == 2  # bounded per call
    assert await store.purge_finished(before=100.0) == 1
    assert await store.purge_finished(before=100.0) == 0
    names = {job.name for job in await store.list_jobs(limit=100)}
    assert names == {"recent", "again", *(f"active-{i}" for i in range(len(ACTIVE_STATES)))}
    for i in range(3):
        assert await store.get_job("team-a", f"old-{i}") is None
        assert await store.history("team-a", f"old-{i}") == []
    assert await store.generations("team-a", "again") == []
    assert len(await store.active_jobs()) == len(ACTIVE_STATES) + 1


async def test_count_active_counts_a_tenants_unfinished_jobs(store: Store) -> None:
    for i, state in enumerate(["Queued", "Placed", "Running", "Succeeded", "Cancelled"]):
        await store.create_job("team-a", f"j{i}", "q", 1, MANIFEST, 1.0)
        if state == "Succeeded":
            await _finish(store, f"j{i}", "Succeeded", 3.0)
        elif state != "Queued":
            await store.transition("team-a", f"j{i}", state, "x", 2.0, cluster="c")  # type: ignore[arg-type]
    await store.create_job("team-b", "other", "q", 1, MANIFEST, 1.0)
    assert await store.count_active("team-a") == 3
    assert await store.count_active("team-b") == 1
    assert await store.count_active("nobody") == 0


async def test_finished_since_gives_the_most_recent_finished_jobs_oldest_first(
    store: Store,
) -> None:
    ends = {"a": 50.0, "b": 300.0, "c": 100.0, "d": 200.0, "e": 100.0}
    for name, at in ends.items():
        await store.create_job("team-a", name, "q", 1, MANIFEST, 10.0)
        await _finish(store, name, "Cancelled" if name == "e" else "Succeeded", at)
    for i, state in enumerate(ACTIVE_STATES):  # active ones never, however recent
        await store.create_job("team-a", f"active-{i}", "q", 1, MANIFEST, 400.0)
        if state != "Queued":
            await store.transition("team-a", f"active-{i}", state, "x", 400.0, cluster="c")

    since = await store.finished_since(100.0, limit=10)  # at the cutoff counts; c, e tie
    assert [j.name for j in since] in (["c", "e", "d", "b"], ["e", "c", "d", "b"])
    assert (since[-1].cluster, since[-1].state, since[-1].updated_at) == ("c", "Succeeded", 300.0)
    # bounded: the most recent ones
    assert [j.name for j in await store.finished_since(0.0, limit=2)] == ["d", "b"]
    assert await store.finished_since(301.0, limit=10) == []
