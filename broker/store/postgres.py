"""The PostgreSQL backend of the job store: an asyncpg pool, one transaction per write.

It owns the pool and the mapping of driver errors onto the store's: anything that means
"the server cannot be used right now" (refused or dropped connections, timeouts, shutdown,
too many clients, a read-only standby after failover, bad credentials) becomes
``StoreUnavailable`` so the service reports not-ready and retries; everything else is a
``StoreError``. Writes are single transactions at READ COMMITTED, which is enough because
each one is a single-row compare-and-set: ``INSERT .. ON CONFLICT DO NOTHING`` waits for a
concurrent insert of the same (tenant, name) and then sees it, and ``UPDATE .. WHERE state
= ANY(expect)`` re-checks the condition on the row version it finally locks. Migrations run
under a transaction-scoped advisory lock so replicas starting together apply each version
once. The URL (which may carry a password) is kept private; messages use ``url_for_logs``
and scrub the password from driver text as a second guard.

Note on ``seq``: it comes from an identity sequence, so it is unique and increasing in
insertion order, but two concurrent transactions may commit out of seq order. FIFO
ordering is unaffected; a client paginating with ``after_seq`` during heavy submission can
miss a row that commits just behind its cursor (it shows up in the next full listing).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Collection, Iterator, Mapping, Sequence
from contextlib import asynccontextmanager, contextmanager
from typing import Any, Final
from urllib.parse import parse_qsl, unquote, urlsplit

import asyncpg
import asyncpg.exceptions as pgerr

from broker.store import (
    ACTIVE_STATES,
    JOB_COLUMNS,
    SUBMITTED_REASON,
    JobNotFound,
    JobRecord,
    JobState,
    LeaseLost,
    StateConflict,
    StoreError,
    StoreUnavailable,
    Transition,
    check_state,
    encode_json,
    job_from_row,
    redact_url,
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

# Any constant works; it only has to be the same in every broker (ASCII "fedbrokr").
_MIGRATION_LOCK: Final = 0x6665646272_6F6B72
PING_TIMEOUT_S: Final = 2.0
CLOSE_TIMEOUT_S: Final = 10.0

_UNAVAILABLE: Final = (
    OSError,  # refused, unreachable, DNS
    TimeoutError,  # connect or command timeout (asyncio.TimeoutError is the same class)
    asyncpg.InterfaceError,  # connection closed under us
    # A query sent on a connection the server has just terminated can trip asyncpg's
    # protocol state check before the EOF is seen; the pool drops that connection.
    pgerr.InternalClientError,
    pgerr.PostgresConnectionError,  # class 08
    pgerr.OperatorInterventionError,  # class 57: admin shutdown, cannot connect now
    pgerr.InsufficientResourcesError,  # class 53: too many connections, disk full
    pgerr.InvalidAuthorizationSpecificationError,  # class 28: fixed by config, not code
    pgerr.InvalidCatalogNameError,  # the database does not exist (yet)
    pgerr.ReadOnlySQLTransactionError,  # connected to a standby after a failover
)


class _PoolReconnectsWithoutTraceback(logging.Filter):
    """asyncpg's pool logs a warning with a full traceback each time it fails to reconnect
    its minimum of connections, every second while the server is down or restarting. That
    is expected (the store reports it as StoreUnavailable, the service as not-ready), not a
    bug: such a record keeps its message and the error's one-line summary, not the trace."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, _UNAVAILABLE):
            record.msg = f"{record.getMessage()}: {type(exc).__name__}: {exc}"
            record.args = None
            record.exc_info = None
            record.exc_text = None
        return True


_POOL_LOG_FILTER: Final = _PoolReconnectsWithoutTraceback()


class PostgresStore:
    """The Store protocol on PostgreSQL (see the module docstring for the design)."""

    def __init__(
        self,
        url: str,
        *,
        migrations: Sequence[Migration] = MIGRATIONS,
        min_size: int = 1,
        max_size: int = 10,
        connect_timeout: float = 10.0,
        command_timeout: float = 30.0,
    ) -> None:
        self._url = url
        self.url_for_logs = redact_url(url)
        self._secrets = _secrets_in(url)
        self._migrations = tuple(migrations)
        self._pool_options: dict[str, Any] = {
            "min_size": min_size,
            "max_size": max_size,
            "timeout": connect_timeout,
            "command_timeout": command_timeout,
        }
        self._pool: asyncpg.Pool | None = None
        self._fence: tuple[str, str] | None = None  # (lease, holder): see fence()

    # -- lifecycle -------------------------------------------------------------------------

    async def open(self) -> None:
        if self._pool is not None:
            return
        check_order(self._migrations)
        logging.getLogger("asyncpg.pool").addFilter(_POOL_LOG_FILTER)  # once: same object
        with self._errors("connect"):
            try:
                pool = await asyncpg.create_pool(self._url, **self._pool_options)
            except ValueError as exc:  # asyncpg's DSN parser
                raise StoreError(
                    f"postgres store {self.url_for_logs}: invalid URL: {self._scrub(exc)}"
                ) from None
        try:
            with self._errors("migrate"):
                await self._migrate(pool)
        except BaseException:
            pool.terminate()
            raise
        self._pool = pool

    async def close(self) -> None:
        pool, self._pool = self._pool, None
        if pool is None:
            return
        try:
            # Waits for connections in use to come back, so a commit in flight completes.
            await asyncio.wait_for(pool.close(), CLOSE_TIMEOUT_S)
        except TimeoutError:
            pool.terminate()

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

    async def _migrate(self, pool: asyncpg.Pool) -> None:
        async with pool.acquire() as conn, conn.transaction():
            # Serialises brokers starting together; released at commit/rollback.
            await conn.execute("SELECT pg_advisory_xact_lock($1)", _MIGRATION_LOCK)
            await conn.execute(SCHEMA_MIGRATIONS_DDL)
            applied = [r[0] for r in await conn.fetch(_SELECT_VERSIONS)]
            for migration in pending(self._migrations, applied):
                try:
                    for statement in migration.render("postgres"):
                        await conn.execute(statement)
                except asyncpg.PostgresError as exc:
                    if isinstance(exc, _UNAVAILABLE):
                        raise
                    raise StoreError(
                        f"postgres store {self.url_for_logs}: migration {migration.version} "
                        f"({migration.name}) failed: {self._scrub(exc)}"
                    ) from exc
                await conn.execute(
                    "INSERT INTO schema_migrations (version, name) VALUES ($1, $2)",
                    migration.version,
                    migration.name,
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
        async with self._txn("create_job") as conn:
            row = await conn.fetchrow(
                f"INSERT INTO jobs (tenant, name, queue, priority, manifest, state, attempts, "
                f"reason, created_at, updated_at) "
                f"VALUES ($1, $2, $3, $4, $5, 'Queued', 0, $6, $7, $7) "
                f"ON CONFLICT (tenant, name) DO NOTHING RETURNING {JOB_COLUMNS}",
                tenant, name, queue, priority, manifest_text, SUBMITTED_REASON, now,
            )  # fmt: skip
            if row is None:
                # ON CONFLICT waited for the other insert to commit; this statement's
                # snapshot (READ COMMITTED) therefore sees it.
                existing = await conn.fetchrow(_SELECT_JOB, tenant, name)
                if existing is None:
                    raise StoreError(f"job {tenant}/{name} conflicted on insert but is missing")
                return _job(existing), False
            return _job(row), True

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
        args = _Args()
        sets = transition_sets(
            state, reason, now, args,
            cluster=cluster, placement=placement, attempts=attempts, not_before=not_before,
        )  # fmt: skip
        where = f"tenant = {args(tenant)} AND name = {args(name)}"
        expected = None if expect is None else [check_state(s) for s in expect]
        if expected is not None:
            where += f" AND state = ANY({args(expected)}::text[])"
        sql = f"UPDATE jobs SET {', '.join(sets)} WHERE {where} RETURNING {JOB_COLUMNS}"
        async with self._txn("transition") as conn:
            row = await conn.fetchrow(sql, *args.values)
            if row is None:
                current = await conn.fetchval(
                    "SELECT state FROM jobs WHERE tenant = $1 AND name = $2", tenant, name
                )
                if current is None:
                    raise JobNotFound(tenant, name)
                raise StateConflict(tenant, name, current, expected or ())
            job = _job(row)
            return job

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
        still holds ``lease`` unexpired, and keeps the lease row share-locked until it
        commits: a replica taking the lease over waits for that write, then sees it when it
        rebuilds; a write of a replica whose lease expired or was taken is refused
        (``LeaseLost``) instead of landing late (the fencing token of the lease)."""
        self._fence = (lease, holder)

    async def _check_fence(
        self, conn: asyncpg.pool.PoolConnectionProxy, action: str, lease: str, holder: str
    ) -> None:
        held = await conn.fetchval(
            "SELECT 1 FROM leases WHERE name = $1 AND holder = $2 AND expires_at > now() FOR SHARE",
            lease,
            holder,
        )
        if held is None:
            raise LeaseLost(
                f"postgres store {self.url_for_logs}: {action} refused: "
                f"{holder} no longer holds the {lease} lease"
            )

    # -- reads -----------------------------------------------------------------------------

    async def get_job(self, tenant: str, name: str) -> JobRecord | None:
        pool = self._require()
        with self._errors("get_job"):
            row = await pool.fetchrow(_SELECT_JOB, tenant, name)
        return None if row is None else _job(row)

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
        args = _Args()
        where: list[str] = []
        for column, value in (("tenant", tenant), ("queue", queue), ("cluster", cluster)):
            if value is not None:
                where.append(f"{column} = {args(value)}")
        states = states_filter(state)
        if states is not None:
            where.append(f"state = ANY({args(list(states))}::text[])")
        if after_seq is not None:
            where.append(f"seq > {args(after_seq)}")
        clause = f"WHERE {' AND '.join(where)} " if where else ""
        sql = f"SELECT {JOB_COLUMNS} FROM jobs {clause}ORDER BY seq LIMIT {args(limit)}"
        pool = self._require()
        with self._errors("list_jobs"):
            rows = await pool.fetch(sql, *args.values)
        return [_job(row) for row in rows]

    async def history(self, tenant: str, name: str) -> list[Transition]:
        pool = self._require()
        with self._errors("history"):
            rows = await pool.fetch(
                "SELECT at, state, reason, cluster FROM job_history "
                "WHERE tenant = $1 AND name = $2 ORDER BY id",
                tenant,
                name,
            )
        return [Transition(at=float(r[0]), state=r[1], reason=r[2], cluster=r[3]) for r in rows]

    async def active_jobs(self) -> list[JobRecord]:
        pool = self._require()
        with self._errors("active_jobs"):
            rows = await pool.fetch(
                f"SELECT {JOB_COLUMNS} FROM jobs WHERE state = ANY($1::text[]) ORDER BY seq",
                list(ACTIVE_STATES),
            )
        return [_job(row) for row in rows]

    # -- leader election (broker/leader.py) ------------------------------------------------

    async def acquire_lease(self, name: str, holder: str, seconds: float) -> str | None:
        """Take the lease ``name`` for ``holder`` when it is free, expired or already
        ``holder``'s, for ``seconds`` of the database's clock; one statement. Returns the
        live holder afterwards (``holder`` when taken; None when nobody holds it)."""
        pool = self._require()
        with self._errors("acquire_lease"):
            taken = await pool.fetchval(_ACQUIRE_LEASE, name, holder, float(seconds))
            if taken is not None:
                return str(taken)
            live = await pool.fetchval(_LEASE_HOLDER, name)
            return None if live is None else str(live)

    async def renew_lease(self, name: str, holder: str, seconds: float) -> str | None:
        """Extend ``holder``'s lease only while it is unexpired and still ``holder``'s;
        returns the live holder afterwards, as acquire_lease."""
        pool = self._require()
        with self._errors("renew_lease"):
            renewed = await pool.fetchval(_RENEW_LEASE, name, holder, float(seconds))
            if renewed is not None:
                return str(renewed)
            live = await pool.fetchval(_LEASE_HOLDER, name)
            return None if live is None else str(live)

    async def release_lease(self, name: str, holder: str) -> None:
        pool = self._require()
        with self._errors("release_lease"):
            await pool.execute("DELETE FROM leases WHERE name = $1 AND holder = $2", name, holder)

    # -- errors ----------------------------------------------------------------------------

    def _require(self) -> asyncpg.Pool:
        if self._pool is None:
            raise StoreUnavailable(f"postgres store {self.url_for_logs} is not open")
        return self._pool

    def _scrub(self, exc: BaseException) -> str:
        # Drivers do not put the password in messages today; this keeps it that way.
        text = f"{type(exc).__name__}: {exc}"
        for secret in self._secrets:
            text = text.replace(secret, "***")
        return text

    @contextmanager
    def _errors(self, action: str) -> Iterator[None]:
        """Translate driver errors into the store's, with the (redacted) URL named."""
        try:
            yield
        except StoreError:
            raise
        except _UNAVAILABLE as exc:
            raise StoreUnavailable(
                f"postgres store {self.url_for_logs}: {action} failed: {self._scrub(exc)}"
            ) from exc
        except asyncpg.PostgresError as exc:
            raise StoreError(
                f"postgres store {self.url_for_logs}: {action} failed: {self._scrub(exc)}"
            ) from exc


def _secrets_in(url: str) -> list[str]:
    """Every spelling of a password in ``url`` (userinfo or query, raw and decoded)."""
    try:
        parts = urlsplit(url)
        found = [parts.password or ""]
        found += [v for k, v in parse_qsl(parts.query) if k.lower() in ("password", "sslpassword")]
    except ValueError:
        return []
    found += [unquote(s) for s in found]
    return sorted({s for s in found if s}, key=len, reverse=True)


class _Args:
    """Collects query arguments and hands out their ``$n`` placeholders in order."""

    def __init__(self) -> None:
        self.values: list[Any] = []

    def __call__(self, value: Any) -> str:
        self.values.append(value)
        return f"${len(self.values)}"


def _job(row: asyncpg.Record) -> JobRecord:
    # Without a custom codec asyncpg passes JSONB as text both ways, the same as SQLite: one
    # encoder (encode_json, which refuses NaN before any I/O) and one decoder for both.
    return job_from_row(tuple(row), json.loads)


_SELECT_JOB = f"SELECT {JOB_COLUMNS} FROM jobs WHERE tenant = $1 AND name = $2"
_SELECT_VERSIONS = "SELECT version FROM schema_migrations ORDER BY version"
_INSERT_HISTORY = (
    "INSERT INTO job_history (tenant, name, at, state, reason, cluster) "
    "VALUES ($1, $2, $3, $4, $5, $6)"
)
# One statement, timed by the database's clock: insert, or take over a row that expired or
# is already ours (a restarted replica with the same identity); no row returned otherwise.
_ACQUIRE_LEASE = (
    "INSERT INTO leases (name, holder, expires_at) "
    "VALUES ($1, $2, now() + make_interval(secs => $3)) "
    "ON CONFLICT (name) DO UPDATE SET holder = EXCLUDED.holder, "
    "expires_at = EXCLUDED.expires_at "
    "WHERE leases.expires_at < now() OR leases.holder = EXCLUDED.holder "
    "RETURNING holder"
)
_RENEW_LEASE = (
    "UPDATE leases SET expires_at = now() + make_interval(secs => $3) "
    "WHERE name = $1 AND holder = $2 AND expires_at >= now() RETURNING holder"
)
_LEASE_HOLDER = "SELECT holder FROM leases WHERE name = $1 AND expires_at >= now()"
