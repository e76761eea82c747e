"""``fedbroker demo``: the broker on its built-in federation, with load and a live view.

This module owns what a newcomer sees on ``make run``: the demo tenants' tokens (from
``FEDBROKER_DEMO_TOKENS`` or generated and printed once), the banner saying where to look,
the workload generator — which submits a seeded mix of gangs (queue ``training``, tenant
team-a) and small whole or shared-GPU jobs (queue ``inference``, tenant team-b) through the
real HTTP API, pausing while the queues are long — and the live table of clusters and
queues. Simulated jobs run a seeded 30-300 s, so they finish and capacity churns. The
service itself is ``broker.cli.runtime.serve`` with ``broker.config.demo_config``.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import random
import secrets
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TextIO

import aiohttp

from adapters.simulated import seeded_run_seconds
from broker.cli.render import table as render_table
from broker.cli.runtime import EXIT_USAGE, TaskFactory, configure_logging, serve
from broker.config import DEMO_TENANTS, ConfigError, demo_config
from broker.process import run_loop
from broker.service.facade import Service

log = logging.getLogger("broker.demo")

TOKENS_ENV = "FEDBROKER_DEMO_TOKENS"
DEFAULT_DATA_DIR = Path(".fedbroker-demo")
MAX_PENDING = 40  # the generator pauses while more jobs than this wait in the queues
TTY_REFRESH_SECONDS = 2.0
LINE_EVERY_SECONDS = 10.0


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


def banner(url: str, tokens: Mapping[str, str], generated: bool, data_dir: Path) -> str:
    lines = [
        f"fedbroker demo: API {url}  (readiness {url}/readyz, metrics {url}/metrics)",
        f"  data dir {data_dir} (restart with the same --data-dir to keep every job)",
        "  clusters onprem-a, onprem-b (simulated openb nodes) and cloud-burst (A100 pool)",
    ]
    if generated:
        lines.append(f"  tokens (generated; set {TOKENS_ENV} to choose them):")
        lines += [f"    {tenant:<7} {token}" for tenant, token in tokens.items()]
    else:
        lines.append(f"  tokens: from {TOKENS_ENV}")
    shown = tokens["team-a"] if generated else "<team-a token>"
    admin = tokens["admin"] if generated else "<admin token>"
    lines += [
        f"  dashboard: {url}/#token={admin}",
        "  try, in another terminal:",
        f"    export FEDBROKER_TOKEN={shown} FEDBROKER_SERVER={url}",
        f"    fedbroker submit -f deploy/examples/job.yaml --server {url}",
        "    fedbroker clusters",
        "    fedbroker list",
        "    fedbroker pools",
    ]
    return "\n".join(lines)


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
        obj: dict[str, Any] = {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
                               "spec": {"replicatedJobs": replicated}}  # fmt: skip
    else:
        replicas = {"Master": {"replicas": 1, "template": pod},
                    "Worker": {"replicas": workers, "template": pod}}  # fmt: skip
        obj = {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
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


# --- the live table --------------------------------------------------------------------


def status_table(service: Service) -> str:
    """Clusters per GPU type (total/used/reserved/free) and queues (pending/running)."""
    rows = []
    for c in service.view.clusters():
        for t in c.gpu_types:
            rows.append([c.cluster, t.gpu_type, t.total, f"{t.allocated:g}",
                         f"{t.reserved:g}", f"{t.free:g}"])  # fmt: skip
    running, placed = _running_by_queue(service)
    queues = [[q.name, q.pending, placed.get(q.name, 0), running.get(q.name, 0)]
              for q in service.view.queues()]  # fmt: skip
    pools = [[p.pool, p.cluster, p.ready, p.coming, p.scale_ups, p.scale_downs,
              f"{p.node_hours:.2f}", f"{p.idle_node_hours:.2f}", f"{p.cost:.2f}"]
             for p in service.view.pools()]  # fmt: skip
    text = (
        render_table(("CLUSTER", "GPU", "TOTAL", "USED", "RESERVED", "FREE"), rows)
        + "\n\n"
        + render_table(("QUEUE", "PENDING", "PLACED", "RUNNING"), queues)
    )
    if pools:
        heads = ("POOL", "CLUSTER", "UP", "COMING", "SCALE-UPS", "REMOVED", "NODE-H",
                 "IDLE-H", "COST")  # fmt: skip
        text += "\n\n" + render_table(heads, pools)
    return text


def status_line(service: Service) -> str:
    total = used = 0.0
    for c in service.view.clusters():
        for t in c.gpu_types:
            total += t.total
            used += t.allocated + t.reserved
    running, placed = _running_by_queue(service)
    return (
        f"status: GPUs {used:g}/{total:g} in use; pending {_pending(service)}, "
        f"placed {sum(placed.values())}, running {sum(running.values())}"
    )


def _running_by_queue(service: Service) -> tuple[dict[str, int], dict[str, int]]:
    running: dict[str, int] = {}
    placed: dict[str, int] = {}
    for launch in service.lifecycle.launches():
        into = running if launch.running else placed
        queue = launch.pending.job.queue
        into[queue] = into.get(queue, 0) + 1
    return running, placed


def live_table(out: TextIO, header: Callable[[str], str]) -> TaskFactory:
    """Redraw the table every 2 s on a terminal (under ``header(url)``); elsewhere print a
    status line every 10 s."""

    async def run(service: Service, url: str) -> None:
        tty = out.isatty()
        while True:
            if tty:
                stamp = time.strftime("%H:%M:%S")
                top = header(url)
                out.write(f"\x1b[H\x1b[2J{top}\n\n{stamp}\n{status_table(service)}\n")
            else:
                out.write(status_line(service) + "\n")
            out.flush()
            await asyncio.sleep(TTY_REFRESH_SECONDS if tty else LINE_EVERY_SECONDS)

    return run


# --- the command -----------------------------------------------------------------------


def add_demo_command(sub: Any) -> None:
    cmd = sub.add_parser("demo", help="run the broker on simulated clusters with a workload")
    cmd.add_argument("--host", default="127.0.0.1")
    cmd.add_argument("--port", type=int, default=8080)
    cmd.add_argument("--data-dir", type=Path, default=DEFAULT_DATA_DIR)
    cmd.add_argument("--no-workload", action="store_true", help="do not generate jobs")
    cmd.add_argument("--seed", type=int, default=1, help="seeds the workload and run times")


def run_demo(args: argparse.Namespace, environ: Mapping[str, str] | None = None) -> int:
    try:
        tokens, generated = demo_tokens(os.environ if environ is None else environ)
        if not 0 <= args.port <= 65_535:
            raise DemoError(f"--port must be within 0..65535, not {args.port}")
        try:
            args.data_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise DemoError(f"--data-dir {args.data_dir}: {exc.strerror}") from None
        config = demo_config(args.data_dir, tokens)
    except (DemoError, ConfigError) as exc:
        sys.stderr.write(f"fedbroker: error: {exc}\n")
        return EXIT_USAGE
    tty = sys.stdout.isatty()
    # On a terminal the table is the view; logs would scroll it away, so only warnings.
    configure_logging(logging.WARNING if tty else logging.INFO, secrets=tokens.values())

    def header(url: str) -> str:
        return banner(url, tokens, generated, args.data_dir)

    def on_listening(url: str) -> None:
        if not tty:  # on a terminal the table shows the banner on top
            print(header(url), flush=True)

    table = live_table(sys.stdout, header)
    return run_loop(
        serve(
            config, host=args.host, port=args.port, on_listening=on_listening, table=table,
            workload=None if args.no_workload else workload(tokens, args.seed),
            run_seconds=seeded_run_seconds(args.seed),
        )
    )  # fmt: skip


__all__ = ["DemoError", "add_demo_command", "draw_manifest", "parse_tokens", "run_demo"]
