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
import json
import sqlite3
from collections.abc import AsyncIterator, Collection, Iterable, Iterator, Mapping, Sequence
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import aiosqlite

from broker.store import (
    ACTIVE_STATES,
    JOB_COLUMNS,
    SUBMITTED_REASON,
    JobNotFound,
    JobRecord,
    JobState,
    StateConflict,
    StoreError,
    StoreUnavailable,
    Transition,
    check_state,
    encode_json,
    job_from_row,
    sqlite_url,
    states_filter,
    transition_sets,
)
from broker.store.migrations import (
    MIGRATIONS,
    SCHEMA_MIGRATIONS_DDL,
    Migration,
    check_order,
    pending,
)

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
            await self._fetchall("SELECT 1", ())
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
            await conn.execute(SCHEMA_MIGRATIONS_DDL)
            applied = [r[0] for r in await conn.execute_fetchall(_SELECT_VERSIONS)]
            for migration in pending(self._migrations, applied):
                try:
                    for statement in migration.render("sqlite"):
                        await conn.execute(statement)
                except sqlite3.Error as exc:
                    raise StoreError(
                        f"sqlite store {self.url_for_logs}: migration {migration.version} "
                        f"({migration.name}) failed: {exc}"
                    ) from exc
                await conn.execute(
                    "INSERT INTO schema_migrations (version, name) VALUES (?, ?)",
                    (migration.version, migration.name),
                )

    # -- writes ----------------------------------------------------------------------------

    async def create_job(
        self,
        tenant: str,
        name: str,
        queue: str,
        priority: int,
        manifest: Mapping[str, Any],
        now: float,
    ) -> tuple[JobRecord, bool]:
        manifest_text = encode_json(manifest)
        async with self._write_txn("create_job") as conn:
            rows = list(
                await conn.execute_fetchall(
                    f"INSERT INTO jobs (tenant, name, queue, priority, manifest, state, "
                    f"attempts, reason, created_at, updated_at) "
                    f"VALUES (?, ?, ?, ?, ?, 'Queued', 0, ?, ?, ?) "
                    f"ON CONFLICT (tenant, name) DO NOTHING RETURNING {JOB_COLUMNS}",
                    (tenant, name, queue, priority, manifest_text, SUBMITTED_REASON, now, now),
                )
            )
            if not rows:
                existing = list(await conn.execute_fetchall(_SELECT_JOB, (tenant, name)))
                return _job(existing[0]), False
            return _job(rows[0]), True

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
        params: list[Any] = []

        def mark(value: Any) -> str:
            params.append(value)
            return "?"

        sets = transition_sets(
            state, reason, now, mark,
            cluster=cluster, placement=placement, attempts=attempts, not_before=not_before,
        )  # fmt: skip
        where = "tenant = ? AND name = ?"
        params += [tenant, name]
        expected = None if expect is None else tuple(check_state(s) for s in expect)
        if expected is not None:
            where += f" AND state IN ({_marks(len(expected))})"
            params += expected
        sql = f"UPDATE jobs SET {', '.join(sets)} WHERE {where} RETURNING {JOB_COLUMNS}"
        async with self._write_txn("transition") as conn:
            rows = list(await conn.execute_fetchall(sql, params))
            if not rows:
                # Nothing changed; find out why for the caller. Same transaction, same view.
                found = list(
                    await conn.execute_fetchall(
                        "SELECT state FROM jobs WHERE tenant = ? AND name = ?", (tenant, name)
                    )
                )
                if not found:
                    raise JobNotFound(tenant, name)
                raise StateConflict(tenant, name, found[0][0], expected or ())
            job = _job(rows[0])
            return job

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
        rows = await self._fetchall(_SELECT_JOB, (tenant, name))
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
        if limit < 1:
            raise ValueError(f"limit must be at least 1, got {limit}")
        where: list[str] = []
        params: list[Any] = []
        for column, value in (("tenant", tenant), ("queue", queue), ("cluster", cluster)):
            if value is not None:
                where.append(f"{column} = ?")
                params.append(value)
        states = states_filter(state)
        if states is not None:
            where.append(f"state IN ({_marks(len(states))})")
            params += states
        if after_seq is not None:
            where.append("seq > ?")
            params.append(after_seq)
        clause = f"WHERE {' AND '.join(where)} " if where else ""
        sql = f"SELECT {JOB_COLUMNS} FROM jobs {clause}ORDER BY seq LIMIT ?"
        return [_job(row) for row in await self._fetchall(sql, [*params, limit])]

    async def history(self, tenant: str, name: str) -> list[Transition]:
        rows = await self._fetchall(
            "SELECT at, state, reason, cluster FROM job_history "
            "WHERE tenant = ? AND name = ? ORDER BY id",
            (tenant, name),
        )
        return [Transition(at=float(r[0]), state=r[1], reason=r[2], cluster=r[3]) for r in rows]

    async def active_jobs(self) -> list[JobRecord]:
        sql = (
            f"SELECT {JOB_COLUMNS} FROM jobs WHERE state IN ({_marks(len(ACTIVE_STATES))}) "
            "ORDER BY seq"
        )
        return [_job(row) for row in await self._fetchall(sql, ACTIVE_STATES)]

    async def _fetchall(self, sql: str, params: Iterable[Any]) -> list[sqlite3.Row]:
        conn = self._reader
        if conn is None:
            raise StoreUnavailable(f"sqlite store {self.url_for_logs} is not open")
        with self._errors("read"):
            if conn is self._writer:
                # One shared connection (:memory:): reading mid-transaction would see
                # uncommitted rows, so reads queue behind writes.
                async with self._write_lock:
                    return list(await conn.execute_fetchall(sql, params))
            return list(await conn.execute_fetchall(sql, params))

    @contextmanager
    def _errors(self, action: str) -> Iterator[None]:
        """Translate sqlite3 errors into the store's, with the database named."""
        try:
            yield
        except sqlite3.Error as exc:
            name = getattr(exc, "sqlite_errorname", "") or ""
            kind = StoreUnavailable if name.startswith(_UNAVAILABLE) else StoreError
            raise kind(f"sqlite store {self.url_for_logs}: {action} failed: {exc}") from exc


_SELECT_JOB = f"SELECT {JOB_COLUMNS} FROM jobs WHERE tenant = ? AND name = ?"
_SELECT_VERSIONS = "SELECT version FROM schema_migrations ORDER BY version"
_INSERT_HISTORY = (
    "INSERT INTO job_history (tenant, name, at, state, reason, cluster) VALUES (?, ?, ?, ?, ?, ?)"
)


def _marks(n: int) -> str:
    return ", ".join("?" * n)


def _job(row: sqlite3.Row) -> JobRecord:
    return job_from_row(tuple(row), json.loads)


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
