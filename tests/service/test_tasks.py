"""The supervisor of the service's background tasks: nothing fails silently."""

from __future__ import annotations

import asyncio
import logging

import pytest

from broker.cli.runtime import EXIT_FAILED, supervise
from broker.service.tasks import Supervisor, TaskFailed


class Sleeps:
    """An injected sleep that records the delays and does not wait."""

    def __init__(self) -> None:
        self.delays: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.delays.append(seconds)


def failures(caplog: pytest.LogCaptureFixture, name: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if getattr(r, "task", None) == name and r.exc_info]


async def test_a_loop_that_raises_is_logged_by_name_and_restarted_with_backoff(
    caplog: pytest.LogCaptureFixture,
) -> None:
    sleeps = Sleeps()
    tasks = Supervisor(backoff=(0.5, 1.5), sleep=sleeps)
    calls = 0
    steady = asyncio.Event()

    async def watcher() -> None:
        nonlocal calls
        calls += 1
        if calls <= 3:
            raise RuntimeError(f"boom {calls}")
        steady.set()
        await asyncio.Event().wait()  # runs until cancelled

    task = tasks.keep("watch east", watcher)
    await asyncio.wait_for(steady.wait(), timeout=5)
    assert calls == 4 and tasks.restarts == {"watch east": 3}
    assert sleeps.delays == [0.5, 1.0, 1.5]  # doubling, capped
    logged = failures(caplog, "watch east")
    assert [str(r.exc_info[1]) for r in logged if r.exc_info] == ["boom 1", "boom 2", "boom 3"]
    assert all("watch east" in r.getMessage() for r in logged)
    for pending in tasks.cancel():
        await asyncio.gather(pending, return_exceptions=True)
    assert task.cancelled()


async def test_a_fatal_loop_that_raises_stops_the_broker(caplog: pytest.LogCaptureFixture) -> None:
    tasks = Supervisor(sleep=Sleeps())

    async def upkeep() -> None:
        raise ValueError("broken invariant")

    tasks.keep("upkeep", upkeep, fatal=True)
    with pytest.raises(TaskFailed, match="task upkeep failed") as raised:
        await asyncio.wait_for(tasks.failed(), timeout=5)
    assert isinstance(raised.value.__cause__, ValueError)
    assert tasks.restarts == {}  # not restarted
    assert any("stopping the broker" in r.getMessage() for r in failures(caplog, "upkeep"))


async def test_serve_stops_when_a_fatal_background_task_fails() -> None:
    tasks = Supervisor(sleep=Sleeps())

    async def upkeep() -> None:
        raise ValueError("broken")

    async def forever() -> None:
        await asyncio.Event().wait()

    tasks.keep("upkeep", upkeep, fatal=True)
    code = await supervise({"background": tasks.failed(), "http": forever()}, asyncio.Event())
    assert code == EXIT_FAILED


async def test_a_short_task_that_raises_is_logged_by_name(caplog: pytest.LogCaptureFixture) -> None:
    tasks = Supervisor()

    async def launch() -> None:
        raise RuntimeError("no such node")

    task = tasks.spawn("launch team-a/train", launch())
    await asyncio.gather(task, return_exceptions=True)
    [record] = failures(caplog, "launch team-a/train")
    assert "launch team-a/train failed" in record.getMessage()
    assert task.get_name() == "launch team-a/train"


async def test_a_loop_that_ends_is_started_again(caplog: pytest.LogCaptureFixture) -> None:
    sleeps = Sleeps()
    tasks = Supervisor(backoff=(2.0, 8.0), sleep=sleeps)
    calls = 0
    again = asyncio.Event()

    async def stale_check() -> None:
        nonlocal calls
        calls += 1
        if calls == 2:
            again.set()
            await asyncio.Event().wait()

    tasks.keep("mqtt-stale", stale_check)
    await asyncio.wait_for(again.wait(), timeout=5)
    assert sleeps.delays == [2.0] and tasks.restarts == {"mqtt-stale": 1}
    [record] = [r for r in caplog.records if getattr(r, "task", None) == "mqtt-stale"]
    assert record.getMessage() == "task mqtt-stale ended; restarting it in 2.0 s"
    for pending in tasks.cancel():
        await asyncio.gather(pending, return_exceptions=True)
