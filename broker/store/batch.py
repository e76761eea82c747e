"""The statements that write many jobs at once, for either SQL dialect (see ``sql``): a
restart's requeue (``update_jobs``), a scheduling cycle's placements (``place_jobs``), and
the concurrent submissions and transitions a ``Coalescer`` sends together (``insert_new_jobs``,
``move_jobs``).

Each is one statement, so atomic on both backends without a savepoint, and the history
trigger writes a row per moved job as for one transition. The jobs are joined by seq (a
row's, never reused) or by (tenant, name) from a list of placeholder rows on SQLite and
from arrays on PostgreSQL, so the statement's text does not depend on the batch's size
there.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from broker.store import SUBMITTED_REASON, JobRecord, JobState, Placing
from broker.store.coalesce import Coalescer
from broker.store.migrations import Dialect
from broker.store.onerow import in_one_row
from broker.store.sql import (
    JOB_COLUMNS,
    Statement,
    check_state,
    encode_json,
    fence_cte,
    job_from_row,
    transition_sets,
)

# What a transition changes (transition_sets), in moved_records' order: the rest of a record
# stays as the caller read it, so a batch's rows come back without their manifests.
MOVED_COLUMNS: Final = "seq, state, cluster, placement, attempts, not_before, reason, updated_at"
# The most writes one coalesced statement carries (both backends).
COALESCED_MOST: Final = 500


def update_jobs(
    dialect: Dialect,
    jobs: Sequence[JobRecord],
    state: JobState,
    reason: str,
    now: float,
    *,
    returning: bool = True,
) -> Statement:
    """Many transitions' compare-and-set as one statement: each job still as the caller read
    it (its row by seq, which is never reused, still in the record's state) moves to
    ``state`` with transition's field rules (as a transition given no cluster, placement,
    attempts or not_before); the others are left as they are, and only the moved come back
    (MOVED_COLUMNS). One statement is atomic on both backends, and the history trigger
    writes a row per moved job, as for one transition. Without ``returning``, nothing
    comes back (SQLite: see ``moving_jobs``)."""
    st = Statement(dialect)
    sets = transition_sets(
        state, reason, now, st, cluster=None, placement=None, attempts=None, not_before=None
    )
    returned = f" RETURNING {', '.join(f'jobs.{c}' for c in MOVED_COLUMNS.split(', '))}"
    return st.done(
        f"UPDATE jobs SET {', '.join(sets)} FROM {_moves(st, jobs)} "
        f"WHERE jobs.seq = moves.column1 AND jobs.state = moves.column2"
        f"{returned if returning else ''}"
    )


def _moves(st: Statement, jobs: Sequence[JobRecord]) -> str:
    """update_jobs' rows to move, (column1, column2) = (seq, state as read), as a table."""
    if st.dialect == "sqlite":  # a row of placeholders per job
        st.args.extend(a for job in jobs for a in (job.seq, check_state(job.state)))
        return f"(VALUES {', '.join(['(?, ?)'] * len(jobs))}) AS moves"
    seqs, states = st([job.seq for job in jobs]), st([check_state(j.state) for j in jobs])
    return f"unnest({seqs}::bigint[], {states}::text[]) AS moves (column1, column2)"


def moving_jobs(jobs: Sequence[JobRecord]) -> Statement:
    """SQLite: the seqs of the jobs ``update_jobs`` would move now, as one JSON array in one
    row (see ``broker.store.onerow``). Read in the update's transaction, under SQLite's one
    writer lock, it is exactly the set the update then moves."""
    st = Statement("sqlite")
    return st.done(
        f"SELECT json_group_array(jobs.seq) FROM {_moves(st, jobs)} "
        "JOIN jobs ON jobs.seq = moves.column1 AND jobs.state = moves.column2"
    )


def moved_rows(seqs: str, columns: str = MOVED_COLUMNS) -> Statement:
    """SQLite: the ``columns`` of the jobs of ``seqs`` (a JSON array), in one row
    (``onerow.rows_of`` reads them)."""
    st = Statement("sqlite")
    select = st.done(
        f"SELECT {columns} FROM jobs WHERE seq IN (SELECT value FROM json_each({st(seqs)}))"
    )
    return in_one_row(select, columns.split(", "))


def queued_among(placings: Sequence[Placing]) -> Statement:
    """SQLite: the seqs of ``placings`` still Queued (what ``place_jobs`` moves now), as one
    JSON array in one row; read under the writer lock, as ``moving_jobs``."""
    st = Statement("sqlite")
    seqs = json.dumps([p.seq for p in placings])
    return st.done(
        "SELECT json_group_array(seq) FROM jobs "
        f"WHERE seq IN (SELECT value FROM json_each({st(seqs)})) AND state = {st('Queued')}"
    )


def moved_records(jobs: Sequence[JobRecord], rows: Iterable[Iterable[Any]]) -> list[JobRecord]:
    """The jobs of an ``update_jobs`` that moved, each its record as given with the fields
    its row (MOVED_COLUMNS) says it has now."""
    by_seq = {job.seq: job for job in jobs}
    moved = []
    for seq, state, cluster, placement, attempts, not_before, reason, updated_at in rows:
        job = by_seq[int(seq)]
        until = None if not_before is None else float(not_before)
        manifest, text = job.manifest_as_read()  # not decoded for the copy
        moved.append(JobRecord(
            job.tenant, job.name, job.queue, job.priority, manifest, state, cluster, None,
            int(attempts), until, reason, job.created_at, float(updated_at), job.seq,
            job.generation, manifest_text=text, placement_text=placement,
            spec_text=job.spec_text,
        ))  # fmt: skip
    return moved


def place_jobs(
    dialect: Dialect,
    placings: Sequence[Placing],
    now: float,
    *,
    fence: tuple[str, str] | None = None,
    returning: bool = True,
) -> Statement:
    """A cycle's placements as one compare-and-set (Store.place_many): each job still Queued
    on the row of its seq moves to Placed with its own cluster, placement, attempts and
    reason; the others are left as they are, and only the moved come back (JOB_COLUMNS;
    without ``returning``, none: SQLite, see ``queued_among``). ``fence`` (PostgreSQL:
    lease, holder) as in ``sql.update_job``: while not held, no row moves and none comes
    back."""
    st = Statement(dialect)  # placeholders in the text's order: SQLite's are positional
    prefix = "" if fence is None else fence_cte(st, fence)
    sets = f"state = {st('Placed')}, updated_at = {st(now)}"
    if dialect == "sqlite":
        rows = (
            f"({st(p.seq)}, {st(p.cluster)}, {st(encode_json(p.placement))}, "
            f"{st(p.attempts)}, {st(p.reason)})"
            for p in placings
        )
        moves, placement = f"(VALUES {', '.join(rows)}) AS moves", "moves.column3"
    else:
        arrays = (
            f"{st([p.seq for p in placings])}::bigint[]",
            f"{st([p.cluster for p in placings])}::text[]",
            f"{st([encode_json(p.placement) for p in placings])}::text[]",
            f"{st([p.attempts for p in placings])}::integer[]",
            f"{st([p.reason for p in placings])}::text[]",
        )
        columns = "column1, column2, column3, column4, column5"
        moves = f"unnest({', '.join(arrays)}) AS moves ({columns})"
        placement = "moves.column3::jsonb"
    sets += (
        f", cluster = moves.column2, placement = {placement}, attempts = moves.column4, "
        "reason = moves.column5"
    )
    where = f"jobs.seq = moves.column1 AND jobs.state = {st('Queued')}"
    if fence is not None:
        where += " AND EXISTS (SELECT 1 FROM fence)"
    columns = ", ".join(f"jobs.{c}" for c in JOB_COLUMNS.split(", "))
    update = f"UPDATE jobs SET {sets} FROM {moves} WHERE {where}"
    return st.done(f"{prefix}{update} RETURNING {columns}" if returning else f"{prefix}{update}")


@dataclass(frozen=True, slots=True)
class NewJob:
    """A submission of a name not stored yet (create_job's common case)."""

    tenant: str
    name: str
    queue: str
    priority: int
    manifest: str  # encoded (encode_json), so a bad one fails before it joins a batch
    now: float
    # The manifest as handed in: the stored record comes back with it, not with a copy
    # decoded from the row (decoding every returned manifest was ~7 % of the soak's loop).
    document: Mapping[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class Move:
    """A transition with no cluster or placement (transition's common case: to Running or
    a final state); attempts and not_before are set where not None."""

    tenant: str
    name: str
    state: JobState
    reason: str
    now: float
    expect: tuple[JobState, ...] | None
    attempts: int | None = None
    not_before: float | None = None


def insert_new_jobs(
    dialect: Dialect, rows: Sequence[NewJob], fence: tuple[str, str] | None = None
) -> Statement:
    """Each submission as ``sql.insert_job`` (generation 1; fenced when ``fence`` is given,
    PostgreSQL) in one statement; a name that exists comes back as no row (ON CONFLICT DO
    NOTHING, also against an earlier row of the same batch)."""
    st = Statement(dialect)
    columns = (
        "INSERT INTO jobs (tenant, name, queue, priority, manifest, generation, state, "
        "attempts, reason, created_at, updated_at) "
    )
    conflict = f"ON CONFLICT (tenant, name) DO NOTHING RETURNING {JOB_COLUMNS}"
    if dialect == "sqlite":  # a row of placeholders per job
        values = ", ".join(
            f"({st(r.tenant)}, {st(r.name)}, {st(r.queue)}, {st(r.priority)}, "
            f"{st(r.manifest)}, 1, 'Queued', 0, {st(SUBMITTED_REASON)}, {st(r.now)}, "
            f"{st(r.now)})"
            for r in rows
        )
        return st.done(f"{columns}VALUES {values} {conflict}")
    prefix = "" if fence is None else fence_cte(st, fence)
    arrays = ", ".join((
        f"{st([r.tenant for r in rows])}::text[]",
        f"{st([r.name for r in rows])}::text[]",
        f"{st([r.queue for r in rows])}::text[]",
        f"{st([r.priority for r in rows])}::bigint[]",
        f"{st([r.manifest for r in rows])}::text[]",
        f"{st([r.now for r in rows])}::double precision[]",
    ))  # fmt: skip
    where = "" if fence is None else " WHERE EXISTS (SELECT 1 FROM fence)"
    return st.done(
        f"{prefix}{columns}"
        f"SELECT n.tenant, n.name, n.queue, n.priority, n.manifest::jsonb, 1, 'Queued', 0, "
        f"{st(SUBMITTED_REASON)}::text, n.at, n.at "
        f"FROM unnest({arrays}) AS n (tenant, name, queue, priority, manifest, at){where} "
        f"{conflict}"
    )


def move_jobs(
    dialect: Dialect, moves: Sequence[Move], fence: tuple[str, str] | None = None
) -> Statement:
    """Each move as ``sql.update_job`` with no cluster or placement (its compare-and-set
    on ``expect``; attempts and not_before set where given, as transition_sets does;
    fenced when ``fence`` is given, PostgreSQL) in one
    statement; a job that is missing or in another state comes back as no row. The jobs of
    a batch are distinct (a join applies one row per job)."""
    st = Statement(dialect)
    for move in moves:
        if move.state in ("Queued", "Placed"):
            raise ValueError(f"move_jobs does not apply {move.state}'s field rules")
    if dialect == "sqlite":  # a row of placeholders per move; expect as ",A,B,"
        rows = ", ".join(
            f"({st(m.tenant)}, {st(m.name)}, {st(check_state(m.state))}, {st(m.reason)}, "
            f"{st(m.now)}, {st(None if m.expect is None else f',{_expected(m.expect)},')}, "
            f"{st(m.attempts)}, {st(m.not_before)})"
            for m in moves
        )
        table = f"(VALUES {rows}) AS m"
        expected = "instr(m.column6, ',' || jobs.state || ',') > 0"
        columns = tuple(f"m.column{i}" for i in range(1, 9))
        prefix = ""
    else:
        prefix = "" if fence is None else fence_cte(st, fence)
        arrays = ", ".join((
            f"{st([m.tenant for m in moves])}::text[]",
            f"{st([m.name for m in moves])}::text[]",
            f"{st([check_state(m.state) for m in moves])}::text[]",
            f"{st([m.reason for m in moves])}::text[]",
            f"{st([m.now for m in moves])}::double precision[]",
            f"{st([_expected(m.expect) for m in moves])}::text[]",
            f"{st([m.attempts for m in moves])}::integer[]",
            f"{st([m.not_before for m in moves])}::double precision[]",
        ))  # fmt: skip
        names = ("tenant", "name", "state", "reason", "at", "expect", "attempts", "not_before")
        table = f"unnest({arrays}) AS m ({', '.join(names)})"
        expected = "jobs.state = ANY(string_to_array(m.expect, ','))"
        columns = tuple(f"m.{n}" for n in names)
    tenant, name, state, reason, at, expect, attempts, not_before = columns
    where = f"jobs.tenant = {tenant} AND jobs.name = {name} AND ({expect} IS NULL OR {expected})"
    if fence is not None:
        where += " AND EXISTS (SELECT 1 FROM fence)"
    returning = ", ".join(f"jobs.{c}" for c in JOB_COLUMNS.split(", "))
    return st.done(
        f"{prefix}UPDATE jobs SET state = {state}, reason = {reason}, updated_at = {at}, "
        f"attempts = COALESCE({attempts}, jobs.attempts), "
        f"not_before = COALESCE({not_before}, jobs.not_before) "
        f"FROM {table} WHERE {where} RETURNING {returning}"
    )


def as_move(
    tenant: str,
    name: str,
    state: JobState,
    reason: str,
    now: float,
    expected: tuple[JobState, ...] | None,
    fields: Mapping[str, Any],
) -> Move | None:
    """The transition as a Move when it is one: no cluster or placement, to a state with no
    field rules of its own (Running or a final state)."""
    if state in ("Queued", "Placed") or fields["cluster"] is not None:
        return None
    if fields["placement"] is not None:
        return None
    attempts, not_before = fields["attempts"], fields["not_before"]
    return Move(tenant, name, check_state(state), reason, now, expected, attempts, not_before)


def coalescers(
    inserts: Callable[[Sequence[NewJob]], Awaitable[Sequence[JobRecord | None]]],
    moves: Callable[[Sequence[Move]], Awaitable[Sequence[JobRecord | None]]],
    slots: int,
) -> tuple[Coalescer[NewJob, JobRecord], Coalescer[Move, JobRecord]]:
    """A store's two coalescers (submissions; moves), keyed by job, at most COALESCED_MOST
    writes a batch (SQLite: 8 placeholders each, far below its 32,766)."""
    return (
        Coalescer(inserts, job_key, slots=slots, most=COALESCED_MOST),
        Coalescer(moves, job_key, slots=slots, most=COALESCED_MOST),
    )


def job_key(write: NewJob | Move) -> tuple[str, str]:
    return write.tenant, write.name


def inserted(jobs: Sequence[NewJob], rows: Iterable[Sequence[Any]]) -> list[JobRecord | None]:
    """A coalesced insert's rows (JOB_COLUMNS) as records in the order of its jobs, each
    with its job's own ``document`` where it has one; None for a job not inserted."""
    documents = {job_key(job): job.document for job in jobs}
    return by_job(jobs, (job_from_row(r, documents.get((r[0], r[1]))) for r in rows))


def by_job(writes: Sequence[NewJob | Move], rows: Iterable[JobRecord]) -> list[JobRecord | None]:
    """A batch's records back, in the order of its writes: None for a write that did not
    apply (its job is not among them)."""
    records = {(r.tenant, r.name): r for r in rows}
    return [records.get(job_key(write)) for write in writes]


def _expected(expect: tuple[JobState, ...] | None) -> str | None:
    return None if expect is None else ",".join(check_state(s) for s in expect)


__all__ = [
    "COALESCED_MOST",
    "MOVED_COLUMNS",
    "Move",
    "NewJob",
    "as_move",
    "by_job",
    "coalescers",
    "insert_new_jobs",
    "inserted",
    "job_key",
    "move_jobs",
    "moved_records",
    "moved_rows",
    "moving_jobs",
    "place_jobs",
    "queued_among",
    "update_jobs",
]
