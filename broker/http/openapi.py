"""The OpenAPI 3.1 document of the HTTP API (``/openapi.json``).

Generated, never hand-written JSON: the request body schema is the FederatedJob schema of
broker.manifest (the very models that validate a submission), and the answers are
described by the pydantic models of ``broker.http.answers``, which mirror what
broker.http.routes writes (the schemathesis test checks every answer against them).
Components live under ``#/components/schemas/{model}``.
"""

from __future__ import annotations

from typing import Any

from pydantic.json_schema import models_json_schema

from broker.http.answers import REF, RESPONSE_MODELS, Job
from broker.http.openapi_pods import pod_paths
from broker.manifest import json_schema
from broker.store import JOB_STATES

_DESCRIPTIONS = {
    "200": "OK",
    "201": "created (committed to the store)",
    "400": "bad input; the message names the field or parameter",
    "401": "missing or invalid bearer token",
    "403": (
        "the caller may not do this: a missing permission (role), a pod template its Pod "
        "Security profile refuses, namespace, queue, its cap of active jobs"
    ),
    "404": "no such job for this tenant (also another tenant's job)",
    "409": "the name is taken by an active job with another spec",
    "413": "body larger than the limit",
    "429": "rate limited; see Retry-After",
    "503": "not ready",
}


def _ref(model: str) -> dict[str, str]:
    return {"$ref": REF.format(model=model)}


def _json(model: str) -> dict[str, Any]:
    return {"application/json": {"schema": _ref(model)}}


def _responses(ok: dict[str, str], *errors: int) -> dict[str, Any]:
    out: dict[str, Any] = {
        code: {"description": _DESCRIPTIONS[code], "content": _json(model)}
        for code, model in ok.items()
    }
    for code in errors:
        entry: dict[str, Any] = {"description": _DESCRIPTIONS[str(code)], "content": _json("Error")}
        if code == 429:
            entry["headers"] = {
                "Retry-After": {
                    "description": "seconds to wait",
                    "schema": {"type": "integer", "minimum": 1},
                }
            }
        out[str(code)] = entry
    return out


def _query(name: str, schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"name": name, "in": "query", "required": False, "schema": schema,
            "description": description}  # fmt: skip


_NAME = {"name": "name", "in": "path", "required": True, "schema": {"type": "string"},
         "description": "the job's metadata.name"}  # fmt: skip
_TENANT = _query(
    "tenant", {"type": "string"}, "admin or viewer only: whose job (default: the caller's)"
)
_AUTH = (401, 403, 429)  # 403: the route's verb (submit, cancel, read) is not granted


def _body() -> dict[str, Any]:
    return {
        "required": True,
        "description": "a FederatedJob (JSON; YAML with Content-Type application/yaml)",
        "content": _json("FederatedJob"),
    }


def _operation(
    operation_id: str, responses: dict[str, Any], summary: str | None = None, **fields: Any
) -> dict[str, Any]:
    """One operation: its id, its summary if any, the other fields, then its answers."""
    operation: dict[str, Any] = {"operationId": operation_id}
    if summary is not None:
        operation["summary"] = summary
    return {**operation, **fields, "responses": responses}


def _list_parameters(max_list_limit: int) -> list[dict[str, Any]]:
    return [
        _query("queue", {"type": "string"}, "only this queue"),
        _query("state", {"type": "string", "enum": list(JOB_STATES)}, "only this state"),
        _query("cluster", {"type": "string"}, "only jobs placed on this cluster"),
        _query("tenant", {"type": "string"}, "admin or viewer only: this tenant's jobs"),
        _query(
            "name",
            {"type": "string"},
            "names containing this, or matching it as a glob (`*`, `?`, `[...]`)",
        ),
        _query(
            "selector",
            {"type": "string"},
            "labels, kubectl-style: `k=v,k2!=v,k3,!k4` "
            "(a filtered page may hold fewer than `limit` jobs: follow `continue`)",
        ),
        _query("limit", {"type": "integer", "minimum": 1, "maximum": max_list_limit}, "page size"),
        _query(
            "continue",
            {"type": "string", "pattern": "^[0-9]{1,18}$"},
            "the cursor of the previous page",
        ),
        _query(
            "view",
            {"type": "string", "enum": ["summary", "full"]},
            "summary (default): the spec without pod templates; full: the manifest as submitted",
        ),
    ]


def _job_paths(max_list_limit: int) -> dict[str, Any]:
    """Submit and list, one job (get, cancel), why it waits, and the dry run."""
    one = Job.__name__  # the response model's schema, named as pydantic names it
    job = _responses({"200": one}, 404, *_AUTH)
    submitted = _responses({"200": one, "201": one}, 400, 409, 413, *_AUTH)
    return {
        "/v1/jobs": {
            "post": _operation(
                "submitJob", submitted, "submit a job (201 once committed; 200 for a resubmit)",
                requestBody=_body(),
            ),
            "get": _operation(
                "listJobs", _responses({"200": "JobList"}, 400, *_AUTH),
                parameters=_list_parameters(max_list_limit),
            ),
        },
        "/v1/jobs/{name}": {
            "parameters": [_NAME],
            "get": _operation("getJob", job, parameters=[_TENANT]),
            "delete": _operation("cancelJob", job, parameters=[_TENANT]),
        },
        "/v1/jobs/{name}/explain": {
            "parameters": [_NAME],
            "get": _operation(
                "explainJob", _responses({"200": "Explain"}, 404, *_AUTH), parameters=[_TENANT]
            ),
        },
        "/v1/plan": {
            "post": _operation(
                "plan", _responses({"200": "Plan"}, 400, 413, *_AUTH),
                "dry run: where would this job go now (nothing is stored)", requestBody=_body(),
            )
        },
    }  # fmt: skip


# The federation's read-only views: (path, operationId and answer model, summary).
_VIEWS: tuple[tuple[str, str, str, str | None], ...] = (
    ("/v1/clusters", "clusters", "Clusters", None),
    ("/v1/queues", "queues", "Queues", None),
    ("/v1/nodes", "nodes", "Nodes",
     "every node's GPU occupancy per cluster (the dashboard's heat map)"),
    ("/v1/pools", "pools", "Pools",
     "burst pools: size, nodes coming and going, node-hours and cost; gangs waiting for "
     "burst nodes and cost per job (own tenant; admin: all)"),
)  # fmt: skip


def _view_paths() -> dict[str, Any]:
    return {
        path: {"get": _operation(operation_id, _responses({"200": model}, *_AUTH), summary)}
        for path, operation_id, model, summary in _VIEWS
    }


def _text(description: str, media: str) -> dict[str, Any]:
    return {"description": description, "content": {media: {"schema": {"type": "string"}}}}


def _stream_paths() -> dict[str, Any]:
    """Server-sent events, and the unauthenticated probes and metrics."""
    stream = _text("an event stream (`event: job|capacity`, JSON `data`)", "text/event-stream")
    return {
        "/v1/events": {
            "get": _operation(
                "events", {"200": stream, **_responses({}, *_AUTH)},
                "server-sent events: job state changes (own tenant; admin: all) "
                "and capacity changes",
            )
        },
        "/healthz": {
            "get": _operation("healthz", _responses({"200": "Health"}), security=[])
        },
        "/readyz": {
            "get": _operation(
                "readyz", _responses({"200": "Health", "503": "Health"}), security=[]
            )
        },
        "/metrics": {
            "get": _operation(
                "metrics", {"200": _text("Prometheus text format", "text/plain")}, security=[]
            )
        },
    }  # fmt: skip


def _paths(max_list_limit: int) -> dict[str, Any]:
    return {
        **_job_paths(max_list_limit), **pod_paths(_NAME, _TENANT), **_view_paths(),
        **_stream_paths(),
    }  # fmt: skip


def openapi_document(max_list_limit: int = 1000) -> dict[str, Any]:
    """The whole document; pure (no service state), so it can be built once per app."""
    manifest = json_schema(ref_template=REF)
    schemas: dict[str, Any] = dict(manifest.pop("$defs", {}))
    schemas["FederatedJob"] = manifest
    _, defs = models_json_schema(
        [(m, "serialization") for m in RESPONSE_MODELS], by_alias=True, ref_template=REF
    )
    for name, schema in defs.get("$defs", {}).items():
        if name in schemas and schemas[name] != schema:
            raise ValueError(f"schema name {name!r} is used by two different models")
        schemas[name] = schema
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "fedbroker",
            "version": "v1",
            "description": "Multi-cluster GPU federation broker. Every error is "
            '`{"error": "<field>: <problem>"}`.',
        },
        "paths": _paths(max_list_limit),
        "components": {
            "schemas": schemas,
            "securitySchemes": {
                "bearer": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "a static token, or an OIDC JWT (RS256/ES256) from the "
                    "configured issuer",
                }
            },
        },
        "security": [{"bearer": []}],
    }


__all__ = ["RESPONSE_MODELS", "openapi_document"]
