"""The durable job store: the one place an accepted job is written down.

This package owns the job records and their transition history, the contract every backend
keeps (``Store``), the errors callers can act on, and the choice of backend from a URL
(``open_store``): SQLite via aiosqlite for a file under the data directory (the default),
PostgreSQL via an asyncpg pool for production. A job is acknowledged only after
``create_job`` has returned, and it returns only after the commit, so a 201 survives
``kill -9``. Every state change is a compare-and-set that writes its history row in the
same transaction. The store never reads a clock: callers pass ``now`` (epoch seconds), so
tests and the simulator drive it with a virtual clock. Backends are imported lazily so a
SQLite deployment never imports asyncpg. What both backends send (statements, the field
rules of a transition, rows back to records) is written once in ``broker.store.sql``, the
schema once in ``broker.store.migrations``.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal, Protocol, get_args
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from broker.store.record import JobRecord

JobState = Literal["Queued", "Placed", "Running", "Succeeded", "Failed", "Cancelled"]
JOB_STATES: Final[tuple[JobState, ...]] = get_args(JobState)
FINAL_STATES: Final[frozenset[JobState]] = frozenset({"Succeeded", "Failed", "Cancelled"})
ACTIVE_STATES: Final[tuple[JobState, ...]] = tuple(s for s in JOB_STATES if s not in FINAL_STATES)

# The reason recorded with the Queued transition that create_job writes.
SUBMITTED_REASON: Final = "Submitted"

# The most jobs one ``place_many`` call moves (SQLite: five of a statement's at most 32,766
# parameters each).
PLACE_BATCH: Final = 1000


@dataclass(frozen=True, slots=True)
class Placing:
    """One queued job's move to Placed in ``Store.place_many``: the row of ``seq`` (never
    reused), the cluster and placement it gets, its attempts so far and the reason."""

    seq: int
    cluster: str
    placement: Mapping[str, Any]
    attempts: int
    reason: str


@dataclass(frozen=True, slots=True)
class Transition:
    at: float
    state: JobState
    reason: str
    cluster: str | None


@dataclass(frozen=True, slots=True)
class Generation:
    """A finished earlier generation of a job name, kept when the name was submitted again:
    its record (camelCase JSON: queue, manifest, state, reason, ...) and its transitions."""

    generation: int
    record: dict[str, Any]
    history: list[dict[str, Any]]


class StoreError(Exception):
    """Something went wrong in the store that retrying the same call will not fix."""


class StateConflict(StoreError):
    """A compare-and-set transition found the job in a state the caller did not expect."""

    def __init__(self, tenant: str, name: str, current: JobState, expected: Collection[str]):
        self.tenant, self.name, self.current = tenant, name, current
        self.expected = tuple(expected)
        super().__init__(
            f"job {tenant}/{name} is {current}, expected one of {', '.join(self.expected)}"
        )


class JobNotFound(StoreError, LookupError):
    """A transition named a job the store does not have."""

    def __init__(self, tenant: str, name: str):
        self.tenant, self.name = tenant, name
        super().__init__(f"job {tenant}/{name} does not exist")


class StoreUnavailable(StoreError):
    """The database cannot be reached right now (the service reports not-ready, retries)."""


class LeaseLost(StoreError):
    """A fenced write refused: this replica no longer holds the leader lease it was fenced
    with (expired, or taken by another replica), so it must not write jobs any more."""


class Store(Protocol):
    """What the broker needs from a durable job store. Both backends keep it exactly."""

    url_for_logs: str  # the store URL with any password removed: safe for logs and errors

    async def open(self) -> None:
        """Connect and apply pending migrations. Raises StoreUnavailable if unreachable."""

    async def close(self) -> None: ...

    async def ping(self) -> bool:
        """Cheap health check for readiness; never raises."""
        ...

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
        """Store a new Queued job, or return ``(existing, False)`` if (tenant, name) exists.

        Commits (job row and its Queued history row) before returning ``(job, True)``. With
        ``reuse_finished``, an existing job in a final state is moved to its generations
        (``generations``) and the new one stored as the next generation, ``(new, True)``.
        """
        ...

    async def purge_finished(self, before: float, limit: int = 1000) -> int:
        """Delete at most ``limit`` finished jobs (and their history) last changed before
        ``before`` (epoch seconds), oldest first, and the earlier generations that finished
        before it; the number of jobs deleted. Active jobs are never deleted."""
        ...

    async def generations(self, tenant: str, name: str) -> list[Generation]:
        """The name's earlier, finished generations, oldest first."""
        ...

    async def count_active(self, tenant: str) -> int:
        """How many of the tenant's jobs are not in a final state (its cap's count)."""
        ...

    async def get_job(self, tenant: str, name: str) -> JobRecord | None: ...

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
        """Jobs matching every given filter, ordered by seq; ``after_seq`` is the cursor."""
        ...

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
        """Atomically move a job to ``state`` and append the history row.

        Raises StateConflict (job unchanged) if ``expect`` is given and the current state is
        not in it, JobNotFound if there is no such job. Field rules: ``cluster`` and
        ``placement`` replace the stored values when given; moving to Queued clears both (a
        queued job holds no placement). ``attempts`` is set when given (the service always
        gives the lifecycle's count of failed attempts), otherwise it grows by one on every
        move to Placed. ``not_before`` is set when given, else kept.
        """
        ...

    async def history(self, tenant: str, name: str) -> list[Transition]:
        """The job's transitions, oldest first (empty if the job does not exist)."""
        ...

    async def transition_many(
        self, jobs: Sequence[JobRecord], state: JobState, reason: str, now: float
    ) -> list[JobRecord]:
        """Move each job, still as the caller read it, to ``state`` in one transaction.

        Per job, the compare-and-set and the history row of ``transition(tenant, name,
        state, reason, now, expect=(record.state,))`` with no other field given, on the very
        row it was read from (its seq, never reused); a job that is gone or no longer in
        that state is skipped (left unchanged, not returned) instead of raising. All or
        nothing: if the transaction fails, no job has moved. The moved jobs come back, in no
        particular order: each the record given with the fields the transition changed as
        stored (its manifest is not read again). Callers keep a batch to a few thousand jobs
        (on SQLite each is two of a statement's at most 32,766 parameters).
        """
        ...

    async def place_many(self, placings: Sequence[Placing], now: float) -> list[JobRecord]:
        """Move each job to Placed in one transaction: a scheduling cycle's placements.

        Per job, the compare-and-set and the history row of ``transition(tenant, name,
        "Placed", reason, now, cluster=, placement=, attempts=, expect=("Queued",))`` on
        the row of its seq; a job that is gone or no longer Queued (cancelled meanwhile) is
        skipped (left unchanged, not returned) instead of raising. All or nothing: if the
        transaction fails, no job has moved. The moved jobs come back as stored, in no
        particular order. Callers keep a batch to at most PLACE_BATCH jobs.
        """
        ...

    async def active_jobs(
        self, *, after_seq: int | None = None, limit: int | None = None
    ) -> list[JobRecord]:
        """Jobs not in a final state, by seq: what a restart rebuilds from. Paged: at most
        ``limit`` of them after the cursor ``after_seq`` (the last seq of the page before)."""
        ...

    async def finished_since(self, since: float, limit: int) -> list[JobRecord]:
        """At most ``limit`` jobs in a final state last changed at or after ``since``, the
        most recent of them, oldest first: the finished jobs a new leader keeps the pods of."""
        ...


def open_store(url: str) -> Store:
    """A store for ``url`` (not yet opened: call ``await store.open()``).

    ``sqlite:///abs/path.db`` (absolute), ``sqlite://rel/path.db`` (relative to the working
    directory), ``sqlite://:memory:`` (tests); ``postgresql://user:pw@host:port/db`` (or
    ``postgres://``; asyncpg's query parameters apply).
    """
    scheme = url.partition("://")[0].lower() if "://" in url else ""
    if scheme == "sqlite":
        from broker.store.sqlite import SqliteStore

        return SqliteStore(sqlite_path(url))
    if scheme in ("postgresql", "postgres"):
        from broker.store.postgres import PostgresStore

        return PostgresStore(url)
    # Only the scheme goes into the message: the rest of the URL may hold a password.
    shown = f"scheme {scheme!r}" if scheme else "no scheme"
    raise ValueError(
        f"unsupported store URL ({shown}): use sqlite:///path/to/file.db or "
        "postgresql://user@host:port/db"
    )


def sqlite_path(url: str) -> str:
    """The file path in a ``sqlite://`` URL (``:memory:`` for an in-memory database)."""
    path = url[len("sqlite://") :]
    if path in (":memory:", "/:memory:"):
        return ":memory:"
    if not path:
        raise ValueError("sqlite store URL has no path: use sqlite:///path/to/file.db")
    return path


def sqlite_url(path: str) -> str:
    """The URL for a database file, the inverse of ``sqlite_path`` (for config defaults)."""
    return f"sqlite://{path}"


_SECRET_QUERY_KEYS: Final = frozenset({"password", "sslpassword"})


def redact_url(url: str) -> str:
    """``url`` without its password (userinfo or query parameter); safe to log."""
    try:
        parts = urlsplit(url)
        netloc = parts.netloc
        if "@" in netloc:
            userinfo, _, hostinfo = netloc.rpartition("@")
            netloc = f"{userinfo.partition(':')[0]}@{hostinfo}"
        query = urlencode(
            [(k, v) for k, v in parse_qsl(parts.query) if k.lower() not in _SECRET_QUERY_KEYS]
        )
        return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))
    except ValueError:
        # A URL we cannot even parse is not echoed at all: it might be mostly password.
        return "<unparseable store URL>"


__all__ = [
    "ACTIVE_STATES",
    "FINAL_STATES",
    "JOB_STATES",
    "PLACE_BATCH",
    "Generation",
    "JobNotFound",
    "JobRecord",
    "JobState",
    "Placing",
    "StateConflict",
    "Store",
    "StoreError",
    "StoreUnavailable",
    "Transition",
    "open_store",
    "redact_url",
    "sqlite_url",
]
