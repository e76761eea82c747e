"""The SQLite backend of the job store: one database file, one writer, durable commits.

It owns two connections to the file: a writer on a thread of its own, to which every write
goes as a function of the connection, run in groups of one transaction each
(``sqlitegroup.GroupWriter``: the writes waiting when the thread frees up, each in a
savepoint, one COMMIT for all, one hop from the event loop), and a read-only aiosqlite
reader, so reads never wait behind a write's fsync and never see an uncommitted row. The
file is in WAL mode with ``synchronous=FULL``: a commit is on disk when ``COMMIT``
returns, which is what lets a 201 survive ``kill -9``. Groups start with ``BEGIN
IMMEDIATE`` so the write lock is taken up front and a second process (a second broker,
``fedbroker`` tools) waits on ``busy_timeout`` instead of failing mid-transaction.
``:memory:`` (tests only) is the writer's connection alone: reads go through it too.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
from collections.abc import Collection, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

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
    onerow,
    sql,
    sqlite_url,
)
from broker.store.batch import (
    MOVED_COLUMNS,
    Move,
    NewJob,
    as_move,
    by_job,
    coalescers,
    insert_new_jobs,
    inserted,
    move_jobs,
    moved_records,
    moved_rows,
    moving_jobs,
    place_jobs,
    queued_among,
    update_jobs,
)
from broker.store.coalesce import coalesced
from broker.store.migrations import MIGRATIONS, Migration, check_order, migrate
from broker.store.sqlitegroup import GroupWriter, Work, rollback

T = TypeVar("T")

# How long a writer waits for another process's write lock before giving up (ms).
DEFAULT_BUSY_TIMEOUT_MS = 5000
# Coalesced statements of one kind (submissions; plain transitions) in flight at once. Two:
# a second batch waits in the writer's queue while the first is on its thread, and joins the
# next group (the soak at 300/s, 30k jobs: 201 p50/p99 8.4/23.8 ms with one slot, 6.1/17.6
# with two, 5.5/17.1 with four; CPU per job the same).
COALESCED_SLOTS = 2

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
        self._executor: ThreadPoolExecutor | None = None
        self._writer: GroupWriter | None = None
        self._reader: aiosqlite.Connection | None = None  # None for :memory:
        # Concurrent submissions and plain transitions leave as one statement each batch:
        # a statement's setup and its round trip cost far more than one more row in a
        # statement (docs/benchmarks.md).
        self._inserts, self._moves = coalescers(
            self._insert_batch, self._move_batch, COALESCED_SLOTS
        )

    # -- lifecycle -------------------------------------------------------------------------

    async def open(self) -> None:
        if self._writer is not None:
            return
        check_order(self._migrations)
        if not self._memory:
            await asyncio.to_thread(Path(self.path).parent.mkdir, parents=True, exist_ok=True)
        executor = ThreadPoolExecutor(1, thread_name_prefix="sqlite-writer")
        try:
            with self._errors("open"):
                conn = await asyncio.get_running_loop().run_in_executor(
                    executor, self._connect_writer
                )
            writer = GroupWriter(executor, conn)
            try:
                await self._migrate(writer)
                reader = None if self._memory else await self._connect_reader()
            except BaseException:
                await writer.call(_close)
                raise
        except BaseException:
            executor.shutdown(wait=False)
            raise
        self._executor, self._writer, self._reader = executor, writer, reader

    async def close(self) -> None:
        await self._inserts.drain()
        await self._moves.drain()
        writer, reader, executor = self._writer, self._reader, self._executor
        self._writer = self._reader = self._executor = None
        if reader is not None:
            await reader.close()
        if writer is not None:
            await writer.drain()  # the last group commits before the connection goes
            await writer.call(_close)
        if executor is not None:
            executor.shutdown(wait=False)

    def take_slowest_write(self) -> float:
        """Seconds of the slowest group of writes since the last call (``bench --soak``)."""
        return self._writer.take_slowest() if self._writer is not None else 0.0

    async def ping(self) -> bool:
        try:
            await self._fetchall(sql.Statement("sqlite", "SELECT 1"))
        except Exception:  # readiness says "no"; the failing call itself logs the cause
            return False
        return True

    def _connect_writer(self) -> sqlite3.Connection:
        """On the writer's thread. isolation_level=None: BEGIN and COMMIT are ours, the
        sqlite3 module's implicit transactions would start them at the wrong statement."""
        conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        try:
            conn.execute(f"PRAGMA busy_timeout = {self._busy_timeout_ms}")
            conn.execute("PRAGMA foreign_keys = ON")
            # journal_mode is persistent in the file, synchronous is per connection: both.
            row = conn.execute("PRAGMA journal_mode = WAL").fetchone()
            mode = str(row[0]).lower() if row else ""
            if mode != "wal" and not self._memory:
                raise StoreError(
                    f"sqlite store {self.url_for_logs}: could not switch to WAL mode (got "
                    f"{mode!r}); the data directory must be on a local filesystem"
                )
            conn.execute("PRAGMA synchronous = FULL")
        except BaseException:
            conn.close()
            raise
        return conn

    async def _connect_reader(self) -> aiosqlite.Connection:
        with self._errors("open"):
            conn = await aiosqlite.connect(self.path, isolation_level=None)
            try:
                await conn.execute(f"PRAGMA busy_timeout = {self._busy_timeout_ms}")
                await conn.execute("PRAGMA query_only = ON")
            except BaseException:
                await conn.close()
                raise
        return conn

    async def _migrate(self, writer: GroupWriter) -> None:
        async def execute(statement: str, args: Sequence[Any]) -> None:
            await writer.call(lambda conn: conn.execute(statement, args))

        async def versions(query: str) -> list[int]:
            return [r[0] for r in await writer.call(lambda c: c.execute(query).fetchall())]

        def failed(migration: Migration, exc: Exception) -> None:
            if isinstance(exc, sqlite3.Error):
                raise StoreError(
                    f"sqlite store {self.url_for_logs}: migration {migration.version} "
                    f"({migration.name}) failed: {exc}"
                ) from exc

        with self._errors("migrate"):
            await writer.call(lambda conn: conn.execute("BEGIN IMMEDIATE"))
            try:
                await migrate("sqlite", self._migrations, execute, versions, failed)
                await writer.call(lambda conn: conn.execute("COMMIT"))
            except BaseException:
                await writer.call(rollback)
                raise

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
        # The common case (a new name) shares a statement with the submissions arriving
        # meanwhile; no row back (the name exists, or the batch failed for another's sake):
        # the write below finds out which and does the rest.
        new = NewJob(tenant, name, queue, priority, sql.encode_json(manifest), now, manifest)
        if (stored := await coalesced(self._inserts, new)) is not None:
            return stored, True
        insert = sql.insert_job("sqlite", tenant, name, queue, priority, manifest, now)

        def work(conn: sqlite3.Connection) -> tuple[JobRecord, bool]:
            rows = conn.execute(insert.sql, insert.args).fetchall()
            if rows:
                return _job(rows[0]), True
            select = sql.select_job("sqlite", tenant, name)
            existing = _job(conn.execute(select.sql, select.args).fetchone())
            if not reuse_finished or existing.state not in FINAL_STATES:
                return existing, False
            # Several statements, one write: its savepoint keeps them together.
            query = sql.history("sqlite", tenant, name)
            history = [sql.transition_from_row(r) for r in conn.execute(query.sql, query.args)]
            for st in (
                sql.archive_generation("sqlite", existing, history),
                sql.delete_finished_job("sqlite", tenant, name),
            ):
                conn.execute(st.sql, st.args)
            again = sql.insert_job(
                "sqlite", tenant, name, queue, priority, manifest, now, existing.generation + 1
            )
            return _job(conn.execute(again.sql, again.args).fetchone()), True

        return await self._write("create_job", work)

    async def purge_finished(self, before: float, limit: int = 1000) -> int:
        purge = sql.purge_finished_jobs("sqlite", before, limit)
        old = sql.purge_generations("sqlite", before)

        def work(conn: sqlite3.Connection) -> int:
            purged = conn.execute(purge.sql, purge.args).rowcount
            conn.execute(old.sql, old.args)
            return int(purged)

        return await self._write("purge_finished", work)

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
        update = sql.update_job(
            "sqlite", tenant, name, state, reason, now, **fields, expected=expected
        )

        def work(conn: sqlite3.Connection) -> JobRecord:
            row = conn.execute(update.sql, update.args).fetchone()
            if row is None:
                # Nothing changed; find out why for the caller. Same transaction, same view.
                query = sql.state_of("sqlite", tenant, name)
                found = conn.execute(query.sql, query.args).fetchone()
                raise sql.missing_job(tenant, name, found[0] if found else None, expected)
            return _job(row)

        return await self._write("transition", work)

    async def transition_many(
        self, jobs: Sequence[JobRecord], state: JobState, reason: str, now: float
    ) -> list[JobRecord]:
        if not jobs:
            return []
        update = update_jobs("sqlite", jobs, state, reason, now, returning=False)
        rows = await self._write("transition_many", _moved_at_once(moving_jobs(jobs), update))
        return moved_records(jobs, rows)

    async def place_many(self, placings: Sequence[Placing], now: float) -> list[JobRecord]:
        if not placings:
            return []
        update = place_jobs("sqlite", placings, now, returning=False)
        work = _moved_at_once(queued_among(placings), update, sql.JOB_COLUMNS)
        return [_job(row) for row in await self._write("place_many", work)]

    async def _insert_batch(self, rows: Sequence[NewJob]) -> list[JobRecord | None]:
        found = await self._write("create_job", _rows_of(insert_new_jobs("sqlite", rows)))
        return inserted(rows, found)

    async def _move_batch(self, moves: Sequence[Move]) -> list[JobRecord | None]:
        found = await self._write("transition", _rows_of(move_jobs("sqlite", moves)))
        return by_job(moves, map(_job, found))

    async def _write(self, action: str, work: Work[T]) -> T:
        """``work`` in the writer's next group (sqlitegroup), durable when this returns."""
        writer = self._writer
        if writer is None:
            raise StoreUnavailable(f"sqlite store {self.url_for_logs} is not open")
        with self._errors(action):
            return await writer.write(work)

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
        return [sql.active_job_from_row(tuple(row)) for row in await self._fetchall(query)]

    async def finished_since(self, since: float, limit: int) -> list[JobRecord]:
        rows = await self._fetchall(sql.finished_since("sqlite", since, limit))
        return [_job(row) for row in reversed(rows)]

    async def count_active(self, tenant: str) -> int:
        rows = await self._fetchall(sql.count_active("sqlite", tenant))
        return int(rows[0][0])

    async def generations(self, tenant: str, name: str) -> list[Generation]:
        rows = await self._fetchall(sql.generations("sqlite", tenant, name))
        return [sql.generation_from_row(r) for r in rows]

    async def _fetchall(self, query: sql.Statement) -> list[sqlite3.Row]:
        conn = self._reader
        if conn is None:
            # :memory: has the writer's connection alone: the read is a write of a group
            # (it sees the group's earlier writes, which commit with it).
            return list(await self._write("read", _rows_of(query)))
        with self._errors("read"):
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


def _job(row: sqlite3.Row | tuple[Any, ...]) -> JobRecord:
    return sql.job_from_row(tuple(row))


def _rows_of(statement: sql.Statement) -> Work[list[Any]]:
    """A write that runs one statement and returns its rows."""

    def work(conn: sqlite3.Connection) -> list[Any]:
        return conn.execute(statement.sql, statement.args).fetchall()

    return work


def _moved_at_once(
    moving: sql.Statement, update: sql.Statement, columns: str = MOVED_COLUMNS
) -> Work[list[Any]]:
    """A write that moves the jobs ``moving`` names (their seqs) with ``update`` (without
    RETURNING) and returns their ``columns`` rows, each way in one row
    (``broker.store.onerow``): which will move, the update, what they are now. Exact: the
    writer lock is held throughout."""

    def work(conn: sqlite3.Connection) -> list[Any]:
        (seqs,) = conn.execute(moving.sql, moving.args).fetchone()
        if seqs == "[]":
            return []
        moved = conn.execute(update.sql, update.args).rowcount
        if moved != len(json.loads(seqs)):  # nothing else writes meanwhile: never
            raise sqlite3.DatabaseError(f"moved {moved} jobs, expected {seqs}")
        now = moved_rows(seqs, columns)
        (rows,) = conn.execute(now.sql, now.args).fetchone()
        return onerow.rows_of(rows, columns.split(", "))

    return work


def _close(conn: sqlite3.Connection) -> None:
    conn.close()
