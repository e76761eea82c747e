"""PostgreSQL's schema: migrated under an advisory lock, its statistics kept up.

``migrate_schema`` applies the migrations under a transaction-scoped advisory lock, so
replicas starting together apply each version once.

PostgreSQL plans from statistics that only ANALYZE writes. On a fresh database (and on any
database while autovacuum is off, or before its first ANALYZE a minute in) the planner
believes ``jobs`` is empty or tiny: it joined a batch of transitions to ``jobs`` by a
sequential scan, and found a job by name through the (tenant, seq) index, reading every
job of the tenant. Each write then cost as much as the table held: 3,000 jobs submitted
and moved twice read 9,003,000 rows of ``jobs``, 165,000 with these ANALYZEs (the
PostgreSQL soak's first minutes on a fresh database stalled on it). ``Statistics`` runs
ANALYZE itself each time the rows inserted since the last one reach the table's size then
(at least MIN_ROWS): O(log n) ANALYZEs over the table's growth, each a sample of at most
30,000 rows, in the background, one at a time. ANALYZE also makes every connection plan
its statements again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence
from typing import Any, Final

import asyncpg

from broker.store import StoreError
from broker.store.migrations import Migration, migrate
from broker.store.pgerrors import UNAVAILABLE

log = logging.getLogger(__name__)

# Any constant works; it only has to be the same in every broker (ASCII "fedbrokr").
_MIGRATION_LOCK: Final = 0x6665646272_6F6B72

MIN_ROWS: Final = 200  # inserted rows that make a young table's statistics stale
TABLES: Final = "jobs, job_history"
# The jobs table's rows as the last ANALYZE (or VACUUM) counted them; -1 before any.
_COUNTED: Final = "SELECT reltuples FROM pg_class WHERE oid = 'jobs'::regclass"


async def migrate_schema(
    pool: asyncpg.Pool,
    migrations: Sequence[Migration],
    named: str,
    scrub: Callable[[BaseException], str],
) -> None:
    """``migrations`` applied on ``pool``'s database under the advisory lock; a migration
    refused by the server is a StoreError naming ``named`` (the store, its URL redacted),
    its message passed through ``scrub``."""
    async with pool.acquire() as conn, conn.transaction():
        # Serialises brokers starting together; released at commit/rollback.
        await conn.execute("SELECT pg_advisory_xact_lock($1)", _MIGRATION_LOCK)

        async def execute(statement: str, args: Sequence[Any]) -> None:
            await conn.execute(statement, *args)

        async def versions(query: str) -> list[int]:
            return [r[0] for r in await conn.fetch(query)]

        def failed(migration: Migration, exc: Exception) -> None:
            if isinstance(exc, asyncpg.PostgresError) and not isinstance(exc, UNAVAILABLE):
                raise StoreError(
                    f"{named}: migration {migration.version} ({migration.name}) failed: "
                    f"{scrub(exc)}"
                ) from exc

        await migrate("postgres", migrations, execute, versions, failed)


class Statistics:
    """When to ANALYZE the store's tables (see the module's doc). Not thread-safe: the
    event loop's."""

    def __init__(self) -> None:
        self.rows = 0  # the jobs table's rows at the last ANALYZE (as PostgreSQL counted)
        self.inserted = 0  # rows inserted since
        self._pool: asyncpg.Pool | None = None
        self._task: asyncio.Task[None] | None = None

    async def open(self, pool: asyncpg.Pool) -> None:
        """Read the size PostgreSQL last counted. A table never analyzed that holds rows is
        analyzed now; an empty one is left to its first MIN_ROWS (analyzed empty, it would
        be planned as empty: sequential scans, whatever it then grows to)."""
        self._pool = pool
        counted = await pool.fetchval(_COUNTED)
        empty = await pool.fetchval("SELECT NOT EXISTS (SELECT 1 FROM jobs)")
        if counted >= 0:
            self.rows = int(counted)
        elif not empty:  # never analyzed, with rows: planned as a tiny table until now
            await self._analyze()

    def grew(self, rows: int) -> None:
        """``rows`` jobs were inserted: ANALYZE in the background once enough were."""
        self.inserted += rows
        busy = self._task is not None and not self._task.done()
        if busy or self._pool is None or self.inserted < max(MIN_ROWS, self.rows):
            return
        self._task = asyncio.get_running_loop().create_task(self._analyze())

    async def _analyze(self) -> None:
        pool = self._pool
        if pool is None:
            return
        since = self.inserted
        try:
            await pool.execute(f"ANALYZE {TABLES}")
            counted = await pool.fetchval(_COUNTED)
        except (asyncpg.PostgresError, OSError) as exc:  # the next insert tries again
            log.warning("ANALYZE of the store's tables failed: %s", type(exc).__name__)
            return
        self.rows = max(int(counted), self.rows + since)
        self.inserted -= since  # those inserted meanwhile count towards the next

    async def close(self) -> None:
        task, self._task, self._pool = self._task, None, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


__all__ = ["MIN_ROWS", "Statistics", "migrate_schema"]
