"""The HTTP API (``/v1``): a thin aiohttp skin over ``broker.service.Service``.

Every answer is JSON, errors included (``{"error": message}``, the message naming the
field for bad input); bad input never gets a 5xx. A bearer token maps to a tenant; a
tenant sees only its own jobs, and another tenant's job answers 404 (never 403), so job
names do not leak. Tokens are never logged: only the tenant name is.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from broker.config import Config, TenantConfig
from broker.manifest import FederatedJob, ManifestError, parse_manifest
from broker.service import Forbidden, NotFound, Service
from broker.store import JOB_STATES, JobRecord, JobState, Transition

log = logging.getLogger(__name__)

SERVICE: web.AppKey[Service] = web.AppKey("service", Service)
CONFIG: web.AppKey[Config] = web.AppKey("config", Config)
MAX_LIST_LIMIT = 1000

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _error(status: int, message: str, **headers: str) -> web.Response:
    return web.json_response({"error": message}, status=status, headers=headers or None)


@web.middleware
async def _errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Every error as JSON: aiohttp's own (404, 405, 413) and ours."""
    try:
        return await handler(request)
    except web.HTTPRequestEntityTooLarge:
        limit = request.app[CONFIG].api.body_limit_bytes
        return _error(413, f"body: larger than the limit of {limit} bytes")
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        return _error(exc.status, exc.reason)
    except ManifestError as exc:
        return _error(400, str(exc))
    except Forbidden as exc:
        return _error(403, str(exc))
    except NotFound as exc:
        return _error(404, str(exc))


def _tenant(request: web.Request) -> TenantConfig:
    header = request.headers.get("Authorization", "")
    scheme, _, token = header.partition(" ")
    tenant = None
    if scheme.lower() == "bearer" and token.strip():
        tenant = request.app[CONFIG].authenticate(token.strip())
    if tenant is None:
        raise web.HTTPUnauthorized(
            reason="missing or invalid bearer token", headers={"WWW-Authenticate": "Bearer"}
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
    log.info("job %s/%s %s", tenant.name, record.name, "created" if created else "resubmitted")
    return web.json_response(job_json(record), status=201 if created else 200)


def _int_param(
    request: web.Request, name: str, default: int | None, lo: int, hi: int
) -> int | None:
    raw = request.query.get(name)
    if raw is None or raw == "":
        return default
    if not raw.isdigit() or not lo <= int(raw) <= hi:
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


async def healthz(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def readyz(request: web.Request) -> web.Response:
    if not request.app[SERVICE].ready:
        return web.json_response({"status": "rebuilding state"}, status=503)
    return web.json_response({"status": "ready"})


def make_app(service: Service, config: Config) -> web.Application:
    app = web.Application(client_max_size=config.api.body_limit_bytes, middlewares=[_errors])
    app[SERVICE] = service
    app[CONFIG] = config
    app.router.add_post("/v1/jobs", submit)
    app.router.add_get("/v1/jobs", list_jobs)
    app.router.add_get("/v1/jobs/{name}", get_job)
    app.router.add_delete("/v1/jobs/{name}", cancel_job)
    app.router.add_get("/v1/jobs/{name}/explain", explain_job)
    app.router.add_post("/v1/plan", plan)
    app.router.add_get("/v1/clusters", clusters)
    app.router.add_get("/v1/queues", queues)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    return app


__all__ = ["CONFIG", "SERVICE", "job_json", "make_app"]
