"""Many concurrent writes sent as one statement: group commit for a server database.

A ``Coalescer`` keeps at most ``slots`` batches in flight. A write that finds a slot free
is sent at once, alone (no added latency when the store is idle); writes that arrive while
every slot is busy wait together and leave as one batch when a slot frees, so under load a
round trip, a commit and a lease check are shared by many writes instead of paid by each.
Two writes with the same key (the same job) never share a batch: a statement that joins its
rows to the table would apply only one of them.

The batch runs in a task of its own: a caller cancelled while waiting still waits until
its batch has settled (stored or not) before the cancellation reaches it, as it would for
a statement of its own.

Complexity: each write is appended and taken once, O(1) amortised; a batch of k writes
costs O(k) to build and to hand out.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Awaitable, Callable, Hashable, MutableSequence, Sequence
from typing import Any, Generic, TypeVar

from broker.store import LeaseLost, StoreError, StoreUnavailable

T = TypeVar("T")
R = TypeVar("R")


class Coalescer(Generic[T, R]):
    """Runs ``send(batch)`` for writes of type T; ``send`` returns one result per write, in
    order (None where the write did not apply and its caller should try it alone), or
    raises, and then every write of the batch raises that error."""

    def __init__(
        self,
        send: Callable[[Sequence[T]], Awaitable[Sequence[R | None]]],
        key: Callable[[T], Hashable],
        *,
        slots: int,
        most: int,
    ) -> None:
        if slots < 1 or most < 1:
            raise ValueError("a coalescer needs at least one slot and one write per batch")
        self._send, self._key, self._slots, self._most = send, key, slots, most
        self._waiting: deque[tuple[T, asyncio.Future[R | None]]] = deque()
        self._in_flight: set[asyncio.Task[None]] = set()
        self.batches = 0  # batches sent so far: for tests and benchmarks
        self.writes = 0

    async def __call__(self, write: T) -> R | None:
        done: asyncio.Future[R | None] = asyncio.get_running_loop().create_future()
        self._waiting.append((write, done))
        self._start()
        return await outcome_of(done, self._waiting)

    async def drain(self) -> None:
        """Wait until every batch in flight has settled (for close)."""
        while self._in_flight:
            await asyncio.wait(set(self._in_flight))

    def _start(self) -> None:
        while self._waiting and len(self._in_flight) < self._slots:
            batch = self._take()
            task = asyncio.get_running_loop().create_task(self._run(batch))
            self._in_flight.add(task)
            task.add_done_callback(self._finished)

    def _take(self) -> list[tuple[T, asyncio.Future[R | None]]]:
        batch: list[tuple[T, asyncio.Future[R | None]]] = []
        keys: set[Hashable] = set()
        while self._waiting and len(batch) < self._most:
            write, done = self._waiting[0]
            key = self._key(write)
            if key in keys:
                break  # the same job twice: the second waits for the next batch
            self._waiting.popleft()
            keys.add(key)
            batch.append((write, done))
        return batch

    async def _run(self, batch: list[tuple[T, asyncio.Future[R | None]]]) -> None:
        self.batches += 1
        self.writes += len(batch)
        try:
            results = await self._send([write for write, _ in batch])
        except BaseException as exc:  # every write of the batch failed with it
            for _, done in batch:
                if not done.done():
                    done.set_exception(exc if isinstance(exc, Exception) else _stopped(exc))
            if not isinstance(exc, Exception):
                raise
            return
        for (_, done), result in zip(batch, results, strict=True):
            if not done.done():
                done.set_result(result)

    def _finished(self, task: asyncio.Task[None]) -> None:
        self._in_flight.discard(task)
        if not task.cancelled():
            task.exception()  # retrieved: the callers got it already
        self._start()


async def outcome_of(done: asyncio.Future[T], waiting: MutableSequence[tuple[Any, Any]]) -> T:
    """The outcome of a write handed in as ``(write, done)`` to ``waiting``. A caller
    cancelled while its write still waits takes it out (nothing was sent; O(waiting), on
    cancellation only); once sent, it waits for the outcome (the write may be stored)."""
    try:
        return await asyncio.shield(done)
    except asyncio.CancelledError:
        for i, (_, other) in enumerate(waiting):
            if other is done:
                del waiting[i]
                done.cancel()
                raise
        await settled(done)
        raise


async def settled(outcome: asyncio.Future[Any]) -> None:
    """Wait for a write's outcome even through further cancel requests: a caller cancelled
    once more still gets control back only once its write is settled (stored or not)."""
    while not outcome.done():
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait([outcome])


async def coalesced(coalescer: Coalescer[T, R], write: T) -> R | None:
    """A store's write sent with others; None when it did not apply (the caller's own
    statement then finds out why) or when its batch failed for another write's sake (a
    refused row fails the whole statement: each is then tried alone)."""
    try:
        return await coalescer(write)
    except (StoreUnavailable, LeaseLost):
        raise  # in doubt, or not ours to write: the same for every write of the batch
    except StoreError:
        return None


def _stopped(exc: BaseException) -> Exception:
    return RuntimeError(f"the batch was stopped: {exc!r}")


__all__ = ["Coalescer", "coalesced", "outcome_of", "settled"]
