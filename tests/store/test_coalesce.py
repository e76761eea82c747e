"""``Coalescer``: concurrent writes leave as one batch when every slot is busy, alone when
one is free; a batch never holds the same job twice nor more than ``most`` writes; every
caller gets its own write's result or its batch's error; a cancelled caller's write is
either not sent or settled before the cancellation reaches it."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.store.coalesce import Coalescer


class Sender:
    """Records the batches; each waits for ``gate`` (when set) before answering."""

    def __init__(self, gate: asyncio.Event | None = None, fail_on: str | None = None) -> None:
        self.batches: list[list[str]] = []
        self.in_flight = self.most_in_flight = 0
        self.gate, self.fail_on = gate, fail_on

    async def __call__(self, writes: Sequence[str]) -> list[str | None]:
        self.batches.append(list(writes))
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            if self.gate is not None:
                await self.gate.wait()
            else:
                await asyncio.sleep(0)
            if self.fail_on is not None and self.fail_on in writes:
                raise ValueError(f"refused {self.fail_on}")
            return [None if w.startswith("skip") else f"done {w}" for w in writes]
        finally:
            self.in_flight -= 1


def key(write: str) -> str:
    return write.split("#", maxsplit=1)[0]  # "a#1" and "a#2" are two writes of job "a"


async def test_a_write_on_an_idle_coalescer_leaves_at_once_alone() -> None:
    sender = Sender()
    coalescer = Coalescer(sender, key, slots=2, most=10)
    assert await coalescer("a") == "done a"
    assert sender.batches == [["a"]]


async def test_writes_arriving_while_the_slots_are_busy_leave_together() -> None:
    gate = asyncio.Event()
    sender = Sender(gate)
    coalescer = Coalescer(sender, key, slots=1, most=10)
    first = asyncio.create_task(coalescer("a"))
    await asyncio.sleep(0)  # "a" is in flight
    rest = [asyncio.create_task(coalescer(w)) for w in ("b", "c", "skip-d")]
    await asyncio.sleep(0)
    assert sender.batches == [["a"]]
    gate.set()
    assert await first == "done a"
    assert await asyncio.gather(*rest) == ["done b", "done c", None]
    assert sender.batches == [["a"], ["b", "c", "skip-d"]]
    assert (coalescer.batches, coalescer.writes) == (2, 4)


async def test_a_batch_holds_each_job_once_and_at_most_most_writes() -> None:
    gate = asyncio.Event()
    sender = Sender(gate)
    coalescer = Coalescer(sender, key, slots=1, most=3)
    blocker = asyncio.create_task(coalescer("x"))
    await asyncio.sleep(0)
    writes = ["a#1", "b", "a#2", "c", "d", "e", "f", "g"]
    tasks = [asyncio.create_task(coalescer(w)) for w in writes]
    await asyncio.sleep(0)
    gate.set()
    assert await asyncio.gather(blocker, *tasks) == [f"done {w}" for w in ["x", *writes]]
    # In arrival order; "a#2" starts a new batch behind "a#1"; none over three.
    assert sender.batches == [["x"], ["a#1", "b"], ["a#2", "c", "d"], ["e", "f", "g"]]


async def test_an_error_fails_its_batch_only() -> None:
    gate = asyncio.Event()
    sender = Sender(gate, fail_on="bad")
    coalescer = Coalescer(sender, key, slots=1, most=2)
    blocker = asyncio.create_task(coalescer("x"))
    await asyncio.sleep(0)
    tasks = [asyncio.create_task(coalescer(w)) for w in ("a", "bad", "c")]
    await asyncio.sleep(0)
    gate.set()
    outcomes = await asyncio.gather(blocker, *tasks, return_exceptions=True)
    assert outcomes[0] == "done x" and outcomes[3] == "done c"
    assert all(isinstance(o, ValueError) and "refused bad" in str(o) for o in outcomes[1:3])


async def test_a_cancelled_waiting_write_is_not_sent() -> None:
    gate = asyncio.Event()
    sender = Sender(gate)
    coalescer = Coalescer(sender, key, slots=1, most=10)
    blocker = asyncio.create_task(coalescer("x"))
    await asyncio.sleep(0)
    dropped = asyncio.create_task(coalescer("dropped"))
    kept = asyncio.create_task(coalescer("kept"))
    await asyncio.sleep(0)
    dropped.cancel()
    with pytest.raises(asyncio.CancelledError):
        await dropped
    gate.set()
    assert list(await asyncio.gather(blocker, kept)) == ["done x", "done kept"]
    assert sender.batches == [["x"], ["kept"]]


async def test_a_cancelled_write_in_flight_settles_before_the_cancellation() -> None:
    gate = asyncio.Event()
    sender = Sender(gate)
    coalescer = Coalescer(sender, key, slots=1, most=10)
    write = asyncio.create_task(coalescer("a"))
    await asyncio.sleep(0)
    write.cancel()
    await asyncio.sleep(0)
    assert not write.done()  # held until its batch has an outcome
    gate.set()
    with pytest.raises(asyncio.CancelledError):
        await write
    assert sender.batches == [["a"]] and sender.in_flight == 0


def test_a_coalescer_needs_a_slot_and_room() -> None:
    with pytest.raises(ValueError, match="at least one slot"):
        Coalescer(Sender(), key, slots=0, most=1)


@settings(max_examples=60, deadline=None)
@given(
    writes=st.lists(st.sampled_from(["a", "b", "c", "d", "skip"]), max_size=40),
    slots=st.integers(1, 4),
    most=st.integers(1, 6),
    yields=st.lists(st.integers(0, 3), max_size=40),
)
def test_every_write_gets_its_own_result_within_the_bounds(
    writes: list[str], slots: int, most: int, yields: list[int]
) -> None:
    async def scenario() -> None:
        sender = Sender()
        coalescer = Coalescer(sender, key, slots=slots, most=most)
        numbered = [f"{w}#{i}" for i, w in enumerate(writes)]

        async def submit(i: int, write: str) -> str | None:
            for _ in range(yields[i] if i < len(yields) else 0):
                await asyncio.sleep(0)  # arrivals spread over loop turns
            return await coalescer(write)

        results = await asyncio.gather(*(submit(i, w) for i, w in enumerate(numbered)))
        assert results == [None if w.startswith("skip") else f"done {w}" for w in numbered]
        sent = [w for batch in sender.batches for w in batch]
        assert sorted(sent) == sorted(numbered)  # each write sent exactly once
        assert all(0 < len(batch) <= most for batch in sender.batches)
        assert all(len({key(w) for w in batch}) == len(batch) for batch in sender.batches)
        assert sender.most_in_flight <= slots

    asyncio.run(scenario())
