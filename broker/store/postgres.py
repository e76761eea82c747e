"""The PostgreSQL backend of the job store: an asyncpg pool, one transaction per write.

The common writes are single fenced statements, and concurrent submissions and plain
transitions share one (``Coalescer``: group commit). Driver errors become the store's in
``pgerrors`` (StoreUnavailable when the server cannot be used right now). Writes run at
READ COMMITTED, which is enough because each one is a single-row compare-and-set:
``INSERT .. ON CONFLICT DO NOTHING`` waits for a concurrent insert of the same (tenant,
name) and then sees it, and ``UPDATE .. WHERE state = ANY(expect)`` re-checks the condition
on the row version it finally locks. Migrations run under a transaction-scoped advisory
lock so replicas starting together apply each version once (``pgschema``). The URL (which
may carry a password) is kept private; messages use ``url_for_logs``.

Note on ``seq``: it comes from an identity sequence, so it is unique and increasing in
insertion order, but two concurrent transactions may commit out of seq order. FIFO
ordering is unaffected; a client paginating with ``after_seq`` during heavy submission can
miss a row that commits just behind its cursor (it shows up in the next full listing).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Collection, Mapping, Sequence
from contextlib import AbstractContextManager, asynccontextmanager
from typing import Any, Final

import asyncpg

from broker.store import (
    FINAL_STATES,
    Generation,
    JobRecord,
    JobState,
    LeaseLost,
    Placing,
    StoreError,
    StoreUnavailable,
    Transition,
    pglease,
    redact_url,
    sql,
)
from broker.store.batch import (
    Move,
    NewJob,
    as_move,
    by_job,
    coalescers,
    insert_new_jobs,
    inserted,
    move_jobs,
    moved_records,
    place_jobs,
    update_jobs,
)
from broker.store.coalesce import coalesced
from broker.store.migrations import MIGRATIONS, Migration, check_order
from broker.store.pgerrors import (
    POOL_LOG_FILTER,
    autovacuum_warning,
    reset_connection,
    scrub,
    secrets_in,
    translated,
)
from broker.store.pglease import ACQUIRE, RELEASE, RENEW
from broker.store.pgschema import Statistics, migrate_schema

log = logging.getLogger(__name__)

PING_TIMEOUT_S: Final = 2.0
# Coalesced statements of one kind in flight at once. Few make the batches under load large:
# each is a commit (a WAL flush) and a lease row lock, which concurrent ones contend for.
COALESCED_SLOTS: Final = 2
CLOSE_TIMEOUT_S: Final = 10.0


class PostgresStore:
    """The Store protocol on PostgreSQL (see the module docstring for the design)."""

    def __init__(
        self,
        url: str,
        *,
        migrations: Sequence[Migration] = MIGRATIONS,
        min_size: int = 1,
        max_size: int = 20,
        connect_timeout: float = 10.0,
        command_timeout: float = 30.0,
    ) -> None:
        self._url = url
        self.url_for_logs = redact_url(url)
        self._secrets = secrets_in(url)
        self._migrations = tuple(migrations)
        self._pool_options: dict[str, Any] = {
            "min_size": min_size,
            "max_size": max_size,
            "timeout": connect_timeout,
            "command_timeout": command_timeout,
            "reset": reset_connection,
        }
        self._pool: asyncpg.Pool | None = None
        # Leader election's own connections: a renewal must not queue behind job writes for
        # a connection of the main pool (the soak's leader, every connection busy at 300
        # jobs/s, timed out renewing and lost its lease).
        self._lease_pool: asyncpg.Pool | None = None
        self._fence: tuple[str, str] | None = None  # (lease, holder): see fence()
        # Concurrent submissions and plain transitions leave as one statement each batch
        # (group commit, as SQLite's): at 300 jobs/s one statement per write, each with its
        # own round trip, commit and lease check, took PostgreSQL most of a core.
        self._statistics = Statistics()  # ANALYZE while the tables are young (pgschema)
        self._inserts, self._moves = coalescers(
            self._insert_batch, self._move_batch, COALESCED_SLOTS
        )

    # -- lifecycle -------------------------------------------------------------------------

    async def open(self) -> None:
        if self._pool is not None:
            return
        check_order(self._migrations)
        logging.getLogger("asyncpg.pool").addFilter(POOL_LOG_FILTER)  # once: same object
        with self._errors("connect"):
            try:
                pool = await asyncpg.create_pool(self._url, **self._pool_options)
            except ValueError as exc:  # asyncpg's DSN parser
                raise StoreError(
                    f"postgres store {self.url_for_logs}: invalid URL: {self._scrub(exc)}"
                ) from None
        try:
            with self._errors("migrate"):
                await migrate_schema(
                    pool, self._migrations, f"postgres store {self.url_for_logs}", self._scrub
                )
                warning = autovacuum_warning(await pool.fetchval("SHOW autovacuum"))
            if warning is not None:
                log.warning("postgres store %s: %s", self.url_for_logs, warning)
            with self._errors("connect"):
                lease_pool = await asyncpg.create_pool(
                    self._url, **{**self._pool_options, "min_size": 1, "max_size": 2}
                )
        except BaseException:
            pool.terminate()
            raise
        self._pool, self._lease_pool = pool, lease_pool
        with self._errors("analyze"):
            await self._statistics.open(pool)

    async def close(self) -> None:
        await self._inserts.drain()
        await self._moves.drain()
        await self._statistics.close()
        pool, self._pool = self._pool, None
        lease_pool, self._lease_pool = self._lease_pool, None
        for each in (pool, lease_pool):
            if each is None:
                continue
            try:
                # Waits for connections in use to come back, so a commit in flight completes.
                await asyncio.wait_for(each.close(), CLOSE_TIMEOUT_S)
            except TimeoutError:
                each.terminate()

    async def ping(self) -> bool:
        pool = self._pool
        if pool is None:
            return False
        try:
            async with asyncio.timeout(PING_TIMEOUT_S):
                await pool.fetchval("SELECT 1")
        except Exception:
            return False
        return True

    # -- writes ----------------------------------------------------------------------------

    async def create_job(
        self,
        tenant: str,
        name: str,
        queue: str,
        priority: int,
        manifest: Mapping[str, Any],
        now: float,
        *,
        reuse_finished: bool = False,
    ) -> tuple[JobRecord, bool]:
        # The common case (a new name) in one fenced statement, shared with the submissions
        # arriving meanwhile (the coalescer): BEGIN, the fence's SELECT, the INSERT and
        # COMMIT were four round trips, each a turn of a busy event loop, in the path of
        # every 201. No row back (the name exists, or the lease is not held): the
        # transaction below finds out which and does the rest.
        new = NewJob(tenant, name, queue, priority, sql.encode_json(manifest), now, manifest)
        if (stored := await coalesced(self._inserts, new)) is not None:
            return stored, True
        insert = sql.insert_job("postgres", tenant, name, queue, priority, manifest, now)
        async with self._txn("create_job") as conn:
            row = await conn.fetchrow(insert.sql, *insert.args)
            if row is not None:
                return _job(row), True
            # ON CONFLICT waited for the other insert to commit; this statement's snapshot
            # (READ COMMITTED) therefore sees it. Locked: two resubmissions of a finished
            # name make one next generation, the second then finds it active.
            select = sql.select_for_update("postgres", tenant, name)
            found = await conn.fetchrow(select.sql, *select.args)
            if found is None:  # a next generation replaced it meanwhile: insert again
                row = await conn.fetchrow(insert.sql, *insert.args)
                found = row or await conn.fetchrow(select.sql, *select.args)
                if found is None:
                    raise StoreError(f"job {tenant}/{name} conflicted on insert but is missing")
                return _job(found), row is not None
            existing = _job(found)
            if not reuse_finished or existing.state not in FINAL_STATES:
                return existing, False
            query = sql.history("postgres", tenant, name)
            history = [sql.transition_from_row(tuple(r)) for r in await conn.fetch(
                query.sql, *query.args)]  # fmt: skip
            for st in (
                sql.archive_generation("postgres", existing, history),
                sql.delete_finished_job("postgres", tenant, name),
            ):
                await conn.execute(st.sql, *st.args)
            again = sql.insert_job(
                "postgres", tenant, name, queue, priority, manifest, now, existing.generation + 1
            )
            created = await conn.fetchrow(again.sql, *again.args)
            if created is None:  # the row was deleted under the lock: cannot conflict
                raise StoreError(f"job {tenant}/{name}: next generation not stored")
            return _job(created), True

    async def purge_finished(self, before: float, limit: int = 1000) -> int:
        purge = sql.purge_finished_jobs("postgres", before, limit)
        old = sql.purge_generations("postgres", before)
        async with self._txn("purge_finished") as conn:
            status = await conn.execute(purge.sql, *purge.args)
            await conn.execute(old.sql, *old.args)
        return int(status.split()[-1])  # "SELECT <n>": a row per job deleted

    async def transition(
        self,
        tenant: str,
        name: str,
        state: JobState,
        reason: str,
        now: float,
        *,
        cluster: str | None = None,
        placement: Mapping[str, Any] | None = None,
        expect: Collection[JobState] | None = None,
        attempts: int | None = None,
        not_before: float | None = None,
    ) -> JobRecord:
        expected = sql.expected_states(expect)
        fields: dict[str, Any] = {
            "cluster": cluster, "placement": placement, "attempts": attempts,
            "not_before": not_before,
        }  # fmt: skip
        move = as_move(tenant, name, state, reason, now, expected, fields)
        if move is not None and (moved := await coalesced(self._moves, move)) is not None:
            return moved
        fields["expected"] = expected
        # The common case in one round trip: one statement is its own transaction, fenced
        # by itself (BEGIN, the fence's SELECT, the UPDATE and COMMIT took four, each a
        # turn of a busy event loop: the soak's writes fell behind at ~500/s on 10
        # connections). No row back: the transaction below finds out why.
        fast = sql.update_job(
            "postgres", tenant, name, state, reason, now, **fields, fence=self._fence
        )
        pool = self._require()
        with self._errors("transition"):
            row = await pool.fetchrow(fast.sql, *fast.args)
        if row is not None:
            return _job(row)
        update = sql.update_job("postgres", tenant, name, state, reason, now, **fields)
        async with self._txn("transition") as conn:
            row = await conn.fetchrow(update.sql, *update.args)
            if row is None:
                query = sql.state_of("postgres", tenant, name)
                current = await conn.fetchval(query.sql, *query.args)
                raise sql.missing_job(tenant, name, current, expected)
            return _job(row)

    async def transition_many(
        self, jobs: Sequence[JobRecord], state: JobState, reason: str, now: float
    ) -> list[JobRecord]:
        if not jobs:
            return []
        update = update_jobs("postgres", jobs, state, reason, now)
        async with self._txn("transition_many") as conn:
            rows = await conn.fetch(update.sql, *update.args)
        return moved_records(jobs, rows)

    async def _insert_batch(self, rows: Sequence[NewJob]) -> list[JobRecord | None]:
        statement = insert_new_jobs("postgres", rows, self._fence)
        with self._errors("create_job"):
            found = await self._require().fetch(statement.sql, *statement.args)
        self._statistics.grew(len(found))
        return inserted(rows, map(tuple, found))

    async def _move_batch(self, moves: Sequence[Move]) -> list[JobRecord | None]:
        statement = move_jobs("postgres", moves, self._fence)
        with self._errors("transition"):
            found = await self._require().fetch(statement.sql, *statement.args)
        return by_job(moves, map(_job, found))

    async def place_many(self, placings: Sequence[Placing], now: float) -> list[JobRecord]:
        if not placings:
            return []
        # One round trip, fenced by itself (as transition's fast path). No row back: the
        # transaction below says LeaseLost, or finds every job moved on meanwhile.
        fast = place_jobs("postgres", placings, now, fence=self._fence)
        with self._errors("place_many"):
            rows = await self._require().fetch(fast.sql, *fast.args)
        if not rows and self._fence is not None:
            update = place_jobs("postgres", placings, now)
            async with self._txn("place_many") as conn:
                rows = await conn.fetch(update.sql, *update.args)
        return [_job(row) for row in rows]

    @asynccontextmanager
    async def _txn(self, action: str) -> AsyncIterator[asyncpg.pool.PoolConnectionProxy]:
        pool = self._require()
        with self._errors(action):
            async with pool.acquire() as conn, conn.transaction():
                if self._fence is not None:
                    await self._check_fence(conn, action, *self._fence)
                yield conn

    def fence(self, lease: str, holder: str) -> None:
        """From now on every job write checks, in its own transaction, that ``holder``
        still holds ``lease`` unexpired, and keeps the lease row key-share-locked until it
        commits: a replica taking the lease over (an update of ``holder``, a key: migration
        6) waits for that write, then sees it when it rebuilds; a write of a replica whose
        lease expired or was taken is refused (``LeaseLost``) instead of landing late (the
        fencing token of the lease). The holder's own renewals (``expires_at`` only) do not
        wait for its writes: with a plain share lock they starved behind them under load."""
        self._fence = (lease, holder)

    async def _check_fence(
        self, conn: asyncpg.pool.PoolConnectionProxy, action: str, lease: str, holder: str
    ) -> None:
        if await conn.fetchval(pglease.FENCE, lease, holder) is None:
            raise LeaseLost(
                f"postgres store {self.url_for_logs}: {action} refused: "
                f"{holder} no longer holds the {lease} lease"
            )

    # -- reads -----------------------------------------------------------------------------

    async def get_job(self, tenant: str, name: str) -> JobRecord | None:
        rows = await self._fetch("get_job", sql.select_job("postgres", tenant, name))
        return _job(rows[0]) if rows else None

    async def list_jobs(
        self,
        *,
        tenant: str | None = None,
        queue: str | None = None,
        state: JobState | Collection[JobState] | None = None,
        cluster: str | None = None,
        limit: int = 100,
        after_seq: int | None = None,
    ) -> list[JobRecord]:
        query = sql.list_jobs(
            "postgres", tenant=tenant, queue=queue, state=state, cluster=cluster, limit=limit,
            after_seq=after_seq,
        )  # fmt: skip
        return [_job(row) for row in await self._fetch("list_jobs", query)]

    async def history(self, tenant: str, name: str) -> list[Transition]:
        rows = await self._fetch("history", sql.history("postgres", tenant, name))
        return [sql.transition_from_row(tuple(r)) for r in rows]

    async def active_jobs(
        self, *, after_seq: int | None = None, limit: int | None = None
    ) -> list[JobRecord]:
        query = sql.active_jobs("postgres", after_seq, limit)
        rows = await self._fetch("active_jobs", query)
        return [sql.active_job_from_row(tuple(row)) for row in rows]

    async def finished_since(self, since: float, limit: int) -> list[JobRecord]:
        rows = await self._fetch("finished_since", sql.finished_since("postgres", since, limit))
        return [_job(row) for row in reversed(rows)]

    async def count_active(self, tenant: str) -> int:
        rows = await self._fetch("count_active", sql.count_active("postgres", tenant))
        return int(rows[0][0])

    async def generations(self, tenant: str, name: str) -> list[Generation]:
        rows = await self._fetch("generations", sql.generations("postgres", tenant, name))
        return [sql.generation_from_row(tuple(r)) for r in rows]

    async def _fetch(self, action: str, query: sql.Statement) -> list[asyncpg.Record]:
        pool = self._require()
        with self._errors(action):
            return list(await pool.fetch(query.sql, *query.args))

    # -- leader election (broker/leader.py) ------------------------------------------------

    async def acquire_lease(self, name: str, holder: str, seconds: float) -> str | None:
        """Take the lease ``name`` for ``holder`` when it is free, expired or already
        ``holder``'s, for ``seconds`` of the database's clock; one statement. Returns the
        live holder afterwards (``holder`` when taken; None when nobody holds it)."""
        with self._errors("acquire_lease"):
            return await pglease.hold(self._require_lease(), ACQUIRE, name, holder, seconds)

    async def renew_lease(self, name: str, holder: str, seconds: float) -> str | None:
        """Extend ``holder``'s lease only while it is unexpired and still ``holder``'s;
        returns the live holder afterwards, as acquire_lease."""
        with self._errors("renew_lease"):
            return await pglease.hold(self._require_lease(), RENEW, name, holder, seconds)

    async def release_lease(self, name: str, holder: str) -> None:
        with self._errors("release_lease"):
            await self._require_lease().execute(RELEASE, name, holder)

    # -- errors ----------------------------------------------------------------------------

    def _require(self) -> asyncpg.Pool:
        if self._pool is None:
            raise StoreUnavailable(f"postgres store {self.url_for_logs} is not open")
        return self._pool

    def _require_lease(self) -> asyncpg.Pool:
        if self._lease_pool is None:
            raise StoreUnavailable(f"postgres store {self.url_for_logs} is not open")
        return self._lease_pool

    def _scrub(self, exc: BaseException) -> str:
        return scrub(exc, self._secrets)

    def _errors(self, action: str) -> AbstractContextManager[None]:
        """Translate driver errors into the store's, with the (redacted) URL named."""
        return translated(f"postgres store {self.url_for_logs}: {action}", self._secrets)


def _job(row: asyncpg.Record) -> JobRecord:
    # Without a custom codec asyncpg passes JSONB as text both ways, the same as SQLite: one
    # encoder (encode_json, which refuses NaN before any I/O) and one decoder for both.
    return sql.job_from_row(tuple(row))
