"""Retention: finished jobs (Succeeded, Failed, Cancelled) older than
``retention.finishedJobsSeconds`` are purged from the store, and so from lists, with
their history and earlier generations; active jobs never are.

Only the leader purges (``Shared.leading``; on PostgreSQL every purge is also fenced by
the lease, as every write), in small batches paced apart so a purge never holds the store
long nor comes as a burst of writes, every ``retention.purgeEverySeconds``, as a supervised
task (``Service.spawn_loop``). The time
is the service's injected clock, the one the store's timestamps were written with.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from broker.service.state import Shared
from broker.store import StoreError

log = logging.getLogger(__name__)

# Jobs per delete statement, and the pause between two statements of one purge. Every other
# write waits behind a purge statement and shares its commit (the store has one writer), so
# a purge must not come as a burst: measured in ``bench --soak`` at 300 jobs/s (18,000 due a
# minute), batches of 1,000 back to back (about 50 ms each) and then of 200 put a purge
# statement in every group commit for seconds each minute, and 201 p99 rose to 68-100 ms in
# every window. Small batches spread out: a write meets at most one small statement, at most
# BATCH / BATCH_PAUSE_SECONDS (500) jobs purged a second, far above what a broker finishes.
# The pause is from one statement's start to the next's (less what the statement took, but
# at least MIN_PAUSE_SECONDS): paced from each statement's end, the soak's purge managed
# 50 jobs per 0.13-0.2 s (the statement's wait for its group and commit came on top), under
# the 300 jobs/s finishing, so finished jobs piled up past their retention (183 s late
# after 500,000 jobs), the store grew, and every write slowed down with it.
BATCH = 50
BATCH_PAUSE_SECONDS = 0.1
MIN_PAUSE_SECONDS = 0.02


class Retention:
    """Purges old finished jobs; ``sleep`` and ``monotonic`` are injected for tests."""

    def __init__(
        self,
        shared: Shared,
        sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.s = shared
        self._sleep = sleep
        self._monotonic = monotonic

    async def purge_once(self) -> int:
        """Purge what is past the retention now, if this replica leads; how many jobs."""
        if not self.s.leading:
            return 0
        cutoff = self.s.clock() - self.s.config.retention.finished_jobs_seconds
        total = 0
        while True:
            started = self._monotonic()
            purged = await self.s.store.purge_finished(cutoff, BATCH)
            total += purged
            if purged < BATCH or not self.s.leading:
                break
            took = self._monotonic() - started
            await self._sleep(max(MIN_PAUSE_SECONDS, BATCH_PAUSE_SECONDS - took))  # see BATCH
        if total:
            log.info("retention: purged %d finished jobs", total)
        return total

    async def run(self) -> None:
        """Purge every ``purgeEverySeconds`` from one purge's start to the next's (a
        long-lived loop under the supervisor). Timed from each purge's end, the period was
        the setting plus the purge: about 96 s instead of 60 in the soak (36 s to purge
        18,000 jobs at 500 a second), and finished jobs stayed that much past retention."""
        every = self.s.config.retention.purge_every_seconds
        took = 0.0
        while True:
            await self._sleep(max(0.0, every - took))
            started = self._monotonic()
            try:
                await self.purge_once()
            except StoreError as exc:  # the store is down or the lease lost: next time
                log.warning("retention: purge failed: %s", exc)
            took = self._monotonic() - started


__all__ = ["BATCH", "BATCH_PAUSE_SECONDS", "MIN_PAUSE_SECONDS", "Retention"]
