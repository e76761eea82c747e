"""Calls to a Kubernetes API server with bounded retries, and log-safe error text.

``ApiCalls`` is what the launcher (``adapters.kube``) and the Cluster API pool
(``adapters.capi``) send every request through: 429, 5xx, connection errors, a response
cut short and an answer the client cannot read (``UnreadableAnswer``: not JSON, not the
object it expects) are retried with exponential backoff and jitter (tenacity), up to
``attempts``; other API errors propagate as ``ApiException``; running out of attempts
raises the caller's error class with the last status. ``refused`` says which answers to a
create are a refusal for good (a retry would be refused again). Messages give the HTTP
status, reason and the server's Status message only, never headers, the request or the
client configuration (tokens, keys).
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
    wait_exponential_jitter,
)
from tenacity.wait import wait_base

_T = TypeVar("_T")


class UnreadableAnswer(Exception):
    """The client raised while it sent a request or read its answer, neither an API error
    nor a connection problem (an HTML page from a proxy, JSON of the wrong shape): the
    member's failure, not the job's. The message is the exception's type only; the
    traceback is logged at debug."""


def transient(exc: BaseException) -> bool:
    """Worth retrying: throttled (429), a server error (5xx), a connection problem (one
    dropped while the answer was read too) or an answer the client could not read."""
    if isinstance(exc, ApiException):
        status = exc.status or 0
        return status == 429 or status >= 500
    return isinstance(
        exc,
        aiohttp.ClientConnectionError | aiohttp.ClientPayloadError | asyncio.TimeoutError
        | UnreadableAnswer,
    )  # fmt: skip


# What an API server answers a create it will refuse again, whatever the wait: a malformed
# (400) or invalid (422) object, one admission or authorization forbids (403: Pod
# Security, a webhook, RBAC, a quota), a resource it does not serve (404, once the
# namespace is known to exist), a name another object holds (409). Kubernetes' API
# conventions (kubernetes/community, api-conventions.md, "HTTP Status codes"): 422 "Do not
# retry. Fix the request."; BadRequest "can never succeed"; only 429, 500, 503 and 504 are
# to be retried with backoff.
REFUSED_ON_CREATE = frozenset({400, 403, 404, 409, 422})


def refused(exc: BaseException) -> bool:
    """``exc`` is an API server's refusal of a create for good (see REFUSED_ON_CREATE)."""
    return isinstance(exc, ApiException) and (exc.status or 0) in REFUSED_ON_CREATE


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
    if isinstance(exc, UnreadableAnswer):
        return f"unreadable answer ({exc})"
    return type(exc).__name__


HTTP_NOT_FOUND = 404


class ApiCalls:
    """One adapter's requests to one API server: ``call`` retries transient failures
    (bounded by ``attempts``, waiting by ``wait``: exponential with jitter unless a test
    injects another tenacity strategy) within ``timeout`` seconds per attempt (None: the
    client's own), and raises ``error(message)`` when they run out. ``checked`` and
    ``maybe`` also turn the other API errors into ``error`` (``maybe``: 404 is None)."""

    def __init__(
        self,
        *,
        attempts: int,
        error: Callable[[str], Exception],
        log: logging.Logger,
        wait: wait_base | None = None,
        timeout: float | None = None,
    ) -> None:
        if attempts < 1:
            raise ValueError("attempts must be at least 1")
        self.attempts = attempts
        self.error = error
        self._log = log
        self._wait: wait_base = wait or wait_exponential_jitter(multiplier=0.2, max=10, jitter=1)
        self._timeout = timeout

    async def call(self, what: str, op: Callable[[], Awaitable[_T]]) -> _T:
        """``op`` retried while it fails transiently; other ``ApiException``s propagate."""
        timeout, attempts, log = self._timeout, self.attempts, self._log

        async def bounded() -> _T:
            # A server that accepts and never answers (a black hole) must not hold a
            # request for the client's default five minutes. (asyncio.timeout, not
            # wait_for: on 3.11 wait_for can swallow a cancel.)
            async with asyncio.timeout(timeout):
                try:
                    return await op()
                except ApiException:
                    raise
                except Exception as exc:
                    if transient(exc):
                        raise
                    log.debug("%s: unreadable answer", what, exc_info=exc)
                    raise UnreadableAnswer(type(exc).__name__) from exc

        def before_sleep(state: RetryCallState) -> None:
            exc = state.outcome.exception() if state.outcome is not None else None
            log.warning(
                "%s: %s (attempt %d of %d); retrying",
                what, describe(exc) if exc is not None else "?", state.attempt_number, attempts,
            )  # fmt: skip

        retrying = AsyncRetrying(
            stop=stop_after_attempt(attempts),
            wait=self._wait,
            retry=retry_if_exception(transient),
            reraise=False,
            before_sleep=before_sleep,
        )
        try:
            async for attempt in retrying:
                with attempt:
                    return await bounded()
        except RetryError as exc:
            last = exc.last_attempt.exception()
            raise self.error(
                f"{what}: {describe(last) if last else 'failed'} after {attempts} attempts"
            ) from last
        raise AssertionError("unreachable")  # pragma: no cover

    async def checked(self, what: str, op: Callable[[], Awaitable[_T]]) -> _T:
        """``call``, with every API error raised as the adapter's error."""
        try:
            return await self.call(what, op)
        except ApiException as exc:
            raise self.error(f"{what}: {describe(exc)}") from exc

    async def maybe(self, what: str, op: Callable[[], Awaitable[_T]]) -> _T | None:
        """``checked``, but an object that is not there (404) is None."""
        try:
            return await self.call(what, op)
        except ApiException as exc:
            if exc.status == HTTP_NOT_FOUND:
                return None
            raise self.error(f"{what}: {describe(exc)}") from exc
