"""Pull mode on the wire: the commands the broker sends an agent-fed cluster's agent, and
the agent's replies (pure: JSON in and out, no I/O).

Topics, below the prefix, for member cluster ``<c>`` (QoS 1, never retained, except
``capabilities``):

``agents/<c>/commands``  broker -> agent: one ``Command`` per message.
``agents/<c>/replies``  agent -> broker: one ``Reply`` per message.
``agents/<c>/capabilities``  agent -> broker, retained: what the agent carries out
    (``{"v": 1, "launch": true, "kinds": ["Job", ...], "mode": "pin"}``); an agent that
    only reports capacity publishes ``{"v": 1, "launch": false}``.

A command is ``{"v", "id", "cluster", "op", "job", "generation", "at", "body", "sig"}``:
``id`` names it for its replies and for deduplication (a resent command keeps its id),
``generation`` is the job's launch attempt (a delete of generation g voids launches of
generation <= g), ``at`` the broker's Unix time when it was (re)sent. ``op`` is one of
``OPS``; the body of each:

``launch``/``delete``  ``{"placement", "spec"}`` (``placement_doc``, ``spec_doc``);
``watch``  ``{"placement", "spec"}``: the final reply comes when the job ends;
``read_back``  ``{}``: the final reply's result is ``{"pods": {job: [bound]},
    "workloads": {job: found}}``;
``collect``  ``{"live": [job keys]}``: delete the objects of every other job;
``pods``  ``{"spec"}``; ``logs``  ``{"spec", "request"}`` (a bounded read, never a
    follow: ``result`` is ``{"data": <text>, "truncated": bool}``).

A reply is ``{"v", "id", "cluster", "op", "status", "error", "permanent", "result",
"sig"}``; ``status``: ``accepted`` (received and valid; work goes on), then one final
``done``, ``failed`` (``error`` says why, ``permanent`` when retrying cannot help) or
``refused`` (the agent will not carry it out: another cluster's command, a bad signature,
a template its policy refuses).

``sig``: HMAC-SHA256 (hex) of the document without ``sig``, serialised with sorted keys and
no spaces, under the cluster's command key, which the broker and that cluster's agent
share. The key never goes on the wire.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from broker.model import Placement, PodBound, PodPlacement, Resources
from broker.ports import (
    Domains,
    LaunchSpec,
    LogRequest,
    PlannedSlot,
    PodRow,
    ReportError,
    RunEnd,
    WorkloadFound,
    WorkloadSpec,
)

VERSION = 1
Op = Literal["launch", "delete", "watch", "read_back", "collect", "pods", "logs"]
OPS: frozenset[str] = frozenset(
    {"launch", "delete", "watch", "read_back", "collect", "pods", "logs"}
)
Status = Literal["accepted", "done", "failed", "refused"]
STATUSES: frozenset[str] = frozenset({"accepted", "done", "failed", "refused"})
FINAL: frozenset[str] = frozenset({"done", "failed", "refused"})
MAX_PAYLOAD = 8 << 20  # bytes of one command or reply
MAX_LOG_BYTES = 1 << 20  # of one log read through an agent (the HTTP API's bound)
MAX_SKEW_SECONDS = 900.0  # a command's ``at`` this far from the agent's clock is refused


class CommandError(ReportError):
    """A command or reply that breaks the schema or its signature (message: the field)."""


def commands_topic(cluster: str) -> str:
    return f"agents/{cluster}/commands"


def replies_topic(cluster: str) -> str:
    return f"agents/{cluster}/replies"


def capabilities_topic(cluster: str) -> str:
    return f"agents/{cluster}/capabilities"


@dataclass(frozen=True, slots=True)
class Command:
    id: str
    cluster: str
    op: Op
    job: str = ""
    generation: int = 0
    at: float = 0.0
    body: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Reply:
    id: str
    cluster: str
    op: str
    status: Status
    error: str = ""
    permanent: bool = False
    result: Mapping[str, Any] = field(default_factory=dict)

    @property
    def final(self) -> bool:
        return self.status in FINAL


# -- signatures --------------------------------------------------------------------------------


def _canonical(doc: Mapping[str, Any]) -> bytes:
    return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()


def sign(doc: Mapping[str, Any], key: bytes) -> str:
    return hmac.new(key, _canonical(doc), hashlib.sha256).hexdigest()


def _signed(doc: dict[str, Any], key: bytes) -> bytes:
    doc["sig"] = sign(doc, key)
    return json.dumps(doc, separators=(",", ":")).encode()


def _verified(payload: bytes, key: bytes, what: str) -> dict[str, Any]:
    if len(payload) > MAX_PAYLOAD:
        raise CommandError(f"{what}: larger than {MAX_PAYLOAD} bytes")
    try:
        doc = json.loads(payload)
    except (ValueError, UnicodeDecodeError):
        raise CommandError(f"{what}: not JSON") from None
    if not isinstance(doc, dict):
        raise CommandError(f"{what}: not an object")
    sig = doc.pop("sig", None)
    if not isinstance(sig, str) or not hmac.compare_digest(sig, sign(doc, key)):
        raise CommandError(f"{what}.sig: not signed with this cluster's command key")
    if doc.get("v") != VERSION:
        raise CommandError(f"{what}.v: version {doc.get('v')!r} is not {VERSION}")
    return doc


def _str(doc: Mapping[str, Any], key: str, what: str, *, empty: bool = False) -> str:
    value = doc.get(key, "")
    if not isinstance(value, str) or (not empty and not value) or len(value) > 1024:
        raise CommandError(f"{what}.{key}: not a name")
    return value


def encode_command(command: Command, key: bytes) -> bytes:
    doc = {
        "v": VERSION, "id": command.id, "cluster": command.cluster, "op": command.op,
        "job": command.job, "generation": command.generation, "at": command.at,
        "body": dict(command.body),
    }  # fmt: skip
    return _signed(doc, key)


def decode_command(payload: bytes, key: bytes) -> Command:
    """The command; ``CommandError`` naming the field when it is malformed or not signed
    with ``key``."""
    doc = _verified(payload, key, "command")
    op = doc.get("op")
    if op not in OPS:
        raise CommandError(f"command.op: {op!r} is not one of {sorted(OPS)}")
    generation, at, body = doc.get("generation", 0), doc.get("at"), doc.get("body", {})
    if not isinstance(generation, int) or isinstance(generation, bool) or generation < 0:
        raise CommandError("command.generation: not a non-negative integer")
    if not isinstance(at, int | float) or isinstance(at, bool):
        raise CommandError("command.at: not a time")
    if not isinstance(body, dict):
        raise CommandError("command.body: not an object")
    return Command(
        _str(doc, "id", "command"), _str(doc, "cluster", "command"), op,
        _str(doc, "job", "command", empty=True), generation, float(at), body,
    )  # fmt: skip


def encode_reply(reply: Reply, key: bytes) -> bytes:
    doc = {
        "v": VERSION, "id": reply.id, "cluster": reply.cluster, "op": reply.op,
        "status": reply.status, "error": reply.error[:4096], "permanent": reply.permanent,
        "result": dict(reply.result),
    }  # fmt: skip
    return _signed(doc, key)


def decode_reply(payload: bytes, key: bytes) -> Reply:
    doc = _verified(payload, key, "reply")
    status = doc.get("status")
    if status not in STATUSES:
        raise CommandError(f"reply.status: {status!r} is not one of {sorted(STATUSES)}")
    error, result = doc.get("error", ""), doc.get("result", {})
    if not isinstance(error, str):
        raise CommandError("reply.error: not a string")
    if not isinstance(result, dict):
        raise CommandError("reply.result: not an object")
    return Reply(
        _str(doc, "id", "reply"), _str(doc, "cluster", "reply"),
        _str(doc, "op", "reply"), status, error, doc.get("permanent") is True, result,
    )  # fmt: skip


# -- what the bodies and results carry ----------------------------------------------------------


def _resources_doc(r: Resources) -> dict[str, int]:
    return {"gpus": r.gpus, "gpuMilli": r.gpu_milli, "cpuMilli": r.cpu_milli,
            "memoryMib": r.memory_mib}  # fmt: skip


def _resources_of(doc: Mapping[str, Any]) -> Resources:
    return Resources(
        int(doc.get("gpus", 0)), int(doc.get("gpuMilli", 0)),
        int(doc.get("cpuMilli", 0)), int(doc.get("memoryMib", 0)),
    )  # fmt: skip


def placement_doc(p: Placement) -> dict[str, Any]:
    return {
        "job": p.job, "cluster": p.cluster, "policy": p.policy,
        "pods": [{"pod": x.pod, "node": x.node, "gpus": list(x.gpus),
                  "resources": _resources_doc(x.resources)} for x in p.pods],
    }  # fmt: skip


def placement_of(doc: Mapping[str, Any]) -> Placement:
    try:
        pods = tuple(
            PodPlacement(
                str(x["pod"]),
                str(x["node"]),
                tuple(int(g) for g in x["gpus"]),
                _resources_of(x["resources"]),
            )
            for x in doc["pods"]
        )
        return Placement(str(doc["job"]), str(doc["cluster"]), pods, str(doc.get("policy", "")))
    except (KeyError, TypeError, ValueError) as exc:
        raise CommandError(f"body.placement: not a placement ({exc})") from None


def spec_doc(spec: LaunchSpec) -> dict[str, Any]:
    workload = spec.workload
    return {
        "tenant": spec.tenant, "job": spec.job, "minMember": spec.min_member,
        "scheduleTimeoutSeconds": spec.schedule_timeout_seconds, "queue": spec.queue,
        "podTemplates": dict(spec.pod_templates), "podSecurity": spec.pod_security,
        "podSets": list(spec.pod_sets), "masterPort": spec.master_port,
        "generation": spec.generation,
        "domains": {name: {"shared": dict(d.shared), "sliceSize": d.slice_size,
                           "slices": [dict(x) for x in d.slices], "unresolved": d.unresolved}
                    for name, d in spec.domains.items()},
        "workload": None if workload is None else {
            "object": workload.object,
            "podSets": [[name, list(path)] for name, path in workload.pod_sets],
        },
    }  # fmt: skip


def spec_of(doc: Mapping[str, Any]) -> LaunchSpec:
    try:
        w = doc.get("workload")
        workload = None
        if w is not None:
            sets = tuple((str(name), tuple(path)) for name, path in w["podSets"])
            if not isinstance(w["object"], dict):
                raise TypeError("workload.object is not an object")
            workload = WorkloadSpec(w["object"], sets)
        templates = doc.get("podTemplates", {})
        if not isinstance(templates, dict):
            raise TypeError("podTemplates is not an object")
        return LaunchSpec(
            tenant=str(doc["tenant"]), job=str(doc["job"]),
            min_member=int(doc.get("minMember", 0)),
            schedule_timeout_seconds=int(doc.get("scheduleTimeoutSeconds", 600)),
            queue=str(doc.get("queue", "default")), pod_templates=templates,
            pod_security=str(doc.get("podSecurity", "baseline")),
            pod_sets=tuple(str(s) for s in doc.get("podSets", ())),
            master_port=int(doc.get("masterPort", 29500)),
            generation=int(doc.get("generation", 0)), workload=workload,
            domains=_domains_of(doc.get("domains", {})),
        )  # fmt: skip
    except (KeyError, TypeError, ValueError) as exc:
        raise CommandError(f"body.spec: not a launch spec ({exc})") from None


def _labels(doc: object) -> dict[str, str]:
    if not isinstance(doc, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in doc.items()
    ):
        raise TypeError("a domain is not an object of label keys to values")
    return dict(doc)


def _domains_of(doc: object) -> dict[str, Domains]:
    """The domains a delegate-mode launch keeps each pod set in (``LaunchSpec.domains``)."""
    if not isinstance(doc, dict):
        raise TypeError("domains is not an object")
    out: dict[str, Domains] = {}
    for name, d in doc.items():
        slices = d.get("slices", []) if isinstance(d, dict) else None
        if not isinstance(slices, list):
            raise TypeError(f"domains.{name} is not a pod set's domains")
        out[str(name)] = Domains(
            _labels(d.get("shared", {})), int(d.get("sliceSize", 0)),
            tuple(_labels(x) for x in slices), str(d.get("unresolved", "")),
        )  # fmt: skip
    return out


def end_doc(end: RunEnd) -> dict[str, Any]:
    """An end as the agent saw it; a ``RunEnd.error`` travels as its message."""
    return {
        "succeeded": end.succeeded, "reason": end.reason, "message": end.message,
        "error": "" if end.error is None else str(end.error)[:4096], "refused": end.refused,
    }  # fmt: skip


def end_of(doc: Mapping[str, Any], error: type[Exception] = Exception) -> RunEnd:
    message = doc.get("error")
    return RunEnd(
        doc.get("succeeded") is True, str(doc.get("reason", "")), str(doc.get("message", "")),
        error(str(message)) if message else None, doc.get("refused") is True,
    )  # fmt: skip


def bound_doc(pod: PodBound) -> dict[str, Any]:
    return {"pod": pod.pod, "node": pod.node, "resources": _resources_doc(pod.resources),
            "gpus": None if pod.gpus is None else list(pod.gpus)}  # fmt: skip


def bound_of(cluster: str, doc: Mapping[str, Any]) -> PodBound:
    gpus = doc.get("gpus")
    return PodBound(
        cluster, str(doc["pod"]), str(doc["node"]), _resources_of(doc["resources"]),
        None if gpus is None else tuple(int(g) for g in gpus),
    )  # fmt: skip


def found_doc(found: WorkloadFound) -> dict[str, Any]:
    plan = found.plan
    return {
        "plan": None if plan is None else [[s.pod, s.node, list(s.gpus)] for s in plan],
        "end": None if found.end is None else end_doc(found.end),
        "slotted": [bound_doc(p) for p in found.slotted], "gated": found.gated,
        "finished": found.finished, "planError": found.plan_error,
        "delegated": found.delegated,
    }  # fmt: skip


def found_of(cluster: str, doc: Mapping[str, Any]) -> WorkloadFound:
    plan = doc.get("plan")
    end = doc.get("end")
    return WorkloadFound(
        plan=None if plan is None else tuple(
            PlannedSlot(str(pod), str(node), tuple(int(g) for g in gpus))
            for pod, node, gpus in plan
        ),
        end=None if end is None else end_of(end),
        slotted=tuple(bound_of(cluster, p) for p in doc.get("slotted", ())),
        gated=int(doc.get("gated", 0)), finished=int(doc.get("finished", 0)),
        plan_error=str(doc.get("planError", "")), delegated=doc.get("delegated") is True,
    )  # fmt: skip


def row_doc(row: PodRow) -> dict[str, Any]:
    return {"name": row.name, "podSet": row.pod_set, "cluster": row.cluster, "node": row.node,
            "phase": row.phase, "restarts": row.restarts, "slot": row.slot}  # fmt: skip


def row_of(doc: Mapping[str, Any]) -> PodRow:
    return PodRow(
        str(doc["name"]), str(doc["podSet"]), str(doc["cluster"]), str(doc["node"]),
        str(doc["phase"]), int(doc["restarts"]), str(doc["slot"]),
    )  # fmt: skip


def log_request_doc(r: LogRequest) -> dict[str, Any]:
    return {"pod": r.pod, "container": r.container, "tailLines": r.tail_lines,
            "timestamps": r.timestamps, "previous": r.previous}  # fmt: skip


def log_request_of(doc: Mapping[str, Any]) -> LogRequest:
    container, tail = doc.get("container"), doc.get("tailLines")
    return LogRequest(
        str(doc["pod"]), None if container is None else str(container),
        None if tail is None else int(tail), follow=False,
        timestamps=doc.get("timestamps") is True, previous=doc.get("previous") is True,
    )  # fmt: skip


__all__ = [
    "FINAL",
    "MAX_LOG_BYTES",
    "MAX_SKEW_SECONDS",
    "OPS",
    "VERSION",
    "Command",
    "CommandError",
    "Reply",
    "bound_doc",
    "bound_of",
    "capabilities_topic",
    "commands_topic",
    "decode_command",
    "decode_reply",
    "encode_command",
    "encode_reply",
    "end_doc",
    "end_of",
    "found_doc",
    "found_of",
    "log_request_doc",
    "log_request_of",
    "placement_doc",
    "placement_of",
    "replies_topic",
    "row_doc",
    "row_of",
    "sign",
    "spec_doc",
    "spec_of",
]
