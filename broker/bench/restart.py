"""``fedbroker bench --restart``: time to ready after ``kill -9`` with N live jobs.

It writes N live jobs straight into a fresh store (a third each Queued, Placed and Running,
with the manifests and history the service itself would have written: the statements of
``broker.store.sql``), then runs ``fedbroker serve`` on it in a child process, with simulated
members, twice: a first start, ``kill -9`` once ready; the jobs marked Placed/Running again
(as a busy broker leaves them); a second start, ``kill -9`` once ready. Each start is timed
from the process's start to ``/readyz`` answering 200; the rebuild's own seconds come from
the broker's log line (``recovery.REBUILT_LOG``), the requeued count from ``/metrics``;
"ready" is ``/readyz`` 200 as the leader (one identity across restarts, so a restarted
broker takes its PostgreSQL lease back at once).
Both start from the project's bytecode, as an installed broker does (``compile_project``).
Afterwards the store is checked: every job still active, each one's last history row its
state. SQLite in a temporary directory by default; ``--store postgresql://...`` uses a
fresh database on that server (created, then dropped). A benchmark: nothing fails on a
slow machine; a missing job or an inconsistent row is reported, not timed.
"""

from __future__ import annotations

import asyncio
import compileall
import contextlib
import json
import os
import re
import secrets
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import aiohttp
import asyncpg

import broker
from broker.bench.e2e import job_body
from broker.bench.serving import bench_document
from broker.manifest import parse_manifest
from broker.process import run_loop
from broker.service.recovery import REBUILT_LOG
from broker.store import JobState, open_store, sql, sqlite_path
from broker.store.migrations import Dialect

TENANT = "bench"
LIVE: tuple[JobState, ...] = ("Queued", "Placed", "Running")
READY_TIMEOUT_S = 600.0
_REBUILT = re.compile(REBUILT_LOG.replace("%d", r"(\d+)").replace("%.3f", r"([0-9.]+)"))
_REQUEUED = re.compile(r'^fedbroker_requeues_total\{reason="restart"\} (\S+)$', re.M)


def job_name(i: int) -> str:
    return f"job-{i:07d}"


def state_of(i: int) -> JobState:
    return LIVE[i % len(LIVE)]


def simulated_slot(i: int) -> tuple[str, str]:
    """Job ``i``'s (cluster, node) on the simulated members (requeued at a restart, so
    their capacity is never checked)."""
    cluster = f"sim-{i % 20:03d}"
    return cluster, f"{cluster}-n0"


def load_statements(
    dialect: Dialect,
    jobs: int,
    *,
    insert: bool,
    state: Callable[[int], JobState] = state_of,
    slot: Callable[[int], tuple[str, str]] = simulated_slot,
) -> Iterator[sql.Statement]:
    """Each job's insert (when ``insert``), then its moves to Placed and Running up to its
    ``state``, on its ``slot`` (cluster, node): what the service writes for a job it placed
    and saw running. Without ``insert``, every job is put back in its state of LIVE
    (whatever a broker did since). Step by step over all jobs (every insert, then every move
    to Placed, ...): each job's writes keep their order, and equal statements come together
    (``write_all`` sends a run of them to PostgreSQL as one ``executemany``)."""
    wire = parse_manifest(job_body("x"), "application/json").wire()
    if insert:
        for i in range(jobs):
            name = job_name(i)
            manifest = {**wire, "metadata": {**wire["metadata"], "name": name}}
            yield sql.insert_job(dialect, TENANT, name, "bench", 0, manifest, float(i))
    else:  # the ones the broker before placed after ready: queued again
        for i in range(0, jobs, len(LIVE)):
            yield sql.update_job(
                dialect, TENANT, job_name(i), "Queued", "queued", float(jobs + i), cluster=None,
                placement=None, expected=None, attempts=None, not_before=None,
            )  # fmt: skip
    for step in LIVE[1:]:
        for i in range(jobs):
            if LIVE.index(step) > LIVE.index(state(i)):
                continue
            name, (cluster, node) = job_name(i), slot(i)
            pods = [{"pod": f"{TENANT}.{name}-main-0", "node": node}]
            placement = {"job": f"{TENANT}/{name}", "cluster": cluster, "policy": "binpack",
                         "pods": pods}  # fmt: skip
            yield sql.update_job(
                dialect, TENANT, name, step, step.lower(), float(jobs + i), cluster=cluster,
                placement=placement, expected=None, attempts=None, not_before=None,
            )  # fmt: skip


async def load_store(url: str, statements: Iterable[sql.Statement]) -> None:
    """A fresh store's schema, as the broker migrates it, then ``statements`` written."""
    opened = open_store(url)
    await opened.open()
    await opened.close()
    await write_all(url, statements)


async def write_all(url: str, statements: Iterable[sql.Statement]) -> None:
    """The statements in one transaction, straight through the backend's driver."""
    if url.startswith("sqlite"):
        with sqlite3.connect(sqlite_path(url), isolation_level=None) as conn:
            conn.execute("BEGIN")
            for st in statements:
                conn.execute(st.sql, st.args).fetchall()
            conn.execute("COMMIT")
        return
    conn_pg = await asyncpg.connect(url)
    try:
        async with conn_pg.transaction():
            batch: list[sql.Statement] = []
            for st in statements:
                if batch and st.sql != batch[0].sql:
                    await conn_pg.executemany(batch[0].sql, [b.args for b in batch])
                    # Planned without statistics, the next run's updates by name would each
                    # read all of the tenant's jobs (the store ANALYZEs as it grows: pgschema).
                    await conn_pg.execute("ANALYZE jobs")
                    batch = []
                batch.append(st)
            if batch:
                await conn_pg.executemany(batch[0].sql, [b.args for b in batch])
    finally:
        await conn_pg.close()


async def check_store(url: str) -> dict[str, Any]:
    """Active jobs by state, and how many jobs' state is not their last history row's."""
    by_state = "SELECT state, count(*) FROM jobs GROUP BY state"
    odd = (
        "SELECT count(*) FROM jobs j WHERE j.state <> (SELECT h.state FROM job_history h "
        "WHERE h.tenant = j.tenant AND h.name = j.name ORDER BY h.id DESC LIMIT 1)"
    )
    if url.startswith("sqlite"):
        with sqlite3.connect(sqlite_path(url)) as conn:
            states = dict(conn.execute(by_state).fetchall())
            inconsistent = conn.execute(odd).fetchone()[0]
    else:
        conn_pg = await asyncpg.connect(url)
        try:
            states = {r[0]: r[1] for r in await conn_pg.fetch(by_state)}
            inconsistent = await conn_pg.fetchval(odd)
        finally:
            await conn_pg.close()
    active = sum(n for state, n in states.items() if state in LIVE)
    return {"active": active, "states": states, "inconsistent": int(inconsistent)}


@contextlib.asynccontextmanager
async def bench_store(store: str | None, tmp: Path, file: str = "restart.db") -> AsyncIterator[str]:
    """A fresh store's URL: a SQLite ``file`` in ``tmp``, or a new database on the server of
    a ``postgresql://`` URL, dropped afterwards."""
    if store is None or store.startswith("sqlite"):
        yield f"sqlite://{tmp / file}"
        return
    admin = await asyncpg.connect(store)
    name = f"fedbroker_bench_{secrets.token_hex(6)}"
    await admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield urlunsplit(urlsplit(store)._replace(path=f"/{name}"))
    finally:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.close()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# The packages a broker process imports from the project (the rest are installed).
PROJECT_PACKAGES = ("broker", "adapters", "policies")


def project_root() -> Path:
    """Where the child imports this very broker package from, wherever it was imported from
    here."""
    return Path(broker.__file__).resolve().parents[1]


def compile_project() -> None:
    """The project's bytecode written, as installing it would (pip compiles what it
    installs): a restarted broker starts from bytecode, not by compiling its source. Run
    from a source tree with PYTHONDONTWRITEBYTECODE=1 (this sandbox sets it), every start
    compiled the broker again: about 0.3 s of each time to ready."""
    root = project_root()
    for package in PROJECT_PACKAGES:
        compileall.compile_dir(root / package, quiet=1)


async def start_once(config: Path, port: int, token: str, log: Path) -> dict[str, Any]:
    """Start ``fedbroker serve``, time it to ready, read its figures, then ``kill -9`` it."""
    here = str(project_root())
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([here, os.environ.get("PYTHONPATH", "")])}
    base = f"http://127.0.0.1:{port}"
    with log.open("w") as err:
        started = time.perf_counter()
        proc = subprocess.Popen(
            [sys.executable, "-m", "broker.cli", "serve", "--config", str(config),
             "--host", "127.0.0.1", "--port", str(port)],
            stdout=subprocess.DEVNULL, stderr=err, env=env,
        )  # fmt: skip
        try:
            async with aiohttp.ClientSession() as session:
                try:
                    ready_s = await _ready(session, base, proc, started)
                except RuntimeError as exc:  # the child's own words on why it stopped
                    tail = log.read_text(errors="replace").splitlines()[-5:]
                    raise RuntimeError("\n".join([str(exc), *tail])) from None
                # The first scrape, with every requeued job waiting: what a scrape costs
                # the loop with that many queued (its reports must not walk them).
                asked = time.perf_counter()
                metrics = await _get(session, f"{base}/metrics", token)
                metrics_s = time.perf_counter() - asked
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
    found = _REQUEUED.search(metrics)
    rebuilt = _rebuilt(log)
    return {
        "ready_s": round(ready_s, 3),
        "metrics_s": round(metrics_s, 3),
        "rebuild_s": None if rebuilt is None else rebuilt[1],
        "rebuilt_jobs": None if rebuilt is None else rebuilt[0],
        "restored": None if rebuilt is None else rebuilt[2],
        "requeued": int(float(found.group(1))) if found else 0,
    }


async def _ready(
    session: aiohttp.ClientSession, base: str, proc: subprocess.Popen[bytes], started: float
) -> float:
    """Poll /readyz every 10 ms; the seconds from the process's start to its first 200."""
    while time.perf_counter() - started < READY_TIMEOUT_S:
        if proc.poll() is not None:
            raise RuntimeError(f"fedbroker serve exited with {proc.returncode} before ready")
        with contextlib.suppress(aiohttp.ClientError):
            async with session.get(f"{base}/readyz") as resp:
                # Ready as the leader: its state rebuilt (a follower is ready at once).
                if resp.status == 200 and (await resp.json()).get("role") == "leader":
                    return time.perf_counter() - started
        await asyncio.sleep(0.01)
    raise TimeoutError(f"fedbroker serve not ready within {READY_TIMEOUT_S:.0f} s")


async def _get(session: aiohttp.ClientSession, url: str, token: str) -> str:
    async with session.get(url, headers={"Authorization": f"Bearer {token}"}) as resp:
        return await resp.text()


def _rebuilt(log: Path) -> tuple[int, float, int] | None:
    """(jobs, seconds, restored from their pods) from the rebuild's log line (JSON lines:
    the message is ``msg``)."""
    for line in log.read_text(errors="replace").splitlines():
        with contextlib.suppress(ValueError):
            found = _REBUILT.search(str(json.loads(line).get("msg", "")))
            if found:
                return int(found.group(1)), float(found.group(2)), int(found.group(3))
    return None


async def run_restart(jobs: int, clusters: int, nodes: int, store: str | None) -> dict[str, Any]:
    token = secrets.token_urlsafe(32)
    with tempfile.TemporaryDirectory(prefix="fedbroker-restart-") as tmp_dir:
        tmp = Path(tmp_dir)
        async with bench_store(store, tmp) as url:
            dialect: Dialect = "sqlite" if url.startswith("sqlite") else "postgres"
            begin = time.perf_counter()
            await load_store(url, load_statements(dialect, jobs, insert=True))
            load_s = time.perf_counter() - begin
            config = tmp / "config.json"
            doc = bench_document(url, token, clusters, nodes)
            # One identity across restarts, as a restarted replica keeps its own: it takes its
            # lease (PostgreSQL) back at once instead of waiting for it to expire.
            doc["leaderElection"] = {"identity": "restart-bench"}
            config.write_text(json.dumps(doc))
            compile_project()
            first = await start_once(config, free_port(), token, tmp / "first.log")
            # The first start requeued them: placed and running again, as a busy broker's.
            await write_all(url, load_statements(dialect, jobs, insert=False))
            second = await start_once(config, free_port(), token, tmp / "second.log")
            after = await check_store(url)
    return {
        "jobs": jobs, "store": dialect, "clusters": clusters, "nodes_per_cluster": nodes,
        "load_s": round(load_s, 2), "first_start": first, "after_kill": second,
        "jobs_back": after["active"], "states": after["states"],
        "inconsistent": after["inconsistent"],
    }  # fmt: skip


def main_restart(args: Any) -> int:
    """``fedbroker bench --restart``: one row per start of the broker."""
    if getattr(args, "kube", False):
        from broker.bench.restart_kube import run_restart_kube

        doc = run_loop(run_restart_kube(args.jobs, args.clusters, args.store))
        what, members = "Running", "Kubernetes (kmock)"
    else:
        doc = run_loop(run_restart(args.jobs, args.clusters, args.nodes_per_cluster, args.store))
        what, members = ", ".join(LIVE), "simulated"
    if args.json:
        print(json.dumps(doc))
        return 0
    print(
        f"restart: {doc['jobs']} live jobs ({what}) on {doc['store']}, "
        f"{doc['clusters']} {members} clusters x {doc['nodes_per_cluster']} nodes"
    )
    print(f"  {'start':<16}{'jobs':>10}{'requeued':>10}{'time to ready s':>17}{'rebuild s':>11}"
          f"{'/metrics s':>12}")  # fmt: skip
    for label, row in (("first", doc["first_start"]), ("after kill -9", doc["after_kill"])):
        print(f"  {label:<16}{doc['jobs']:>10}{row['requeued']:>10}{row['ready_s']:>17.3f}"
              f"{row['rebuild_s'] if row['rebuild_s'] is not None else '-':>11}"
              f"{row['metrics_s']:>12.3f}")  # fmt: skip
    print(f"  jobs back {doc['jobs_back']} of {doc['jobs']}, inconsistent {doc['inconsistent']}")
    for label, row in (("first", doc["first_start"]), ("after kill -9", doc["after_kill"])):
        if "problems" in row:  # Kubernetes members: restored from their pods, not requeued
            first = f": {row['first_problem']}" if row["problems"] else ""
            print(f"  {label}: {row['restored']} restored from their pods, "
                  f"{row['problems']} warnings or errors{first}")  # fmt: skip
    return 0
