"""The running broker process: one supervisor of named tasks, signals and clean shutdown.

This module owns the life of ``fedbroker serve`` (and of ``fedbroker demo``, which is
``serve`` with a built-in config): it builds the Service and its aiohttp app, opens the
store and connects the members (``service.start()``), listens, and only then campaigns for
the leader lease (``service.campaign()``: the leader rebuilds its state there; readiness
comes after it). Campaigning after listening means two processes given one address (one
identity) never both lead: the second cannot listen. Then it runs named tasks — the
scheduler loop, the leader election, the HTTP site, and optionally the demo's workload
generator and live table — under one supervisor (the service's own background tasks are
supervised by ``broker.service.tasks``; a fatal one ends the ``background`` task here).
The first task that ends or fails is logged with its name and stops the rest;
SIGTERM/SIGINT stop everything cleanly: stop accepting, cancel the tasks (bounded wait),
close the store, exit 0; SIGHUP re-reads ``serve --config``'s file and swaps the static
bearer tokens in (``broker.http.auth.reload_tokens``), keeping the old ones if it is bad.
With ``api.tls`` it serves HTTPS and re-reads the certificate when its files change (the
``tls-reload`` task). It sets up the process's logging (``broker.cli.logs``: JSON lines,
the access log, the audit trail, secrets redacted).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import logging
import signal
import sys
import time
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from pathlib import Path
from typing import Any

from aiohttp import web

from adapters.mqtt.tls import MqttTlsError
from broker.cli.logs import (
    ACCESS_LOG_FORMAT,
    JsonFormatter,
    configure_logging,
    remember_secrets,
    secrets_of,
)
from broker.config import Config, ConfigError, load_config
from broker.http.app import make_app
from broker.http.auth import reload_tokens
from broker.http.tls import ApiCertificates, TlsError
from broker.model import Placement
from broker.ports import KubeconfigError
from broker.process import run_loop, settle_heap
from broker.service.facade import Service
from broker.service.mqtt import settings_of

log = logging.getLogger("broker.runtime")

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
SHUTDOWN_TIMEOUT_SECONDS = 10.0

# A task of the supervisor gets the base URL the API listens on once it is bound.
TaskFactory = Callable[[Service, str], Coroutine[Any, Any, None]]


async def serve(
    config: Config,
    *,
    host: str,
    port: int,
    workload: TaskFactory | None = None,
    table: TaskFactory | None = None,
    on_listening: Callable[[str], None] | None = None,
    run_seconds: Callable[[Placement], float | None] | None = None,
    config_path: str | Path | None = None,
) -> int:
    """Run the broker until a signal (exit 0) or until a task fails (exit 1). With
    ``config_path`` (``serve --config``), SIGHUP re-reads it and swaps the static tokens.
    Raises TlsError when ``api.tls``'s files do not load."""
    certificates = None if config.api.tls is None else ApiCertificates(config.api.tls)
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    service = Service(config, run_seconds=run_seconds)
    app = make_app(service, config, certificates=certificates)
    reload = (
        None
        if config_path is None
        else functools.partial(reload_tokens, app, config_path, remember_secrets)
    )
    handled = _handle_signals(loop, stop, reload)
    runner = web.AppRunner(app, access_log_format=ACCESS_LOG_FORMAT)
    try:
        try:
            await service.start(elect=False)
        except KubeconfigError as exc:  # scrubbed of the kubeconfig's secrets
            log.error("%s", exc)
            return EXIT_USAGE
        site = await _listen(runner, host, port, certificates)
        if site is None:
            return EXIT_FAILED
        url = _base_url(runner, host, port, "http" if certificates is None else "https")
        if certificates is not None:
            _watch(service, certificates)
        service.advertise(int(url.rpartition(":")[2]))
        await service.campaign()  # leader: state rebuilt before readiness
        settle_heap()
        log.info("listening on %s", url, extra={"url": url, "store": config.store.redacted_url})
        if on_listening is not None:
            on_listening(url)
        tasks: dict[str, Awaitable[None]] = {
            "scheduler": service.run(), "leader": service.lead(), "http": _hold(site),
            "background": service.tasks.failed(),  # a fatal background task stops us
        }  # fmt: skip
        if workload is not None:
            tasks["workload"] = workload(service, url)
        if table is not None:
            tasks["table"] = table(service, url)
        return await supervise(tasks, stop)
    finally:
        for sig in handled:
            loop.remove_signal_handler(sig)
        await runner.cleanup()  # stop accepting before the store goes away
        await service.close()
        log.info("broker stopped")


async def _listen(
    runner: web.AppRunner, host: str, port: int, certificates: ApiCertificates | None
) -> web.TCPSite | None:
    """The API's site, listening (over TLS with ``certificates``); None when it cannot."""
    await runner.setup()
    ssl_context = None if certificates is None else certificates.server
    site = web.TCPSite(runner, host, port, ssl_context=ssl_context)
    try:
        await site.start()
    except OSError as exc:
        log.error("cannot listen on %s:%s: %s", host, port, exc.strerror or exc)
        return None
    return site


def _watch(service: Service, certificates: ApiCertificates) -> None:
    """The ``tls-reload`` task: changed certificate files are taken in without a restart."""
    interval = certificates.tls.reload_seconds
    service.tasks.keep("tls-reload", lambda: certificates.watch(interval))


def _handle_signals(
    loop: asyncio.AbstractEventLoop, stop: asyncio.Event, reload: Callable[[], object] | None
) -> list[signal.Signals]:
    """SIGTERM and SIGINT set ``stop``; SIGHUP calls ``reload`` (if any). The signals
    handled, to be removed at the end."""
    handlers: dict[signal.Signals, Callable[[], object]] = {
        signal.SIGTERM: stop.set, signal.SIGINT: stop.set,
    }  # fmt: skip
    if reload is not None:
        handlers[signal.SIGHUP] = reload
    handled: list[signal.Signals] = []
    for sig, handler in handlers.items():
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, handler)
            handled.append(sig)
    return handled


async def _hold(site: web.TCPSite) -> None:
    """The HTTP site as a task: it serves until cancelled, then stops listening."""
    try:
        await asyncio.get_running_loop().create_future()
    finally:
        await site.stop()


def _base_url(runner: web.AppRunner, host: str, port: int, scheme: str = "http") -> str:
    for address in runner.addresses:
        if isinstance(address, tuple) and len(address) >= 2:
            port = int(address[1])
            break
    shown = "127.0.0.1" if host in ("0.0.0.0", "") else f"[{host}]" if ":" in host else host
    return f"{scheme}://{shown}:{port}"


async def supervise(
    coros: Mapping[str, Awaitable[None]],
    stop: asyncio.Event,
    timeout: float = SHUTDOWN_TIMEOUT_SECONDS,
) -> int:
    """Run named tasks until ``stop`` is set (0) or one of them ends (1), then cancel the
    rest and wait for them, at most ``timeout`` seconds."""
    tasks: dict[asyncio.Future[Any], str] = {}
    for name, coro in coros.items():
        started = asyncio.ensure_future(coro)
        if isinstance(started, asyncio.Task):
            started.set_name(name)
        tasks[started] = name
    stopper: asyncio.Future[Any] = asyncio.ensure_future(stop.wait())
    code = EXIT_OK
    try:
        done, _ = await asyncio.wait([*tasks, stopper], return_when=asyncio.FIRST_COMPLETED)
        for ended in done:
            if ended is stopper:
                log.info("shutdown requested")
                continue
            code = EXIT_FAILED
            name = tasks[ended]
            if ended.cancelled():
                log.error("task %s was cancelled; shutting down", name, extra={"task": name})
            elif (exc := ended.exception()) is not None:
                log.error(
                    "task %s failed; shutting down", name, extra={"task": name},
                    exc_info=(type(exc), exc, exc.__traceback__),
                )  # fmt: skip
            else:
                log.error("task %s ended unexpectedly; shutting down", name, extra={"task": name})
    finally:
        pending = [t for t in [*tasks, stopper] if not t.done()]
        for future in pending:
            future.cancel()
        if pending:
            _, late = await asyncio.wait(pending, timeout=timeout)
            for future in late:
                name = tasks.get(future, "stop")
                log.error("task %s did not stop within %ss", name, timeout, extra={"task": name})
        for future in tasks:  # retrieve every outcome: none is reported as never retrieved
            if future.done() and not future.cancelled():
                future.exception()
    return code


def add_serve_command(sub: Any) -> None:
    cmd = sub.add_parser("serve", help="run the broker (API, scheduler, store) from a config")
    cmd.add_argument("--config", required=True, metavar="FILE", help="YAML config file")
    cmd.add_argument("--host", default=None, help="listen address (default: config api.host)")
    cmd.add_argument("--port", type=int, default=None, help="listen port (default: api.port)")


def run_serve(args: argparse.Namespace) -> int:
    try:
        config = load_config(args.config)
    except ConfigError as exc:
        sys.stderr.write(f"fedbroker: error: {exc}\n")
        return EXIT_USAGE
    try:  # checked here too, for a one-line error like the config's own
        if config.api.tls is not None:
            ApiCertificates(config.api.tls)
        if config.events.mqtt is not None:
            settings_of(config).tls_context()
    except (TlsError, MqttTlsError) as exc:
        sys.stderr.write(f"fedbroker: error: {args.config}: {exc}\n")
        return EXIT_USAGE
    port = config.api.port if args.port is None else args.port
    if not 0 <= port <= 65_535:
        sys.stderr.write(f"fedbroker: error: --port must be within 0..65535, not {port}\n")
        return EXIT_USAGE
    try:
        configure_logging(secrets=secrets_of(config), audit_file=config.audit.file)
    except OSError as exc:
        sys.stderr.write(f"fedbroker: error: audit.file: cannot open: {exc.strerror}\n")
        return EXIT_USAGE
    host = args.host or config.api.host
    started = time.monotonic()
    code = run_loop(serve(config, host=host, port=port, config_path=args.config))
    log.info("ran for %.0fs", time.monotonic() - started)
    return code


__all__ = ["JsonFormatter", "configure_logging", "run_loop", "run_serve", "serve", "supervise"]
