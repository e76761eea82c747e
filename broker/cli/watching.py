"""``fedbroker list --watch`` and ``fedbroker get NAME --watch``: what changed, until Ctrl-C.

The first answer is printed whole; after each job event (``/v1/events``) the jobs are read
again (at most every WATCH_MIN_SECONDS) and only the jobs whose status changed (ages aside)
are printed, as ``kubectl get -w`` does: on a pipe, one table row per change, aligned with
the first table (``-o wide``, ``-A``: with the list's wide and TENANT columns); ``-o json``:
one JSON object per line; ``-o yaml``: one document each. On a terminal, the table is
redrawn in place instead, since a person reads it as a screen.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
from collections.abc import Awaitable, Callable
from functools import partial
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
from broker.cli.listing import jobs_table
from broker.cli.render import render
from broker.cli.retrying import REQUEST_TIMEOUT_SECONDS

ListJobs = Callable[[argparse.Namespace], Awaitable[dict[str, Any]]]

WATCH_MIN_SECONDS = 0.5  # a busy broker's events re-read the jobs at most this often


def _key(job: dict[str, Any]) -> tuple[Any, ...]:
    meta = job.get("metadata", {})
    return meta.get("name"), meta.get("namespace")  # the namespace is the tenant


def _seen(job: dict[str, Any]) -> dict[str, Any]:
    """What a change is judged on: the status without its clock."""
    return {k: v for k, v in job.get("status", {}).items() if k != "updatedAt"}


class Changes:
    """The jobs already printed, and what to print of each new answer (pure)."""

    def __init__(
        self, output: str, terminal: bool, draw: Callable[[dict[str, Any]], str] | None = None
    ) -> None:
        self.output = "table" if output == "wide" else output
        self.terminal = terminal and self.output == "table"
        self.draw = draw or (lambda doc: render("list", doc))  # the table of a list's answer
        self.shown: dict[tuple[Any, ...], dict[str, Any]] | None = None
        self.first: list[dict[str, Any]] = []  # the first table's jobs: the row widths

    def text(self, doc: dict[str, Any]) -> str | None:
        """What to print for ``doc`` (a list's answer), or None when nothing changed."""
        items = [j for j in doc.get("items") or [] if isinstance(j, dict)]
        now = {_key(j): _seen(j) for j in items}
        if self.shown is None:
            self.shown, self.first = now, items
            return self._whole(doc)
        changed = [j for j in items if self.shown.get(_key(j)) != now[_key(j)]]
        if self.terminal and now != self.shown:
            self.shown = now
            return self._whole(doc)
        self.shown = now
        if not changed:
            return None  # events of jobs not in this answer (another filter or tenant)
        return self._lines(changed)

    def _whole(self, doc: dict[str, Any]) -> str:
        if self.output != "table":
            return self._lines(doc.get("items") or []) if doc.get("items") else ""
        text = self.draw(doc)
        return "\x1b[H\x1b[2J" + text if self.terminal else text

    def _lines(self, jobs: list[dict[str, Any]]) -> str:
        if self.output == "json":
            return "\n".join(json.dumps(j) for j in jobs)
        if self.output == "yaml":
            return "\n".join("---\n" + yaml.safe_dump(j, sort_keys=False).rstrip() for j in jobs)
        # Laid out with the first table's jobs, so the columns line up with its header.
        rows = self.draw({"items": [*self.first, *jobs]}).splitlines()
        return "\n".join(rows[-len(jobs) :])


async def watch(args: argparse.Namespace, list_jobs: ListJobs) -> int:
    """The jobs, then their changes after job events (``/v1/events``), at most every
    WATCH_MIN_SECONDS; until Ctrl-C (exit 0) or the stream ends (exit 1)."""
    base, token = server_url(args), token_of(args)
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    changed = asyncio.Event()
    every, wide = bool(getattr(args, "all_tenants", False)), args.output == "wide"
    draw = partial(jobs_table, tenants=every or wide, wide=wide)
    changes = Changes(args.output, sys.stdout.isatty(), draw)

    async def show() -> None:
        text = changes.text(await list_jobs(args))
        if text:
            sys.stdout.write(text + "\n")
            sys.stdout.flush()

    async def painter() -> None:
        while True:
            await changed.wait()
            changed.clear()
            await show()
            await asyncio.sleep(WATCH_MIN_SECONDS)

    await show()
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
                    paint.result()  # a read's error ends the watch
    except aiohttp.ClientError as exc:
        raise ClientError(unreachable(base, exc)) from None
    finally:
        paint.cancel()
        with contextlib.suppress(asyncio.CancelledError, ClientError):
            await paint
    raise ClientError(f"the broker at {base} ended the event stream")


__all__ = ["WATCH_MIN_SECONDS", "Changes", "watch"]
