"""Every error of the API as JSON (``{"error": "<field>: <problem>"}``): aiohttp's own and
the broker's mapped to a status code, a one-line message and, where a retry helps, a
``Retry-After``. Bad input never gets a 5xx; a bug gets a 500 and a logged traceback."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from aiohttp import web

from broker.http.forwarding import forward
from broker.http.state import CONFIG, route_template
from broker.manifest import ManifestError
from broker.service.admission import Conflict, Forbidden, NotFound, NotLeader
from broker.service.budget import PlanRefused
from broker.store import LeaseLost, StoreUnavailable

log = logging.getLogger(__name__)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

# Retry-After while the store cannot be reached or the lease was lost under a write.
STORE_RETRY_AFTER_SECONDS = 1
# The headers an aiohttp error keeps on its JSON answer.
_KEPT_HEADERS = ("Retry-After", "WWW-Authenticate")


def error(status: int, message: str, **headers: str) -> web.Response:
    """The JSON error answer: ``{"error": message}`` with ``status`` and ``headers``."""
    return web.json_response({"error": message}, status=status, headers=headers or None)


def _http_error(request: web.Request, exc: web.HTTPException) -> web.Response:
    """aiohttp's errors (4xx, 5xx) with their messages in the API's words."""
    if isinstance(exc, web.HTTPRequestEntityTooLarge):
        limit = request.app[CONFIG].api.body_limit_bytes
        return error(413, f"body: larger than the limit of {limit} bytes")
    if isinstance(exc, web.HTTPNotFound):
        return error(404, exc.reason if ":" in exc.reason else "path: no such resource")
    if isinstance(exc, web.HTTPMethodNotAllowed):
        allow = ",".join(sorted(exc.allowed_methods))
        return error(405, f"method: {exc.method} not allowed here", Allow=allow)
    headers = {k: v for k, v in exc.headers.items() if k in _KEPT_HEADERS}
    return error(exc.status, exc.reason, **headers)


async def _not_leader(request: web.Request, exc: NotLeader) -> web.Response:
    """Writes go to the leader; reads are served here. The leader's identity is its address
    (hostname:port): this replica forwards the write there if it can, else a client can go
    there."""
    forwarded = await forward(request, exc)
    if forwarded is not None:
        return forwarded
    headers = {"Retry-After": str(exc.retry_after)}
    if exc.holder:
        headers["X-Fedbroker-Leader"] = exc.holder
    return error(503, str(exc), **headers)


def _store_refused(request: web.Request, exc: LeaseLost | StoreUnavailable) -> web.Response:
    """Nothing was written or acknowledged; the client retries. No traceback: not a bug.

    LeaseLost: fenced, this replica's lease ran out under it (a pause longer than the
    lease); the replica that leads now takes it. StoreUnavailable: the database is down or
    restarting (the broker reports not-ready meanwhile)."""
    wait = STORE_RETRY_AFTER_SECONDS
    if isinstance(exc, LeaseLost):
        logged, message = "write refused", "leader: this replica lost the lease"
    else:
        logged, message = "store unavailable", "store: unavailable right now"
    log.warning("%s on %s %s: %s", logged, request.method, route_template(request), exc)
    return error(503, f"{message}; retry after {wait} s", **{"Retry-After": str(wait)})


@web.middleware
async def errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Every error as JSON: aiohttp's own and ours (see the module's docstring)."""
    try:
        return await handler(request)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        return _http_error(request, exc)
    except ManifestError as exc:
        return error(400, str(exc))
    except Forbidden as exc:
        return error(403, str(exc))
    except Conflict as exc:
        return error(409, str(exc))
    except NotFound as exc:
        return error(404, f"name: {exc}")
    except NotLeader as exc:
        return await _not_leader(request, exc)
    except (LeaseLost, StoreUnavailable) as exc:
        return _store_refused(request, exc)
    except PlanRefused as exc:  # the dry runs' bounds: busy, or over the time budget
        return error(429, str(exc), **{"Retry-After": str(exc.retry_after)})
    except Exception:
        # A bug, not the caller's fault; the path only (no headers: they hold the token).
        log.exception("internal error on %s %s", request.method, route_template(request))
        return error(500, "server: internal error")


__all__ = ["STORE_RETRY_AFTER_SECONDS", "Handler", "error", "errors"]
