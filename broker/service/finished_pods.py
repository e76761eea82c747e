"""The pods of finished jobs, kept in their member for their logs for
``retention.finishedPodsSeconds``, then deleted.

``FinishedPods`` is the leader's book of the jobs that ended (Succeeded or Failed) with
their pods left in place: the garbage collection of a Kubernetes member counts them as
live while kept (``live``), ``JobPods`` reads their pods and logs, and ``run`` (a
supervised task) deletes the pods of those past the retention through the launcher, for
every kind of member alike. A resubmission of the name forgets its entry and deletes its
pods first (``forget``), so the next run never adopts the last one's ended pods. The book
is in memory, bounded by ``MAX_KEPT`` (past it the oldest go first). A new leader (after a
restart or a takeover) refills it from the store before its first garbage collection
(``restore``): the jobs that finished within the retention, on the cluster each was placed
on, so their pods outlive the broker's restart as long as they would have outlived none.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from broker.core.lifecycle import Launch
from broker.model import Placement
from broker.store import JobRecord

log = logging.getLogger(__name__)

Delete = Callable[[Placement, Launch | None], Awaitable[None]]

# The ends a run's pods are kept after (a cancelled job's are deleted at once).
FINISHED_STATES = ("Succeeded", "Failed")

MAX_KEPT = 10_000
# How often kept pods past the retention are looked for, at most (a shorter retention:
# that often).
SWEEP_SECONDS = 60.0


@dataclass(frozen=True, slots=True)
class Kept:
    """A finished job's placement (where its pods are), when it ended, and its launch (the
    spec that deletes a workload's object) when this leader launched or restored it."""

    placement: Placement
    ended_at: float
    launch: Launch | None = None


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
        self._keep(Kept(launch.placement, ended_at, launch))

    def restore(self, finished: Sequence[JobRecord]) -> int:
        """A new leader's book: those of ``finished`` (the store's jobs that ended within
        the retention, oldest first) whose run ended on a cluster; how many. Where a job's
        pods are is its cluster: deleting them and reading them go by its labels there."""
        kept = 0
        for record in finished:
            if record.state in FINISHED_STATES and record.cluster:
                key = f"{record.tenant}/{record.name}"
                self._keep(Kept(Placement(key, record.cluster, ()), record.updated_at))
                kept += 1
        return kept

    def _keep(self, kept: Kept) -> None:
        key = kept.placement.job
        self._kept.pop(key, None)
        self._kept[key] = kept
        while len(self._kept) > MAX_KEPT:
            self._due.append(self._kept.popitem(last=False)[1])

    def get(self, key: str) -> Kept | None:
        return self._kept.get(key)

    def forget(self, key: str) -> Kept | None:
        """The job's entry, taken out of the book (its pods are the caller's to delete)."""
        return self._kept.pop(key, None)

    def cutoff(self) -> float:
        """When a job must have ended, at the earliest, for its pods to be kept now."""
        return self.clock() - self.keep_seconds

    def live(self, cluster: str) -> set[str]:
        """The jobs whose pods are kept on ``cluster`` now (not garbage)."""
        cutoff = self.cutoff()
        return {
            key
            for key, kept in self._kept.items()
            if kept.placement.cluster == cluster and kept.ended_at > cutoff
        }

    def due(self) -> list[Kept]:
        """The entries past the retention (or pushed out), taken out of the book."""
        cutoff = self.cutoff()
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


__all__ = ["FINISHED_STATES", "MAX_KEPT", "SWEEP_SECONDS", "Delete", "FinishedPods", "Kept"]
