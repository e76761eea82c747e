"""The leader's active-job counts per tenant (``broker.service.active``), behind the
``maxActiveJobs`` check on every submission: through any sequence of the writes the service
makes (creations, new generations of finished names, moves with and without ``expect``,
batched requeues, refused compare-and-sets), the count ``PublishingStore.count_active``
answers equals the store's own count over its rows.
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from broker.service.active import ActiveCounts
from broker.service.events import EventBus, PublishingStore
from broker.store import (
    ACTIVE_STATES,
    FINAL_STATES,
    JOB_STATES,
    JobNotFound,
    JobState,
    StateConflict,
    open_store,
    sqlite_url,
)

TENANTS = ("t1", "t2")
NAMES = ("a", "b", "c")
STATES = st.sampled_from(JOB_STATES)
EXPECTS = st.one_of(
    st.none(),
    st.just(ACTIVE_STATES),
    st.just(tuple(sorted(FINAL_STATES))),
    st.lists(STATES, min_size=1, max_size=3).map(tuple),
)
WRITES = st.one_of(
    st.tuples(st.just("create"), st.sampled_from(TENANTS), st.sampled_from(NAMES)),
    st.tuples(st.just("move"), st.sampled_from(TENANTS), st.sampled_from(NAMES), STATES, EXPECTS),
    st.tuples(st.just("requeue"), st.sampled_from(TENANTS), st.sampled_from(NAMES), STATES),
    st.tuples(st.just("count"), st.sampled_from(TENANTS)),
)


@pytest.mark.parametrize(
    ("state", "expect", "delta"),
    [
        ("Succeeded", ("Running",), -1),
        ("Cancelled", ACTIVE_STATES, -1),
        ("Running", ("Placed",), 0),
        ("Queued", ("Succeeded",), 1),  # no such move today; counted right if one comes
        ("Failed", ("Failed",), 0),
    ],
)
def test_a_move_from_a_known_state_moves_the_count(
    state: JobState, expect: tuple[JobState, ...], delta: int
) -> None:
    counts = ActiveCounts()
    counts.seed("t", 5)
    counts.moved("t", state, expect)
    assert counts.get("t") == 5 + delta


@pytest.mark.parametrize("expect", [None, ("Running", "Failed")])
def test_a_move_from_an_unknown_state_forgets_the_count(
    expect: tuple[JobState, ...] | None,
) -> None:
    counts = ActiveCounts()
    counts.seed("t", 5)
    counts.seed("u", 2)
    counts.moved("t", "Cancelled", expect)
    assert counts.get("t") is None
    assert counts.get("u") == 2


def test_a_seed_does_not_overwrite_a_known_count() -> None:
    counts = ActiveCounts()
    counts.seed("t", 5)
    counts.created("t")
    counts.seed("t", 5)  # a read that started before the creation committed
    assert counts.get("t") == 6
    counts.clear()
    assert counts.get("t") is None


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(writes=st.lists(WRITES, max_size=25))
def test_counts_match_the_store_through_any_writes(
    tmp_path_factory: pytest.TempPathFactory, writes: list[tuple[Any, ...]]
) -> None:
    path = tmp_path_factory.mktemp("active") / "jobs.db"
    asyncio.run(_replay(path, writes))


async def _replay(path: Path, writes: list[tuple[Any, ...]]) -> None:
    inner = open_store(sqlite_url(str(path)))
    await inner.open()
    store = PublishingStore(inner, EventBus())
    try:
        for now, write in enumerate(writes, start=1):
            await _apply(store, write, float(now))
            for tenant in TENANTS:
                assert await store.count_active(tenant) == await inner.count_active(tenant), (
                    f"after {write}"
                )
    finally:
        await store.close()


async def _apply(store: PublishingStore, write: tuple[Any, ...], now: float) -> None:
    kind, tenant = write[0], write[1]
    if kind == "create":
        await store.create_job(tenant, write[2], "q", 0, {"spec": {}}, now, reuse_finished=True)
    elif kind == "move":
        _, _, name, state, expect = write
        # A refused move changes nothing, and the count must not move either.
        with contextlib.suppress(StateConflict, JobNotFound):
            await store.transition(tenant, name, state, "test", now, expect=expect)
    elif kind == "requeue":
        _, _, name, was = write
        read = await store.get_job(tenant, name)
        if read is not None:  # as read earlier, in state ``was`` (stale unless it still is)
            stale = read.replace(state=was)
            await store.transition_many([stale], "Queued", "restart", now)
    else:
        await store.count_active(tenant)  # seeds the count mid-sequence
