"""The HTTP API's application (``make_app``): a thin aiohttp skin over
``broker.service.facade.Service``, its middlewares (the audit trail and request ids,
request counts, errors as JSON) and the registration of every route.

Every answer is JSON, errors included (``{"error": message}``, the message naming the
field for bad input); bad input never gets a 5xx. A bearer token (static, or an OIDC
JWT) maps to a principal: a tenant and its roles (``broker.http.auth``); a tenant sees
only its own jobs, and another tenant's job answers 404 (never 403), so job
names do not leak. Tokens are never logged: only the tenant name is.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable

from aiohttp import web
from prometheus_client import CollectorRegistry

from broker.config import Config
from broker.http import routes
from broker.http.audit import audit, echo_request_id
from broker.http.auth import AUTH, Authenticator, auth_context
from broker.http.dashboard import add_dashboard
from broker.http.errors import Handler, errors
from broker.http.forwarding import forwarder
from broker.http.limits import ANONYMOUS, OPEN_STREAMS, unauthenticated
from broker.http.openapi import openapi_document
from broker.http.podlogs import OPEN_FOLLOWS, job_logs, job_pods
from broker.http.protocol import common_headers, json_parser_errors
from broker.http.ratelimit import RateLimiter
from broker.http.state import (
    CONFIG,
    EVENTS,
    LIMITER,
    METRICS,
    OPENAPI,
    SERVICE,
    TLS,
    ApiMetrics,
    route_template,
)
from broker.http.stream import events
from broker.http.tls import ApiCertificates
from broker.service.facade import Service


@web.middleware
async def _count(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Counts every answer by route template and status (errors included)."""
    status = 500
    try:
        response = await handler(request)
        status = response.status
        return response
    except web.HTTPException as exc:
        status = exc.status
        raise
    finally:
        request.app[METRICS].requests.labels(route_template(request), str(status)).inc()


async def _close_events(app: web.Application) -> None:
    app[EVENTS].close()


def make_app(
    service: Service,
    config: Config,
    *,
    registry: CollectorRegistry | None = None,
    clock: Callable[[], float] = time.monotonic,
    certificates: ApiCertificates | None = None,
) -> web.Application:
    """The API over ``service``. ``registry``: where the metrics go (default: a new one,
    never the global registry); ``clock``: monotonic seconds for the rate limiter (and the
    refetch of an OIDC issuer's keys); ``certificates``: the listener's TLS (a follower then
    forwards writes over HTTPS). ``/v1/events`` reads the service's bus (every committed
    job change reaches it).
    """
    middlewares = [audit, _count, unauthenticated, errors]
    app = web.Application(client_max_size=config.api.body_limit_bytes, middlewares=middlewares)
    app[SERVICE] = service
    app[CONFIG] = config
    app[EVENTS] = service.bus
    app[METRICS] = ApiMetrics(registry or CollectorRegistry(), service)
    app[LIMITER] = RateLimiter(config.api.rate_limit_per_tenant, clock)
    app[ANONYMOUS] = RateLimiter(config.api.rate_limit_unauthenticated, clock)
    app[OPEN_STREAMS] = Counter()
    app[OPEN_FOLLOWS] = Counter()
    app[AUTH] = Authenticator(config, clock)
    app[OPENAPI] = openapi_document(routes.MAX_LIST_LIMIT)
    if certificates is not None:
        app[TLS] = certificates
    app.on_shutdown.append(_close_events)
    app.on_response_prepare.append(common_headers)
    json_parser_errors()
    app.on_response_prepare.append(echo_request_id)
    app.cleanup_ctx.append(forwarder)
    app.cleanup_ctx.append(auth_context)
    app.router.add_post("/v1/jobs", routes.submit)
    app.router.add_get("/v1/jobs", routes.list_jobs)
    app.router.add_get("/v1/jobs/{name}", routes.get_job)
    app.router.add_delete("/v1/jobs/{name}", routes.cancel_job)
    app.router.add_get("/v1/jobs/{name}/explain", routes.explain_job)
    app.router.add_get("/v1/jobs/{name}/pods", job_pods)
    app.router.add_get("/v1/jobs/{name}/logs", job_logs)
    app.router.add_post("/v1/plan", routes.plan)
    app.router.add_get("/v1/clusters", routes.clusters)
    app.router.add_get("/v1/queues", routes.queues)
    app.router.add_get("/v1/pools", routes.pools)
    app.router.add_get("/healthz", routes.healthz)
    app.router.add_get("/readyz", routes.readyz)
    app.router.add_get("/v1/events", events)
    app.router.add_get("/metrics", routes.metrics)
    app.router.add_get("/openapi.json", routes.openapi)
    add_dashboard(app)
    return app


__all__ = ["make_app"]
