"""The HTTP API (``/v1``): a thin aiohttp skin over ``broker.service.facade.Service``.

Every answer is JSON, errors included (``{"error": message}``, the message naming the
field for bad input); bad input never gets a 5xx. A bearer token maps to a tenant; a
tenant sees only its own jobs, and another tenant's job answers 404 (never 403), so job
names do not leak. Tokens are never logged: only the tenant name is.
"""

from __future__ import annotations

import json
import logging
import math
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, generate_latest
from yarl import URL

from broker.config import Config, RateLimit, TenantConfig
from broker.http.dashboard import add_dashboard
from broker.http.openapi import openapi_document
from broker.manifest import FederatedJob, ManifestError, parse_manifest
from broker.service.admission import Forbidden, NotFound, NotLeader
from broker.service.events import Event, EventBus
from broker.service.facade import Service
from broker.service.metrics import Forward, ServiceCollector
from broker.store import (
    JOB_STATES,
    JobRecord,
    JobState,
    LeaseLost,
    StoreUnavailable,
    Transition,
)

log = logging.getLogger(__name__)

MAX_LIST_LIMIT = 1000
KEEPALIVE_SECONDS = 15.0  # an SSE comment this often, so idle streams and dead peers show
# Retry-After while the store cannot be reached or the lease was lost under a write.
STORE_RETRY_AFTER_SECONDS = 1
_DIGITS = re.compile(r"[0-9]{1,18}")  # ASCII only: str.isdigit() accepts "²", int() does not

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

# A follower's forward of a write to the leader (leaderElection.forwardWrites).
FORWARDED_BY = "X-Fedbroker-Forwarded-By"  # set on the hop, and on the answer relayed back
FORWARD_TIMEOUT = aiohttp.ClientTimeout(total=10, sock_connect=2)
WRITE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
_FORWARD_REQUEST_HEADERS = ("Authorization", "Content-Type", "Accept")
_FORWARD_RESPONSE_HEADERS = (
    "Content-Type", "Retry-After", "X-Fedbroker-Leader", "WWW-Authenticate", "Allow",
)  # fmt: skip
# host:port (a DNS name or IPv4 address) or [IPv6]:port: an identity that is an address.
_ADDRESS = re.compile(
    r"(?:[A-Za-z0-9](?:[A-Za-z0-9.-]{0,251}[A-Za-z0-9])?|\[[0-9A-Fa-f:.]{2,45}\]):[0-9]{1,5}"
)


# --- rate limit --------------------------------------------------------------------------


@dataclass
class TokenBucket:
    """``rate`` tokens a second up to ``burst``; a request takes one."""

    rate: float
    burst: float
    tokens: float
    at: float

    def take(self, now: float) -> float:
        """0 when allowed (a token taken), else the seconds until a token is there."""
        self.tokens = min(self.burst, self.tokens + max(0.0, now - self.at) * self.rate)
        self.at = max(self.at, now)
        if self.tokens >= 1:
            self.tokens -= 1
            return 0.0
        return (1 - self.tokens) / self.rate


@dataclass
class RateLimiter:
    """One token bucket per tenant; the clock is injected (monotonic seconds)."""

    limit: RateLimit
    clock: Callable[[], float] = time.monotonic
    _buckets: dict[str, TokenBucket] = field(default_factory=dict)

    def retry_after(self, tenant: str) -> int | None:
        """None when the request may go on, else whole seconds to wait (at least 1)."""
        now = self.clock()
        bucket = self._buckets.get(tenant)
        if bucket is None:
            burst = float(self.limit.burst)
            bucket = self._buckets[tenant] = TokenBucket(
                self.limit.requests_per_second, burst, burst, now
            )
        wait = bucket.take(now)
        return None if wait == 0 else max(1, math.ceil(wait))


# --- metrics -----------------------------------------------------------------------------


class ApiMetrics:
    """The API's Prometheus metrics, in an injected registry (never the global one)."""

    def __init__(self, registry: CollectorRegistry, service: Service) -> None:
        self.registry = registry
        self.submitted = Counter(
            "fedbroker_jobs_submitted", "Jobs accepted (201) per queue", ["queue"],
            registry=registry,
        )  # fmt: skip
        self.requests = Counter(
            "fedbroker_http_requests", "HTTP requests per route template and status",
            ["route", "status"], registry=registry,
        )  # fmt: skip
        collector = ServiceCollector(
            service.view, lambda: service.leading, service.metric_sources, service.bus
        )
        registry.register(collector)
        registry.register(Forward(service.metrics.registry))


SERVICE: web.AppKey[Service] = web.AppKey("service", Service)
CONFIG: web.AppKey[Config] = web.AppKey("config", Config)
EVENTS: web.AppKey[EventBus] = web.AppKey("events", EventBus)
METRICS: web.AppKey[ApiMetrics] = web.AppKey("metrics", ApiMetrics)
LIMITER: web.AppKey[RateLimiter] = web.AppKey("limiter", RateLimiter)
OPENAPI: web.AppKey[dict[str, Any]] = web.AppKey("openapi", dict)
FORWARDER: web.AppKey[aiohttp.ClientSession] = web.AppKey("forwarder", aiohttp.ClientSession)


def _route(request: web.Request) -> str:
    """The route template (``/v1/jobs/{name}``), never the path: no job names in labels."""
    route = request.match_info.route
    resource = route.resource if route is not None else None
    return resource.canonical if resource is not None else "unmatched"


def _error(status: int, message: str, **headers: str) -> web.Response:
    return web.json_response({"error": message}, status=status, headers=headers or None)


@web.middleware
async def _count(request: web.Request, handler: Handler) -> web.StreamResponse:
    status = 500
    try:
        response = await handler(request)
        status = response.status
        return response
    except web.HTTPException as exc:
        status = exc.status
        raise
    finally:
        request.app[METRICS].requests.labels(_route(request), str(status)).inc()


@web.middleware
async def _errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Every error as JSON (``{"error": "<field>: <problem>"}``): aiohttp's own and ours."""
    try:
        return await handler(request)
    except web.HTTPRequestEntityTooLarge:
        limit = request.app[CONFIG].api.body_limit_bytes
        return _error(413, f"body: larger than the limit of {limit} bytes")
    except web.HTTPNotFound as exc:
        message = exc.reason if ":" in exc.reason else "path: no such resource"
        return _error(404, message)
    except web.HTTPMethodNotAllowed as exc:
        return _error(
            405,
            f"method: {exc.method} not allowed here",
            Allow=",".join(sorted(exc.allowed_methods)),
        )
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        headers = {k: v for k, v in exc.headers.items() if k in ("Retry-After", "WWW-Authenticate")}
        return _error(exc.status, exc.reason, **headers)
    except ManifestError as exc:
        return _error(400, str(exc))
    except Forbidden as exc:
        return _error(403, str(exc))
    except NotFound as exc:
        return _error(404, f"name: {exc}")
    except NotLeader as exc:
        # Writes go to the leader; reads are served here. The leader's identity is its
        # address (hostname:port): this replica forwards the write there if it can, else a
        # client can go there.
        forwarded = await _forward(request, exc)
        if forwarded is not None:
            return forwarded
        headers = {"Retry-After": str(exc.retry_after)}
        if exc.holder:
            headers["X-Fedbroker-Leader"] = exc.holder
        return _error(503, str(exc), **headers)
    except LeaseLost as exc:
        # Fenced: this replica's lease ran out under it (a pause longer than the lease);
        # nothing was written. The replica that leads now takes it.
        log.warning("write refused on %s %s: %s", request.method, _route(request), exc)
        return _error(
            503,
            f"leader: this replica lost the lease; retry after {STORE_RETRY_AFTER_SECONDS} s",
            **{"Retry-After": str(STORE_RETRY_AFTER_SECONDS)},
        )
    except StoreUnavailable as exc:
        # The database is down or restarting: nothing was acknowledged, the client retries
        # (the broker reports not-ready meanwhile). No traceback: this is not a bug.
        log.warning("store unavailable on %s %s: %s", request.method, _route(request), exc)
        return _error(
            503,
            f"store: unavailable right now; retry after {STORE_RETRY_AFTER_SECONDS} s",
            **{"Retry-After": str(STORE_RETRY_AFTER_SECONDS)},
        )
    except Exception:
        # A bug, not the caller's fault; the path only (no headers: they hold the token).
        log.exception("internal error on %s %s", request.method, _route(request))
        return _error(500, "server: internal error")


def leader_address(holder: str | None, me: str) -> str | None:
    """The leader's identity when it is an address (host:port) and not this replica's."""
    if not holder or holder == me or not _ADDRESS.fullmatch(holder):
        return None
    return holder if 1 <= int(holder.rpartition(":")[2]) <= 65_535 else None


async def _forward(request: web.Request, refused: NotLeader) -> web.Response | None:
    """The leader's answer to this write, relayed (with ``X-Fedbroker-Forwarded-By``), or
    None when it is not forwarded: forwarding off, not a write under /v1/, already
    forwarded once (no loops), the leader unknown or no address, or the leader not
    answering within FORWARD_TIMEOUT. Whatever the leader answers is relayed, a 503 too
    (it stopped leading meanwhile: its answer names the newer leader).

    The Authorization header goes to the leader as it came; it is never logged."""
    session = request.app.get(FORWARDER)
    me = request.app[SERVICE].leadership.identity
    if (
        session is None
        or not request.app[CONFIG].leader_election.forward_writes
        or request.method not in WRITE_METHODS
        or not request.path.startswith("/v1/")
        or FORWARDED_BY in request.headers
    ):
        return None
    address = leader_address(refused.holder, me)
    if address is None:
        return None
    body = await request.read()  # already read (and size-checked) by the handler: cached
    headers = {k: request.headers[k] for k in _FORWARD_REQUEST_HEADERS if k in request.headers}
    headers[FORWARDED_BY] = me
    url = URL(f"http://{address}{request.raw_path}", encoded=True)  # path and query as sent
    try:
        async with session.request(
            request.method, url, data=body, headers=headers, allow_redirects=False
        ) as answer:
            payload = await answer.read()
            relayed = {
                k: answer.headers[k] for k in _FORWARD_RESPONSE_HEADERS if k in answer.headers
            }
            status = answer.status
    except (aiohttp.ClientError, TimeoutError) as exc:
        # The route template and the error only: no path (job names), no headers (token).
        log.warning(
            "%s %s not forwarded to the leader %s (%s: %s); answering 503",
            request.method, _route(request), address, type(exc).__name__, exc,
        )  # fmt: skip
        return None
    log.info("%s %s forwarded to the leader %s: %d", request.method, _route(request),
             address, status)  # fmt: skip
    relayed[FORWARDED_BY] = me
    return web.Response(body=payload, status=status, headers=relayed)


def _tenant(request: web.Request) -> TenantConfig:
    header = request.headers.get("Authorization", "")
    scheme, _, token = header.partition(" ")
    tenant = None
    if scheme.lower() == "bearer" and token.strip():
        tenant = request.app[CONFIG].authenticate(token.strip())
    if tenant is None:
        raise web.HTTPUnauthorized(
            reason="Authorization: missing or invalid bearer token",
            headers={"WWW-Authenticate": "Bearer"},
        )
    wait = request.app[LIMITER].retry_after(tenant.name)
    if wait is not None:
        limit = request.app[CONFIG].api.rate_limit_per_tenant
        raise web.HTTPTooManyRequests(
            reason=f"rate limit: tenant {tenant.name!r} is over {limit.requests_per_second:g} "
            f"requests/s (burst {limit.burst}); retry after {wait} s",
            headers={"Retry-After": str(wait)},
        )
    return tenant


def _owner(request: web.Request, tenant: TenantConfig) -> str:
    """Whose job a path names: the caller's, or for an admin the ``tenant`` query's."""
    other = request.query.get("tenant")
    return other if tenant.admin and other else tenant.name


def job_json(record: JobRecord, history: list[Transition] | None = None) -> dict[str, Any]:
    manifest = record.manifest
    status: dict[str, Any] = {
        "state": record.state,
        "cluster": record.cluster,
        "reason": record.reason,
        "queue": record.queue,
        "attempts": record.attempts,
        "notBefore": record.not_before,
        "createdAt": record.created_at,
        "updatedAt": record.updated_at,
    }
    if history is not None:
        status["history"] = [
            {"at": t.at, "state": t.state, "reason": t.reason, "cluster": t.cluster}
            for t in history
        ]
    return {
        "apiVersion": manifest.get("apiVersion"),
        "kind": manifest.get("kind"),
        "metadata": {**manifest.get("metadata", {}), "namespace": record.tenant},
        "spec": manifest.get("spec", {}),
        "status": status,
    }


async def _manifest(request: web.Request) -> FederatedJob:
    body = await request.read()
    return parse_manifest(body, request.headers.get("Content-Type"))


async def submit(request: web.Request) -> web.Response:
    tenant = _tenant(request)
    manifest = await _manifest(request)
    record, created = await request.app[SERVICE].submit(tenant.name, manifest)
    if created:
        request.app[METRICS].submitted.labels(record.queue).inc()
    log.info("job %s/%s %s", tenant.name, record.name, "created" if created else "resubmitted")
    return web.json_response(job_json(record), status=201 if created else 200)


def _int_param(
    request: web.Request, name: str, default: int | None, lo: int, hi: int
) -> int | None:
    raw = request.query.get(name)
    if raw is None or raw == "":
        return default
    if not _DIGITS.fullmatch(raw) or not lo <= int(raw) <= hi:
        raise web.HTTPBadRequest(reason=f"{name}: must be an integer in {lo}..{hi}")
    return int(raw)


async def list_jobs(request: web.Request) -> web.Response:
    tenant = _tenant(request)
    query = request.query
    state = query.get("state")
    if state is not None and state not in JOB_STATES:
        raise web.HTTPBadRequest(reason=f"state: must be one of {', '.join(JOB_STATES)}")
    limit = _int_param(request, "limit", 100, 1, MAX_LIST_LIMIT) or 100
    after = _int_param(request, "continue", None, 0, 2**62)
    owner = query.get("tenant") if tenant.admin else tenant.name
    states: JobState | None = next((s for s in JOB_STATES if s == state), None)
    records = await request.app[SERVICE].store.list_jobs(
        tenant=owner or None,
        queue=query.get("queue") or None,
        state=states,
        cluster=query.get("cluster") or None,
        limit=limit,
        after_seq=after,
    )
    cursor = str(records[-1].seq) if len(records) == limit else None
    return web.json_response({"items": [job_json(r) for r in records], "continue": cursor})


async def get_job(request: web.Request) -> web.Response:
    owner = _owner(request, _tenant(request))
    name = request.match_info["name"]
    service = request.app[SERVICE]
    record = await service.get(owner, name)
    return web.json_response(job_json(record, await service.store.history(owner, name)))


async def cancel_job(request: web.Request) -> web.Response:
    owner = _owner(request, _tenant(request))
    record = await request.app[SERVICE].cancel(owner, request.match_info["name"])
    return web.json_response(job_json(record))


async def explain_job(request: web.Request) -> web.Response:
    owner = _owner(request, _tenant(request))
    return web.json_response(await request.app[SERVICE].explain(owner, request.match_info["name"]))


async def plan(request: web.Request) -> web.Response:
    tenant = _tenant(request)
    manifest = await _manifest(request)
    return web.json_response(request.app[SERVICE].plan(tenant.name, manifest))


async def clusters(request: web.Request) -> web.Response:
    _tenant(request)
    return web.json_response({"clusters": request.app[SERVICE].clusters()})


async def queues(request: web.Request) -> web.Response:
    _tenant(request)
    return web.json_response({"queues": request.app[SERVICE].queues()})


async def pools(request: web.Request) -> web.Response:
    tenant = _tenant(request)
    return web.json_response(request.app[SERVICE].burst(None if tenant.admin else tenant.name))


def _role(service: Service) -> dict[str, Any]:
    leadership = service.leadership
    role = "leader" if service.leading else "follower"
    return {"role": role, "identity": leadership.identity, "leader": leadership.holder}


async def healthz(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok", **_role(request.app[SERVICE])})


async def readyz(request: web.Request) -> web.Response:
    """Ready once state is rebuilt (the leader's, or a follower's: it serves reads) and
    while the store answers (it cannot accept a job without it)."""
    service = request.app[SERVICE]
    if not service.ready:
        return web.json_response({"status": "rebuilding state"}, status=503)
    if not await service.store.ping():
        return web.json_response({"status": "store unavailable"}, status=503)
    return web.json_response({"status": "ready", **_role(service)})


# --- events (server-sent) ----------------------------------------------------------------


def _sse(event_id: int, kind: str, data: object) -> bytes:
    return f"id: {event_id}\nevent: {kind}\ndata: {json.dumps(data)}\n\n".encode()


async def events(request: web.Request) -> web.StreamResponse:
    """Job state changes (own tenant's; an admin's: all) and capacity changes, as SSE.

    Subscribed BEFORE the headers go out: once a client has the response, it misses
    nothing. Capacity events carry the clusters as ``/v1/clusters`` shows them, sent only
    when they changed. Events a slow reader lost are announced by an ``event: dropped``.
    """
    tenant = _tenant(request)
    bus = request.app[EVENTS]
    service = request.app[SERVICE]
    sub = bus.subscribe(None if tenant.admin else tenant.name)
    response = web.StreamResponse(
        headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache",
                 "X-Accel-Buffering": "no"}
    )  # fmt: skip
    try:
        await response.prepare(request)
        await response.write(b": subscribed\n\n")
        capacity: list[dict[str, Any]] | None = None
        dropped = 0
        while True:
            event: Event | None = await sub.next(timeout=KEEPALIVE_SECONDS)
            if sub.dropped != dropped:
                await response.write(_sse(0, "dropped", {"dropped": sub.dropped - dropped}))
                dropped = sub.dropped
            if event is None:
                if sub.closed:
                    break
                await response.write(b": keepalive\n\n")
                continue
            if event.kind == "capacity":
                now = service.clusters()
                if now == capacity:
                    continue
                capacity = now
                await response.write(_sse(event.id, "capacity", {"clusters": now}))
            else:
                await response.write(_sse(event.id, event.kind, dict(event.data)))
    except (ConnectionResetError, ConnectionError):
        pass  # the client went away
    finally:
        bus.unsubscribe(sub)
    return response


async def metrics(request: web.Request) -> web.Response:
    body = generate_latest(request.app[METRICS].registry)
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


async def openapi(request: web.Request) -> web.Response:
    return web.json_response(request.app[OPENAPI])


async def _close_events(app: web.Application) -> None:
    app[EVENTS].close()


async def _forwarder(app: web.Application) -> AsyncIterator[None]:
    """The HTTP client a follower forwards writes with (one pool, closed on shutdown)."""
    async with aiohttp.ClientSession(timeout=FORWARD_TIMEOUT) as session:
        app[FORWARDER] = session
        yield


def make_app(
    service: Service,
    config: Config,
    *,
    registry: CollectorRegistry | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> web.Application:
    """The API over ``service``. ``registry``: where the metrics go (default: a new one,
    never the global registry); ``clock``: monotonic seconds for the rate limiter.
    ``/v1/events`` reads the service's bus (every committed job change reaches it).
    """
    app = web.Application(
        client_max_size=config.api.body_limit_bytes, middlewares=[_count, _errors]
    )
    app[SERVICE] = service
    app[CONFIG] = config
    app[EVENTS] = service.bus
    app[METRICS] = ApiMetrics(registry or CollectorRegistry(), service)
    app[LIMITER] = RateLimiter(config.api.rate_limit_per_tenant, clock)
    app[OPENAPI] = openapi_document(MAX_LIST_LIMIT)
    app.on_shutdown.append(_close_events)
    app.cleanup_ctx.append(_forwarder)
    app.router.add_post("/v1/jobs", submit)
    app.router.add_get("/v1/jobs", list_jobs)
    app.router.add_get("/v1/jobs/{name}", get_job)
    app.router.add_delete("/v1/jobs/{name}", cancel_job)
    app.router.add_get("/v1/jobs/{name}/explain", explain_job)
    app.router.add_post("/v1/plan", plan)
    app.router.add_get("/v1/clusters", clusters)
    app.router.add_get("/v1/queues", queues)
    app.router.add_get("/v1/pools", pools)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/v1/events", events)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/openapi.json", openapi)
    add_dashboard(app, service, _tenant)
    return app


__all__ = [
    "CONFIG", "EVENTS", "LIMITER", "METRICS", "SERVICE", "ApiMetrics", "RateLimiter",
    "TokenBucket", "job_json", "make_app",
]  # fmt: skip
