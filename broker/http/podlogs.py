"""A placed job's pods and logs (``GET /v1/jobs/{name}/pods``, ``/v1/jobs/{name}/logs``).

Both check ``read`` on the job's tenant like explain does; another tenant's job, a pod
that is not the job's, or a container not in the pod are 404; a job that is not placed or
running is 409; a member that cannot be read is 502. The log's query is checked by pure
code (``log_params``: ``pod`` a DNS subdomain, ``container`` a DNS label, ``tailLines``
1..100000, ``follow``, ``timestamps`` and ``previous`` true/false; one-line 400s naming the
parameter) before anything is asked of a member.

The log is streamed as ``text/plain`` as the member sends it, and bounded: at most
``api.logLimitBytes`` bytes of log per answer (then one last line says it was truncated,
and the member's stream is closed), and at most ``maxLogFollows`` followed logs open per
tenant (the caller's; beyond: 429). When the client goes away (noticed within
``DISCONNECT_POLL_SECONDS`` even while the member sends nothing), the member's stream is
closed too.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from broker.http.auth import authenticate, owner_of, require
from broker.http.errors import error
from broker.http.state import CONFIG, SERVICE
from broker.ports import ContainerNotFound, LogStream, PodNotFound, PodReadError, PodRow

log = logging.getLogger(__name__)

MAX_TAIL_LINES = 100_000
DISCONNECT_POLL_SECONDS = 0.5
FOLLOW_RETRY_AFTER_SECONDS = 15
_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")
_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
_DIGITS = re.compile(r"[0-9]{1,6}")
_BOOLEANS = {"true": True, "1": True, "false": False, "0": False, "": False}

OPEN_FOLLOWS: web.AppKey[Counter[str]] = web.AppKey("open_follows", Counter)


class ParamError(ValueError):
    """A log query parameter is wrong; the message starts with its name."""


@dataclass(frozen=True, slots=True)
class LogParams:
    pod: str | None = None
    container: str | None = None
    tail_lines: int | None = None
    follow: bool = False
    timestamps: bool = False
    previous: bool = False


def log_params(query: Mapping[str, str]) -> LogParams:
    """The log query, checked (pure; raises ``ParamError`` naming the parameter)."""
    pod = query.get("pod") or None
    if pod is not None and not _SUBDOMAIN.fullmatch(pod):
        raise ParamError("pod: must be a pod name (lower-case DNS subdomain, 253 at most)")
    container = query.get("container") or None
    if container is not None and not _LABEL.fullmatch(container):
        raise ParamError("container: must be a container name (lower-case DNS label, 63 at most)")
    tail: int | None = None
    raw_tail = query.get("tailLines")
    if raw_tail is not None:
        if not _DIGITS.fullmatch(raw_tail) or not 1 <= int(raw_tail) <= MAX_TAIL_LINES:
            raise ParamError(f"tailLines: must be an integer in 1..{MAX_TAIL_LINES}")
        tail = int(raw_tail)
    flags = {key: _BOOLEANS.get(query.get(key, "")) for key in ("follow", "timestamps", "previous")}
    for key, value in flags.items():
        if value is None:
            raise ParamError(f"{key}: must be true or false")
    return LogParams(
        pod, container, tail, bool(flags["follow"]), bool(flags["timestamps"]),
        bool(flags["previous"]),
    )  # fmt: skip


def pod_json(row: PodRow) -> dict[str, Any]:
    return {
        "name": row.name, "podSet": row.pod_set, "cluster": row.cluster, "node": row.node,
        "phase": row.phase, "restarts": row.restarts, "slot": row.slot,
    }  # fmt: skip


def _member_failed(exc: PodReadError) -> web.Response:
    return error(502, f"member: {exc}")


async def job_pods(request: web.Request) -> web.Response:
    owner = owner_of(request, await authenticate(request))
    await require(request, "read", tenant=owner)
    name = request.match_info["name"]
    try:
        rows = await request.app[SERVICE].pods(owner, name)
    except PodReadError as exc:
        return _member_failed(exc)
    return web.json_response({"job": name, "pods": [pod_json(r) for r in rows]})


@contextlib.contextmanager
def follow_slot(request: web.Request, tenant: str, follow: bool) -> Iterator[None]:
    """Holds one of the tenant's ``maxLogFollows`` while a followed log is open."""
    if not follow:
        yield
        return
    config = request.app[CONFIG].tenant(tenant)
    cap = config.max_log_follows if config is not None else 1
    counts = request.app[OPEN_FOLLOWS]
    if counts[tenant] >= cap:
        raise web.HTTPTooManyRequests(
            reason=f"limit: tenant {tenant!r} follows {cap} logs, its maxLogFollows cap; stop one",
            headers={"Retry-After": str(FOLLOW_RETRY_AFTER_SECONDS)},
        )
    counts[tenant] += 1
    try:
        yield
    finally:
        counts[tenant] -= 1
        if counts[tenant] <= 0:
            del counts[tenant]


async def job_logs(request: web.Request) -> web.StreamResponse:
    principal = await authenticate(request)
    owner = owner_of(request, principal)
    await require(request, "read", tenant=owner)
    try:
        params = log_params(request.query)
    except ParamError as exc:
        raise web.HTTPBadRequest(reason=str(exc)) from None
    name = request.match_info["name"]
    with follow_slot(request, principal.tenant, params.follow):
        try:
            stream = await request.app[SERVICE].logs(
                owner, name, params.pod, params.container, params.tail_lines, params.follow,
                timestamps=params.timestamps, previous=params.previous,
            )  # fmt: skip
        except PodNotFound as exc:
            field = "container" if isinstance(exc, ContainerNotFound) else "pod"
            raise web.HTTPNotFound(reason=f"{field}: {exc}") from None
        except PodReadError as exc:
            return _member_failed(exc)
        try:
            return await _stream(request, stream)
        finally:
            await stream.aclose()


async def _stream(request: web.Request, stream: LogStream) -> web.StreamResponse:
    response = web.StreamResponse(
        headers={"Content-Type": "text/plain; charset=utf-8", "Cache-Control": "no-cache",
                 "X-Accel-Buffering": "no"}
    )  # fmt: skip
    await response.prepare(request)
    limit = request.app[CONFIG].api.log_limit_bytes
    copying = asyncio.ensure_future(copy_bounded(stream, response, limit))
    try:
        while not copying.done():
            await asyncio.wait({copying}, timeout=DISCONNECT_POLL_SECONDS)
            if not copying.done() and _gone(request):
                copying.cancel()
        failed = None if copying.cancelled() else copying.exception()
        if failed is None:
            await response.write_eof()
        elif not isinstance(failed, ConnectionError):
            log.warning("log of %s ended: %s", request.match_info["name"], type(failed).__name__)
    except ConnectionError:
        pass  # the client went away
    finally:
        copying.cancel()
        await asyncio.gather(copying, return_exceptions=True)
    return response


def _gone(request: web.Request) -> bool:
    transport = request.transport
    return transport is None or transport.is_closing()


def truncated_line(limit: int) -> bytes:
    return f"\n[fedbroker: log truncated at {limit} bytes (api.logLimitBytes)]\n".encode()


async def copy_bounded(stream: LogStream, response: web.StreamResponse, limit: int) -> None:
    """The log's chunks to the client, ``limit`` bytes at most, then the truncation line."""
    sent = 0
    async for chunk in stream:
        room = limit - sent
        if len(chunk) > room:
            if room > 0:
                await response.write(chunk[:room])
            await response.write(truncated_line(limit))
            return
        await response.write(chunk)
        sent += len(chunk)


__all__ = [
    "MAX_TAIL_LINES", "OPEN_FOLLOWS", "LogParams", "ParamError", "copy_bounded", "job_logs",
    "job_pods", "log_params", "pod_json", "truncated_line",
]  # fmt: skip
