"""The statements both store backends send, written once for either SQL dialect.

Each function returns a ``Statement``: its text with the dialect's placeholders (SQLite's
``?``, PostgreSQL's ``$n``) and its arguments in order; the backend only runs it on its
driver. Rows come back through ``job_from_row``, so both backends hand the same JobRecord
types to callers; ``missing_job`` says why a compare-and-set changed nothing. The field
rules of a transition (Store.transition) live here, once.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from broker.store import (
    ACTIVE_STATES,
    FINAL_STATES,
    JOB_STATES,
    SUBMITTED_REASON,
    Generation,
    JobNotFound,
    JobRecord,
    JobState,
    StateConflict,
    StoreError,
    Transition,
)
from broker.store.migrations import Dialect

# Column order shared by every SELECT/RETURNING list and job_from_row.
JOB_COLUMNS: Final = (
    "tenant, name, queue, priority, manifest, state, cluster, placement, attempts, "
    "not_before, reason, created_at, updated_at, seq, generation"
)


@dataclass
class Statement:
    """A statement's text and its arguments, built one placeholder at a time."""

    dialect: Dialect
    sql: str = ""
    args: list[Any] = field(default_factory=list)

    def __call__(self, value: Any) -> str:
        """Record an argument; its placeholder in the dialect."""
        self.args.append(value)
        return "?" if self.dialect == "sqlite" else f"${len(self.args)}"

    def any_of(self, column: str, values: Sequence[str]) -> str:
        """``column`` is one of ``values`` (text): a list of placeholders or one array."""
        if self.dialect == "sqlite":
            return f"{column} IN ({', '.join(self(v) for v in values)})"
        return f"{column} = ANY({self(list(values))}::text[])"

    def done(self, sql: str) -> Statement:
        self.sql = sql
        return self


def _one_job(st: Statement, tenant: str, name: str) -> str:
    return f"tenant = {st(tenant)} AND name = {st(name)}"


def fence_cte(st: Statement, fence: tuple[str, str]) -> str:
    """The lease check of a fenced statement (PostgreSQL): a ``fence`` row while the holder
    holds the lease unexpired, key-share-locked until the statement's transaction ends."""
    lease, holder = fence
    return (
        f"WITH fence AS (SELECT 1 FROM leases WHERE name = {st(lease)} AND holder = "
        f"{st(holder)} AND expires_at > now() FOR KEY SHARE) "
    )


def select_job(dialect: Dialect, tenant: str, name: str) -> Statement:
    st = Statement(dialect)
    return st.done(f"SELECT {JOB_COLUMNS} FROM jobs WHERE {_one_job(st, tenant, name)}")


def state_of(dialect: Dialect, tenant: str, name: str) -> Statement:
    st = Statement(dialect)
    return st.done(f"SELECT state FROM jobs WHERE {_one_job(st, tenant, name)}")


def insert_job(
    dialect: Dialect,
    tenant: str,
    name: str,
    queue: str,
    priority: int,
    manifest: Mapping[str, Any],
    now: float,
    generation: int = 1,
) -> Statement:
    """A new Queued job, or no row when (tenant, name) exists (ON CONFLICT DO NOTHING).
    (PostgreSQL's common case sends ``batch.insert_new_jobs``, fenced, instead.)"""
    st = Statement(dialect)
    args = (tenant, name, queue, priority, encode_json(manifest), generation)
    values = ", ".join(st(v) for v in args)
    return st.done(
        "INSERT INTO jobs (tenant, name, queue, priority, manifest, generation, state, "
        f"attempts, reason, created_at, updated_at) VALUES ({values}, 'Queued', 0, "
        f"{st(SUBMITTED_REASON)}, {st(now)}, {st(now)}) "
        f"ON CONFLICT (tenant, name) DO NOTHING RETURNING {JOB_COLUMNS}"
    )


def update_job(
    dialect: Dialect,
    tenant: str,
    name: str,
    state: JobState,
    reason: str,
    now: float,
    *,
    cluster: str | None,
    placement: Mapping[str, Any] | None,
    expected: Sequence[JobState] | None,
    attempts: int | None,
    not_before: float | None,
    fence: tuple[str, str] | None = None,
) -> Statement:
    """A transition's compare-and-set: no row back when the job is missing or, with
    ``expected``, in another state (then ``missing_job`` says which). ``fence`` (PostgreSQL:
    lease, holder): the statement also checks that ``holder`` holds ``lease`` unexpired and
    share-locks its row until it commits, as ``PostgresStore.fence`` describes, so one
    statement in its own transaction is a fenced write (no row back also when not held)."""
    st = Statement(dialect)
    prefix = ""
    sets = transition_sets(
        state, reason, now, st,
        cluster=cluster, placement=placement, attempts=attempts, not_before=not_before,
    )  # fmt: skip
    where = _one_job(st, tenant, name)
    if expected is not None:
        where += f" AND {st.any_of('state', expected)}"
    if fence is not None:
        prefix = fence_cte(st, fence)
        where += " AND EXISTS (SELECT 1 FROM fence)"
    return st.done(
        f"{prefix}UPDATE jobs SET {', '.join(sets)} WHERE {where} RETURNING {JOB_COLUMNS}"
    )


def expected_states(expect: Collection[JobState] | None) -> tuple[JobState, ...] | None:
    return None if expect is None else tuple(check_state(s) for s in expect)


def missing_job(
    tenant: str, name: str, current: JobState | None, expected: Sequence[JobState] | None
) -> StoreError:
    """Why an update changed nothing: no such job, or it is in another state."""
    if current is None:
        return JobNotFound(tenant, name)
    return StateConflict(tenant, name, current, expected or ())


def list_jobs(
    dialect: Dialect,
    *,
    tenant: str | None,
    queue: str | None,
    state: JobState | Collection[JobState] | None,
    cluster: str | None,
    limit: int,
    after_seq: int | None,
) -> Statement:
    """Jobs matching every given filter, by seq, at most ``limit``, after the cursor."""
    if limit < 1:
        raise ValueError(f"limit must be at least 1, got {limit}")
    st = Statement(dialect)
    where: list[str] = []
    for column, value in (("tenant", tenant), ("queue", queue), ("cluster", cluster)):
        if value is not None:
            where.append(f"{column} = {st(value)}")
    states = states_filter(state)
    if states is not None:
        where.append(st.any_of("state", states))
    if after_seq is not None:
        where.append(f"seq > {st(after_seq)}")
    clause = f"WHERE {' AND '.join(where)} " if where else ""
    return st.done(f"SELECT {JOB_COLUMNS} FROM jobs {clause}ORDER BY seq LIMIT {st(limit)}")


# The active states spelled as literals, not parameters: only then do both planners see that
# a statement's condition implies the partial index jobs_active_seq's (migration 5).
ACTIVE_LITERALS: Final = f"state IN ({', '.join(repr(s) for s in ACTIVE_STATES)})"
# The final states the same way, for the partial index jobs_finished_updated (migration 7).
FINAL_LITERALS: Final = f"state IN ({', '.join(repr(s) for s in JOB_STATES if s in FINAL_STATES)})"


# The manifest's spec as JSON text, read by the database (JobRecord.spec_text): SQLite's
# json_extract gives an object back minified, PostgreSQL's -> gives JSONB's canonical text;
# on either, equal specs give equal texts.
SPEC_TEXT: Final[dict[Dialect, str]] = {
    "sqlite": "json_extract(manifest, '$.spec')",
    "postgres": "(manifest -> 'spec')::text",
}


def active_jobs(
    dialect: Dialect, after_seq: int | None = None, limit: int | None = None
) -> Statement:
    """Active jobs by seq, a page after the cursor ``after_seq`` when given: the partial
    index on the active jobs' seq walks just them, in order, from the cursor on. Rows are
    JOB_COLUMNS and the spec's text (``active_job_from_row``)."""
    st = Statement(dialect)
    where = ACTIVE_LITERALS if after_seq is None else f"{ACTIVE_LITERALS} AND seq > {st(after_seq)}"
    page = "" if limit is None else f" LIMIT {st(limit)}"
    # SQLite without statistics (the store never runs ANALYZE) would rather read the
    # (state, seq) index and sort every active job for each page; name the index.
    jobs = "jobs INDEXED BY jobs_active_seq" if dialect == "sqlite" else "jobs"
    return st.done(
        f"SELECT {JOB_COLUMNS}, {SPEC_TEXT[dialect]} FROM {jobs} WHERE {where} ORDER BY seq{page}"
    )


def finished_since(dialect: Dialect, since: float, limit: int) -> Statement:
    """The ``limit`` finished jobs last changed most recently at or after ``since``, the
    newest first: the partial index on finished jobs' updated_at walks just them, backwards
    from its end. Rows are JOB_COLUMNS."""
    st = Statement(dialect)
    jobs = "jobs INDEXED BY jobs_finished_updated" if dialect == "sqlite" else "jobs"
    return st.done(
        f"SELECT {JOB_COLUMNS} FROM {jobs} WHERE {FINAL_LITERALS} AND updated_at >= {st(since)} "
        f"ORDER BY updated_at DESC LIMIT {st(limit)}"
    )


def count_active(dialect: Dialect, tenant: str) -> Statement:
    st = Statement(dialect)
    return st.done(f"SELECT count(*) FROM jobs WHERE tenant = {st(tenant)} AND {ACTIVE_LITERALS}")


def history(dialect: Dialect, tenant: str, name: str) -> Statement:
    st = Statement(dialect)
    return st.done(
        "SELECT at, state, reason, cluster FROM job_history "
        f"WHERE {_one_job(st, tenant, name)} ORDER BY id"
    )


def select_for_update(dialect: Dialect, tenant: str, name: str) -> Statement:
    """The job, row-locked until the transaction ends (SQLite's writer lock is wider)."""
    lock = " FOR UPDATE" if dialect == "postgres" else ""
    st = select_job(dialect, tenant, name)
    return st.done(st.sql + lock)


def archive_generation(
    dialect: Dialect, record: JobRecord, history: Sequence[Transition]
) -> Statement:
    """A finished generation into job_generations: its record and history as JSON."""
    data = {
        "queue": record.queue, "priority": record.priority, "manifest": record.manifest,
        "state": record.state, "cluster": record.cluster, "reason": record.reason,
        "attempts": record.attempts, "createdAt": record.created_at,
        "updatedAt": record.updated_at, "seq": record.seq,
    }  # fmt: skip
    rows = [{"at": t.at, "state": t.state, "reason": t.reason, "cluster": t.cluster}
            for t in history]  # fmt: skip
    st = Statement(dialect)
    values = (record.tenant, record.name, record.generation, encode_json(data))
    return st.done(
        "INSERT INTO job_generations (tenant, name, generation, record, history, finished_at) "
        f"VALUES ({', '.join(st(v) for v in values)}, {st(json.dumps(rows))}, "
        f"{st(record.updated_at)}) ON CONFLICT DO NOTHING"
    )


def delete_finished_job(dialect: Dialect, tenant: str, name: str) -> Statement:
    """The job's row and its history if it is finished."""
    st = Statement(dialect)
    where = f"{_one_job(st, tenant, name)} AND {st.any_of('state', sorted(FINAL_STATES))}"
    return st.done(_with_history(dialect, f"DELETE FROM jobs WHERE {where}"))


def purge_finished_jobs(dialect: Dialect, before: float, limit: int) -> Statement:
    """At most ``limit`` finished jobs last changed before ``before``, oldest first, with
    their history. Its count is the jobs deleted (PostgreSQL's status: ``SELECT n``)."""
    st = Statement(dialect)
    # SQLite without statistics would rather read (state, seq) and sort: name the index.
    jobs = "jobs INDEXED BY jobs_finished_updated" if dialect == "sqlite" else "jobs"
    return st.done(
        _with_history(
            dialect,
            f"DELETE FROM jobs WHERE seq IN (SELECT seq FROM {jobs} WHERE {FINAL_LITERALS} "
            f"AND updated_at < {st(before)} ORDER BY updated_at LIMIT {st(limit)})",
        )
    )


def _with_history(dialect: Dialect, delete: str) -> str:
    """``delete`` (of jobs rows) with their history: SQLite's foreign key cascades;
    PostgreSQL's has none (migration 8), so a second DELETE in the same statement takes the
    history of the jobs the first one deleted, and a row per job deleted comes back."""
    if dialect == "sqlite":
        return delete
    return (
        f"WITH gone AS ({delete} RETURNING tenant, name), history AS ("
        "DELETE FROM job_history h USING gone WHERE h.tenant = gone.tenant "
        "AND h.name = gone.name) SELECT 1 FROM gone"
    )


def purge_generations(dialect: Dialect, before: float) -> Statement:
    st = Statement(dialect)
    return st.done(f"DELETE FROM job_generations WHERE finished_at < {st(before)}")


def generations(dialect: Dialect, tenant: str, name: str) -> Statement:
    st = Statement(dialect)
    return st.done(
        "SELECT generation, record, history FROM job_generations "
        f"WHERE {_one_job(st, tenant, name)} ORDER BY generation"
    )


def generation_from_row(row: Sequence[Any]) -> Generation:
    """A finished generation from (generation, record JSON, history JSON); text from both
    drivers, as job_from_row's JSON columns."""
    return Generation(int(row[0]), json.loads(row[1]), json.loads(row[2]))


def transition_from_row(row: Sequence[Any]) -> Transition:
    return Transition(at=float(row[0]), state=row[1], reason=row[2], cluster=row[3])


def active_job_from_row(row: Sequence[Any]) -> JobRecord:
    """A JobRecord from a row of ``active_jobs``: JOB_COLUMNS, then the spec's text."""
    return job_from_row(row, spec_text=row[15])


def job_from_row(
    row: Sequence[Any], manifest: Mapping[str, Any] | None = None, spec_text: str | None = None
) -> JobRecord:
    """A JobRecord from a row in JOB_COLUMNS order; with ``manifest`` (the document just
    stored, as its caller handed it in) instead of the row's copy, which the record
    decodes only if it is read.

    Both drivers hand JSON columns back as text (asyncpg without a custom codec passes
    JSONB as text both ways), so one decoder serves both. Numbers are coerced because
    SQLite's RETURNING hands back a REAL column holding 1.0 as the integer 1; callers
    should see the same types from every backend and every query.
    """
    not_before = row[9]  # positional: a restart makes 100,000 of these (the placement is
    # decoded if it is read)
    return JobRecord(
        row[0], row[1], row[2], int(row[3]), None if manifest is None else dict(manifest),
        row[5], row[6], None, int(row[8]), None if not_before is None else float(not_before),
        row[10], float(row[11]), float(row[12]), int(row[13]), int(row[14]),
        manifest_text=row[4] if manifest is None else None, placement_text=row[7],
        spec_text=spec_text,
    )  # fmt: skip


def encode_json(value: Mapping[str, Any]) -> str:
    # allow_nan=False: NaN/Infinity are not JSON, and PostgreSQL's JSONB rejects them; fail
    # here, with Python's message, instead of deep in a driver.
    return json.dumps(value, separators=(",", ":"), allow_nan=False)


def transition_sets(
    state: JobState,
    reason: str,
    now: float,
    mark: Callable[[Any], str],
    *,
    cluster: str | None,
    placement: Mapping[str, Any] | None,
    attempts: int | None,
    not_before: float | None,
) -> list[str]:
    """The SET clauses of a transition (see Store.transition). ``mark(value)`` records a
    parameter and returns its placeholder in the backend's dialect."""
    check_state(state)
    if state == "Queued" and (cluster is not None or placement is not None):
        raise ValueError("a transition to Queued clears cluster and placement; pass neither")
    sets = [f"state = {mark(state)}", f"reason = {mark(reason)}", f"updated_at = {mark(now)}"]
    if state == "Queued":
        sets += ["cluster = NULL", "placement = NULL"]
    if cluster is not None:
        sets.append(f"cluster = {mark(cluster)}")
    if placement is not None:
        sets.append(f"placement = {mark(encode_json(placement))}")
    if attempts is not None:
        sets.append(f"attempts = {mark(attempts)}")
    elif state == "Placed":
        sets.append("attempts = attempts + 1")
    if not_before is not None:
        sets.append(f"not_before = {mark(not_before)}")
    return sets


def check_state(state: str) -> JobState:
    if state not in JOB_STATES:
        raise ValueError(f"unknown job state {state!r}: expected one of {', '.join(JOB_STATES)}")
    return state


def states_filter(state: JobState | Collection[JobState] | None) -> tuple[JobState, ...] | None:
    """Normalise list_jobs' ``state`` argument (one state or several) to a tuple."""
    if state is None:
        return None
    if isinstance(state, str):
        return (check_state(state),)
    return tuple(check_state(s) for s in state)
