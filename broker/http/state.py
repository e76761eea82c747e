"""What the HTTP handlers share through the application: its typed keys, the API's own
Prometheus metrics, and the route template a request is logged and counted under."""

from __future__ import annotations

from typing import Any

import aiohttp
from aiohttp import web
from prometheus_client import CollectorRegistry, Counter

from broker.config import Config
from broker.http.ratelimit import RateLimiter
from broker.http.tls import ApiCertificates
from broker.service.events import EventBus
from broker.service.facade import Service
from broker.service.metrics import Forward, ServiceCollector


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
TLS: web.AppKey[ApiCertificates] = web.AppKey("tls", ApiCertificates)  # absent: plain HTTP


def route_template(request: web.Request) -> str:
    """The route template (``/v1/jobs/{name}``), never the path: no job names in labels."""
    route = request.match_info.route
    resource = route.resource if route is not None else None
    return resource.canonical if resource is not None else "unmatched"


__all__ = [
    "CONFIG", "EVENTS", "FORWARDER", "LIMITER", "METRICS", "OPENAPI", "SERVICE", "TLS",
    "ApiMetrics",
    "route_template",
]  # fmt: skip
