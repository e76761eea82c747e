"""``fedbroker demo``: the broker on its built-in federation, with load and a live view.

This module owns what a newcomer sees on ``make run``: the demo tenants' tokens (from
``FEDBROKER_DEMO_TOKENS``, else kept in the data dir's ``tokens`` file: generated at the
first start and read at every later one, so an exported token outlives a restart), the
banner saying where to look and what the start restored, the workload generator
(``broker.cli.demo_workload``: background load that leaves room for the user's jobs), and
the live view (``broker.cli.view``, the same one ``fedbroker top`` draws over HTTP), redrawn
in place under the banner on a terminal, or a status line every few seconds elsewhere
(``--plain``). On a terminal nothing but the view is printed: the logs go to ``demo.log`` in
the data dir (``--log-stderr``: to stderr). Simulated jobs run a seeded 30-300 s, so they
finish and capacity churns. The service itself is ``broker.cli.runtime.serve`` with
``broker.config.demo_config``.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import secrets
import shutil
import sys
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from rich.console import Console, RenderableType
from rich.panel import Panel
from rich.text import Text

from adapters.simulated import seeded_run_seconds
from broker.cli.demo_workload import workload
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
from broker.process import run_loop
from broker.service.facade import Service
from broker.service.recovery import Rebuilt

log = logging.getLogger("broker.demo")

TOKENS_ENV = "FEDBROKER_DEMO_TOKENS"
DEFAULT_DATA_DIR = Path(".fedbroker-demo")
LOG_FILE = "demo.log"  # in --data-dir, unless --log-stderr
TOKENS_FILE = "tokens"  # in --data-dir: the tokens generated at the first start
RATE, MAX_RATE = 2.0, 50.0  # the generator's jobs per second: default, most accepted


class DemoError(ValueError):
    """A problem with the demo's inputs: one line for the user."""


def parse_tokens(text: str, source: str = TOKENS_ENV) -> dict[str, str]:
    """``team-a=T1,team-b=T2,admin=T3`` -> {tenant: token}. The message names ``source``
    (the variable, or the tokens file) and the tenants, never a token."""
    tokens: dict[str, str] = {}
    for i, item in enumerate(x.strip() for x in text.split(",")):
        tenant, sep, token = item.partition("=")
        tenant, token = tenant.strip(), token.strip()
        if not sep or not tenant or not token:
            raise DemoError(f"{source}: item {i + 1} must be TENANT=TOKEN")
        if tenant not in DEMO_TENANTS:
            raise DemoError(f"{source}: unknown tenant {tenant!r} ({', '.join(DEMO_TENANTS)})")
        if tenant in tokens:
            raise DemoError(f"{source}: tenant {tenant!r} given twice")
        tokens[tenant] = token
    missing = [t for t in DEMO_TENANTS if t not in tokens]
    if missing:
        raise DemoError(f"{source}: missing tenant(s) {', '.join(missing)}")
    return tokens


@dataclass(frozen=True)
class Tokens:
    """The demo tenants' tokens and where they came from: ``env`` (``FEDBROKER_DEMO_TOKENS``),
    ``kept`` (the data dir's tokens file, written by an earlier start) or ``new`` (generated
    now, and written there for the next start)."""

    tokens: Mapping[str, str]
    source: str
    path: Path

    @property
    def shown(self) -> bool:
        """Whether the banner prints them: not when the user chose them."""
        return self.source != "env"


def demo_tokens(environ: Mapping[str, str], data_dir: Path) -> Tokens:
    """The tokens from the variable, else the data dir's file, else new ones written there
    (readable by the owner only), so that an exported token still works after a restart."""
    path = data_dir / TOKENS_FILE
    text = environ.get(TOKENS_ENV)
    if text is not None:
        return Tokens(parse_tokens(text), "env", path)
    try:
        return Tokens(parse_tokens(path.read_text(encoding="utf-8").strip(), str(path)), "kept",
                      path)  # fmt: skip
    except FileNotFoundError:
        pass
    except OSError as exc:
        raise DemoError(f"{path}: {exc.strerror}") from None
    tokens = {t: secrets.token_urlsafe(18) for t in DEMO_TENANTS}
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(",".join(f"{t}={tok}" for t, tok in tokens.items()) + "\n")
    except OSError as exc:
        raise DemoError(f"{path}: {exc.strerror}") from None
    return Tokens(tokens, "new", path)


def tokens_said(tokens: Tokens) -> str:
    """Where the tokens came from, in the banner's words."""
    if tokens.source == "env":
        return f"from {TOKENS_ENV}"
    if tokens.source == "kept":
        return f"kept in {tokens.path} from an earlier start; delete it for new ones"
    return f"new; kept in {tokens.path} for the next start; {TOKENS_ENV} chooses them"


def restored_said(rebuilt: Rebuilt | None) -> str | None:
    """What the start found in the data dir, or None when it found no job. The jobs that
    were placed or running are queued again: simulated pods stop with the demo."""
    if rebuilt is None or not rebuilt.jobs:
        return None
    queued = rebuilt.jobs - rebuilt.restored - rebuilt.requeued
    parts = [f"{queued} queued"] if queued else []
    if rebuilt.requeued:
        parts.append(f"{rebuilt.requeued} that were running, queued again to start afresh")
    if rebuilt.restored:
        parts.append(f"{rebuilt.restored} still running")
    return f"restored {rebuilt.jobs} job{'s' if rebuilt.jobs != 1 else ''}: {', '.join(parts)}"


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


def banner(url: str, tokens: Tokens, data_dir: Path, log: Path | None,
           restored: str | None = None) -> str:  # fmt: skip
    """The banner ``--plain`` prints once: where the API is, the tokens, what to try."""
    lines = [
        f"fedbroker demo: API {url}  (readiness {url}/readyz, metrics {url}/metrics)",
        f"  data dir {data_dir} (restart with the same --data-dir to keep every job and token)",
        f"  logs {log if log is not None else 'on stderr (--log-stderr)'}",
        "  clusters onprem-a, onprem-b (simulated openb nodes) and cloud-burst (A100 pool)",
    ]
    if restored is not None:
        lines.append(f"  {restored}")
    if tokens.shown:
        lines.append(f"  tokens ({tokens_said(tokens)}):")
        lines += [f"    {tenant:<7} {token}" for tenant, token in tokens.tokens.items()]
    else:
        lines.append(f"  tokens: {tokens_said(tokens)}")
    shown = tokens.tokens["team-a"] if tokens.shown else "<team-a token>"
    admin = tokens.tokens["admin"] if tokens.shown else "<admin token>"
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


def banner_view(url: str, tokens: Tokens, data_dir: Path, log: Path | None,
                restored: str | None = None) -> Panel:  # fmt: skip
    """The banner on top of the live view: the same facts, fewer lines."""
    admin = tokens.tokens["admin"] if tokens.shown else "<admin token>"

    def row(label: str, *parts: str | tuple[str, str]) -> Text:
        text = Text(f"{label:<10}", style="bold")
        for part in parts:
            text.append(*(part if isinstance(part, tuple) else (part,)))
        return text

    if tokens.shown:
        pairs: list[str | tuple[str, str]] = []
        for tenant, token in tokens.tokens.items():
            pairs += [f"{tenant} ", (token, "cyan"), "   "]
        tokens_row = row("tokens", *pairs)
    else:
        tokens_row = row("tokens", tokens_said(tokens))
    team_a = tokens.tokens["team-a"] if tokens.shown else "<team-a token>"
    kept = "jobs" if tokens.source == "env" else "jobs and tokens"
    cli = invoked_as()
    lines = [
        row("API", (url, "cyan"), f"   readiness {url}/readyz   metrics {url}/metrics"),
        row("dashboard", (f"{url}/#token={admin}", "cyan")),
        tokens_row,
        row("try", f"FEDBROKER_SERVER={url} FEDBROKER_TOKEN={team_a} {cli} top"),
        row("", f"(or: {cli} submit -f deploy/examples/job.yaml, {cli} list)"),
        row("logs", str(log) if log is not None else "on stderr (--log-stderr)",
            f"   data dir {data_dir} (its {kept} outlive a restart)"),
        *([row("restored", restored.removeprefix("restored "))] if restored else []),
        row("stop", "Ctrl-C"),
    ]  # fmt: skip
    return banner_panel(lines, "fedbroker demo")


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


def live_view(console: Console, header: Callable[[Service, str], RenderableType],
              interval: float) -> TaskFactory:  # fmt: skip
    """The view redrawn in place every ``interval`` seconds under ``header(service, url)``."""

    async def run(service: Service, url: str) -> None:
        top = header(service, url)
        await live(console, (render(s, top) async for s in _snapshots(service, interval)))

    return run


def status_lines(out: TextIO, first: Callable[[Service, str], str], interval: float) -> TaskFactory:
    """``first(service, url)`` (the banner), then a status line every ``interval`` seconds
    (``--plain``)."""

    async def run(service: Service, url: str) -> None:
        print(first(service, url), file=out, flush=True)
        await plain(out, (status_line(s) async for s in _snapshots(service, interval)))

    return run


# --- the command -----------------------------------------------------------------------


def add_demo_command(sub: Any) -> None:
    cmd = sub.add_parser("demo", help="run the broker on simulated clusters with a workload")
    cmd.add_argument("--host", default="127.0.0.1", help="listen address (default 127.0.0.1)")
    cmd.add_argument("--port", type=int, default=8080, help="listen port (default 8080)")
    cmd.add_argument(
        "--data-dir", type=Path, default=DEFAULT_DATA_DIR,
        help=f"where the jobs, the tokens and the log file are kept (default {DEFAULT_DATA_DIR})",
    )  # fmt: skip
    cmd.add_argument("--no-workload", action="store_true",
                     help="do not generate jobs (default: generate them)")  # fmt: skip
    cmd.add_argument("--seed", type=int, default=1,
                     help="seeds the workload and run times (default 1)")  # fmt: skip
    cmd.add_argument(
        "--rate", type=float, default=RATE, metavar="JOBS_PER_SECOND",
        help=f"how many jobs a second the generator submits, on average (default {RATE:g}, "
        f"at most {MAX_RATE:g})",
    )  # fmt: skip
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
        if not 0 <= args.port <= 65_535:
            raise DemoError(f"--port must be within 0..65535, not {args.port}")
        if not 0 < args.rate <= MAX_RATE:
            raise DemoError(f"--rate must be above 0 and at most {MAX_RATE:g}, not {args.rate:g}")
        try:
            args.data_dir.mkdir(parents=True, exist_ok=True)
            tokens = demo_tokens(environ, args.data_dir)  # its errors still on the terminal
            if log_path is not None:
                _log_to_file(log_path)
        except OSError as exc:
            raise DemoError(f"--data-dir {args.data_dir}: {exc.strerror}") from None
        config = demo_config(args.data_dir, tokens.tokens)
    except (DemoError, ConfigError) as exc:
        sys.stderr.write(f"fedbroker: error: {exc}\n")
        return EXIT_USAGE
    is_plain = use_plain(args.plain, sys.stdout, environ)
    interval = interval_of(args, is_plain)
    configure_logging(logging.INFO, secrets=tokens.tokens.values())
    logging.captureWarnings(True)  # into the log, not onto the view

    # The banners are made once the state is rebuilt: they say what was restored.
    def text(service: Service, url: str) -> str:
        restored = restored_said(service.recovery.rebuilt)
        return banner(url, tokens, args.data_dir, log_path, restored)

    def header(service: Service, url: str) -> RenderableType:
        restored = restored_said(service.recovery.rebuilt)
        return banner_view(url, tokens, args.data_dir, log_path, restored)

    if is_plain:
        table = status_lines(sys.stdout, text, interval)
    else:
        table = live_view(Console(file=sys.stdout), header, interval)
    code = run_loop(
        serve(
            config, host=args.host, port=args.port, table=table,
            workload=None if args.no_workload else workload(tokens.tokens, args.seed, args.rate),
            run_seconds=seeded_run_seconds(args.seed),
        )
    )  # fmt: skip
    if not is_plain:
        where = f"; logs in {log_path}" if log_path is not None else ""
        print(f"fedbroker demo stopped (exit {code}){where}", flush=True)
    return code


__all__ = [
    "DemoError", "Tokens", "add_demo_command", "banner", "banner_view", "demo_tokens",
    "parse_tokens", "restored_said", "run_demo", "snapshot",
]  # fmt: skip
