"""``fedbroker bench --soak``: the real service under a steady stream of jobs that end, for
as long as it takes to see whether its cost per job stays flat as work accumulates.

As ``--e2e`` (``broker.bench.serving``): the broker in this process, an open-loop HTTP
load generator in another. Jobs are a mix as in the demo (one in four a gang of 2-8 pods of
4 or 8 GPUs, queue ``training``; the rest one pod of a whole GPU or a quarter or half of
one, queue ``inference``); the simulated members end each job after a seeded run time
(``seeded_run_seconds``) drawn so that the federation stays about ``BUSY`` full. One row per
``window`` jobs: what the generator saw (201 latency, submissions/s) and what the broker's
own probes saw (``broker.bench.probes``: loop lag, GC pauses, submit->placed, CPU, RSS,
store size). A benchmark, not a test: nothing fails on a slow machine.
"""

from __future__ import annotations

import asyncio
import gc
import json
import math
import multiprocessing
import queue
import random
import secrets
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg

from adapters.simulated import seeded_run_seconds
from broker.bench.probes import Probes, probing, rss_mib, store_bytes
from broker.bench.restart import bench_store
from broker.bench.serving import bench_config, open_loop, percentile, serving
from broker.process import run_loop, settle_heap
from broker.service.facade import Service
from broker.store.sqlite import SqliteStore

BUSY = 0.8  # the share of the federation's GPUs the offered work keeps busy, on average
GANG_SHARE = 0.25
GANG_PODS = (2, 8)  # uniform, inclusive
GANG_GPUS = (4, 8)  # GPUs per gang pod, either
SHARES_MILLI = (250, 500)  # a single pod's share of one GPU, either (else one whole GPU)
MEAN_GPUS_PER_JOB = GANG_SHARE * (sum(GANG_PODS) / 2) * (sum(GANG_GPUS) / 2) + (1 - GANG_SHARE) * (
    0.5 * 1 + 0.5 * sum(SHARES_MILLI) / 2 / 1000
)
QUEUES = {"inference": "binpack", "training": "gang"}
GPUS_PER_NODE = 8  # bench_config's node shape
MESSAGE_WAIT_SECONDS = 5.0


@dataclass(frozen=True)
class SoakLoad:
    jobs: int
    rate: float
    window: int
    seed: int
    run_id: str  # in every job name: a second run on the same store submits new jobs


def soak_manifest(rng: random.Random, name: str) -> dict[str, Any]:
    """One job of the mix (see the module docstring)."""
    spec: dict[str, Any]
    if rng.random() < GANG_SHARE:
        pods, gpus = rng.randint(*GANG_PODS), rng.choice(GANG_GPUS)
        resources: dict[str, Any] = {
            "nvidia.com/gpu": gpus, "cpu": str(8 * gpus), "memory": f"{32 * gpus}Gi"
        }  # fmt: skip
        spec = {"queue": "training", "gang": {"minMember": pods, "scheduleTimeoutSeconds": 600}}
    else:
        pods = 1
        if rng.random() < 0.5:
            resources = {"nvidia.com/gpu": 1, "cpu": "4", "memory": "16Gi"}
        else:
            resources = {"fedbroker.io/gpu-milli": rng.choice(SHARES_MILLI), "cpu": "2",
                         "memory": "8Gi"}  # fmt: skip
        spec = {"queue": "inference"}
    spec["podSets"] = [{"name": "worker", "count": pods, "resources": resources}]
    return {"apiVersion": "fedbroker.io/v1alpha1", "kind": "FederatedJob",
            "metadata": {"name": name}, "spec": spec}  # fmt: skip


def mean_run_seconds(gpus: int, rate: float) -> float:
    """Little's law: busy GPUs = rate x mean GPUs per job x mean run time."""
    return BUSY * gpus / (rate * MEAN_GPUS_PER_JOB)


def ms(values: list[float], pct: float) -> float | None:
    value = percentile(values, pct)
    return None if math.isnan(value) else round(1000 * value, 2)


# -- the load generator's process ----------------------------------------------------------


@dataclass
class _Window:
    size: int
    answered: int = 0
    failed: int = 0
    first_sent: float = math.inf
    last_answer: float = 0.0
    acked: list[float] = field(default_factory=list)


class Windows:
    """Tallies answers per window of jobs and ``emit``s each window's summary, in order,
    once all of its submissions are answered."""

    def __init__(self, jobs: int, window: int, emit: Callable[[dict[str, Any]], None]) -> None:
        self._jobs, self._window, self._emit = jobs, window, emit
        self._open: dict[int, _Window] = {}
        self._next = 0

    def answered(self, i: int, started: float, finished: float, ok: bool) -> None:
        index = i // self._window
        size = min(self._window, self._jobs - index * self._window)
        w = self._open.setdefault(index, _Window(size))
        w.answered += 1
        w.first_sent = min(w.first_sent, started)
        w.last_answer = max(w.last_answer, finished)
        if ok:
            w.acked.append(finished - started)
        else:
            w.failed += 1
        while (done := self._open.get(self._next)) is not None and done.answered == done.size:
            del self._open[self._next]
            self._next += 1
            self._emit(self._summary(done))

    def _summary(self, w: _Window) -> dict[str, Any]:
        span = w.last_answer - w.first_sent
        return {
            "jobs_submitted": min(self._jobs, self._next * self._window),
            "window_jobs": w.size,
            "failed": w.failed,
            "submissions_per_s": round(len(w.acked) / span, 1) if span > 0 else None,
            "ack_p50_ms": ms(w.acked, 50),
            "ack_p99_ms": ms(w.acked, 99),
        }


def _generate(base: str, token: str, load: SoakLoad, out: Any) -> None:
    settle_heap()
    rng = random.Random(load.seed)

    def body(i: int) -> bytes:
        return json.dumps(soak_manifest(rng, f"soak-{load.run_id}-{i:07d}")).encode()

    windows = Windows(load.jobs, load.window, out.put)
    run_loop(open_loop(base, token, load.jobs, load.rate, body, windows.answered))
    out.put(None)


# -- the broker's process ------------------------------------------------------------------


@dataclass(frozen=True)
class SoakSettings:
    load: SoakLoad
    clusters: int
    nodes_per_cluster: int
    store_url: str | None  # None: SQLite in a temporary directory
    retention_seconds: float = 600.0  # finished jobs kept this long (retention config)


async def run_soak(
    settings: SoakSettings, on_row: Callable[[dict[str, Any]], None]
) -> list[dict[str, Any]]:
    """Every window's row, in order (each also handed to ``on_row`` as it is measured)."""
    token = secrets.token_urlsafe(32)
    gpus = settings.clusters * settings.nodes_per_cluster * GPUS_PER_NODE
    mean_run = mean_run_seconds(gpus, settings.load.rate)
    run_seconds = seeded_run_seconds(settings.load.seed, 0.5 * mean_run, 1.5 * mean_run)
    # A fresh database even on a given server: jobs left live there by an earlier run would
    # be rebuilt and hold capacity (a run on a used database measured a full federation).
    with tempfile.TemporaryDirectory(prefix="fedbroker-soak-") as tmp:
        async with bench_store(settings.store_url, Path(tmp), "soak.db") as url:
            config = bench_config(
                url, token, settings.clusters, settings.nodes_per_cluster, QUEUES,
                retention_seconds=settings.retention_seconds,
            )  # fmt: skip
            async with serving(config, run_seconds=run_seconds) as (service, base):
                return await _drive(service, base, token, settings.load, url, on_row)


async def _drive(
    service: Service,
    base: str,
    token: str,
    load: SoakLoad,
    url: str,
    on_row: Callable[[dict[str, Any]], None],
) -> list[dict[str, Any]]:
    ctx = multiprocessing.get_context("spawn")
    messages: Any = ctx.Queue()
    generator = ctx.Process(target=_generate, args=(base, token, load, messages))
    rows: list[dict[str, Any]] = []
    async with probing(service.bus) as probes:
        cpu = time.process_time()
        generator.start()
        try:
            while (window := await _next_message(messages, generator)) is not None:
                now = time.process_time()
                cpu_ms = round(1000 * (now - cpu) / window["window_jobs"], 3)
                cpu = now
                row = {
                    **window,
                    **await _broker_row(service, probes, url),
                    "cpu_ms_per_job": cpu_ms,
                }
                rows.append(row)
                on_row(row)
        finally:
            await asyncio.to_thread(generator.join, 30)
    return rows


async def _broker_row(service: Service, probes: Probes, url: str) -> dict[str, Any]:
    """What the broker's process saw since the last row (its probes' samples) and holds now.
    Reading the totals costs O(clusters + live jobs) once a window (GPU use, queued gangs)."""
    probes.check()
    gc_pauses, placed, lags = probes.pauses.take(), probes.placements.take(), probes.lag.take()
    full_passes = probes.pauses.take_full()
    gpus = [t for c in service.view.clusters() for t in c.gpu_types]
    total = sum(t.total for t in gpus)
    return {
        "live_jobs": len(service.lifecycle.launches()),
        "queued_jobs": len(service.queue),
        "queued_gangs": len(service.queue.pending("training")),
        "gpu_busy_pct": round(100 * sum(t.total - t.free for t in gpus) / max(1, total), 1),
        "placed": len(placed),
        "submit_to_placed_p99_ms": ms(placed, 99),
        "loop_lag_p99_ms": ms(lags, 99),
        # One sample per wake-up: a long stall is one sample, which the p99 may not show.
        "loop_lag_max_ms": round(1000 * max(lags, default=0.0), 2),
        "gc_pause_p99_ms": ms(gc_pauses, 99),
        "gc_pause_max_ms": round(1000 * max(gc_pauses, default=0.0), 2),
        "gc_collections": len(gc_pauses),
        "gc_full_passes": len(full_passes),
        "gc_full_max_ms": round(1000 * max(full_passes, default=0.0), 2),
        # Objects frozen by full passes (broker.process.freeze_after_full_passes): growing
        # while live jobs are steady would be cycles leaked by the freezing.
        "gc_frozen": gc.get_freeze_count(),
        "rss_mib": round(rss_mib(), 1),
        "store_mib": round(await store_bytes(url) / (1024 * 1024), 1),
        "store_write_max_ms": _slowest_write_ms(service),
    }


def _slowest_write_ms(service: Service) -> float | None:
    """SQLite: the slowest group of writes in the window (BEGIN to COMMIT, its fsync
    included), which every write behind it waited for. None on PostgreSQL."""
    store = getattr(service.store, "inner", service.store)
    if not isinstance(store, SqliteStore):
        return None
    return round(1000 * store.take_slowest_write(), 1)


async def _next_message(messages: Any, generator: Any) -> dict[str, Any] | None:
    """The generator's next window (None: it is done), waited for in a thread so the broker
    keeps serving; an error if the generator died without saying it was done."""
    while True:
        try:
            message: dict[str, Any] | None = await asyncio.to_thread(
                messages.get, True, MESSAGE_WAIT_SECONDS
            )
            return message
        except queue.Empty:
            if not generator.is_alive():
                raise RuntimeError(f"the load generator exited ({generator.exitcode})") from None


# -- the command --------------------------------------------------------------------------

COLUMNS = [  # (heading, key, width)
    ("JOBS", "jobs_submitted", 9), ("LIVE", "live_jobs", 7), ("QUEUED", "queued_jobs", 7),
    ("GANGS-Q", "queued_gangs", 7), ("GPU%", "gpu_busy_pct", 5),
    ("SUBM/S", "submissions_per_s", 7), ("201-P50", "ack_p50_ms", 8),
    ("201-P99", "ack_p99_ms", 8), ("PLACED-P99", "submit_to_placed_p99_ms", 10),
    ("CPU/JOB", "cpu_ms_per_job", 8), ("LAG-P99", "loop_lag_p99_ms", 8),
    ("LAG-MAX", "loop_lag_max_ms", 8),
    ("GC-P99", "gc_pause_p99_ms", 7), ("GC-N", "gc_collections", 6),
    ("FULL-N", "gc_full_passes", 6), ("FULL-MAX", "gc_full_max_ms", 8),
    ("FROZEN", "gc_frozen", 8),
    ("RSS-MIB", "rss_mib", 8), ("STORE-MIB", "store_mib", 9),
    ("WRITE-MAX", "store_write_max_ms", 9), ("FAILED", "failed", 6),
]  # fmt: skip


def table_header() -> str:
    return " ".join(f"{heading:>{width}}" for heading, _, width in COLUMNS)


def table_row(row: dict[str, Any]) -> str:
    cells = []
    for _, key, width in COLUMNS:
        value = row.get(key)
        cells.append(f"{'-' if value is None else value:>{width}}")
    return " ".join(cells)


def plot(rows: list[dict[str, Any]], path: str | Path) -> None:
    """CPU per job, the p99s and RSS against jobs submitted, one panel each, in ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    jobs = [row["jobs_submitted"] for row in rows]
    fig, (cpu, p99, rss) = plt.subplots(3, 1, sharex=True, figsize=(8, 9))
    cpu.plot(jobs, [row["cpu_ms_per_job"] for row in rows], marker="o")
    cpu.set_ylabel("broker CPU per job (ms)")
    p99s = [("ack_p99_ms", "201"), ("submit_to_placed_p99_ms", "submit->placed"),
            ("loop_lag_p99_ms", "loop lag"), ("gc_pause_p99_ms", "GC pause")]  # fmt: skip
    for key, label in p99s:
        values = [math.nan if row[key] is None else row[key] for row in rows]
        p99.plot(jobs, values, marker="o", label=label)
    p99.set_ylabel("p99 (ms, log scale)")
    p99.set_yscale("log")  # from a few ms (loop lag) to seconds (a backlog's placements)
    p99.legend()
    rss.plot(jobs, [row["rss_mib"] for row in rows], marker="o")
    rss.set_ylabel("broker RSS (MiB)")
    rss.set_xlabel("jobs submitted")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def store_description(store: str | None) -> str:
    """The store as the header names it; on PostgreSQL with the server's autovacuum
    setting, without which the tables bloat and every write slows down as a run goes on
    (docs/operations.md): a table of figures must say which it was."""
    if not store or store.startswith("sqlite"):
        return "SQLite store"

    async def autovacuum() -> str:
        conn = await asyncpg.connect(store)
        try:
            return str(await conn.fetchval("SHOW autovacuum"))
        finally:
            await conn.close()

    return f"PostgreSQL store (server autovacuum {run_loop(autovacuum())})"


def main_soak(args: Any) -> int:
    """``fedbroker bench --soak``: prints each row as its window ends (``--json``: all of
    them at the end, as a list)."""
    load = SoakLoad(args.jobs, float(args.rate), args.window, args.seed, secrets.token_hex(3))
    settings = SoakSettings(
        load, args.clusters, args.nodes_per_cluster, args.store, float(args.retention)
    )
    if not args.json:
        gpus = args.clusters * args.nodes_per_cluster * GPUS_PER_NODE
        store = store_description(args.store)
        print(
            f"soak over HTTP: {args.jobs} jobs offered at {args.rate}/s to {args.clusters} "
            f"simulated clusters x {args.nodes_per_cluster} nodes ({gpus} GPUs), {store}; "
            f"mean run {mean_run_seconds(gpus, load.rate):.1f} s for {BUSY:.0%} busy; "
            f"finished jobs kept {args.retention:g} s"
        )
        print("latencies in ms, CPU per job in ms of the broker's process")
        print(table_header(), flush=True)

    def on_row(row: dict[str, Any]) -> None:
        if not args.json:
            print(table_row(row), flush=True)

    rows = run_loop(run_soak(settings, on_row))
    if args.json:
        print(json.dumps(rows))
    if args.plot:
        plot(rows, args.plot)
    return 0


__all__ = [
    "SoakLoad",
    "SoakSettings",
    "Windows",
    "main_soak",
    "mean_run_seconds",
    "run_soak",
    "soak_manifest",
    "store_description",
]
