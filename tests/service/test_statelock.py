"""``StateLock``: the service lock with a cheap path for short synchronous sections.

Sections never run inside another holder's critical section nor inside each other, run in
the order they asked, run at once when the lock is free, and are all run by the holder as
it leaves: the point of it is that N queued sections cost one handoff, not N loop turns."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.service.statelock import StateLock


def noting(ran: list[object], value: object) -> Callable[[], object]:
    """A section that notes ``value`` in ``ran`` and returns it."""

    def section() -> object:
        ran.append(value)
        return value

    return section


async def test_a_section_runs_at_once_when_the_lock_is_free() -> None:
    lock, ran = StateLock(), list[object]()
    call = lock.call(noting(ran, 7))
    assert ran == []  # a coroutine: nothing yet
    assert await call == 7
    assert ran == [7] and not lock.locked()


async def test_queued_sections_run_in_order_as_the_holder_leaves_before_the_next_holder() -> None:
    lock, ran = StateLock(), list[object]()
    entered = asyncio.Event()
    leave = asyncio.Event()

    async def holder() -> list[object]:
        async with lock:
            entered.set()
            await leave.wait()
            ran.append("holder leaves")
        return list(ran)  # just out, no await since: what ran as it left

    async def next_holder() -> None:
        async with lock:
            ran.append("next holder")

    first = asyncio.create_task(holder())
    await entered.wait()
    calls = [asyncio.create_task(lock.call(noting(ran, i))) for i in range(100)]
    second = asyncio.create_task(next_holder())
    await asyncio.sleep(0)  # every call and the next holder are waiting now
    assert ran == []
    leave.set()
    # All hundred ran as the holder left, before any of their callers resumed.
    assert await first == ["holder leaves", *range(100)]
    assert [await c for c in calls] == list(range(100))
    await second
    assert ran == ["holder leaves", *range(100), "next holder"]


async def test_a_failing_section_raises_in_its_caller_only() -> None:
    lock = StateLock()

    def boom() -> None:
        raise ValueError("no such launch")

    async with lock:
        failing = asyncio.create_task(lock.call(boom))
        fine = asyncio.create_task(lock.call(lambda: "ok"))
        await asyncio.sleep(0)
    with pytest.raises(ValueError, match="no such launch"):
        await failing
    assert await fine == "ok"
    assert await lock.call(lambda: 1) == 1  # the lock is usable after


async def test_a_cancelled_callers_section_never_runs() -> None:
    lock, ran = StateLock(), list[object]()
    async with lock:
        gone = asyncio.create_task(lock.call(noting(ran, "gone")))
        kept = asyncio.create_task(lock.call(noting(ran, "kept")))
        await asyncio.sleep(0)
        gone.cancel()
        await asyncio.sleep(0)
    await kept
    assert gone.cancelled() and ran == ["kept"]


async def test_a_holder_that_raises_still_runs_the_queued_sections_and_releases() -> None:
    lock, ran = StateLock(), list[object]()
    with pytest.raises(RuntimeError):
        async with lock:
            queued = asyncio.create_task(lock.call(noting(ran, "queued")))
            await asyncio.sleep(0)
            raise RuntimeError("cycle failed")
    await queued
    assert ran == ["queued"] and not lock.locked()


# Each step: ("hold", awaits inside) or ("call", 0): a mix of holders and sections.
STEPS = st.lists(
    st.tuples(st.sampled_from(["hold", "call"]), st.integers(min_value=0, max_value=3)),
    min_size=1, max_size=25,
)  # fmt: skip


@settings(max_examples=150, deadline=None)
@given(steps=STEPS, stagger=st.lists(st.integers(min_value=0, max_value=2), max_size=25))
def test_no_two_sections_or_holders_ever_overlap(
    steps: list[tuple[str, int]], stagger: list[int]
) -> None:
    async def scenario() -> None:
        lock = StateLock()
        inside: list[str] = []
        overlaps: list[tuple[str, ...]] = []
        order: list[int] = []

        def enter(who: str) -> None:
            if inside:
                overlaps.append((*inside, who))
            inside.append(who)

        async def hold(i: int, turns: int) -> None:
            async with lock:
                enter(f"holder {i}")
                for _ in range(turns):
                    await asyncio.sleep(0)
                inside.remove(f"holder {i}")

        async def call(i: int) -> None:
            def section() -> int:
                enter(f"section {i}")
                inside.remove(f"section {i}")
                order.append(i)
                return i

            assert await lock.call(section) == i

        tasks = []
        for i, (kind, turns) in enumerate(steps):
            tasks.append(asyncio.create_task(hold(i, turns) if kind == "hold" else call(i)))
            for _ in range(stagger[i] if i < len(stagger) else 0):
                await asyncio.sleep(0)
        await asyncio.gather(*tasks)
        assert overlaps == []
        assert order == sorted(order)  # sections ran in the order they asked
        assert not lock.locked()

    asyncio.run(scenario())
