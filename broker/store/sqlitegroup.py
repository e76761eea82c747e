"""SQLite's writer: one thread owns the write connection, and each group of writes reaches
it in one hop.

Writes are functions of the connection (``Work``), run on that thread. The writes that
are waiting when the thread frees up form a group: ``BEGIN IMMEDIATE``, each write inside
a savepoint of its own (a failing one undoes only itself and fails only its caller; a write
alone in its group needs none), one ``COMMIT`` (one fsync) for all. A caller gets its
outcome only after that COMMIT, so "acknowledged" still means "on disk".

Why one hop per group: with a statement per hop (aiosqlite's ``execute`` for BEGIN, each
statement and COMMIT) every statement waited for a turn of the busy event loop while
holding the writer. A probe in the soak at 300 jobs/s measured the writer held all the
time, 0.4-2.5 ms per statement, and a submission's p50 of 12-20 ms spent queueing for it.

Cancellation: a caller cancelled before its write is taken is dropped (nothing written);
once taken, it waits for the group's outcome (``settled``) before the cancellation reaches
it, so a write is stored or not by the time its caller learns anything.

Complexity: each write is appended and taken once, O(1) amortised; a group of k writes is
one thread hop and O(k) to hand out.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Generic, TypeVar

from broker.store.coalesce import outcome_of

T = TypeVar("T")
Work = Callable[[sqlite3.Connection], T]

# The most writes one group carries: a bound on the time one hop holds the thread.
GROUP_MOST = 1000


class Outcome(Generic[T]):
    """A write's result, or the exception it raised (on the writer thread)."""

    __slots__ = ("error", "value")

    def __init__(self, value: T | None = None, error: Exception | None = None) -> None:
        self.value, self.error = value, error


class GroupWriter:
    """Runs writes on one thread, in groups of one transaction each (module docstring)."""

    def __init__(self, executor: ThreadPoolExecutor, conn: sqlite3.Connection) -> None:
        self._executor, self._conn = executor, conn
        self._waiting: list[tuple[Work[Any], asyncio.Future[Any]]] = []
        self._drainer: asyncio.Task[None] | None = None
        self.groups = 0  # groups committed or failed so far: for tests and benchmarks
        # The longest hop of a group (BEGIN to COMMIT, its fsync included) since the last
        # take_slowest(): ``bench --soak`` shows it per window, where a disk's stall is the
        # wait of every write behind it.
        self._slowest = 0.0

    async def write(self, work: Work[T]) -> T:
        """``work(conn)`` inside the next group; its result once the group has committed.
        It raises what ``work`` raised (nothing of it stays), or the error that failed
        BEGIN or COMMIT (nothing of the group stays)."""
        done: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        self._waiting.append((work, done))
        if self._drainer is None or self._drainer.done():
            self._drainer = asyncio.get_running_loop().create_task(self._drain())
        return await outcome_of(done, self._waiting)

    async def call(self, work: Work[T]) -> T:
        """``work(conn)`` on the writer thread, outside any group (opening, migrations)."""
        return await asyncio.get_running_loop().run_in_executor(self._executor, work, self._conn)

    def take_slowest(self) -> float:
        """Seconds of the longest group since the last call (0.0: none ran)."""
        slowest, self._slowest = self._slowest, 0.0
        return slowest

    async def drain(self) -> None:
        """Wait until every write handed in so far has settled (for close)."""
        while self._drainer is not None and not self._drainer.done():
            await asyncio.wait([self._drainer])

    async def _drain(self) -> None:
        loop = asyncio.get_running_loop()
        while self._waiting:
            group = self._waiting[:GROUP_MOST]
            del self._waiting[:GROUP_MOST]
            works = [work for work, _ in group]
            began = time.perf_counter()
            try:
                outcomes = await loop.run_in_executor(self._executor, run_group, self._conn, works)
            except Exception as exc:  # the hop itself failed (the executor is shut down)
                outcomes = [Outcome(error=exc)] * len(group)
            except BaseException as exc:  # the loop is shutting down: outcomes unknown
                stopped = RuntimeError(f"the write was stopped, its outcome unknown: {exc!r}")
                for _, done in group + self._waiting:
                    if not done.done():
                        done.set_exception(stopped)
                self._waiting.clear()
                raise
            self.groups += 1
            self._slowest = max(self._slowest, time.perf_counter() - began)
            for (_, done), outcome in zip(group, outcomes, strict=True):
                if done.done():
                    continue
                if outcome.error is None:
                    done.set_result(outcome.value)
                else:
                    done.set_exception(outcome.error)


def run_group(conn: sqlite3.Connection, works: list[Work[Any]]) -> list[Outcome[Any]]:
    """On the writer thread: one transaction, each write in a savepoint of its own. Any
    error outside a write (BEGIN, a savepoint, COMMIT) fails the whole group, rolled back."""
    try:
        conn.execute("BEGIN IMMEDIATE")
    except sqlite3.Error as exc:
        return [Outcome(error=exc)] * len(works)
    # Alone, a write's transaction is its savepoint: two statements fewer (and two fewer
    # retakes of the GIL, which the thread waits for while the loop is busy).
    several = len(works) > 1
    try:
        outcomes: list[Outcome[Any]] = []
        for work in works:
            if several:
                conn.execute("SAVEPOINT write")
            try:
                outcomes.append(Outcome(work(conn)))
            except Exception as exc:
                if not several:
                    rollback(conn)
                    return [Outcome(error=exc)]
                conn.execute("ROLLBACK TO write")
                outcomes.append(Outcome(error=exc))
            if several:
                conn.execute("RELEASE write")
        conn.execute("COMMIT")
    except BaseException as exc:
        rollback(conn)
        if not isinstance(exc, Exception):
            raise
        return [Outcome(error=exc)] * len(works)
    return outcomes


def rollback(conn: sqlite3.Connection) -> None:
    # No transaction open, or the connection is gone: either way there is nothing left to
    # undo, and the original error is what matters.
    with contextlib.suppress(sqlite3.Error, ValueError):
        conn.execute("ROLLBACK")


__all__ = ["GROUP_MOST", "GroupWriter", "Outcome", "Work", "rollback", "run_group"]
