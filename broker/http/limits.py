"""The API's caps beyond the per-tenant rate limit: requests without a valid
token limited per source address, and open ``/v1/events`` streams counted per tenant.

A request that carries no ``Authorization`` header takes a token from its address's
bucket before it is handled; one whose token is refused (401) takes one after, and once
the bucket is empty the answer is 429 instead of 401, so guessing tokens is slowed. The
address is the peer's (behind a proxy: the proxy's). The probes (``/healthz``,
``/readyz``) and ``/metrics`` are exempt: a refused liveness probe would get the broker
restarted under a flood, which is worse than answering it, and a refused scrape leaves a
gap in the very metrics that show the flood (keep ``/metrics`` reachable by the monitoring
network only, as usual). Nothing here reads the token.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager

from aiohttp import web

from broker.config import TenantConfig
from broker.http.errors import Handler, error
from broker.http.ratelimit import RateLimiter

EXEMPT = frozenset({"/healthz", "/readyz", "/metrics"})
# How many addresses' buckets are kept before idle ones are forgotten.
MAX_ADDRESSES = 10_000
# An answer to a client over its stream cap: retry after a keepalive, when dead peers show.
STREAM_RETRY_AFTER_SECONDS = 15

ANONYMOUS: web.AppKey[RateLimiter] = web.AppKey("anonymous_limiter", RateLimiter)
OPEN_STREAMS: web.AppKey[Counter[str]] = web.AppKey("open_streams", Counter)


def _over(request: web.Request) -> web.Response | None:
    limiter = request.app[ANONYMOUS]
    limiter.prune(MAX_ADDRESSES)
    wait = limiter.retry_after(request.remote or "unknown")
    if wait is None:
        return None
    return error(
        429,
        f"rate limit: too many requests without a valid token from this address; "
        f"retry after {wait} s",
        **{"Retry-After": str(wait)},
    )


@web.middleware
async def unauthenticated(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Requests without a valid token, per source address (see the module's docstring)."""
    if request.path in EXEMPT:
        return await handler(request)
    if "Authorization" not in request.headers:
        refused = _over(request)
        return refused if refused is not None else await handler(request)
    response = await handler(request)
    if response.status == 401:
        return _over(request) or response
    return response


@contextmanager
def stream_slot(request: web.Request, tenant: TenantConfig) -> Iterator[None]:
    """Holds one of the tenant's ``maxEventStreams`` slots while a stream is open; over
    the cap, 429 (as an HTTP error, answered as JSON)."""
    counts = request.app[OPEN_STREAMS]
    cap = tenant.max_event_streams
    if counts[tenant.name] >= cap:
        raise web.HTTPTooManyRequests(
            reason=f"limit: tenant {tenant.name!r} has {cap} open event streams, its "
            "maxEventStreams cap; close one",
            headers={"Retry-After": str(STREAM_RETRY_AFTER_SECONDS)},
        )
    counts[tenant.name] += 1
    try:
        yield
    finally:
        counts[tenant.name] -= 1
        if counts[tenant.name] <= 0:
            del counts[tenant.name]


__all__ = [
    "ANONYMOUS", "MAX_ADDRESSES", "OPEN_STREAMS", "stream_slot", "unauthenticated",
]  # fmt: skip
