"""The OpenAPI part of a placed job's pods and logs (``broker.http.podlogs``): its answer
models and its two paths, put into the document by ``broker.http.openapi``."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from broker.http.podlogs import MAX_TAIL_LINES

REF = "#/components/schemas/{model}"


class PodInfo(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True)

    name: str
    pod_set: str
    cluster: str
    node: str = Field(description="empty while the pod is not bound to a node")
    phase: str
    restarts: int = Field(ge=0, description="the sum of its containers' restart counts")
    slot: str = Field(description="the placement slot it holds (<pod set>-<index>)")


class JobPods(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True)

    job: str
    pods: list[PodInfo]


POD_MODELS: tuple[type[BaseModel], ...] = (JobPods,)

_ERRORS = {
    "400": "a query parameter is wrong; the message names it",
    "401": "missing or invalid bearer token",
    "403": "the caller may not read this tenant's jobs",
    "404": "no such job for this tenant (also another tenant's job), or no such pod or "
    "container in the job",
    "409": "the job is not placed or running: it has no pods",
    "429": "rate limited, or the tenant's maxLogFollows followed logs are open; see Retry-After",
    "502": "the member cluster could not be read",
}


def _errors(*codes: str) -> dict[str, Any]:
    content = {"application/json": {"schema": {"$ref": REF.format(model="Error")}}}
    return {code: {"description": _ERRORS[code], "content": content} for code in codes}


def _query(name: str, schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"name": name, "in": "query", "required": False, "schema": schema,
            "description": description}  # fmt: skip


def pod_paths(name: dict[str, Any], tenant: dict[str, Any]) -> dict[str, Any]:
    """``/v1/jobs/{name}/pods`` and ``/v1/jobs/{name}/logs`` (``name``, ``tenant``: the
    document's path and tenant parameters)."""
    pods_ok = {"description": "OK", "content": {
        "application/json": {"schema": {"$ref": REF.format(model="JobPods")}}}}  # fmt: skip
    log_ok = {"description": "the log as the member sends it; past api.logLimitBytes a last "
              "line says it was truncated", "content": {"text/plain": {"schema": {
                  "type": "string"}}}}  # fmt: skip
    log_query = [
        tenant,
        _query("pod", {"type": "string", "maxLength": 253}, "the pod (default: the first)"),
        _query("container", {"type": "string", "maxLength": 63}, "the container"),
        _query("tailLines", {"type": "integer", "minimum": 1, "maximum": MAX_TAIL_LINES},
               "only the last lines"),
        _query("follow", {"type": "boolean"}, "keep streaming as the pod writes"),
        _query("timestamps", {"type": "boolean"}, "each line after when it was written"),
        _query("previous", {"type": "boolean"},
               "the container's previous instance (before its last restart)"),
    ]  # fmt: skip
    return {
        "/v1/jobs/{name}/pods": {
            "parameters": [name],
            "get": {
                "operationId": "jobPods",
                "summary": "a placed job's pods: cluster, node, phase, restarts, slot",
                "parameters": [tenant],
                "responses": {"200": pods_ok, **_errors("401", "403", "404", "409", "429",
                                                        "502")},
            },
        },
        "/v1/jobs/{name}/logs": {
            "parameters": [name],
            "get": {
                "operationId": "jobLogs",
                "summary": "one pod's log, streamed from its member cluster",
                "parameters": log_query,
                "responses": {"200": log_ok, **_errors("400", "401", "403", "404", "409",
                                                       "429", "502")},
            },
        },
    }  # fmt: skip


__all__ = ["POD_MODELS", "JobPods", "PodInfo", "pod_paths"]
