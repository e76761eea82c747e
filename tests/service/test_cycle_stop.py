"""The scheduler loop stops when cancelled, whatever it was doing (issue 16, item 4).

SIGTERM to a busy broker once waited out serve's 10 s shutdown bound ("task scheduler did
not stop within 10.0s"): on Python 3.11, ``asyncio.wait_for`` swallows a cancellation that
arrives just as the awaited wake-up completes, so the loop went on as if never cancelled.
Under load a submission wakes the scheduler every few milliseconds, so the race was there
to lose. Each case here cancels the loop at one step after a wake-up (the event loop's
iterations counted out with ``sleep(0)``, the interleaving itself under test, not a wait),
and one absorbs the cancellation inside a cycle, as a library call might. ``Service.close``
does not wait without bound for a background task that ignores its cancellation.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from broker.config import demo_config
from broker.service.cycle import Cycles
from broker.service.facade import Service

TOKENS = {"team-a": "tok-a", "team-b": "tok-b", "admin": "tok-admin"}
STOP_SECONDS = 2.0  # generous: the loop has nothing left to wait for once cancelled


@pytest.fixture
async def service(tmp_path: Path) -> AsyncIterator[Service]:
    service = Service(demo_config(tmp_path, TOKENS))
    await service.start()
    try:
        yield service
    finally:
        await service.close()


async def steps(n: int) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


async def stops(task: asyncio.Task[None]) -> bool:
    """Cancel ``task``; whether it ended, cancelled, within STOP_SECONDS (else it is
    cancelled again and left to end, so that the test does not leak it)."""
    task.cancel()
    done, _ = await asyncio.wait([task], timeout=STOP_SECONDS)
    if task not in done:
        task.cancel()
        await asyncio.wait([task], timeout=STOP_SECONDS)
        return False
    return task.cancelled()


@pytest.mark.parametrize("after_wake", range(8))
async def test_the_loop_stops_when_cancelled_as_it_wakes(service: Service, after_wake: int) -> None:
    assert service.leading  # so a wake-up runs a cycle, as on a busy broker
    task = asyncio.create_task(service.run(), name="scheduler under test")
    await steps(3)  # waiting for a wake-up
    service.shared.wake.set()
    await steps(after_wake)
    assert await stops(task), f"still running when cancelled {after_wake} steps after waking"


async def test_the_loop_stops_when_a_cycle_absorbs_the_cancellation(service: Service) -> None:
    entered = asyncio.Event()

    class Absorbing(Cycles):
        """Its first cycle absorbs a cancellation (only the first: a loop that goes on
        after it must still be stoppable, so that a failing test ends)."""

        async def schedule_once(self, now: float | None = None) -> None:
            if entered.is_set():
                return
            entered.set()
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.sleep(60)

    cycles = Absorbing(service.shared, service.binding)
    task = asyncio.create_task(cycles.run(), name="scheduler under test")
    service.shared.wake.set()
    await asyncio.wait_for(entered.wait(), STOP_SECONDS * 5)
    assert await stops(task), "the loop went on to another cycle after its cancellation"


async def test_close_does_not_wait_forever_for_a_task_that_ignores_its_cancellation(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    service = Service(demo_config(tmp_path, TOKENS))
    await service.start()
    release = asyncio.Event()

    async def stubborn() -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            await release.wait()  # absorbs it, as a misbehaving library call might

    task = service.tasks.spawn("stubborn", stubborn())
    await steps(1)
    with caplog.at_level(logging.ERROR, logger="broker.service.facade"):
        await service.close(timeout=0.2)
    assert not task.done()  # close returned without it
    assert any("task stubborn did not stop" in r.getMessage() for r in caplog.records)
    release.set()
    await task
