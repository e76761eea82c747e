"""The ``/v1`` handlers (jobs, the dry run, the federation's views) and the probes,
``/metrics`` and ``/openapi.json``: each reads the request, asks the service, answers JSON.

Every ``/v1`` handler checks its verb through ``auth.require`` (submit, cancel, read) before
it does anything else. A tenant sees only its own jobs, and another tenant's job answers
404 (never 403), so job names do not leak; only the tenant name is logged."""

from __future__ import annotations

import logging
import re
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from broker.http.auth import authenticate, owner_of, require, require_on_queue, seen_by, sees_all
from broker.http.selectors import SelectorError, name_matcher, parse_selector
from broker.http.state import CONFIG, METRICS, OPENAPI, SERVICE
from broker.manifest import FederatedJob, parse_manifest
from broker.service.facade import Service
from broker.store import JOB_STATES, JobRecord, JobState, Transition

log = logging.getLogger(__name__)

MAX_LIST_LIMIT = 1000
_DIGITS = re.compile(r"[0-9]{1,18}")  # ASCII only: str.isdigit() accepts "²", int() does not


LIST_VIEWS = ("summary", "full")


def summary_spec(spec: dict[str, Any]) -> dict[str, Any]:
    """The spec without what makes a manifest large (pod templates, an embedded workload):
    what a list shows by default, a few KB at most whatever was submitted."""
    small = {k: v for k, v in spec.items() if k != "workload"}
    pod_sets = small.get("podSets")
    if isinstance(pod_sets, list):
        small["podSets"] = [
            {k: v for k, v in ps.items() if k != "template"} if isinstance(ps, dict) else ps
            for ps in pod_sets
        ]
    return small


def job_json(
    record: JobRecord,
    history: list[Transition] | None = None,
    *,
    full: bool = True,
    waiting: str | None = None,
) -> dict[str, Any]:
    """A job as the API shows it: its manifest (``full``; else the summary spec),
    namespaced to its tenant, and its status (``waiting``: why a queued job waits, in
    short, from the scheduler's last look at it)."""
    manifest = record.manifest
    status: dict[str, Any] = {
        "state": record.state,
        "cluster": record.cluster,
        "reason": record.reason,
        "queue": record.queue,
        "attempts": record.attempts,
        "generation": record.generation,
        "notBefore": record.not_before,
        "createdAt": record.created_at,
        "updatedAt": record.updated_at,
    }
    if waiting is not None:
        status["waiting"] = waiting
    if history is not None:
        status["history"] = [
            {"at": t.at, "state": t.state, "reason": t.reason, "cluster": t.cluster}
            for t in history
        ]
    return {
        "apiVersion": manifest.get("apiVersion"),
        "kind": manifest.get("kind"),
        "metadata": {**manifest.get("metadata", {}), "namespace": record.tenant},
        "spec": manifest.get("spec", {}) if full else summary_spec(manifest.get("spec", {})),
        "status": status,
    }


async def _manifest(request: web.Request) -> FederatedJob:
    body = await request.read()
    return parse_manifest(body, request.headers.get("Content-Type"))


async def submit(request: web.Request) -> web.Response:
    tenant = (await authenticate(request)).tenant
    manifests: list[FederatedJob] = []

    async def queue() -> str:  # the manifest's queue, or the tenant's default
        manifests.append(await _manifest(request))
        config = request.app[CONFIG].tenant(tenant)
        default = config.default_queue if config is not None else ""
        return manifests[0].spec.queue or default

    await require_on_queue(request, "submit", tenant, queue)
    manifest = manifests[0] if manifests else await _manifest(request)
    record, created = await request.app[SERVICE].submit(tenant, manifest)
    if created:
        request.app[METRICS].submitted.labels(record.queue).inc()
    log.info("job %s/%s %s", tenant, record.name, "created" if created else "resubmitted")
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
    principal = await authenticate(request)
    owner = request.query.get("tenant") if sees_all(principal) else principal.tenant
    await require(request, "read", tenant=owner or principal.tenant)
    query = request.query
    state = query.get("state")
    if state is not None and state not in JOB_STATES:
        raise web.HTTPBadRequest(reason=f"state: must be one of {', '.join(JOB_STATES)}")
    view = query.get("view") or "summary"
    if view not in LIST_VIEWS:
        raise web.HTTPBadRequest(reason=f"view: must be one of {', '.join(LIST_VIEWS)}")
    limit = _int_param(request, "limit", 100, 1, MAX_LIST_LIMIT) or 100
    after = _int_param(request, "continue", None, 0, 2**62)
    states: JobState | None = next((s for s in JOB_STATES if s == state), None)
    keep = _job_filter(query.get("name") or None, query.get("selector") or None)
    service = request.app[SERVICE]

    async def page(after_seq: int | None) -> list[JobRecord]:
        return await service.store.list_jobs(
            tenant=owner or None,
            queue=query.get("queue") or None,
            state=states,
            cluster=query.get("cluster") or None,
            limit=limit,
            after_seq=after_seq,
        )

    records, cursor = await _filtered(page, keep, after, limit)
    items = [
        job_json(r, full=view == "full", waiting=service.waiting(r.tenant, r.name)) for r in records
    ]
    return web.json_response({"items": items, "continue": cursor})


# A filtered list reads at most this many pages of ``limit`` jobs per request; a page that
# filled up short of ``limit`` answers what it found and a cursor (follow ``continue``).
FILTER_SCAN_PAGES = 10


def _job_filter(name: str | None, selector: str | None) -> Callable[[JobRecord], bool] | None:
    if name is None and selector is None:
        return None
    try:
        wanted = parse_selector(selector) if selector is not None else ()
    except SelectorError as exc:
        raise web.HTTPBadRequest(reason=f"selector: {exc}") from None
    try:
        named = name_matcher(name) if name is not None else None
    except SelectorError as exc:
        raise web.HTTPBadRequest(reason=f"name: {exc}") from None

    def keep(record: JobRecord) -> bool:
        if named is not None and not named(record.name):
            return False
        if not wanted:
            return True
        labels = record.manifest.get("metadata", {}).get("labels") or {}
        return all(r.matches(labels) for r in wanted)

    return keep


async def _filtered(
    page: Callable[[int | None], Awaitable[list[JobRecord]]],
    keep: Callable[[JobRecord], bool] | None,
    after: int | None,
    limit: int,
) -> tuple[list[JobRecord], str | None]:
    """Up to ``limit`` kept jobs after ``after``, and the cursor to go on from (None: the
    end). Unfiltered: one page. Filtered: at most FILTER_SCAN_PAGES pages are read."""
    if keep is None:
        records = await page(after)
        return records, str(records[-1].seq) if len(records) == limit else None
    kept: list[JobRecord] = []
    cursor = after
    for _ in range(FILTER_SCAN_PAGES):
        records = await page(cursor)
        for r in records:
            cursor = r.seq
            if keep(r):
                kept.append(r)
                if len(kept) == limit:
                    return kept, str(cursor)
        if len(records) < limit:
            return kept, None
    return kept, None if cursor is None else str(cursor)


async def get_job(request: web.Request) -> web.Response:
    owner = owner_of(request, await authenticate(request))
    await require(request, "read", tenant=owner)
    name = request.match_info["name"]
    service = request.app[SERVICE]
    record = await service.get(owner, name)
    stored = await service.store.history(owner, name)
    bursts = service.burst_history(owner, name, record.created_at)
    history = sorted([*stored, *bursts], key=lambda t: t.at)  # stable: stored order kept
    return web.json_response(job_json(record, history, waiting=service.waiting(owner, name)))


async def cancel_job(request: web.Request) -> web.Response:
    owner = owner_of(request, await authenticate(request))
    name = request.match_info["name"]

    async def queue() -> str:  # the job's own queue (404 if there is no such job)
        return (await request.app[SERVICE].get(owner, name)).queue

    await require_on_queue(request, "cancel", owner, queue)
    record = await request.app[SERVICE].cancel(owner, name)
    return web.json_response(job_json(record))


async def explain_job(request: web.Request) -> web.Response:
    """The per-cluster rows are a dry run: counted against the caller's tenant (an admin's
    or a viewer's for another tenant's job too), 429 beyond its bounds."""
    principal = await authenticate(request)
    owner = owner_of(request, principal)
    await require(request, "read", tenant=owner)
    name = request.match_info["name"]
    doc = await request.app[SERVICE].explain(owner, name, caller=principal.tenant)
    return web.json_response(doc)


async def plan(request: web.Request) -> web.Response:
    """A dry run stores nothing: reading the federation is enough to ask it. It runs off
    the event loop, bounded per tenant and on a time budget (429 beyond)."""
    principal = await require(request, "read")
    manifest = await _manifest(request)
    return web.json_response(await request.app[SERVICE].plan(principal.tenant, manifest))


async def clusters(request: web.Request) -> web.Response:
    await require(request, "read")
    clusters = request.app[SERVICE].clusters(stranded_gpus_too=True)
    return web.json_response({"clusters": clusters})


async def queues(request: web.Request) -> web.Response:
    await require(request, "read")
    return web.json_response({"queues": request.app[SERVICE].queues()})


async def pools(request: web.Request) -> web.Response:
    principal = await require(request, "read")
    return web.json_response(request.app[SERVICE].burst(seen_by(principal)))


def _role(service: Service) -> dict[str, Any]:
    leadership = service.leadership
    role = "leader" if service.leading else "follower"
    return {"role": role, "identity": leadership.identity, "leader": leadership.holder}


async def healthz(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok", **_role(request.app[SERVICE])})


async def readyz(request: web.Request) -> web.Response:
    """Ready once state is rebuilt (the leader's, or a follower's: it serves reads) and
    while the store answers (it cannot accept a job without it). A burst pool that cannot
    be read is a detail (``burstPools``), not unreadiness: placing on the members goes on."""
    service = request.app[SERVICE]
    if not service.ready:
        return web.json_response({"status": "rebuilding state"}, status=503)
    if not await service.store.ping():
        return web.json_response({"status": "store unavailable"}, status=503)
    pools = [a.as_json() for a in service.view.availability()]
    return web.json_response({"status": "ready", **_role(service), "burstPools": pools})


async def metrics(request: web.Request) -> web.Response:
    body = generate_latest(request.app[METRICS].registry)
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


async def openapi(request: web.Request) -> web.Response:
    return web.json_response(request.app[OPENAPI])


__all__ = ["MAX_LIST_LIMIT", "job_json"]
