"""The audit trail and request ids: one JSON line on the ``fedbroker.audit`` logger per write
(submit, cancel, any write route), per denied request (401, 403, 429) and per admin action,
and an ``X-Request-Id`` on every answer.

The ``audit`` middleware is the outermost one: it runs around the error middleware, so it
sees the final status of every request (HTTP exceptions and errors included) and writes
exactly one line for an audited one. The line holds who (the principal authentication
stored on the request, else ``anonymous``, and its tenant, also as ``tenant``: the caller's,
whatever it acted on), on whom (``targetTenant``: another tenant an admin or a viewer
acted on, else null), what (the action, the job and its queue), the result code, the
source address and the request id: the client's
``X-Request-Id`` when it is short and of safe characters, else a new one. It never holds a
header, a body or a token. Where the line goes is the process's business (``audit.file``).
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
import uuid
from datetime import UTC, datetime
from typing import Any

from aiohttp import web

from broker.http.auth import sees_all
from broker.http.errors import Handler
from broker.http.principal import principal_of
from broker.http.state import route_template

AUDIT_LOGGER = "fedbroker.audit"
audit_log = logging.getLogger(AUDIT_LOGGER)

REQUEST_ID_HEADER = "X-Request-Id"
REQUEST_ID = web.RequestKey("request_id", str)  # where the request's id is kept
_SAFE_REQUEST_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")
DENIED = frozenset({401, 403, 429})
WRITE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
CLIENT_CLOSED = 499  # the client went away before the answer (nginx's code)
# Writes that change nothing: a dry run is audited only when denied.
_NOT_WRITES = frozenset({("POST", "/v1/plan")})
_ACTIONS = {
    ("POST", "/v1/jobs"): "submit",
    ("DELETE", "/v1/jobs/{name}"): "cancel",
    ("GET", "/v1/jobs"): "list",
    ("GET", "/v1/jobs/{name}"): "get",
    ("GET", "/v1/jobs/{name}/explain"): "explain",
    ("POST", "/v1/plan"): "plan",
    ("GET", "/v1/events"): "events",
}


def request_id(given: str | None) -> str:
    """The client's request id when it is safe to repeat (bounded, safe characters), else
    a new one."""
    if given is not None and _SAFE_REQUEST_ID.fullmatch(given):
        return given
    return uuid.uuid4().hex


def action_of(method: str, route: str) -> str:
    """The audit name of a route (``submit``, ``cancel``, ...; else ``METHOD route``)."""
    return _ACTIONS.get((method, route), f"{method} {route}")


def audited(method: str, route: str, status: int, roles: frozenset[str]) -> bool:
    """A write, a denied request, or anything an admin does under /v1/."""
    if status in DENIED:
        return True
    if not route.startswith("/v1/"):
        return False
    is_write = method in WRITE_METHODS and (method, route) not in _NOT_WRITES
    return is_write or "admin" in roles


def rfc3339(seconds: float) -> str:
    """``YYYY-MM-DDThh:mm:ss.sssZ``: RFC 3339, UTC, milliseconds."""
    return datetime.fromtimestamp(seconds, UTC).isoformat(timespec="milliseconds")[:-6] + "Z"


def _answered_job(response: web.StreamResponse | None) -> tuple[Any, Any, Any]:
    """(name, tenant, queue) of the job a JSON answer shows, where it shows one."""
    if not isinstance(response, web.Response) or response.content_type != "application/json":
        return None, None, None
    body = response.body
    try:
        doc = json.loads(body) if isinstance(body, bytes) and body.startswith(b"{") else None
    except ValueError:
        doc = None
    if not isinstance(doc, dict) or not isinstance(doc.get("metadata"), dict):
        return None, None, None
    status = doc.get("status")
    queue = status.get("queue") if isinstance(status, dict) else None
    return doc["metadata"].get("name"), doc["metadata"].get("namespace"), queue


def audit_line(
    request: web.Request, status: int, response: web.StreamResponse | None, now: float
) -> dict[str, Any]:
    """The audit record of ``request`` answered with ``status``."""
    principal = principal_of(request)
    route = route_template(request)
    # Only a write's answer is read: it is one job (a list of a thousand is not worth it).
    shown = request.method in WRITE_METHODS
    name, owner, queue = _answered_job(response) if shown else (None, None, None)
    name = name or request.match_info.get("name")
    caller = principal.tenant if principal is not None else None
    return {
        "ts": rfc3339(now),
        "actor": {
            "subject": principal.subject if principal is not None else "anonymous",
            "tenant": caller,
        },
        "tenant": caller,
        "targetTenant": _target(request, owner, caller),
        "roles": sorted(principal.roles) if principal is not None else [],
        "action": action_of(request.method, route),
        "job": name,
        "queue": queue,
        "result": status,
        "source": request.remote,
        "requestId": request.get(REQUEST_ID),
    }


def _target(request: web.Request, answered: Any, caller: str | None) -> str | None:
    """Another tenant the request acted on (None: the caller's own, or no tenant): the
    answered job's, or the ``tenant`` query of an admin or a viewer, the only callers whose
    ``?tenant=`` the routes follow (``auth.owner_of``); anyone else's names nothing."""
    principal = principal_of(request)
    if principal is None:
        return None
    asked = request.query.get("tenant") if sees_all(principal) else None
    target = answered if isinstance(answered, str) else asked
    return target if target and target != caller else None


@web.middleware
async def audit(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Around everything: the request id, and one audit line for an audited request."""
    request[REQUEST_ID] = request_id(request.headers.get(REQUEST_ID_HEADER))
    status, response = 500, None
    try:
        response = await handler(request)
        status = response.status
        return response
    except web.HTTPException as exc:
        status = exc.status
        raise
    except asyncio.CancelledError:
        status = CLIENT_CLOSED
        raise
    finally:
        principal = principal_of(request)
        roles = principal.roles if principal is not None else frozenset()
        if audited(request.method, route_template(request), status, roles):
            line = audit_line(request, status, response, time.time())
            audit_log.info(json.dumps(line, separators=(",", ":")), extra={"audit": line})


async def echo_request_id(request: web.Request, response: web.StreamResponse) -> None:
    """``on_response_prepare``: every answer names its request id (streams too)."""
    rid = request.get(REQUEST_ID)
    if rid is not None:
        response.headers[REQUEST_ID_HEADER] = rid


__all__ = [
    "AUDIT_LOGGER", "DENIED", "REQUEST_ID", "REQUEST_ID_HEADER", "action_of", "audit",
    "audit_line", "audited", "echo_request_id", "request_id", "rfc3339",
]  # fmt: skip
