"""The probes ``bench --soak`` runs inside the broker's process, read once per window:
event-loop lag, garbage-collector pauses, submit->placed latency from the service's own job
events, and the figures read off the process and the store (CPU, RSS, bytes on disk).

Each probe keeps only what arrived since it was last read (``take``), so reading one costs
O(window), never O(all jobs); the placement probe also holds the jobs submitted and not yet
placed (O(queued)). Their own cost is part of the broker's CPU they report, as a metrics
exporter's would be.
"""

from __future__ import annotations

import asyncio
import gc
import os
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from broker.bench.decisions import max_rss_mib
from broker.service.events import EventBus
from broker.store import sqlite_path

LAG_PERIOD_SECONDS = 0.01
# Our tables, for the size of a PostgreSQL store (the database may hold others).
STORE_TABLES = ["jobs", "job_history", "job_generations", "leases", "schema_migrations"]


@dataclass(eq=False)
class LoopLag:
    """Sleeps ``LAG_PERIOD_SECONDS`` again and again and records how late it wakes: the
    time every other task waited behind whatever held the loop."""

    samples: list[float] = field(default_factory=list)

    async def run(self) -> None:
        while True:
            before = time.perf_counter()
            await asyncio.sleep(LAG_PERIOD_SECONDS)
            self.samples.append(max(0.0, time.perf_counter() - before - LAG_PERIOD_SECONDS))

    def take(self) -> list[float]:
        taken, self.samples = self.samples, []
        return taken


@dataclass(eq=False)
class GcPauses:
    """Every collection's pause, timed by ``gc.callbacks`` (start -> stop), while entered;
    full passes (generation 2) are also kept apart."""

    pauses: list[float] = field(default_factory=list)
    full: list[float] = field(default_factory=list)
    _started: float = 0.0

    def _callback(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
            return
        pause = time.perf_counter() - self._started
        self.pauses.append(pause)
        if info.get("generation") == 2:
            self.full.append(pause)

    def __enter__(self) -> GcPauses:
        gc.callbacks.append(self._callback)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self._callback)

    def take(self) -> list[float]:
        taken, self.pauses = self.pauses, []
        return taken

    def take_full(self) -> list[float]:
        taken, self.full = self.full, []
        return taken


class Placements:
    """Submit -> placed seconds of each job placed since the last ``take``, on the server's
    clock, from the job events every committed store write publishes: a job's creation
    (Queued, attempt 0) to its first Placed, as ``bench --e2e`` reads them from the stored
    history. The subscription is unbounded, so no event is dropped."""

    def __init__(self, bus: EventBus) -> None:
        self._bus = bus
        self._sub = bus.subscribe(None, queue_size=0)
        self._submitted: dict[str, float] = {}  # placed ones leave: O(queued jobs)
        self.latencies: list[float] = []
        self.placed = 0  # jobs seen placed since the probe started (take() keeps it)
        self._more = asyncio.Event()

    async def run(self) -> None:
        try:
            while (event := await self._sub.next()) is not None:
                if event.kind != "job":
                    continue
                data = event.data
                key = f"{data['tenant']}/{data['name']}"
                if data["state"] == "Queued" and data["attempts"] == 0:
                    self._submitted.setdefault(key, data["at"])
                elif data["state"] == "Placed":
                    submitted = self._submitted.pop(key, None)
                    if submitted is not None:
                        self.latencies.append(data["at"] - submitted)
                        self.placed += 1
                        self._more.set()
        finally:
            self._bus.unsubscribe(self._sub)

    def take(self) -> list[float]:
        taken, self.latencies = self.latencies, []
        return taken

    async def wait_placed(self, jobs: int, timeout: float) -> bool:
        """Wait until ``jobs`` jobs have been seen placed (False after ``timeout`` seconds).
        The store holding no queued job is not enough: its last events may not have reached
        this probe yet."""
        try:
            async with asyncio.timeout(timeout):
                while self.placed < jobs:
                    self._more.clear()
                    await self._more.wait()
        except TimeoutError:
            return False
        return True


@dataclass(frozen=True)
class Probes:
    lag: LoopLag
    pauses: GcPauses
    placements: Placements
    tasks: tuple[asyncio.Task[None], ...]

    def check(self) -> None:
        """Raise if a probe's task has ended (it failed): its figures would be empty, not
        wrong, and an empty figure must not read as "nothing happened"."""
        for task in self.tasks:
            if task.done():
                raise RuntimeError(f"probe {task.get_name()} ended") from task.exception()


@asynccontextmanager
async def probing(bus: EventBus) -> AsyncIterator[Probes]:
    """The three probes, running (their tasks cancelled and awaited on exit)."""
    lag, placements = LoopLag(), Placements(bus)
    with GcPauses() as pauses:
        tasks = (
            asyncio.create_task(lag.run(), name="soak-loop-lag"),
            asyncio.create_task(placements.run(), name="soak-placements"),
        )
        try:
            yield Probes(lag, pauses, placements, tasks)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)


def rss_mib() -> float:
    """The process's resident set now (Linux: /proc/self/statm); elsewhere its peak."""
    try:
        resident_pages = int(Path("/proc/self/statm").read_text().split()[1])
    except (OSError, IndexError, ValueError):
        return max_rss_mib()
    return resident_pages * os.sysconf("SC_PAGE_SIZE") / (1024 * 1024)


async def store_bytes(url: str) -> int:
    """The store on disk: SQLite's database, WAL and shared-memory files; PostgreSQL's
    tables of ours with their indexes and TOAST (``pg_total_relation_size``)."""
    if url.lower().startswith(("postgresql://", "postgres://")):
        import asyncpg

        conn = await asyncpg.connect(url)
        try:
            size = await conn.fetchval(
                "SELECT coalesce(sum(pg_total_relation_size(to_regclass(t))), 0)"
                " FROM unnest($1::text[]) AS t",
                STORE_TABLES,
            )
        finally:
            await conn.close()
        return int(size)
    path = sqlite_path(url)
    files = [Path(f"{path}{suffix}") for suffix in ("", "-wal", "-shm")]
    return sum(f.stat().st_size for f in files if f.exists())


__all__ = ["GcPauses", "LoopLag", "Placements", "Probes", "probing", "rss_mib", "store_bytes"]
