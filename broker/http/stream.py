"""The server-sent event stream (``GET /v1/events``): job state changes (own tenant's; an
admin's or a viewer's: all) and capacity changes, with keepalives and a notice of events a
slow reader lost; at most ``maxEventStreams`` open per tenant (``limits.stream_slot``)."""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

from broker.http.auth import require, seen_by
from broker.http.limits import stream_slot
from broker.http.principal import Principal
from broker.http.state import CONFIG, EVENTS, SERVICE
from broker.service.events import Event

KEEPALIVE_SECONDS = 15.0  # an SSE comment this often, so idle streams and dead peers show


def _sse(event_id: int, kind: str, data: object) -> bytes:
    return f"id: {event_id}\nevent: {kind}\ndata: {json.dumps(data)}\n\n".encode()


async def events(request: web.Request) -> web.StreamResponse:
    """Job state changes (own tenant's; an admin's: all) and capacity changes, as SSE.

    Subscribed BEFORE the headers go out: once a client has the response, it misses
    nothing. Capacity events carry the clusters as ``/v1/clusters`` shows them, sent only
    when they changed. Events a slow reader lost are announced by an ``event: dropped``.
    """
    principal = await require(request, "read")
    tenant = request.app[CONFIG].tenant(principal.tenant)
    if tenant is None:  # a principal always names a configured tenant
        raise web.HTTPForbidden(reason=f"forbidden: no tenant {principal.tenant!r}")
    with stream_slot(request, tenant):
        return await _stream(request, principal)


async def _stream(request: web.Request, principal: Principal) -> web.StreamResponse:
    bus = request.app[EVENTS]
    service = request.app[SERVICE]
    sub = bus.subscribe(seen_by(principal))
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


__all__ = ["KEEPALIVE_SECONDS", "events"]
