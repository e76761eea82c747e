"""How the CLI client asks again: a 503 that carries Retry-After (a follower that does not
take writes, a store that is down, a new leader rebuilding its state), or a 429 with one
(the tenant's rate limit), is retried after the hinted wait, for at most ``--retry-for``
seconds in all (tenacity); each retry is announced on stderr, and when the time is up the
last answer is the error."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any

import aiohttp
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception_type

from broker.cli.connection import ClientError, answer_body, error_of, http_error

DEFAULT_RETRY_SECONDS = 30.0
MAX_RETRY_SECONDS = 3600.0
REQUEST_TIMEOUT_SECONDS = 30.0

Sleep = Callable[[float], Awaitable[None]]


class Unavailable(ClientError):
    """A 503 with Retry-After: the broker asks to be asked again after ``retry_after`` s."""

    def __init__(self, message: str, retry_after: float) -> None:
        super().__init__(message)
        self.retry_after = retry_after


def retry_seconds(text: str) -> float:
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


async def retried(send: Callable[[], Awaitable[Any]], budget: float, sleep: Sleep) -> Any:
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


async def send_request(
    session: aiohttp.ClientSession,
    method: str,
    url: str,
    body: bytes | None,
    headers: dict[str, str],
    params: dict[str, str],
    token: str = "",
) -> tuple[int, Any]:
    async with session.request(method, url, data=body, headers=headers, params=params) as resp:
        doc = answer_body(await resp.text())
        if resp.status >= 400:
            line = http_error(resp.status, error_of(doc), resp.reason, token)
            wait = retry_after_seconds(resp.headers.get("Retry-After"))
            if resp.status in (429, 503) and wait is not None:  # asked to come back
                raise Unavailable(line, wait)
            raise ClientError(line)
        return resp.status, doc


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


__all__ = [
    "DEFAULT_RETRY_SECONDS",
    "MAX_RETRY_SECONDS",
    "REQUEST_TIMEOUT_SECONDS",
    "Sleep",
    "Unavailable",
    "retried",
    "retry_after_seconds",
    "retry_seconds",
    "send_request",
]
