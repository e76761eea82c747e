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
(an admin's or a viewer's: everyone's, as ``tenant/name``).
"""

from __future__ import annotations

from pathlib import Path

from aiohttp import web

from broker.http.auth import require, seen_by
from broker.http.state import SERVICE

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


async def nodes(request: web.Request) -> web.Response:
    """``/v1/nodes``, authenticated as the rest of ``/v1`` (the same tokens, rate limit and
    ``read`` permission)."""
    principal = await require(request, "read")
    rows = request.app[SERVICE].view.nodes(seen_by(principal))
    return web.json_response({"clusters": [row.as_json() for row in rows]})


def add_dashboard(app: web.Application) -> None:
    """Serve the dashboard (``/``, ``/static/{file}``) and ``/v1/nodes`` on ``app``."""
    app.router.add_get("/", page)
    app.router.add_get("/static/{file}", static)
    app.router.add_get("/v1/nodes", nodes)


__all__ = ["STATIC", "add_dashboard"]
