"""``fedbroker list --watch``: the list, then again after each job event (``/v1/events``)
that changed it, at most every WATCH_MIN_SECONDS, until Ctrl-C."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Any

import aiohttp
import yaml

from broker.cli.connection import (
    ClientError,
    answer_body,
    ca_file_of,
    error_of,
    http_error,
    server_url,
    token_of,
    trust,
    unreachable,
)
from broker.cli.render import render
from broker.cli.retrying import REQUEST_TIMEOUT_SECONDS

ListJobs = Callable[[argparse.Namespace], Awaitable[dict[str, Any]]]

WATCH_MIN_SECONDS = 0.5  # a busy broker's events redraw the list at most this often


async def watch(args: argparse.Namespace, list_jobs: ListJobs) -> int:
    """``list --watch``: the list, then again after job events (``/v1/events``) that
    changed it, at most every WATCH_MIN_SECONDS; until Ctrl-C (exit 0) or the stream ends
    (exit 1)."""
    base, token = server_url(args), token_of(args)
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    changed = asyncio.Event()

    shown: list[Any] = [None]  # what the last drawing showed (ages aside)

    async def redraw() -> None:
        doc = await list_jobs(args)
        seen = [
            (j.get("metadata", {}).get("name"), j.get("metadata", {}).get("namespace"),
             {k: v for k, v in j.get("status", {}).items() if k != "updatedAt"})
            for j in doc.get("items", [])
        ]  # fmt: skip
        if seen == shown[0]:
            return  # events of jobs not in this list (another filter, another tenant's)
        shown[0] = seen
        sys.stdout.write(_drawing(args.output, doc) + "\n")
        sys.stdout.flush()

    async def painter() -> None:
        while True:
            await changed.wait()
            changed.clear()
            await redraw()
            await asyncio.sleep(WATCH_MIN_SECONDS)

    await redraw()
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=REQUEST_TIMEOUT_SECONDS)
    connector = aiohttp.TCPConnector(ssl=trust(ca_file_of(args)))
    paint = asyncio.ensure_future(painter())
    try:
        async with (
            aiohttp.ClientSession(timeout=timeout, connector=connector) as session,
            session.get(base + "/v1/events", headers=headers) as resp,
        ):
            if resp.status >= 400:
                message = error_of(answer_body(await resp.text()))
                raise ClientError(http_error(resp.status, message, resp.reason, token))
            async for line in resp.content:
                if line.startswith(b"event:") and line[6:].strip() not in (b"capacity",):
                    changed.set()
                if paint.done():
                    paint.result()  # a redraw's error ends the watch
    except aiohttp.ClientError as exc:
        raise ClientError(unreachable(base, exc)) from None
    finally:
        paint.cancel()
        with contextlib.suppress(asyncio.CancelledError, ClientError):
            await paint
    raise ClientError(f"the broker at {base} ended the event stream")


def _drawing(output: str, doc: Any) -> str:
    """One redraw of ``list --watch`` in the chosen output."""
    if output == "json":
        return json.dumps(doc)
    if output not in ("table", "wide"):
        return "---\n" + yaml.safe_dump(doc, sort_keys=False).rstrip()
    text = render("list", doc)
    if sys.stdout.isatty():
        return "\x1b[H\x1b[2J" + text  # clear the screen, then the table
    return f"--- {datetime.now().strftime('%H:%M:%S')}\n{text}"


__all__ = ["WATCH_MIN_SECONDS", "watch"]
