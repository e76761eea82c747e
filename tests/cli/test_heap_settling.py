"""``broker.process``: the GIL's switch interval while the loop runs, and the heap a
long-running broker keeps out of the collector's full passes. After start-up its state is
frozen; after every later full pass what survived it is frozen too, so the next full pass
walks only what came since (not every live job again), while a frozen object is still
freed by reference counting; a service run inside a longer process undoes all of it
(``release_heap``)."""

from __future__ import annotations

import gc
import sys
import weakref
from collections.abc import Iterator

import pytest

from broker.process import (
    SWITCH_INTERVAL_S,
    _freeze_survivors,
    release_heap,
    run_loop,
    settle_heap,
)


class Record:
    """A stand-in for a live job's record: a tracked container."""

    __slots__ = ("__weakref__", "data")

    def __init__(self, data: list[int]) -> None:
        self.data = data


@pytest.fixture(autouse=True)
def restored_gc() -> Iterator[None]:
    threshold = gc.get_threshold()
    yield
    release_heap()
    gc.set_threshold(*threshold)


def test_full_passes_leave_their_survivors_out_of_the_next() -> None:
    settle_heap()
    assert _freeze_survivors in gc.callbacks
    live = [Record([i]) for i in range(1000)]  # "jobs" arriving after start-up
    # Young (a collection of the young generation may have promoted it meanwhile).
    assert any(r is live[0] for g in (0, 1) for r in gc.get_objects(generation=g))
    frozen_before = gc.get_freeze_count()
    gc.collect(2)  # a full pass: its survivors are frozen by the callback
    assert gc.get_freeze_count() >= frozen_before + len(live)
    in_gen2 = {id(o) for o in gc.get_objects(generation=2)}
    assert not any(id(r) in in_gen2 for r in live)  # the next full pass skips them
    gone = weakref.ref(live[0])
    del live[0]  # a job that ends: freed at once by reference counting, frozen or not
    assert gone() is None


def test_a_service_in_a_longer_process_leaves_nothing_frozen() -> None:
    settle_heap()
    kept = [Record([i]) for i in range(100)]
    gc.collect(2)
    assert gc.get_freeze_count() > 0
    release_heap()
    assert _freeze_survivors not in gc.callbacks
    assert gc.get_freeze_count() == 0
    gc.collect(2)
    assert gc.get_freeze_count() == 0  # no longer frozen after full passes
    assert len(kept) == 100


def test_the_loop_runs_with_the_short_switch_interval_and_restores_it() -> None:
    before = sys.getswitchinterval()
    assert before != SWITCH_INTERVAL_S

    async def interval() -> float:
        return sys.getswitchinterval()

    assert run_loop(interval()) == SWITCH_INTERVAL_S
    assert sys.getswitchinterval() == before

    async def fails() -> None:
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        run_loop(fails())
    assert sys.getswitchinterval() == before
