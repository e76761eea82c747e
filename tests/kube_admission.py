"""The test member's API server between a request and storage: a create or update of a
Pod, a batch/v1 Job or a workload custom resource is decoded (``kube_schema``), defaulted
and validated (``kube_pod_rules``, ``kube_pod_update``, ``kube_job_rules``, the CRDs'
schemas) into what is stored, or refused with the ``Status`` a kube-apiserver answers: 400
``BadRequest`` for a body that does not decode, 422 ``Invalid`` with ``details.causes[]``
(``field``, ``reason``, ``message``) for one that breaks a rule
(``staging/src/k8s.io/apimachinery/pkg/api/errors``: ``NewInvalid`` writes ``<Kind> "<name>"
is invalid: <causes>``). Updates follow the status subresource split: a PATCH of the object
keeps its status, a PATCH of ``/status`` changes nothing else.

Pure: no HTTP here; ``kmock_namespaces.NamespacedEmulator`` calls it.
"""

from __future__ import annotations

import copy
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kube_job_rules import default_job, job_create, job_update
from kube_pod_rules import default_pod, metadata, pod_create
from kube_pod_update import pod_update
from kube_schema import Cause, Decoded, DecodeError, decode_builtin, decode_custom

# (group, plural) -> the real CRD file of a custom resource the member serves
CRD_FILES: Mapping[tuple[str, str], str] = {
    ("jobset.x-k8s.io", "jobsets"): "jobset.x-k8s.io_jobsets.yaml",
    ("kubeflow.org", "pytorchjobs"): "kubeflow.org_pytorchjobs.yaml",
    ("ray.io", "rayjobs"): "ray.io_rayjobs.yaml",
    ("ray.io", "rayclusters"): "ray.io_rayclusters.yaml",
    ("trainer.kubeflow.org", "trainjobs"): "trainer.kubeflow.org_trainjobs.yaml",
    ("trainer.kubeflow.org", "clustertrainingruntimes"): (
        "trainer.kubeflow.org_clustertrainingruntimes.yaml"
    ),
    ("trainer.kubeflow.org", "trainingruntimes"): "trainer.kubeflow.org_trainingruntimes.yaml",
    ("kubeflow.org", "mpijobs"): "kubeflow.org_mpijobs-v2beta1.yaml",
    ("leaderworkerset.x-k8s.io", "leaderworkersets"): (
        "leaderworkerset.x-k8s.io_leaderworkersets.yaml"
    ),
    ("scheduling.x-k8s.io", "podgroups"): "scheduling.x-k8s.io_podgroups.yaml",
    ("scheduling.volcano.sh", "podgroups"): "scheduling.volcano.sh_podgroups.yaml",
}
BUILTIN: Mapping[tuple[str, str], tuple[str, str]] = {
    ("", "pods"): ("Pod", "v1"),
    ("batch", "jobs"): ("Job", "batch/v1"),
}


@dataclass(frozen=True, slots=True)
class Kind:
    """A resource the member validates: its group, version and plural."""

    group: str
    version: str
    plural: str

    @property
    def builtin(self) -> tuple[str, str] | None:
        return BUILTIN.get((self.group, self.plural))

    @property
    def crd_file(self) -> str | None:
        return CRD_FILES.get((self.group, self.plural))

    @property
    def validated(self) -> bool:
        return self.builtin is not None or self.crd_file is not None


@dataclass
class Review:
    """What the server makes of one write: ``obj`` to store, or ``status`` (the refusal's
    body, its ``code`` the HTTP status); ``pruned``: the fields it dropped."""

    obj: dict[str, Any] | None = None
    status: dict[str, Any] | None = None
    pruned: list[str] = field(default_factory=list)

    @property
    def code(self) -> int:
        return int((self.status or {}).get("code") or 200)


def status(
    code: int, reason: str, message: str, details: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Status",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }
    if details is not None:
        body["details"] = dict(details)
    return body


def refused(kind: Kind, obj: Mapping[str, Any], causes: list[Cause]) -> dict[str, Any]:
    """The 422 ``Invalid`` a kube-apiserver answers for ``causes``."""
    name = str((obj.get("metadata") or {}).get("name") or "")
    type_name = str(obj.get("kind") or (kind.builtin or ("",))[0])
    qualified = f"{type_name}.{kind.group}" if kind.crd_file else type_name
    lines = [c.line() for c in causes]
    listed = lines[0] if len(lines) == 1 else f"[{', '.join(lines)}]"
    details = {
        "name": name,
        "group": kind.group,
        "kind": type_name,
        "causes": [{"reason": c.reason, "message": c.message, "field": c.field} for c in causes],
    }
    return status(422, "Invalid", f'{qualified} "{name}" is invalid: {listed}', details)


def _decode(kind: Kind, body: Any) -> Decoded:
    builtin = kind.builtin
    if builtin is not None:
        return decode_builtin(body, *builtin)
    assert kind.crd_file is not None
    return decode_custom(body, kind.crd_file, kind.version)


def create(kind: Kind, namespace: str | None, body: Any) -> Review:
    """A POST of ``body`` into ``namespace``."""
    if not isinstance(body, dict):
        return Review(status=status(400, "BadRequest", "the object provided is unrecognized"))
    given = (body.get("metadata") or {}).get("namespace")
    if given and namespace and given != namespace:
        message = (
            "the namespace of the provided object does not match the namespace sent on the request"
        )
        return Review(status=status(400, "BadRequest", message))
    try:
        decoded = _decode(kind, copy.deepcopy(body))
    except DecodeError as exc:
        return Review(status=status(400, "BadRequest", str(exc)))
    obj = decoded.obj
    if namespace:
        obj.setdefault("metadata", {})["namespace"] = namespace
    causes = list(decoded.causes)
    if kind.plural == "pods" and kind.builtin:
        default_pod(obj)
        obj["status"] = {"phase": "Pending"}  # PrepareForCreate: a new pod's status is the server's
        causes += pod_create(obj)
    elif kind.plural == "jobs" and kind.builtin:
        default_job(obj)
        obj["status"] = {}
        causes += job_create(obj)
    else:
        causes += metadata(obj.get("metadata") or {})
    if not (obj.get("metadata") or {}).get("name"):
        causes.insert(
            0,
            Cause(
                "metadata.name",
                "FieldValueRequired",
                "Required value: name or generateName is required",
            ),
        )
    if causes:
        return Review(status=refused(kind, obj, causes), pruned=decoded.pruned)
    obj["metadata"].setdefault("uid", str(uuid.uuid4()))  # the server's, as every object's
    return Review(obj=obj, pruned=decoded.pruned)


def update(kind: Kind, old: Mapping[str, Any], merged: Any, subresource: str | None) -> Review:
    """A PATCH that turns stored ``old`` into ``merged`` (the patch applied); only its
    status when ``subresource`` is ``status``, everything but the status otherwise."""
    if not isinstance(merged, dict):
        return Review(status=status(400, "BadRequest", "the object provided is unrecognized"))
    if subresource == "status":
        merged = {**copy.deepcopy(dict(old)), "status": merged.get("status")}
    elif "status" in old:
        merged = {**merged, "status": copy.deepcopy(old["status"])}
    else:
        merged.pop("status", None)
    try:
        decoded = _decode(kind, copy.deepcopy(merged))
    except DecodeError as exc:
        return Review(status=status(400, "BadRequest", str(exc)))
    obj = decoded.obj
    causes = list(decoded.causes)
    if kind.plural == "pods" and kind.builtin and subresource is None:
        default_pod(obj)
        stored = copy.deepcopy(dict(old))
        default_pod(stored)  # as stored by a real server (a test may have written it raw)
        causes += pod_update(obj, stored)
    elif kind.plural == "jobs" and kind.builtin:
        causes += job_update(obj, old)
    else:
        causes += metadata(obj.get("metadata") or {})
    if causes:
        return Review(status=refused(kind, obj, causes), pruned=decoded.pruned)
    return Review(obj=obj, pruned=decoded.pruned)


def merge_patch_from(old: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, Any]:
    """The JSON merge patch (RFC 7386) that turns ``old`` into ``new``."""
    patch: dict[str, Any] = {key: None for key in old if key not in new}
    for key, value in new.items():
        before = old.get(key)
        if isinstance(value, dict) and isinstance(before, dict):
            inner = merge_patch_from(before, value)
            if inner:
                patch[key] = inner
        elif key not in old or before != value:
            patch[key] = value
    return patch
