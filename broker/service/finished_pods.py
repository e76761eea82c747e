"""The pods of finished jobs, kept in their member for their logs for
``retention.finishedPodsSeconds``, then deleted.

``FinishedPods`` is the leader's book of the jobs that ended (Succeeded or Failed) with
their pods left in place: the garbage collection of a Kubernetes member counts them as
live while kept (``live``), ``JobPods`` reads their pods and logs, and ``run`` (a
supervised task) deletes the pods of those past the retention through the launcher, for
every kind of member alike. A resubmission of the name forgets its entry and deletes its
pods first (``forget``), so the next run never adopts the last one's ended pods. The book
is memory only, bounded by ``MAX_KEPT`` (past it the oldest go first): a restart or a new
leader forgets it, and the first garbage collection then deletes what it held.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from broker.core.lifecycle import Launch
from broker.model import Placement

log = logging.getLogger(__name__)

Delete = Callable[[Placement, Launch | None], Awaitable[None]]

MAX_KEPT = 10_000
# How often kept pods past the retention are looked for, at most (a shorter retention:
# that often).
SWEEP_SECONDS = 60.0


@dataclass(frozen=True, slots=True)
class Kept:
    """A finished job's launch (where its pods are, and the spec that deletes them) and
    when it ended."""

    launch: Launch
    ended_at: float

    @property
    def placement(self) -> Placement:
        return self.launch.placement


class FinishedPods:
    """The finished jobs whose pods are kept (see the module's docstring)."""

    def __init__(self, keep_seconds: float, clock: Callable[[], float]) -> None:
        self.keep_seconds = keep_seconds
        self.clock = clock
        self._kept: OrderedDict[str, Kept] = OrderedDict()  # by end: the oldest first
        self._due: list[Kept] = []  # pushed out by MAX_KEPT: deleted at the next sweep

    def add(self, launch: Launch, ended_at: float) -> None:
        """A job ended with its pods in place (with a retention of 0: deleted at the next
        sweep or garbage collection)."""
        key = launch.placement.job
        self._kept.pop(key, None)
        self._kept[key] = Kept(launch, ended_at)
        while len(self._kept) > MAX_KEPT:
            self._due.append(self._kept.popitem(last=False)[1])

    def get(self, key: str) -> Kept | None:
        return self._kept.get(key)

    def forget(self, key: str) -> Kept | None:
        """The job's entry, taken out of the book (its pods are the caller's to delete)."""
        return self._kept.pop(key, None)

    def live(self, cluster: str) -> set[str]:
        """The jobs whose pods are kept on ``cluster`` now (not garbage)."""
        cutoff = self.clock() - self.keep_seconds
        return {
            key
            for key, kept in self._kept.items()
            if kept.placement.cluster == cluster and kept.ended_at > cutoff
        }

    def due(self) -> list[Kept]:
        """The entries past the retention (or pushed out), taken out of the book."""
        cutoff = self.clock() - self.keep_seconds
        out, self._due = self._due, []
        while self._kept:
            key, kept = next(iter(self._kept.items()))
            if kept.ended_at > cutoff:
                break
            del self._kept[key]
            out.append(kept)
        return out

    def clear(self) -> None:
        """Lead lost: what is kept is the next leader's garbage collection's."""
        self._kept.clear()
        self._due.clear()

    async def sweep(self, delete: Delete) -> int:
        """Delete the pods of the jobs past the retention; how many jobs'. ``delete`` is
        the binding's: a failure is logged there, and a Kubernetes member's garbage
        collection deletes what is left."""
        due = self.due()
        for kept in due:
            await delete(kept.placement, kept.launch)
        return len(due)

    async def run(
        self,
        delete: Delete,
        leading: Callable[[], bool],
        sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
    ) -> None:
        """Sweep every ``SWEEP_SECONDS`` (or the retention, if shorter) while leading."""
        every = max(1.0, min(SWEEP_SECONDS, self.keep_seconds))
        while True:
            await sleep(every)
            if leading():
                await self.sweep(delete)


__all__ = ["MAX_KEPT", "SWEEP_SECONDS", "Delete", "FinishedPods", "Kept"]
