"""Retention: finished jobs (Succeeded, Failed, Cancelled) older than
``retention.finishedJobsSeconds`` are purged from the store, and so from lists, with
their history and earlier generations; active jobs never are.

Only the leader purges (``Shared.leading``; on PostgreSQL every purge is also fenced by
the lease, as every write), in batches so one purge never holds the store long, every
``retention.purgeEverySeconds``, as a supervised task (``Service.spawn_loop``). The time
is the service's injected clock, the one the store's timestamps were written with.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from broker.service.state import Shared
from broker.store import StoreError

log = logging.getLogger(__name__)

# Jobs per delete statement. Every other write waits behind one (the store has one writer):
# at 1,000 a statement took about 50 ms on SQLite with their history, and the soak's purge
# of 18,000 jobs a minute put 18 of those in the submissions' path (201 p99 ~100 ms); at
# 200 each waits out ~10 ms at most, for the same total work.
BATCH = 200


class Retention:
    """Purges old finished jobs; ``sleep`` is injected for tests."""

    def __init__(
        self, shared: Shared, sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep
    ) -> None:
        self.s = shared
        self._sleep = sleep

    async def purge_once(self) -> int:
        """Purge what is past the retention now, if this replica leads; how many jobs."""
        if not self.s.leading:
            return 0
        cutoff = self.s.clock() - self.s.config.retention.finished_jobs_seconds
        total = 0
        while True:
            purged = await self.s.store.purge_finished(cutoff, BATCH)
            total += purged
            if purged < BATCH:
                break
        if total:
            log.info("retention: purged %d finished jobs", total)
        return total

    async def run(self) -> None:
        """Purge every ``purgeEverySeconds`` (a long-lived loop under the supervisor)."""
        while True:
            await self._sleep(self.s.config.retention.purge_every_seconds)
            try:
                await self.purge_once()
            except StoreError as exc:  # the store is down or the lease lost: next time
                log.warning("retention: purge failed: %s", exc)


__all__ = ["BATCH", "Retention"]
