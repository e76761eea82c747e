"""The CLI client: ``fedbroker submit | get | list | cancel | explain | clusters``.

It talks to a running broker over its HTTP API (``--server``, default
``$FEDBROKER_SERVER`` or http://127.0.0.1:8080; token from ``--token`` or
``$FEDBROKER_TOKEN``; an https server's certificate verified against ``--ca-file`` or
``$FEDBROKER_CA_FILE``, else the system's trust store) and prints tables for people
(``broker.cli.render``) or ``-o json|yaml`` for scripts. Every failure is one line on stderr:
the server's own error message, or why it could not be reached. The token is sent as a
bearer header and never printed.

A 503 that carries Retry-After (a follower that does not take writes, a store that is
down, a new leader rebuilding its state), or a 429 with one (the tenant's rate limit), is
retried after the hinted wait, for at most
``--retry-for`` seconds in all (default ``$FEDBROKER_RETRY_SECONDS`` or 30; 0 turns it off);
each retry is announced on stderr, and when the time is up the last answer is the error.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import ssl
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from functools import partial
from pathlib import Path
from typing import Any

import aiohttp
import yaml
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception_type

from broker.cli.render import render
from broker.cli.wrap import WrapError, is_plain_object, wrap

DEFAULT_SERVER = "http://127.0.0.1:8080"
EXIT_ERROR = 1
DEFAULT_RETRY_SECONDS = 30.0
MAX_RETRY_SECONDS = 3600.0
REQUEST_TIMEOUT_SECONDS = 30.0

Sleep = Callable[[float], Awaitable[None]]


class ClientError(Exception):
    """One line for the user."""


class Unavailable(ClientError):
    """A 503 with Retry-After: the broker asks to be asked again after ``retry_after`` s."""

    def __init__(self, message: str, retry_after: float) -> None:
        super().__init__(message)
        self.retry_after = retry_after


def _retry_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number of seconds, not {text!r}") from None
    if not 0 <= value <= MAX_RETRY_SECONDS:  # also rejects nan
        raise argparse.ArgumentTypeError(f"must be within 0..{MAX_RETRY_SECONDS:g}, not {text}")
    return value


def retry_after_seconds(value: str | None, now: datetime | None = None) -> float | None:
    """Retry-After as seconds (delta-seconds or an HTTP date, RFC 9110 10.2.3); None when
    absent or unreadable."""
    if value is None:
        return None
    value = value.strip()
    if value.isascii() and value.isdigit():
        return float(value)
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - (now or datetime.now(UTC))).total_seconds())


def add_client_commands(sub: Any, parser_class: type[argparse.ArgumentParser]) -> None:
    common = parser_class(add_help=False)
    common.add_argument("--server", default=os.environ.get("FEDBROKER_SERVER", DEFAULT_SERVER))
    common.add_argument("--token", default=None, help="bearer token (default $FEDBROKER_TOKEN)")
    common.add_argument(
        "--ca-file", default=os.environ.get("FEDBROKER_CA_FILE") or None, metavar="FILE",
        help="PEM CA certificates an https broker is verified with (default "
        "$FEDBROKER_CA_FILE, else the system's trust store)",
    )  # fmt: skip
    common.add_argument("-o", "--output", choices=("table", "json", "yaml"), default="table")
    common.add_argument(
        "--retry-for",
        type=_retry_seconds,
        metavar="SECONDS",
        default=os.environ.get("FEDBROKER_RETRY_SECONDS", str(DEFAULT_RETRY_SECONDS)),
        help="retry a 503 or 429 with Retry-After (no leader, store down, state being "
        "rebuilt, rate limited) for "
        "at most this long in all; 0: never (default $FEDBROKER_RETRY_SECONDS or 30)",
    )

    submit = sub.add_parser("submit", parents=[common], help="submit a FederatedJob manifest")
    submit.add_argument("-f", "--file", type=Path, required=True, help="YAML or JSON manifest")
    submit.add_argument("--queue", help="queue of a plain workload object (else its label)")
    submit.add_argument(
        "--priority", type=int, help="priority of a plain workload object (else its label)"
    )
    for name, text in (
        ("get", "show a job and its history"),
        ("cancel", "cancel a job"),
        ("explain", "why a job waits"),
    ):
        cmd = sub.add_parser(name, parents=[common], help=text)
        cmd.add_argument("name")
    lister = sub.add_parser("list", parents=[common], help="list your jobs")
    lister.add_argument("--queue")
    lister.add_argument("--state")
    lister.add_argument("--cluster")
    lister.add_argument("--limit", type=int, default=100)
    sub.add_parser("clusters", parents=[common], help="capacity per cluster and GPU type")
    sub.add_parser(
        "pools", parents=[common], help="burst pools: nodes up and coming, node-hours, cost"
    )


CLIENT_COMMANDS = ("submit", "get", "list", "cancel", "explain", "clusters", "pools")


def run_client(args: argparse.Namespace) -> int:
    try:
        doc = asyncio.run(call(args))
    except ClientError as exc:
        sys.stderr.write(f"fedbroker: error: {exc}\n")
        return EXIT_ERROR
    if args.output == "json":
        print(json.dumps(doc, indent=2))
    elif args.output == "yaml":
        print(yaml.safe_dump(doc, sort_keys=False), end="")
    else:
        print(render(args.command, doc))
    return 0


async def _sleep(seconds: float) -> None:
    await asyncio.sleep(seconds)


@dataclass(frozen=True)
class _Request:
    method: str
    path: str
    body: bytes | None = None
    params: dict[str, str] = field(default_factory=dict)
    content_type: str | None = None


def _request_for(args: argparse.Namespace) -> _Request:
    """The HTTP request a client command stands for."""
    match args.command:
        case "submit":
            try:
                body = args.file.read_bytes()
            except OSError as exc:
                raise ClientError(f"{args.file}: {exc.strerror}") from None
            kind = "application/json" if args.file.suffix == ".json" else "application/yaml"
            wrapped = _wrapped(args, body)
            if wrapped is not None:
                return _Request("POST", "/v1/jobs", wrapped, content_type="application/json")
            return _Request("POST", "/v1/jobs", body, content_type=kind)
        case "get":
            return _Request("GET", f"/v1/jobs/{args.name}")
        case "cancel":
            return _Request("DELETE", f"/v1/jobs/{args.name}")
        case "explain":
            return _Request("GET", f"/v1/jobs/{args.name}/explain")
        case "list":
            filters = (("queue", args.queue), ("state", args.state), ("cluster", args.cluster))
            params = {k: str(v) for k, v in filters if v}
            params["limit"] = str(args.limit)
            return _Request("GET", "/v1/jobs", params=params)
        case "clusters":
            return _Request("GET", "/v1/clusters")
        case "pools":
            return _Request("GET", "/v1/pools")
    return _Request("GET", "")


def _wrapped(args: argparse.Namespace, body: bytes) -> bytes | None:
    """A plain workload object in the file, wrapped in a FederatedJob (``wrap``); None for
    a FederatedJob or what does not parse (the broker names what is wrong)."""
    try:
        doc = yaml.safe_load(body)
    except yaml.YAMLError:
        return None
    if not is_plain_object(doc):
        if args.queue is not None or args.priority is not None:
            raise ClientError("--queue/--priority: only for a plain workload object")
        return None
    try:
        return json.dumps(wrap(doc, args.queue, args.priority)).encode()
    except WrapError as exc:
        raise ClientError(f"{args.file}: {exc}") from None


async def call(args: argparse.Namespace, *, sleep: Sleep = _sleep) -> Any:
    """The command's request, its answer as JSON; raises ClientError (one line).

    ``sleep`` waits between retries (tests inject one that returns at once: the budget is
    counted in the waits asked for as well as in wall-clock time, so it still runs out).
    """
    request = _request_for(args)
    token = args.token or os.environ.get("FEDBROKER_TOKEN", "")
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    if request.content_type is not None:
        headers["Content-Type"] = request.content_type
    base = args.server.rstrip("/")
    timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_SECONDS)
    connector = aiohttp.TCPConnector(ssl=_trust(getattr(args, "ca_file", None)))
    try:
        async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
            send = partial(
                _request, session, request.method, base + request.path, request.body, headers,
                request.params,
            )  # fmt: skip
            return await _retried(send, float(args.retry_for), sleep)
    except aiohttp.ClientSSLError as exc:
        raise ClientError(
            f"cannot verify the broker at {base} over TLS (--ca-file, $FEDBROKER_CA_FILE): "
            f"{_ssl_reason(exc)}"
        ) from None
    except aiohttp.ClientConnectionError:
        raise ClientError(f"cannot reach the broker at {base} (is it running? --server)") from None
    except TimeoutError:
        raise ClientError(
            f"the broker at {base} did not answer within {REQUEST_TIMEOUT_SECONDS:g} s"
        ) from None


def _trust(ca_file: str | None) -> ssl.SSLContext | bool:
    """How an https broker is verified: against ``ca_file``, else the system's trust."""
    if ca_file is None:
        return True
    try:
        return ssl.create_default_context(cafile=ca_file)
    except (OSError, ssl.SSLError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else "not PEM"
        raise ClientError(f"--ca-file {ca_file}: cannot load: {reason}") from None


def _ssl_reason(exc: aiohttp.ClientSSLError) -> str:
    cause = getattr(exc, "certificate_error", None) or exc.__cause__ or exc
    return str(getattr(cause, "verify_message", None) or getattr(cause, "reason", None) or cause)


async def _retried(send: Callable[[], Awaitable[Any]], budget: float, sleep: Sleep) -> Any:
    """``send()``, again after each Unavailable for at most ``budget`` seconds in all.

    Every command is safe to send again, writes included:
    * submit: jobs are idempotent by (tenant, name) -- the store inserts with
      ON CONFLICT (tenant, name) DO NOTHING and the API answers a resubmission of the
      same spec with 200 and the job already stored (never a second job; another spec
      is a 409 while the job is active). So a retry
      after an answer that was lost (e.g. a follower's forward that reached the
      leader) cannot create a duplicate.
    * cancel: cancelling a job in a final state returns it unchanged.
    * the rest are reads.
    A follower's 503 is raised before anything is written in any case.
    """
    retrying = AsyncRetrying(
        sleep=sleep,
        retry=retry_if_exception_type(Unavailable),
        wait=lambda state: min(_hint(state), _left(state, budget)),
        stop=lambda state: _left(state, budget) <= 0,
        before_sleep=_announce,
        reraise=True,
    )
    try:
        async for attempt in retrying:
            with attempt:
                return await send()
    except Unavailable as exc:
        tries = retrying.statistics.get("attempt_number", 1)
        if budget <= 0:
            raise ClientError(f"{exc} (not retried: --retry-for 0)") from None
        raise ClientError(
            f"{exc} (still unavailable after {tries} attempts in {budget:g} s; --retry-for)"
        ) from None
    raise AssertionError("unreachable: tenacity returns or raises")  # pragma: no cover


async def _request(
    session: aiohttp.ClientSession,
    method: str,
    url: str,
    body: bytes | None,
    headers: dict[str, str],
    params: dict[str, str],
) -> Any:
    async with session.request(method, url, data=body, headers=headers, params=params) as resp:
        text = await resp.text()
        try:
            doc = json.loads(text) if text else {}
        except json.JSONDecodeError:
            doc = {"error": text.strip()[:200]}
        if resp.status >= 400:
            message = doc.get("error") if isinstance(doc, dict) else None
            line = " ".join(f"{resp.status} {message or resp.reason}".split())
            wait = retry_after_seconds(resp.headers.get("Retry-After"))
            if resp.status in (429, 503) and wait is not None:  # asked to come back
                raise Unavailable(line, wait)
            raise ClientError(line)
        return doc


def _elapsed(state: RetryCallState) -> float:
    """Time used so far: wall clock, or the waits asked for when sleep was faster."""
    return max(state.seconds_since_start or 0.0, state.idle_for)


def _left(state: RetryCallState, budget: float) -> float:
    return budget - _elapsed(state)


def _hint(state: RetryCallState) -> float:
    exc = state.outcome.exception() if state.outcome is not None else None
    return exc.retry_after if isinstance(exc, Unavailable) else 1.0


def _announce(state: RetryCallState) -> None:
    exc = state.outcome.exception() if state.outcome is not None else None
    sys.stderr.write(f"fedbroker: {exc}; retrying in {state.upcoming_sleep:.3g} s\n")
