"""``fedbroker demo``: the broker on its built-in federation, with load and a live view.

This module owns what a newcomer sees on ``make run``: the demo tenants' tokens (from
``FEDBROKER_DEMO_TOKENS`` or generated and printed once), the banner saying where to look,
the workload generator — which submits a seeded mix of gangs (queue ``training``, tenant
team-a) and small whole or shared-GPU jobs (queue ``inference``, tenant team-b) through the
real HTTP API, pausing while the queues are long — and the live view (``broker.cli.view``,
the same one ``fedbroker top`` draws over HTTP), redrawn in place under the banner on a
terminal, or a status line every few seconds elsewhere (``--plain``). On a terminal nothing
but the view is printed: the logs go to ``demo.log`` in the data dir (``--log-stderr``:
to stderr). Simulated jobs run a seeded 30-300 s, so they finish and capacity churns. The
service itself is ``broker.cli.runtime.serve`` with ``broker.config.demo_config``.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import random
import secrets
import shutil
import sys
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, TextIO

import aiohttp
from rich.console import Console, RenderableType
from rich.panel import Panel
from rich.text import Text

from adapters.simulated import seeded_run_seconds
from broker.cli.runtime import EXIT_USAGE, TaskFactory, configure_logging, serve
from broker.cli.top import add_interval, add_plain, interval_of, live, plain
from broker.cli.view import (
    EVENTS_SHOWN,
    Snapshot,
    banner_panel,
    render,
    snapshot_from_json,
    status_line,
    use_plain,
)
from broker.config import DEMO_TENANTS, ConfigError, demo_config
from broker.manifest.workloads import jobset, pytorchjob
from broker.process import run_loop
from broker.service.facade import Service

log = logging.getLogger("broker.demo")

TOKENS_ENV = "FEDBROKER_DEMO_TOKENS"
DEFAULT_DATA_DIR = Path(".fedbroker-demo")
MAX_PENDING = 40  # the generator pauses while more jobs than this wait in the queues
LOG_FILE = "demo.log"  # in --data-dir, unless --log-stderr


class DemoError(ValueError):
    """A problem with the demo's inputs: one line for the user."""


def parse_tokens(text: str) -> dict[str, str]:
    """``team-a=T1,team-b=T2,admin=T3`` -> {tenant: token}. The message never repeats a
    token, only the tenant names and the variable."""
    tokens: dict[str, str] = {}
    for i, item in enumerate(x.strip() for x in text.split(",")):
        tenant, sep, token = item.partition("=")
        tenant, token = tenant.strip(), token.strip()
        if not sep or not tenant or not token:
            raise DemoError(f"{TOKENS_ENV}: item {i + 1} must be TENANT=TOKEN")
        if tenant not in DEMO_TENANTS:
            raise DemoError(f"{TOKENS_ENV}: unknown tenant {tenant!r} ({', '.join(DEMO_TENANTS)})")
        if tenant in tokens:
            raise DemoError(f"{TOKENS_ENV}: tenant {tenant!r} given twice")
        tokens[tenant] = token
    missing = [t for t in DEMO_TENANTS if t not in tokens]
    if missing:
        raise DemoError(f"{TOKENS_ENV}: missing tenant(s) {', '.join(missing)}")
    return tokens


def demo_tokens(environ: Mapping[str, str]) -> tuple[dict[str, str], bool]:
    """The tokens, and whether they were generated (and so must be printed)."""
    text = environ.get(TOKENS_ENV)
    if text is not None:
        return parse_tokens(text), False
    return {t: secrets.token_urlsafe(18) for t in DEMO_TENANTS}, True


def invoked_as() -> str:
    """How to type this CLI in another terminal: ``fedbroker`` when that is on PATH and is
    this program, else the path it was started by (``.venv/bin/fedbroker`` after
    ``make run``), else the script beside this interpreter, else the module."""
    found = shutil.which("fedbroker")
    started = Path(sys.argv[0])
    if started.name == "fedbroker":
        if found is not None and Path(found).resolve() == started.resolve():
            return "fedbroker"
        return str(started)
    if found is not None:
        return "fedbroker"
    beside = Path(sys.executable).parent / "fedbroker"  # the virtualenv's script
    return str(beside) if beside.exists() else f"{sys.executable} -m broker.cli"


def banner(
    url: str, tokens: Mapping[str, str], generated: bool, data_dir: Path, log: Path | None
) -> str:
    """The banner ``--plain`` prints once: where the API is, the tokens, what to try."""
    lines = [
        f"fedbroker demo: API {url}  (readiness {url}/readyz, metrics {url}/metrics)",
        f"  data dir {data_dir} (restart with the same --data-dir to keep every job)",
        f"  logs {log if log is not None else 'on stderr (--log-stderr)'}",
        "  clusters onprem-a, onprem-b (simulated openb nodes) and cloud-burst (A100 pool)",
    ]
    if generated:
        lines.append(f"  tokens (generated; set {TOKENS_ENV} to choose them):")
        lines += [f"    {tenant:<7} {token}" for tenant, token in tokens.items()]
    else:
        lines.append(f"  tokens: from {TOKENS_ENV}")
    shown = tokens["team-a"] if generated else "<team-a token>"
    admin = tokens["admin"] if generated else "<admin token>"
    cli = invoked_as()
    lines += [
        f"  dashboard: {url}/#token={admin}",
        "  try, in another terminal:",
        f"    export FEDBROKER_TOKEN={shown} FEDBROKER_SERVER={url}",
        f"    {cli} submit -f deploy/examples/job.yaml",
        f"    {cli} top",
        f"    {cli} list",
        "  stop with Ctrl-C (or SIGTERM)",
    ]
    return "\n".join(lines)


def banner_view(
    url: str, tokens: Mapping[str, str], generated: bool, data_dir: Path, log: Path | None
) -> Panel:
    """The banner on top of the live view: the same facts, fewer lines."""
    admin = tokens["admin"] if generated else "<admin token>"

    def row(label: str, *parts: str | tuple[str, str]) -> Text:
        text = Text(f"{label:<10}", style="bold")
        for part in parts:
            text.append(*(part if isinstance(part, tuple) else (part,)))
        return text

    if generated:
        pairs: list[str | tuple[str, str]] = []
        for tenant, token in tokens.items():
            pairs += [f"{tenant} ", (token, "cyan"), "   "]
        tokens_row = row("tokens", *pairs)
    else:
        tokens_row = row("tokens", f"from {TOKENS_ENV}")
    team_a = tokens["team-a"] if generated else "<team-a token>"
    cli = invoked_as()
    lines = [
        row("API", (url, "cyan"), f"   readiness {url}/readyz   metrics {url}/metrics"),
        row("dashboard", (f"{url}/#token={admin}", "cyan")),
        tokens_row,
        row("try", f"FEDBROKER_SERVER={url} FEDBROKER_TOKEN={team_a} {cli} top"),
        row("", f"(or: {cli} submit -f deploy/examples/job.yaml, {cli} list)"),
        row("logs", str(log) if log is not None else "on stderr (--log-stderr)",
            f"   data dir {data_dir}"),
        row("stop", "Ctrl-C"),
    ]  # fmt: skip
    return banner_panel(lines, "fedbroker demo")


# --- the workload generator ------------------------------------------------------------


def draw_manifest(rng: random.Random, run_id: str, seq: int) -> tuple[str, dict[str, Any]]:
    """(tenant, manifest): a gang for team-a's training queue (one in four; allowed to burst,
    and one in seven of them asks for A100s, which only the cloud pool has; one in twenty
    of all is a JobSet or PyTorchJob: ``workload_manifest``), else a small job for team-b's
    inference queue, on one whole GPU or a quarter or half of one."""
    if rng.random() < 0.05:  # now and then a JobSet or a PyTorchJob, as teams run them
        return "team-a", workload_manifest(rng, f"wl-{run_id}-{seq:05d}")
    placement: dict[str, Any] = {}
    if rng.random() < 0.25:
        pods, gpus = rng.randint(2, 8), rng.choice((4, 8))
        resources: dict[str, Any] = {
            "nvidia.com/gpu": gpus, "cpu": str(8 * gpus), "memory": f"{32 * gpus}Gi"
        }  # fmt: skip
        tenant, queue, policy = "team-a", "training", "gang"
        gang = {"minMember": pods, "scheduleTimeoutSeconds": 600}
        placement = {"allowBurst": True}
        if rng.random() < 0.15:  # A100 only: no on-prem cluster has them, so it bursts
            placement["gpuTypes"] = ["A100"]
            pods, resources = rng.randint(2, 4), {"nvidia.com/gpu": 8, "cpu": "64",
                                                  "memory": "512Gi"}  # fmt: skip
            gang["minMember"] = pods
    else:
        pods, gang = 1, {}
        if rng.random() < 0.5:
            resources = {"nvidia.com/gpu": 1, "cpu": "4", "memory": "16Gi"}
        else:
            resources = {"fedbroker.io/gpu-milli": rng.choice((250, 500)), "cpu": "2",
                         "memory": "8Gi"}  # fmt: skip
        tenant, queue, policy = "team-b", "inference", "binpack"
    spec: dict[str, Any] = {
        "queue": queue,
        "policy": policy,
        "podSets": [{"name": "worker", "count": pods, "resources": resources}],
    }
    if gang:
        spec["gang"] = gang
    if placement:
        spec["placement"] = placement
    name = f"{'gang' if gang else 'small'}-{run_id}-{seq:05d}"
    manifest = {"apiVersion": "fedbroker.io/v1alpha1", "kind": "FederatedJob",
                "metadata": {"name": name}, "spec": spec}  # fmt: skip
    return tenant, manifest


def workload_manifest(rng: random.Random, name: str) -> dict[str, Any]:
    """A small JobSet (2 to 4 one-GPU workers) or PyTorchJob (a master and 1 to 3 workers
    of one GPU each) for team-a's training queue, embedded as ``spec.workload``."""
    limits = {"nvidia.com/gpu": 1, "cpu": "4", "memory": "16Gi"}
    container = {"name": "train", "image": "nvcr.io/nvidia/pytorch:24.05-py3",
                 "resources": {"limits": limits}}  # fmt: skip
    pod = {"spec": {"restartPolicy": "Never", "containers": [container]}}
    workers = rng.randint(1, 3)
    if rng.random() < 0.5:
        job_template = {"spec": {"parallelism": workers + 1, "template": pod}}
        replicated = [{"name": "workers", "template": job_template}]
        obj: dict[str, Any] = {"apiVersion": jobset.API_VERSION, "kind": jobset.KIND,
                               "spec": {"replicatedJobs": replicated}}  # fmt: skip
    else:
        # The training operator wants its container named "pytorch".
        pod = {"spec": {**pod["spec"], "containers": [{**container, "name": "pytorch"}]}}
        replicas = {"Master": {"replicas": 1, "template": pod},
                    "Worker": {"replicas": workers, "template": pod}}  # fmt: skip
        obj = {"apiVersion": pytorchjob.API_VERSION, "kind": pytorchjob.KIND,
               "spec": {"pytorchReplicaSpecs": replicas}}  # fmt: skip
    spec = {"queue": "training", "policy": "gang", "workload": obj,
            "placement": {"allowBurst": True}}  # fmt: skip
    return {"apiVersion": "fedbroker.io/v1alpha1", "kind": "FederatedJob",
            "metadata": {"name": name}, "spec": spec}  # fmt: skip


def workload(tokens: Mapping[str, str], seed: int, per_second: float = 2.0) -> TaskFactory:
    """The generator as a supervisor task: submits through the HTTP API until cancelled."""

    async def run(service: Service, url: str) -> None:
        rng = random.Random(seed)
        run_id = secrets.token_hex(3)  # a restart with the same seed submits new names
        headers = {t: {"Authorization": f"Bearer {tok}"} for t, tok in tokens.items()}
        timeout = aiohttp.ClientTimeout(total=10)
        sent = 0
        async with aiohttp.ClientSession(base_url=url, timeout=timeout) as session:
            while True:
                await asyncio.sleep(rng.expovariate(per_second))
                if _pending(service) > MAX_PENDING:
                    continue
                tenant, body = draw_manifest(rng, run_id, sent)
                sent += 1
                try:
                    async with session.post("/v1/jobs", json=body, headers=headers[tenant]) as r:
                        if r.status >= 400:
                            text = await r.text()
                            log.warning("workload: submit answered %s: %s", r.status, text)
                except (aiohttp.ClientError, TimeoutError) as exc:
                    log.warning("workload: submit failed: %s", exc)

    return run


def _pending(service: Service) -> int:
    return sum(q.pending for q in service.view.queues())


# --- the live view ---------------------------------------------------------------------


def snapshot(service: Service, events: Iterable[Mapping[str, Any]] = ()) -> Snapshot:
    """The view's rows from the service's own read model, as the API would serve them."""
    return snapshot_from_json(
        time.time(), {"clusters": service.clusters()}, {"queues": service.queues()},
        service.burst(None), events, source="in-process",
    )  # fmt: skip


async def _snapshots(service: Service, interval: float) -> AsyncIterator[Snapshot]:
    """A snapshot every ``interval`` seconds, with the last job events (every tenant's)
    gathered from the service's bus while waiting for the next."""
    loop = asyncio.get_running_loop()
    events: deque[Mapping[str, Any]] = deque(maxlen=EVENTS_SHOWN)
    sub = service.bus.subscribe(None)
    try:
        while True:
            yield snapshot(service, events)
            deadline = loop.time() + interval
            while (left := deadline - loop.time()) > 0:
                if sub.closed:
                    await asyncio.sleep(left)
                    break
                event = await sub.next(timeout=left)
                if event is not None and event.kind == "job":
                    events.append(event.data)
    finally:
        service.bus.unsubscribe(sub)


def live_view(console: Console, header: Callable[[str], RenderableType],
              interval: float) -> TaskFactory:  # fmt: skip
    """The view redrawn in place every ``interval`` seconds under ``header(url)``."""

    async def run(service: Service, url: str) -> None:
        top = header(url)
        await live(console, (render(s, top) async for s in _snapshots(service, interval)))

    return run


def status_lines(out: TextIO, interval: float) -> TaskFactory:
    """A status line every ``interval`` seconds (``--plain``)."""

    async def run(service: Service, url: str) -> None:
        await plain(out, (status_line(s) async for s in _snapshots(service, interval)))

    return run


# --- the command -----------------------------------------------------------------------


def add_demo_command(sub: Any) -> None:
    cmd = sub.add_parser("demo", help="run the broker on simulated clusters with a workload")
    cmd.add_argument("--host", default="127.0.0.1", help="listen address (default 127.0.0.1)")
    cmd.add_argument("--port", type=int, default=8080, help="listen port (default 8080)")
    cmd.add_argument(
        "--data-dir", type=Path, default=DEFAULT_DATA_DIR,
        help=f"where the jobs and the log file are kept (default {DEFAULT_DATA_DIR})",
    )  # fmt: skip
    cmd.add_argument("--no-workload", action="store_true",
                     help="do not generate jobs (default: generate them)")  # fmt: skip
    cmd.add_argument("--seed", type=int, default=1,
                     help="seeds the workload and run times (default 1)")  # fmt: skip
    add_plain(cmd)
    add_interval(cmd)
    cmd.add_argument(
        "--log-stderr", action="store_true",
        help=f"log to stderr (default: to the file {LOG_FILE} in --data-dir; nothing but "
        "the view goes to the terminal)",
    )  # fmt: skip


def _log_to_file(path: Path) -> None:
    """Point this process's stderr (file descriptor 2) at ``path``, appended: every log
    line, warning and traceback goes there, and nothing but the view to the terminal."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    sys.stderr.flush()
    os.dup2(fd, 2)
    os.close(fd)


def run_demo(args: argparse.Namespace, environ: Mapping[str, str] | None = None) -> int:
    environ = os.environ if environ is None else environ
    log_path = None if args.log_stderr else args.data_dir / LOG_FILE
    try:
        tokens, generated = demo_tokens(environ)
        if not 0 <= args.port <= 65_535:
            raise DemoError(f"--port must be within 0..65535, not {args.port}")
        try:
            args.data_dir.mkdir(parents=True, exist_ok=True)
            if log_path is not None:
                _log_to_file(log_path)
        except OSError as exc:
            raise DemoError(f"--data-dir {args.data_dir}: {exc.strerror}") from None
        config = demo_config(args.data_dir, tokens)
    except (DemoError, ConfigError) as exc:
        sys.stderr.write(f"fedbroker: error: {exc}\n")
        return EXIT_USAGE
    is_plain = use_plain(args.plain, sys.stdout, environ)
    interval = interval_of(args, is_plain)
    configure_logging(logging.INFO, secrets=tokens.values())
    logging.captureWarnings(True)  # into the log, not onto the view

    def on_listening(url: str) -> None:
        if is_plain:
            print(banner(url, tokens, generated, args.data_dir, log_path), flush=True)

    if is_plain:
        table = status_lines(sys.stdout, interval)
    else:

        def header(url: str) -> RenderableType:
            return banner_view(url, tokens, generated, args.data_dir, log_path)

        table = live_view(Console(file=sys.stdout), header, interval)
    code = run_loop(
        serve(
            config, host=args.host, port=args.port, on_listening=on_listening, table=table,
            workload=None if args.no_workload else workload(tokens, args.seed),
            run_seconds=seeded_run_seconds(args.seed),
        )
    )  # fmt: skip
    if not is_plain:
        where = f"; logs in {log_path}" if log_path is not None else ""
        print(f"fedbroker demo stopped (exit {code}){where}", flush=True)
    return code


__all__ = [
    "DemoError", "add_demo_command", "banner", "banner_view", "draw_manifest", "parse_tokens",
    "run_demo", "snapshot",
]  # fmt: skip
