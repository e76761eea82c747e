"""Every background task of the live broker: named, supervised, never vanishing silently.

``Supervisor.keep`` runs a long-lived loop (a watcher, the burst pools' executor, the
upkeep of Kubernetes members, MQTT's loops): an unexpected exception is logged with the
task's name and the loop is started again after a backoff (doubling from ``BACKOFF[0]`` up
to ``BACKOFF[1]``; reset once the loop ran for ``STEADY_SECONDS``), or, for a task marked
``fatal``, recorded so that ``failed()`` raises it and the process stops. ``Supervisor.spawn``
runs one short task (a job's launch, its run watch, a placement in doubt): named, and its
failure logged with the name. ``cancel`` stops everything.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

log = logging.getLogger(__name__)

BACKOFF = (0.5, 30.0)  # seconds before a failed loop is restarted: first, cap
STEADY_SECONDS = 60.0  # a loop that ran this long before failing starts from the first delay

Loop = Callable[[], Awaitable[None]]


class TaskFailed(Exception):
    """A fatal background task failed; the broker stops (the cause is chained)."""


class Supervisor:
    """Named tasks of one service; ``sleep`` and ``backoff`` are injected for tests."""

    def __init__(
        self,
        backoff: tuple[float, float] = BACKOFF,
        sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
    ) -> None:
        self._backoff = backoff
        self._sleep = sleep
        self._tasks: set[asyncio.Task[None]] = set()
        self._fatal: asyncio.Future[str] | None = None
        self.restarts: dict[str, int] = {}

    def spawn(self, name: str, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        """One short task: named; an exception it ends with is logged with the name."""
        task = asyncio.create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._ended)
        return task

    def keep(self, name: str, loop: Loop, *, fatal: bool = False) -> asyncio.Task[None]:
        """A long-lived loop: restarted with backoff after an unexpected exception (or, when
        ``fatal``, the broker stops: ``failed()`` raises)."""
        return self.spawn(name, self._keep(name, loop, fatal))

    async def _keep(self, name: str, loop: Loop, fatal: bool) -> None:
        first, cap = self._backoff
        delay = first
        while True:
            started = time.monotonic()
            failure: Exception | None = None
            try:
                await loop()
            except Exception as exc:
                if fatal:
                    log.exception("task %s failed; stopping the broker", name, extra={"task": name})
                    self._fail(name, exc)
                    return
                failure = exc
            if time.monotonic() - started >= STEADY_SECONDS:
                delay = first
            how = "failed" if failure is not None else "ended"
            log.error(
                "task %s %s; restarting it in %.1f s", name, how, delay, exc_info=failure,
                extra={"task": name},
            )  # fmt: skip
            self.restarts[name] = self.restarts.get(name, 0) + 1
            await self._sleep(delay)
            delay = min(cap, delay * 2)

    def _fail(self, name: str, exc: Exception) -> None:
        future = self._failure()
        if not future.done():
            error = TaskFailed(f"task {name} failed: {exc}")
            error.__cause__ = exc
            future.set_exception(error)

    def _failure(self) -> asyncio.Future[str]:
        if self._fatal is None:
            self._fatal = asyncio.get_running_loop().create_future()
        return self._fatal

    async def failed(self) -> None:
        """Wait until a fatal task fails, then raise TaskFailed (a task of ``serve``)."""
        await asyncio.shield(self._failure())

    def _ended(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if task.cancelled():
            return
        exc = task.exception()
        if exc is not None:
            name = task.get_name()
            log.error(
                "task %s failed", name, extra={"task": name},
                exc_info=(type(exc), exc, exc.__traceback__),
            )  # fmt: skip

    def cancel(self) -> list[asyncio.Task[None]]:
        """Cancel every task; the caller awaits the returned tasks (after closing the
        clients whose reads do not always notice a cancellation on their own)."""
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        if self._fatal is not None and not self._fatal.done():
            self._fatal.cancel()
        return tasks


__all__ = ["BACKOFF", "Supervisor", "TaskFailed"]
