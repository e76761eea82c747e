"""Every hot statement of the store is served by an index, on both backends.

The statements come from ``broker.store.hot.hot_statements``, built by the same functions
the backends call, so this test reads the plans of what the broker really sends. Each runs
on a store holding jobs in every state over several tenants, queues and clusters, finished
generations and history. SQLite: ``EXPLAIN QUERY PLAN`` (the store never runs ANALYZE, so
this is the plan it gets) must have no ``SCAN`` of one of our tables without an index.
PostgreSQL: ``EXPLAIN (FORMAT JSON)`` with ``enable_seqscan = off``, so a plan that still
holds a ``Seq Scan`` of one of our tables means no index could serve the statement.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from services import postgres_database

from broker.store import JobRecord, JobState, Store, hot, open_store, sql, sqlite_path, sqlite_url
from broker.store.migrations import Dialect

OUR_TABLES = frozenset({"jobs", "job_history", "job_generations", "leases", "schema_migrations"})
ROWS = 120
# Where each job ends up, in order: the states a job passes through on its way there.
PATHS: tuple[tuple[JobState, ...], ...] = (
    (),
    ("Placed",),
    ("Placed", "Running"),
    ("Placed", "Running", "Succeeded"),
    ("Placed", "Failed"),
    ("Cancelled",),
)


@pytest.fixture(params=["sqlite", "postgres"])
async def url(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[str]:
    if request.param == "sqlite":
        yield sqlite_url(str(tmp_path / "jobs.db"))
        return
    async with postgres_database() as pg_url:
        yield pg_url


async def fill(store: Store) -> None:
    """Jobs of four tenants on three clusters in every state; some names submitted again."""
    for i in range(ROWS):
        tenant, name = f"team-{'abcd'[i % 4]}", f"job-{i}"
        await store.create_job(tenant, name, f"q{i % 3}", i % 5, {"i": i}, float(i))
        for step, state in enumerate(PATHS[i % len(PATHS)]):
            cluster = f"c{i % 3}" if state != "Cancelled" else None
            await store.transition(tenant, name, state, "test", i + step + 1.0, cluster=cluster)
        if i % 10 == 3:  # finished: a next generation, the first one archived
            await store.create_job(tenant, name, "q0", 0, {"i": i}, i + 9.0, reuse_finished=True)


async def filled(url: str) -> None:
    store = open_store(url)
    await store.open()
    try:
        await fill(store)
    finally:
        await store.close()


def sqlite_full_scans(path: str, statement: sql.Statement) -> list[str]:
    with sqlite3.connect(path) as conn:
        steps = [str(row[3]) for row in conn.execute(f"EXPLAIN QUERY PLAN {statement.sql}",
                                                     statement.args)]  # fmt: skip
    return [
        step for step in steps
        if step.startswith("SCAN ") and step.split()[1] in OUR_TABLES and "INDEX" not in step
    ]  # fmt: skip


def nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", ()):
        yield from nodes(child)


async def postgres_plan(url: str, statement: sql.Statement) -> dict[str, Any]:
    """PostgreSQL's plan of a statement, with sequential scans off (so a scan left in it
    is one no index could replace)."""
    conn = await asyncpg.connect(url)
    try:
        await conn.execute("SET enable_seqscan = off")
        text = await conn.fetchval(f"EXPLAIN (FORMAT JSON) {statement.sql}", *statement.args)
    finally:
        await conn.close()
    plan: dict[str, Any] = json.loads(text)[0]["Plan"]
    return plan


async def postgres_full_scans(url: str, statement: sql.Statement) -> list[str]:
    plan = await postgres_plan(url, statement)
    return [
        f"Seq Scan on {node['Relation Name']}" for node in nodes(plan)
        if node["Node Type"] == "Seq Scan" and node.get("Relation Name") in OUR_TABLES
    ]  # fmt: skip


async def test_hot_statements_use_indexes(url: str) -> None:
    await filled(url)
    dialect: Dialect = "sqlite" if url.startswith("sqlite") else "postgres"
    scans: dict[str, list[str]] = {}
    for name, statement in hot.hot_statements(dialect).items():
        if dialect == "sqlite":
            found = sqlite_full_scans(sqlite_path(url), statement)
        else:
            found = await postgres_full_scans(url, statement)
        if found:
            scans[name] = found
    assert scans == {}


async def test_rebuild_pages_read_active_jobs_in_index_order(url: str) -> None:
    """A page of active jobs walks the partial index from its cursor: no sort of every
    active job for each page (which would make the paged rebuild quadratic)."""
    store = open_store(url)
    await store.open()
    try:
        await fill(store)
        pages = [page async for page in pages_of(store)]
    finally:
        await store.close()
    statement = sql.active_jobs("sqlite" if url.startswith("sqlite") else "postgres", 10, 50)
    if url.startswith("sqlite"):
        with sqlite3.connect(sqlite_path(url)) as conn:
            steps = [str(r[3]) for r in conn.execute(f"EXPLAIN QUERY PLAN {statement.sql}",
                                                     statement.args)]  # fmt: skip
        assert steps == ["SEARCH jobs USING INDEX jobs_active_seq (seq>?)"]
    else:
        conn_pg = await asyncpg.connect(url)
        try:
            text = await conn_pg.fetchval(f"EXPLAIN (FORMAT JSON) {statement.sql}", *statement.args)
        finally:
            await conn_pg.close()
        plan = [(n["Node Type"], n.get("Index Name")) for n in nodes(json.loads(text)[0]["Plan"])]
        assert plan == [("Limit", None), ("Index Scan", "jobs_active_seq")]
    seqs = [job.seq for page in pages for job in page]
    assert seqs == sorted(seqs) and len(seqs) == len(set(seqs)) > 50
    assert [len(page) for page in pages[:-1]] == [50] * (len(pages) - 1)


async def pages_of(store: Store) -> AsyncIterator[list[JobRecord]]:
    after: int | None = None
    while page := await store.active_jobs(after_seq=after, limit=50):
        yield page
        after = page[-1].seq


def test_the_check_sees_a_full_scan(tmp_path: Path) -> None:
    """The SQLite check flags a statement no index serves (so the test above can fail)."""
    path = str(tmp_path / "scan.db")
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE jobs (seq INTEGER PRIMARY KEY, reason TEXT)")
    unindexed = sql.Statement("sqlite", "SELECT seq FROM jobs WHERE reason = ?", ["x"])
    assert sqlite_full_scans(path, unindexed) == ["SCAN jobs"]


async def test_the_postgres_check_sees_a_full_scan() -> None:
    async with postgres_database() as url:
        conn = await asyncpg.connect(url)
        try:
            await conn.execute("CREATE TABLE jobs (seq BIGINT PRIMARY KEY, reason TEXT)")
        finally:
            await conn.close()
        unindexed = sql.Statement("postgres", "SELECT seq FROM jobs WHERE reason = $1", ["x"])
        assert await postgres_full_scans(url, unindexed) == ["Seq Scan on jobs"]


async def indexes_used(url: str, statement: sql.Statement) -> set[str]:
    """The indexes a statement's plan reads: SQLite's ``USING ... INDEX name``,
    PostgreSQL's index nodes (with sequential scans off, as above)."""
    if url.startswith("sqlite"):
        with sqlite3.connect(sqlite_path(url)) as conn:
            steps = [str(r[3]) for r in conn.execute(f"EXPLAIN QUERY PLAN {statement.sql}",
                                                     statement.args)]  # fmt: skip
        return {s.split("INDEX ")[1].split()[0] for s in steps if "INDEX " in s}
    plan = await postgres_plan(url, statement)
    return {n["Index Name"] for n in nodes(plan) if "Index Name" in n}


@pytest.mark.parametrize(
    ("name", "index"),
    [("purge finished", "jobs_finished_updated"), ("count active", "jobs_tenant_active")],
)
async def test_retention_and_the_cap_read_partial_indexes(url: str, name: str, index: str) -> None:
    """Retention reads an index of the finished jobs alone, the cap one of the active jobs
    alone (migration 7): neither index changes on the transitions in between."""
    await filled(url)
    dialect: Dialect = "sqlite" if url.startswith("sqlite") else "postgres"
    assert index in await indexes_used(url, hot.hot_statements(dialect)[name])


async def test_postgres_writes_read_jobs_linearly_from_a_fresh_database() -> None:
    """Counted, not timed: a fresh database (no statistics: as before autovacuum's first
    ANALYZE, or with it off) given JOBS jobs of one tenant, each submitted and moved twice.
    Planned as if the table were empty, each write once read the whole table or all of the
    tenant's jobs: 9 million rows in all here, about JOBS**2; the store's own
    ANALYZEs while the table is young (pgschema) keep it near linear (about 165,000, nearly
    all of them while the table was still small enough for a sequential scan to be the
    cheapest plan)."""
    jobs = 3000
    async with postgres_database() as url:
        store = open_store(url)
        await store.open()
        try:
            for i in range(jobs):
                await store.create_job("one", f"job-{i}", "q", 0, {"i": i}, float(i))
                await store.transition("one", f"job-{i}", "Placed", "p", i + 0.5, cluster="c")
                await store.transition("one", f"job-{i}", "Running", "r", i + 0.7)
        finally:
            await store.close()  # its connections end: their counts are reported
        conn = await asyncpg.connect(url)
        try:
            read = await conn.fetchval(
                "SELECT coalesce(seq_tup_read, 0) + coalesce(idx_tup_fetch, 0) "
                "FROM pg_stat_user_tables WHERE relname = 'jobs'"
            )
        finally:
            await conn.close()
    assert read < jobs**2 / 10, f"{read} rows of jobs read for {jobs} jobs' writes"
