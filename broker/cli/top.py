"""``fedbroker top``: the demo's live view, drawn from any running broker's HTTP API.

Like ``kubectl top`` or k9s: it polls ``/v1/clusters``, ``/v1/queues`` and ``/v1/pools``
every ``--interval`` seconds and follows ``/v1/events`` for the last job events (the
token's own tenant's; an admin's or a viewer's: everyone's), and redraws the view in place
(``broker.cli.view.render``). Where to find the broker, and what a refused connection or
token says, is as for the other client commands (``broker.cli.connection``: ``--server``,
default ``$FEDBROKER_SERVER`` or http://127.0.0.1:8080, a scheme-less host:port taken as
http://; ``--token``, default ``$FEDBROKER_TOKEN``; ``--ca-file``). A broker that stops
answering is shown as an error line over the last data, and polled again; a refused token
ends the command (exit 1). ``--plain`` (chosen by itself when stdout is not a terminal)
prints a status line every interval instead; ``--once`` prints the view once and exits
(down a pipe too, without colours; with ``--plain``: the status line).

``live`` and ``plain`` draw a stream of frames; ``fedbroker demo`` uses them too.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections import deque
from collections.abc import AsyncIterator, Mapping
from typing import Any, TextIO

import aiohttp
from rich.console import Console, RenderableType
from rich.live import Live
from rich.text import Text

from broker.cli.connection import (
    ClientError,
    add_connection_options,
    answer_body,
    ca_file_of,
    error_of,
    exit_status,
    http_error,
    server_url,
    token_of,
    trust,
    unreachable,
)
from broker.cli.view import (
    EVENTS_SHOWN,
    Snapshot,
    positive_seconds,
    render,
    snapshot_from_json,
    status_line,
    use_plain,
)

VIEW_INTERVAL_SECONDS = 2.0
PLAIN_INTERVAL_SECONDS = 10.0
REQUEST_TIMEOUT_SECONDS = 10.0
STREAM_READ_TIMEOUT_SECONDS = 45.0  # the stream sends a keepalive every 15 s
RECONNECT_SECONDS = 2.0


class Refused(ClientError):
    """The broker refused the token (401/403): polling again will not help."""


# --- drawing frames --------------------------------------------------------------------


async def live(console: Console, frames: AsyncIterator[RenderableType]) -> None:
    """Draw each frame in place of the one before (nothing else goes to ``console``)."""
    with Live(console=console, auto_refresh=False, redirect_stdout=False,
              redirect_stderr=False, vertical_overflow="crop") as view:  # fmt: skip
        async for frame in frames:
            view.update(frame, refresh=True)


async def plain(out: TextIO, lines: AsyncIterator[str]) -> None:
    async for line in lines:
        out.write(line + "\n")
        out.flush()


def add_interval(cmd: argparse.ArgumentParser) -> None:
    cmd.add_argument(
        "--interval", type=positive_seconds, default=None, metavar="SECONDS",
        help=f"redraw the view every SECONDS (default {VIEW_INTERVAL_SECONDS:g}); with "
        f"--plain, print a status line every SECONDS (default {PLAIN_INTERVAL_SECONDS:g})",
    )  # fmt: skip


def add_plain(cmd: argparse.ArgumentParser) -> None:
    cmd.add_argument(
        "--plain", action="store_true",
        help="status lines instead of the live view (default: only when stdout is not a "
        "terminal, or TERM=dumb)",
    )  # fmt: skip


def interval_of(args: argparse.Namespace, is_plain: bool) -> float:
    if args.interval is not None:
        return float(args.interval)
    return PLAIN_INTERVAL_SECONDS if is_plain else VIEW_INTERVAL_SECONDS


# --- the HTTP source -------------------------------------------------------------------


class Broker:
    """A running broker's views over HTTP, and its job events as they come."""

    def __init__(self, session: aiohttp.ClientSession, server: str, token: str) -> None:
        self.session = session
        self.base = server.rstrip("/")
        self.token = token
        self.headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.events: deque[dict[str, Any]] = deque(maxlen=EVENTS_SHOWN)
        self.last: Snapshot | None = None

    async def _get(self, path: str) -> Mapping[str, Any]:
        timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_SECONDS)
        try:
            async with self.session.get(self.base + path, headers=self.headers,
                                        timeout=timeout) as resp:  # fmt: skip
                doc = answer_body(await resp.text())
                if resp.status >= 400:
                    error = http_error(resp.status, error_of(doc), resp.reason, self.token)
                    line = f"{path}: {error}"
                    raise (Refused if resp.status in (401, 403) else ClientError)(line)
                return doc if isinstance(doc, dict) else {}
        except aiohttp.ClientConnectionError as exc:
            raise ClientError(unreachable(self.base, exc)) from None
        except TimeoutError:
            raise ClientError(f"{self.base}{path} did not answer in time") from None

    async def snapshot(self) -> Snapshot:
        """The views now; on an error, the last ones with the error (Refused is raised)."""
        try:
            clusters, queues, pools = await asyncio.gather(
                self._get("/v1/clusters"), self._get("/v1/queues"), self._get("/v1/pools")
            )
        except Refused:
            raise
        except ClientError as exc:
            if self.last is None:
                return Snapshot(time.time(), source=self.base, error=str(exc))
            last = self.last
            return Snapshot(time.time(), last.clusters, last.queues, last.pools, last.events,
                            self.base, str(exc))  # fmt: skip
        self.last = snapshot_from_json(
            time.time(), clusters, queues, pools, self.events, source=self.base
        )
        return self.last

    async def follow(self) -> None:
        """Keep ``events`` filled with the last job events of ``/v1/events``, reconnecting
        when the stream ends or fails, until cancelled."""
        timeout = aiohttp.ClientTimeout(total=None, sock_read=STREAM_READ_TIMEOUT_SECONDS)
        while True:
            try:
                async with self.session.get(self.base + "/v1/events", headers=self.headers,
                                            timeout=timeout) as resp:  # fmt: skip
                    if resp.status == 200:
                        await self._read(resp)
            except (aiohttp.ClientError, TimeoutError, ValueError):
                pass
            await asyncio.sleep(RECONNECT_SECONDS)

    async def _read(self, resp: aiohttp.ClientResponse) -> None:
        buffer = ""
        async for chunk in resp.content.iter_any():
            buffer += chunk.decode("utf-8", errors="replace").replace("\r\n", "\n")
            while "\n\n" in buffer:
                message, buffer = buffer.split("\n\n", 1)
                self._take(message)

    def _take(self, message: str) -> None:
        kind, data = "message", []
        for line in message.split("\n"):
            field, _, value = line.partition(":")
            value = value.removeprefix(" ")
            if field == "event":
                kind = value
            elif field == "data":
                data.append(value)
        if kind != "job" or not data:
            return
        try:
            doc = json.loads("\n".join(data))
        except json.JSONDecodeError:
            return
        if isinstance(doc, dict):
            self.events.append(doc)


# --- the command -----------------------------------------------------------------------


def add_top_command(sub: Any) -> None:
    cmd = sub.add_parser(
        "top", help="a live view of a running broker: GPUs per cluster, queues, burst pools, "
        "job events",
    )  # fmt: skip
    add_connection_options(cmd)
    add_interval(cmd)
    add_plain(cmd)
    cmd.add_argument(
        "--once", action="store_true",
        help="print the view once and exit, to a terminal or not (with --plain: the status "
        "line) (default: keep redrawing until Ctrl-C)",
    )  # fmt: skip


def header(server: str) -> Text:
    text = Text()
    text.append("fedbroker top", style="bold")
    text.append(f"  {server}  ·  Ctrl-C to stop", style="grey50")
    return text


async def _frames(broker: Broker, interval: float) -> AsyncIterator[Snapshot]:
    while True:
        yield await broker.snapshot()
        await asyncio.sleep(interval)


async def top(args: argparse.Namespace, out: TextIO) -> int:
    # Printed once, the view goes down a pipe too (without colours), unless --plain.
    is_plain = args.plain if args.once else use_plain(args.plain, out)
    interval = interval_of(args, is_plain)
    server, token = server_url(args), token_of(args)
    connector = aiohttp.TCPConnector(ssl=trust(ca_file_of(args)))
    async with aiohttp.ClientSession(connector=connector) as session:
        broker = Broker(session, server, token)
        if args.once:
            snapshot = await broker.snapshot()
            if snapshot.error is not None:
                raise ClientError(snapshot.error)
            if is_plain:
                out.write(status_line(snapshot) + "\n")
            else:
                Console(file=out).print(render(snapshot, header(broker.base)))
            return 0
        follower = asyncio.ensure_future(broker.follow())
        try:
            if is_plain:
                await plain(out, (status_line(s) async for s in _frames(broker, interval)))
            else:
                frames = (render(s, header(broker.base)) async for s in _frames(broker, interval))
                await live(Console(file=out), frames)
        finally:
            follower.cancel()
            await asyncio.gather(follower, return_exceptions=True)
    return 0


def run_top(args: argparse.Namespace) -> int:
    try:
        return asyncio.run(top(args, sys.stdout))
    except ClientError as exc:
        sys.stderr.write(f"fedbroker: error: {exc}\n")
        return exit_status(exc)


__all__ = ["Broker", "add_top_command", "live", "plain", "run_top", "top"]
