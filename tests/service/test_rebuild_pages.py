"""The rebuild after a restart, over several pages: every live job back in the queue once,
the placed ones requeued in the store, and a job another writer moves between the page's
read and its batch settled by what it is now (queued if Queued, left alone if finished)."""

from __future__ import annotations

import asyncio
import json
import sqlite3
from collections.abc import Awaitable
from pathlib import Path
from typing import Any

import pytest

from broker.bench.restart import job_name, load_statements, write_all
from broker.bench.serving import bench_document
from broker.config import parse_config
from broker.manifest import ManifestError
from broker.service import recovery
from broker.service.facade import Service
from broker.store import JobRecord, open_store

JOBS = 25


async def stored_jobs(tmp_path: Path) -> str:
    """A SQLite store holding JOBS live jobs (Queued, Placed, Running in turn); its URL."""
    url = f"sqlite://{tmp_path / 'jobs.db'}"
    store = open_store(url)
    await store.open()
    await store.close()
    await write_all(url, load_statements("sqlite", JOBS, insert=True))
    return url


async def paged_service(url: str, monkeypatch: pytest.MonkeyPatch) -> Service:
    """A service on ``url`` whose rebuild reads pages of 4 jobs, its store open."""
    monkeypatch.setattr(recovery, "REBUILD_PAGE", 4)
    config = parse_config(json.dumps(bench_document(url, "x" * 43, 1, 4)), "test", {})
    service = Service(config)
    await service.store.open()
    return service


async def test_every_job_back_over_pages_and_moved_ones_settled(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    service = await paged_service(await stored_jobs(tmp_path), monkeypatch)
    inner = service.shared.store
    read = inner.active_jobs
    pages: list[list[JobRecord]] = []

    async def page_then_another_writer(**kwargs: Any) -> list[JobRecord]:
        page = await read(**kwargs)
        if not pages and page:  # after the first page is read, before its batch
            placed = [r for r in page if r.state != "Queued"]
            await inner.transition(placed[0].tenant, placed[0].name, "Succeeded", "done", 5.0)
            await inner.transition(placed[1].tenant, placed[1].name, "Queued", "other", 5.0)
        pages.append(page)
        return page

    monkeypatch.setattr(inner, "active_jobs", page_then_another_writer)
    try:
        await service.campaign()
        finished = {r.name for r in await inner.list_jobs(state="Succeeded")}
        active = await inner.list_jobs(state=("Queued", "Placed", "Running"), limit=100)
        assert len(finished) == 1 and len(active) == JOBS - 1
        assert {r.state for r in active} == {"Queued"}
        queued = {p.job.name for p in service.shared.queue.pending()}
        assert queued == {r.name for r in active}
        assert [len(p) for p in pages] == [4, 4, 4, 4, 4, 4, 1, 0]
    finally:
        await service.close()


async def test_a_refused_spec_stops_the_rebuild_with_no_batch_left_running(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Two pages' batches are in flight while one page's entries are built: when a stored
    # spec is refused now, both are settled before the error goes on, none left behind.
    url = await stored_jobs(tmp_path)
    with sqlite3.connect(tmp_path / "jobs.db") as conn:  # job 9: the third page's second
        conn.execute(
            "UPDATE jobs SET manifest = json_set(manifest, '$.spec.podSets[0].count', 0) "
            "WHERE name = ?",
            (job_name(9),),
        )
    service = await paged_service(url, monkeypatch)
    inner = service.shared.store
    writes: list[asyncio.Future[list[JobRecord]]] = []
    batch = inner.transition_many

    def counted(*args: Any) -> Awaitable[list[JobRecord]]:
        write = asyncio.ensure_future(batch(*args))
        writes.append(write)
        return write

    monkeypatch.setattr(inner, "transition_many", counted)
    try:
        with pytest.raises(ManifestError, match="count"):
            await service.recovery.elected()
        assert len(writes) == 4  # pages 1-4 started: the refused one and the next in flight
        assert all(write.done() for write in writes)
        assert not service.shared.rebuilt
    finally:
        await service.close()
