"""The lock every state change of the service runs under (``Shared.lock``).

An ``asyncio.Lock`` hands itself to one waiter per turn of the event loop. Runs end and
launches complete as fast as jobs are submitted, and each needs a few synchronous lines
under the lock; while a scheduling cycle held it through its store writes, hundreds of them
queued, and draining them took as many loop turns as there were waiters. Measured in
``bench --soak`` on PostgreSQL at 300 jobs/s (each loop turn several ms there): the next
cycle waited 2-8 s for the lock, and the queue grew while GPUs sat idle.

``call(section)`` runs a synchronous section at once when the lock is free (nothing else
runs between the check and the section: it has no await), and otherwise queues it for the
holder, which runs every queued section in order as it leaves, before it releases. So the
sections still run one at a time, never inside another holder's critical section, and in
the order they asked; draining any number of them costs the holder one handoff.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from types import TracebackType
from typing import Any, TypeVar

T = TypeVar("T")


class StateLock:
    """``async with lock:`` for sections that await; ``await lock.call(section)`` for the
    short synchronous ones. Complexity: ``call`` O(1) besides the section; leaving the lock
    O(sections queued meanwhile), each run once."""

    def __init__(self) -> None:
        self._lock = asyncio.Lock()
        self._queued: deque[tuple[Callable[[], Any], asyncio.Future[Any]]] = deque()

    def locked(self) -> bool:
        return self._lock.locked()

    async def __aenter__(self) -> None:
        await self._lock.acquire()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            self._run_queued()
        finally:
            self._lock.release()

    async def call(self, section: Callable[[], T]) -> T:
        """``section()`` under the lock: now if it is free, else as its holder leaves."""
        if not self._lock.locked():
            return section()
        done: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        self._queued.append((section, done))
        return await done

    def _run_queued(self) -> None:
        while self._queued:
            section, done = self._queued.popleft()
            if done.cancelled():
                continue  # its caller is gone (as a cancelled waiter of a lock never runs)
            try:
                result = section()
            except Exception as exc:  # the caller's to handle, as if it had run it itself
                done.set_exception(exc)
            else:
                done.set_result(result)


__all__ = ["StateLock"]
