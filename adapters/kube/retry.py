"""Calls to a Kubernetes API server with bounded retries, and log-safe error text.

Shared by the launcher (``adapters.kube.launch``) and the Cluster API pool
(``adapters.capi``): 429, 5xx and connection errors are retried with exponential backoff
and jitter (tenacity), up to ``attempts``; other API errors propagate as ``ApiException``;
running out of attempts raises the caller's error class with the last status. Messages give
the HTTP status, reason and the server's Status message only, never headers, the request or
the client configuration (tokens, keys).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

import aiohttp
from kubernetes.aio.client.exceptions import ApiException
from tenacity import (
    AsyncRetrying,
    RetryCallState,
    RetryError,
    retry_if_exception,
    stop_after_attempt,
)
from tenacity.wait import wait_base

_T = TypeVar("_T")


def transient(exc: BaseException) -> bool:
    """Worth retrying: throttled (429), a server error (5xx) or a connection problem."""
    if isinstance(exc, ApiException):
        status = exc.status or 0
        return status == 429 or status >= 500
    return isinstance(exc, aiohttp.ClientConnectionError | asyncio.TimeoutError)


def describe(exc: BaseException) -> str:
    """HTTP status, reason and the server's Status message; never headers or the request."""
    if isinstance(exc, ApiException):
        message = ""
        reason = exc.reason or ""
        try:
            body = json.loads(exc.body or "")
        except (TypeError, ValueError):
            body = None
        if isinstance(body, dict):
            reason = str(body.get("reason") or reason)
            message = str(body.get("message") or "")[:200]
        return f"HTTP {exc.status} {reason}" + (f": {message}" if message else "")
    return type(exc).__name__


async def call(
    what: str,
    op: Callable[[], Awaitable[_T]],
    *,
    attempts: int,
    wait: wait_base,
    error: Callable[[str], Exception],
    log: logging.Logger,
) -> _T:
    """``op``, retried while it fails transiently; ``error(message)`` is raised once the
    attempts are used up."""

    def before_sleep(state: RetryCallState) -> None:
        exc = state.outcome.exception() if state.outcome is not None else None
        log.warning(
            "%s: %s (attempt %d of %d); retrying",
            what, describe(exc) if exc is not None else "?", state.attempt_number, attempts,
        )  # fmt: skip

    retrying = AsyncRetrying(
        stop=stop_after_attempt(attempts),
        wait=wait,
        retry=retry_if_exception(transient),
        reraise=False,
        before_sleep=before_sleep,
    )
    try:
        async for attempt in retrying:
            with attempt:
                return await op()
    except RetryError as exc:
        last = exc.last_attempt.exception()
        raise error(
            f"{what}: {describe(last) if last else 'failed'} after {attempts} attempts"
        ) from last
    raise AssertionError("unreachable")  # pragma: no cover
