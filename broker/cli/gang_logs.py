"""``fedbroker logs JOB --all-pods``: the log of every pod of the job, each line prefixed
with its pod as ``kubectl logs --prefix`` does (``[pod/NAME] ``, or ``[pod/NAME/CONTAINER] ``
with ``-c``).

The pods are those ``/v1/jobs/{name}/pods`` lists, by name. Without ``-f`` their logs are
printed one pod after another; with ``-f`` they are followed at once, whole lines
interleaved as they come (each followed log holds one of the tenant's ``maxLogFollows``,
so a gang larger than that cap is refused by the broker with its 429 line). The first
failure ends the command (one line on stderr, as ``broker.cli.podlogs``).
"""

from __future__ import annotations

import argparse
import asyncio
from typing import Any, BinaryIO
from urllib.parse import quote

import aiohttp

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

CONNECT_TIMEOUT_SECONDS = 30.0


class _Broker:
    """One session to the broker, and the checks of its answers."""

    def __init__(self, args: argparse.Namespace, session: aiohttp.ClientSession) -> None:
        self.base, self.token, self.session = server_url(args), token_of(args), session
        self.headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}

    async def checked(self, resp: aiohttp.ClientResponse) -> aiohttp.ClientResponse:
        if resp.status >= 400:
            message = error_of(answer_body(await resp.text()))
            raise ClientError(http_error(resp.status, message, resp.reason, self.token))
        return resp

    def get(self, path: str, params: dict[str, str]) -> Any:
        return self.session.get(self.base + path, params=params, headers=self.headers)


def prefixed(prefix: bytes, pending: bytes, chunk: bytes) -> tuple[bytes, bytes]:
    """The whole lines of ``pending + chunk``, each after ``prefix``, and the rest."""
    data = pending + chunk
    cut = data.rfind(b"\n") + 1
    lines = data[:cut].splitlines(keepends=True)
    return b"".join(prefix + line for line in lines), data[cut:]


async def _copy(
    broker: _Broker, args: argparse.Namespace, params: dict[str, str], pod: str, out: BinaryIO
) -> None:
    path = f"/v1/jobs/{quote(args.name, safe='')}/logs"
    label = f"pod/{pod}" + (f"/{args.container}" if args.container else "")
    prefix, pending = f"[{label}] ".encode(), b""
    async with broker.get(path, {**params, "pod": pod}) as resp:
        await broker.checked(resp)
        async for chunk in resp.content.iter_any():
            lines, pending = prefixed(prefix, pending, chunk)
            out.write(lines)
            out.flush()
    if pending:
        out.write(prefix + pending + b"\n")
        out.flush()


# ``logs -l``: the keys a selector may name, each a field of the pods answer (a pod's
# labels are the member's, not the tenant's, so its fields are what a user can select on).
SELECTOR_KEYS = {"pod-set": "podSet", "cluster": "cluster", "node": "node", "phase": "phase"}


def parse_selector(text: str) -> dict[str, str]:
    """``pod-set=worker,phase=Running`` as {field: value}; ValueError names what is wrong."""
    out: dict[str, str] = {}
    for term in text.split(","):
        key, eq, value = term.strip().partition("=")
        if not eq or not key or not value:
            raise ValueError(f"{term.strip()!r} is not KEY=VALUE")
        if key not in SELECTOR_KEYS:
            raise ValueError(f"unknown key {key!r} (keys: {', '.join(SELECTOR_KEYS)})")
        out[SELECTOR_KEYS[key]] = value
    return out


def matches(pod: dict[str, Any], wanted: dict[str, str]) -> bool:
    return all(str(pod.get(field)) == value for field, value in wanted.items())


def _said(wanted: dict[str, str]) -> str:
    keys = {v: k for k, v in SELECTOR_KEYS.items()}
    return ",".join(f"{keys[f]}={v}" for f, v in wanted.items())


async def all_pods(args: argparse.Namespace, params: dict[str, str], out: BinaryIO) -> None:
    """Every pod's log of ``args.name`` to ``out``, prefixed (``params``: the log query)."""
    base = server_url(args)
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=CONNECT_TIMEOUT_SECONDS)
    connector = aiohttp.TCPConnector(ssl=trust(ca_file_of(args)))
    try:
        async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
            broker = _Broker(args, session)
            whose = {k: v for k, v in params.items() if k == "tenant"}  # --tenant, -A
            async with broker.get(f"/v1/jobs/{quote(args.name, safe='')}/pods", whose) as resp:
                doc = await (await broker.checked(resp)).json()
            wanted: dict[str, str] = getattr(args, "selector", None) or {}
            pods = sorted(str(p.get("name")) for p in doc.get("pods") or [] if matches(p, wanted))
            if not pods:
                what = f" matching {_said(wanted)}" if wanted else " yet"
                raise ClientError(f"job {args.name!r} has no pods{what}")
            if not args.follow:
                for pod in pods:
                    await _copy(broker, args, params, pod, out)
                return
            await _all_at_once([_copy(broker, args, params, pod, out) for pod in pods])
    except aiohttp.ClientError as exc:
        raise ClientError(unreachable(base, exc)) from None


async def _all_at_once(reads: list[Any]) -> None:
    """Run the reads together until all end; the first to fail cancels the others."""
    tasks = [asyncio.ensure_future(r) for r in reads]
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
        for task in done:
            task.result()
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


__all__ = ["SELECTOR_KEYS", "all_pods", "matches", "parse_selector", "prefixed"]
