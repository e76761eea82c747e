"""The SQLite backend of the job store: one database file, one writer, durable commits.

It owns two aiosqlite connections to the file: a writer, through which every write goes one
transaction at a time (an ``asyncio.Lock``; aiosqlite runs each connection on its own
thread, so the lock is what keeps two coroutines' statements out of one transaction), and a
read-only reader, so reads never wait behind a write's fsync and never see an uncommitted
row. The file is in WAL mode with ``synchronous=FULL``: a commit is on disk when
``COMMIT`` returns, which is what lets a 201 survive ``kill -9``. Writes start with
``BEGIN IMMEDIATE`` so the write lock is taken up front and a second process (a second
broker, ``fedbroker`` tools) waits on ``busy_timeout`` instead of failing mid-transaction.
``:memory:`` (tests only) is a single connection shared by reads and writes.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
from collections.abc import AsyncIterator, Collection, Iterator, Mapping, Sequence
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import aiosqlite

from broker.store import (
    FINAL_STATES,
    Generation,
    JobRecord,
    JobState,
    Placing,
    StoreError,
    StoreUnavailable,
    Transition,
    sql,
    sqlite_url,
)
from broker.store.batch import moved_records, place_jobs, update_jobs
from broker.store.migrations import MIGRATIONS, Migration, check_order, migrate

# How long a writer waits for another process's write lock before giving up (ms).
DEFAULT_BUSY_TIMEOUT_MS = 5000

# Error names that mean "the database cannot be used right now" (disk, locks, permissions),
# as opposed to a bug or a schema problem. Prefixes cover the extended codes (IOERR_FSYNC).
_UNAVAILABLE = (
    "SQLITE_BUSY",
    "SQLITE_LOCKED",
    "SQLITE_IOERR",
    "SQLITE_FULL",
    "SQLITE_CANTOPEN",
    "SQLITE_READONLY",
    "SQLITE_PROTOCOL",
    "SQLITE_NOTADB",
    "SQLITE_CORRUPT",
)


class SqliteStore:
    """The Store protocol on a SQLite file (see the module docstring for the design)."""

    def __init__(
        self,
        path: str,
        *,
        migrations: Sequence[Migration] = MIGRATIONS,
        busy_timeout_ms: int = DEFAULT_BUSY_TIMEOUT_MS,
    ) -> None:
        self.path = path
        self._busy_timeout_ms = int(busy_timeout_ms)
        self.url_for_logs = sqlite_url(path)
        self._migrations = tuple(migrations)
        self._memory = path == ":memory:"
        self._writer: aiosqlite.Connection | None = None
        self._reader: aiosqlite.Connection | None = None
        self._write_lock = asyncio.Lock()
        # The open group-commit transaction's future (resolved by its COMMIT), and the task
        # that will commit it.
        self._group: asyncio.Future[None] | None = None
        self._committer: asyncio.Task[None] | None = None

    # -- lifecycle -------------------------------------------------------------------------

    async def open(self) -> None:
        if self._writer is not None:
            return
        check_order(self._migrations)
        if not self._memory:
            await asyncio.to_thread(Path(self.path).parent.mkdir, parents=True, exist_ok=True)
        self._writer = await self._connect(read_only=False)
        try:
            await self._migrate()
            self._reader = self._writer if self._memory else await self._connect(read_only=True)
        except BaseException:
            await self._writer.close()
            self._writer = None
            raise

    async def close(self) -> None:
        if self._committer is not None:
            # The last group commits before the connection goes.
            await asyncio.gather(self._committer, return_exceptions=True)
        # Under the write lock, so a transaction in flight finishes before its connection goes.
        async with self._write_lock:
            reader, writer = self._reader, self._writer
            self._reader = self._writer = None
            if reader is not None and reader is not writer:
                await reader.close()
            if writer is not None:
                await writer.close()

    async def ping(self) -> bool:
        try:
            await self._fetchall(sql.Statement("sqlite", "SELECT 1"))
        except Exception:  # readiness says "no"; the failing call itself logs the cause
            return False
        return True

    async def _connect(self, *, read_only: bool) -> aiosqlite.Connection:
        with self._errors("open"):
            # isolation_level=None: we issue BEGIN/COMMIT ourselves; the sqlite3 module's
            # implicit transactions would start them at the wrong statement.
            conn = await aiosqlite.connect(self.path, isolation_level=None)
            try:
                await conn.execute(f"PRAGMA busy_timeout = {self._busy_timeout_ms}")
                await conn.execute("PRAGMA foreign_keys = ON")
                if read_only:
                    await conn.execute("PRAGMA query_only = ON")
                else:
                    await self._make_durable(conn)
            except BaseException:
                await conn.close()
                raise
        return conn

    async def _make_durable(self, conn: aiosqlite.Connection) -> None:
        # journal_mode is persistent in the file, synchronous is per connection: set both.
        rows = list(await conn.execute_fetchall("PRAGMA journal_mode = WAL"))
        mode = str(rows[0][0]).lower() if rows else ""
        if mode != "wal" and not self._memory:
            raise StoreError(
                f"sqlite store {self.url_for_logs}: could not switch to WAL mode (got "
                f"{mode!r}); the data directory must be on a local filesystem"
            )
        await conn.execute("PRAGMA synchronous = FULL")

    async def _migrate(self) -> None:
        async with self._write_txn("migrate") as conn:

            async def execute(statement: str, args: Sequence[Any]) -> None:
                await conn.execute(statement, args)

            async def versions(query: str) -> list[int]:
                return [r[0] for r in await conn.execute_fetchall(query)]

            def failed(migration: Migration, exc: Exception) -> None:
                if isinstance(exc, sqlite3.Error):
                    raise StoreError(
                        f"sqlite store {self.url_for_logs}: migration {migration.version} "
                        f"({migration.name}) failed: {exc}"
                    ) from exc

            await migrate("sqlite", self._migrations, execute, versions, failed)

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
        insert = sql.insert_job("sqlite", tenant, name, queue, priority, manifest, now)
        async with self._write_txn("create_job") as conn:
            rows = list(await conn.execute_fetchall(insert.sql, insert.args))
            if rows:
                return _job(rows[0]), True
            select = sql.select_job("sqlite", tenant, name)
            existing = _job(next(iter(await conn.execute_fetchall(select.sql, select.args))))
            if not reuse_finished or existing.state not in FINAL_STATES:
                return existing, False
            # Several statements: a savepoint, so a failing one leaves the group untouched.
            await conn.execute("SAVEPOINT next_generation")
            try:
                query = sql.history("sqlite", tenant, name)
                history = [sql.transition_from_row(r) for r in await conn.execute_fetchall(
                    query.sql, query.args)]  # fmt: skip
                for st in (
                    sql.archive_generation("sqlite", existing, history),
                    sql.delete_finished_job("sqlite", tenant, name),
                ):
                    await conn.execute(st.sql, st.args)
                again = sql.insert_job(
                    "sqlite", tenant, name, queue, priority, manifest, now,
                    existing.generation + 1,
                )  # fmt: skip
                rows = list(await conn.execute_fetchall(again.sql, again.args))
            except BaseException:
                await conn.execute("ROLLBACK TO next_generation")
                raise
            finally:
                await conn.execute("RELEASE next_generation")
            return _job(rows[0]), True

    async def purge_finished(self, before: float, limit: int = 1000) -> int:
        purge = sql.purge_finished_jobs("sqlite", before, limit)
        old = sql.purge_generations("sqlite", before)
        async with self._write_txn("purge_finished") as conn:
            purged = (await conn.execute(purge.sql, purge.args)).rowcount
            await conn.execute(old.sql, old.args)
        return int(purged)

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
        update = sql.update_job(
            "sqlite", tenant, name, state, reason, now,
            cluster=cluster, placement=placement, expected=expected, attempts=attempts,
            not_before=not_before,
        )  # fmt: skip
        async with self._write_txn("transition") as conn:
            rows = list(await conn.execute_fetchall(update.sql, update.args))
            if not rows:
                # Nothing changed; find out why for the caller. Same transaction, same view.
                query = sql.state_of("sqlite", tenant, name)
                found = list(await conn.execute_fetchall(query.sql, query.args))
                raise sql.missing_job(tenant, name, found[0][0] if found else None, expected)
            return _job(rows[0])

    async def transition_many(
        self, jobs: Sequence[JobRecord], state: JobState, reason: str, now: float
    ) -> list[JobRecord]:
        if not jobs:
            return []
        update = update_jobs("sqlite", jobs, state, reason, now)
        async with self._write_txn("transition_many") as conn:
            # One statement: atomic on its own, as every write in a group (see _write_txn).
            rows = await conn.execute_fetchall(update.sql, update.args)
        return moved_records(jobs, rows)

    async def place_many(self, placings: Sequence[Placing], now: float) -> list[JobRecord]:
        if not placings:
            return []
        update = place_jobs("sqlite", placings, now)
        async with self._write_txn("place_many") as conn:
            rows = await conn.execute_fetchall(update.sql, update.args)
        return [_job(row) for row in rows]

    @asynccontextmanager
    async def _write_txn(self, action: str) -> AsyncIterator[aiosqlite.Connection]:
        """One write, durable when the caller gets control back.

        Group commit: writes that arrive while others are in flight join one open
        transaction, each a single statement (a failing one undoes only itself), and one
        COMMIT (one fsync) makes the whole group durable. Every writer returns only
        after that COMMIT, so "acknowledged" still means "on disk"; under load many writes
        share an fsync instead of paying one each. (A shared in-memory database commits
        each write alone: its reads share the writer's connection.)
        """
        async with self._write_lock:
            conn = self._writer
            if conn is None:
                raise StoreUnavailable(f"sqlite store {self.url_for_logs} is not open")
            with self._errors(action):
                if self._memory:
                    try:
                        await conn.execute("BEGIN IMMEDIATE")
                        yield conn
                        await conn.execute("COMMIT")
                    except BaseException:
                        await _rollback(conn)
                        raise
                    return
                if self._group is None:
                    # Marked open before BEGIN is awaited: cancelled mid-await, BEGIN may still
                    # run on aiosqlite's thread, and the committer then ends it either way.
                    self._group = asyncio.get_running_loop().create_future()
                    self._ensure_committer()
                    await conn.execute("BEGIN IMMEDIATE")
                group = self._group
                cancelled: asyncio.CancelledError | None = None
                try:
                    # Every write is one statement (the history row comes from a trigger),
                    # atomic on its own: a failing one undoes only itself, no savepoint.
                    yield conn
                except asyncio.CancelledError as exc:
                    cancelled = exc  # its statement may already be running: see below
                finally:
                    self._ensure_committer()
        # Shielded: a caller cancelled while waiting must not stop the others' commit, and
        # it still waits for the outcome, so the write is settled (stored or not) by the time
        # the cancellation reaches the caller, as when each write committed alone.
        if cancelled is not None:
            await _settled(group)
            raise cancelled
        try:
            await asyncio.shield(group)
        except asyncio.CancelledError:
            await _settled(group)
            raise

    def _ensure_committer(self) -> None:
        if self._committer is None or self._committer.done():
            self._committer = asyncio.create_task(self._commit_group())

    async def _commit_group(self) -> None:
        # Queued on the lock behind the writers already waiting, so they join this group.
        async with self._write_lock:
            group, self._group = self._group, None
            conn = self._writer
            if group is None:
                return
            try:
                if conn is None:
                    raise StoreUnavailable(f"sqlite store {self.url_for_logs} is not open")
                with self._errors("commit"):
                    # Unconditional: a BEGIN whose writer was cancelled may still be queued on
                    # aiosqlite's thread, which runs statements in order; COMMIT lands after it.
                    try:
                        await conn.execute("COMMIT")
                    except sqlite3.OperationalError as exc:
                        if "no transaction is active" not in str(exc):
                            raise
            except BaseException as exc:
                if conn is not None:
                    await _rollback(conn)
                error = exc if isinstance(exc, Exception) else StoreUnavailable("commit cancelled")
                group.set_exception(error)
                group.exception()  # retrieved here too: no "never retrieved" warning
                if not isinstance(exc, Exception):
                    raise
                return
            group.set_result(None)

    # -- reads -----------------------------------------------------------------------------

    async def get_job(self, tenant: str, name: str) -> JobRecord | None:
        rows = await self._fetchall(sql.select_job("sqlite", tenant, name))
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
            "sqlite", tenant=tenant, queue=queue, state=state, cluster=cluster, limit=limit,
            after_seq=after_seq,
        )  # fmt: skip
        return [_job(row) for row in await self._fetchall(query)]

    async def history(self, tenant: str, name: str) -> list[Transition]:
        rows = await self._fetchall(sql.history("sqlite", tenant, name))
        return [sql.transition_from_row(r) for r in rows]

    async def active_jobs(
        self, *, after_seq: int | None = None, limit: int | None = None
    ) -> list[JobRecord]:
        query = sql.active_jobs("sqlite", after_seq, limit)
        return [_job(row) for row in await self._fetchall(query)]

    async def count_active(self, tenant: str) -> int:
        rows = await self._fetchall(sql.count_active("sqlite", tenant))
        return int(rows[0][0])

    async def generations(self, tenant: str, name: str) -> list[Generation]:
        rows = await self._fetchall(sql.generations("sqlite", tenant, name))
        return [sql.generation_from_row(r) for r in rows]

    async def _fetchall(self, query: sql.Statement) -> list[sqlite3.Row]:
        conn = self._reader
        if conn is None:
            raise StoreUnavailable(f"sqlite store {self.url_for_logs} is not open")
        with self._errors("read"):
            if conn is self._writer:
                # One shared connection (:memory:): reading mid-transaction would see
                # uncommitted rows, so reads queue behind writes.
                async with self._write_lock:
                    return list(await conn.execute_fetchall(query.sql, query.args))
            return list(await conn.execute_fetchall(query.sql, query.args))

    @contextmanager
    def _errors(self, action: str) -> Iterator[None]:
        """Translate sqlite3 errors into the store's, with the database named."""
        try:
            yield
        except sqlite3.Error as exc:
            name = getattr(exc, "sqlite_errorname", "") or ""
            kind = StoreUnavailable if name.startswith(_UNAVAILABLE) else StoreError
            raise kind(f"sqlite store {self.url_for_logs}: {action} failed: {exc}") from exc


def _job(row: sqlite3.Row) -> JobRecord:
    return sql.job_from_row(tuple(row))


async def _settled(group: asyncio.Future[None]) -> None:
    """Wait for a group's COMMIT even through further cancel requests (a caller cancelled
    once more still gets control back only once its write is settled: a commit is short)."""
    while not group.done():
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait([group])


async def _rollback(conn: aiosqlite.Connection) -> None:
    # No transaction open (BEGIN never ran, or COMMIT already did) or the connection is
    # gone: either way there is nothing left to undo, and the original error is what matters.
    with contextlib.suppress(sqlite3.Error, ValueError):
        await conn.execute("ROLLBACK")
