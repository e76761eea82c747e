"""The live dashboard: a static page at ``/`` and the one JSON it needs beyond ``/v1``.

``/`` (and its script and style under ``/static/``) is public: the files hold no data. The
page asks for a bearer token (a field, or ``/#token=...``: a fragment never reaches the
server, so it is not logged), keeps it in sessionStorage and sends it as an
``Authorization`` header on every call, the event stream included: the page reads
``/v1/events`` with ``fetch`` and a stream reader, not ``EventSource`` (which cannot set
headers), so no token ever travels in a URL.

``GET /v1/nodes`` (auth as the rest of ``/v1``; the rows of ``ReadModel.nodes``): per
cluster its nodes with GPU occupancy, in GPUs: ``used`` (bound pods), ``reserved`` (the
broker's placements not running yet), ``free``; ``burst`` marks nodes a burst pool
added. Occupancy is not a tenant's secret (``/v1/clusters`` shows it to every tenant),
but the jobs holding reservations are: ``reservedFor`` lists the caller's own jobs only
(an admin's: everyone's, as ``tenant/name``).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from aiohttp import web

from broker.config import TenantConfig
from broker.service.facade import Service

# The API's authentication (``broker.http.api._tenant``: bearer token -> tenant, 401 or 429),
# passed in by ``make_app`` so this module never imports broker.http.api (which imports it).
Authenticate = Callable[[web.Request], TenantConfig]

STATIC = Path(__file__).with_name("static")
# The only files served, by name: nothing else under static/ is reachable.
_FILES = {
    "dashboard.js": "text/javascript",
    "dashboard.css": "text/css",
}
_HEADERS = {
    # No inline script or style, nothing from elsewhere; the page renders data as text.
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
        "img-src 'self' data:; frame-ancestors 'none'; base-uri 'none'; form-action 'none'"
    ),
    "Referrer-Policy": "no-referrer",
    "X-Content-Type-Options": "nosniff",
    "Cache-Control": "no-cache",
}


async def page(request: web.Request) -> web.FileResponse:
    return web.FileResponse(
        STATIC / "dashboard.html", headers={**_HEADERS, "Content-Type": "text/html"}
    )


async def static(request: web.Request) -> web.FileResponse:
    name = request.match_info["file"]
    kind = _FILES.get(name)
    if kind is None:
        raise web.HTTPNotFound(reason="path: no such file")
    return web.FileResponse(STATIC / name, headers={**_HEADERS, "Content-Type": kind})


def add_dashboard(app: web.Application, service: Service, authenticate: Authenticate) -> None:
    """Serve the dashboard (``/``, ``/static/{file}``) and ``/v1/nodes`` on ``app``;
    ``authenticate``: the API's own (the same tokens, tenants and rate limit)."""

    async def nodes(request: web.Request) -> web.Response:
        tenant = authenticate(request)
        rows = service.view.nodes(None if tenant.admin else tenant.name)
        return web.json_response({"clusters": [row.as_json() for row in rows]})

    app.router.add_get("/", page)
    app.router.add_get("/static/{file}", static)
    app.router.add_get("/v1/nodes", nodes)


__all__ = ["STATIC", "add_dashboard"]
