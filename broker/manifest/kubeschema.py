"""What a tenant's pod templates and workload objects must be for a member's API server to
take them: validation against the real schemas (``broker.manifest.schemas``: Kubernetes'
own types, the workload kinds' CRDs) and quantities rewritten in their canonical form
(pure: no I/O beyond reading the shipped schemas once).

Validation is strict where a member would be lenient: a field the schema does not know is
refused (a member would drop it, and what the tenant meant with it would be lost without a
word), and so is an ``int32`` out of range. Every problem is a ``Violation`` at its full
path from the manifest root, with a message that names the type or values wanted and never
repeats more than 40 characters of what was sent. Compiled validators are kept per root
(``jsonschema_rs``, a compiled JSON Schema validator; the pure-Python one costs ~100 times
as much per template), and a template already found valid is not validated again.
"""

from __future__ import annotations

import copy
import functools
import json
from collections.abc import Mapping
from typing import Any

import jsonschema_rs

from broker.manifest import schemas
from broker.manifest.errors import show
from broker.manifest.podrequests import Path, Violation
from broker.quantity import QuantityError, canonical

POD_TEMPLATE = "io.k8s.api.core.v1.PodTemplateSpec"
JOB_SPEC = "io.k8s.api.batch.v1.JobSpec"
# A podSets template may leave its containers out: the launcher gives the pod its default one.
POD_SET_TEMPLATE = "fedbroker.PodSetTemplateSpec"
_POD_SPEC = "io.k8s.api.core.v1.PodSpec"
_POD_SET_SPEC = "fedbroker.PodSetPodSpec"
_CHECKED_CACHE = 2048  # distinct valid templates remembered (their JSON text)


def _definitions() -> dict[str, Any]:
    defs = dict(schemas.kubernetes()["$defs"])
    pod_spec = copy.deepcopy(defs[_POD_SPEC])
    pod_spec["required"] = [r for r in pod_spec.get("required", ()) if r != "containers"]
    defs[_POD_SET_SPEC] = pod_spec
    template = copy.deepcopy(defs[POD_TEMPLATE])
    template["properties"]["spec"] = {"$ref": f"#/$defs/{_POD_SET_SPEC}"}
    defs[POD_SET_TEMPLATE] = template
    return defs


@functools.cache
def _defs() -> dict[str, Any]:
    return _definitions()


@functools.cache
def _validator(root: str) -> Any:
    """The compiled validator of a Kubernetes definition, or of a CRD's spec
    (``crd:<apiVersion>/<Kind>``)."""
    if root.startswith("crd:"):
        schema = schemas.crds()[root[4:]]["schema"]
        document: dict[str, Any] = {"$schema": "https://json-schema.org/draft/2020-12/schema",
                                    **schema}  # fmt: skip
    else:
        document = {"$schema": "https://json-schema.org/draft/2020-12/schema",
                    "$ref": f"#/$defs/{root}", "$defs": _defs()}  # fmt: skip
    return jsonschema_rs.validator_for(document)


def _kind_name(error: Any) -> str:
    return str(getattr(error.kind, "name", "") or "")


def _message(error: Any) -> tuple[Path, str]:
    """A validation error as (path below the validated object, message)."""
    path: Path = tuple(error.instance_path)
    kind = error.kind
    name = _kind_name(error)
    if name == "additionalProperties":
        unexpected = list(getattr(kind, "unexpected", ()) or ())
        field = str(unexpected[0]) if unexpected else "?"
        return (*path, field), "unknown field (not in the member's schema for this object)"
    if name == "required":
        return (*path, str(getattr(kind, "property", "?"))), "required"
    if name == "type":
        wanted = [t for t in _types(getattr(kind, "types", None)) if t != "null"]
        return path, f"must be {' or '.join(_ARTICLE.get(t, t) for t in wanted) or 'valid'}"
    if name in ("oneOf", "anyOf") and _is_quantity_path(error):
        return path, 'must be a quantity (a string such as "500m" or "16Gi", or a number)'
    if name == "enum":
        options = ", ".join(json.dumps(o) for o in list(getattr(kind, "options", ()) or ())[:8])
        return path, f"must be one of {options}"
    if name in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"):
        bound = getattr(kind, "limit", None)
        sign = {"minimum": ">=", "maximum": "<=", "exclusiveMinimum": ">",
                "exclusiveMaximum": "<"}[name]  # fmt: skip
        return path, f"must be {sign} {bound}"
    if name == "pattern":
        return path, f"must match {getattr(kind, 'pattern', '')}"
    if name in ("maxLength", "minLength", "maxItems", "minItems"):
        return path, str(error.message).replace(json.dumps(error.instance), "value")[:120]
    return path, str(error.message)[:120]


_ARTICLE = {"integer": "an integer", "string": "a string", "boolean": "a boolean (true or false)",
            "object": "a mapping", "array": "a list", "number": "a number"}  # fmt: skip


def _types(value: object) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, list | tuple):
        return [str(v) for v in value]
    return []


def _is_quantity_path(error: Any) -> bool:
    """A oneOf/anyOf refusal of a quantity: the schema path ends in the Quantity
    definition or a CRD's int-or-string quantity."""
    parts = [str(p) for p in error.schema_path]
    return "io.k8s.apimachinery.pkg.api.resource.Quantity" in parts or (
        not isinstance(error.instance, bool) and "anyOf" in parts[-1:]
    )


def problems(obj: object, root: str, base: Path) -> list[Violation]:
    """Every place ``obj`` breaks the schema ``root`` (a Kubernetes definition, or
    ``crd:<apiVersion>/<Kind>`` for a CRD's spec), at its path below ``base``; the deepest
    first, as that is where the fix is."""
    found = []
    for error in _validator(root).iter_errors(obj):
        path, message = _message(error)
        found.append(Violation((*base, *path), message))
    found.sort(key=lambda v: -len(v.path))
    return found


@functools.lru_cache(maxsize=_CHECKED_CACHE)
def _template_problems(text: str, root: str) -> tuple[Violation, ...]:
    return tuple(problems(json.loads(text), root, ()))


def template_problems(template: Mapping[str, Any], base: Path, *, pod_set: bool) -> list[Violation]:
    """``problems`` of a pod template (``pod_set``: a podSets template, whose containers
    the launcher supplies when it gives none); each distinct template is checked once."""
    root = POD_SET_TEMPLATE if pod_set else POD_TEMPLATE
    text = json.dumps(template, sort_keys=True, separators=(",", ":"))
    return [Violation((*base, *v.path), v.message) for v in _template_problems(text, root)]


# -- quantities ----------------------------------------------------------------------------


def normalised(obj: Any, root: str, base: Path) -> tuple[Any, list[Violation]]:
    """``obj`` (valid against ``root``) with every quantity its schema names written in
    canonical form (``1`` -> ``"1"``, ``0.5`` -> ``"500m"``), and a Violation for each that
    is no quantity (the schema takes any string there); the same object when nothing
    changed, so an unchanged manifest is not copied."""
    if root.startswith("crd:"):
        schema, defs = schemas.crds()[root[4:]]["schema"], {}
    else:
        schema, defs = {"$ref": f"#/$defs/{root}"}, _defs()
    found: list[Violation] = []
    return _walk(obj, schema, defs, base, found), found


def _resolved(schema: Mapping[str, Any], defs: Mapping[str, Any]) -> Mapping[str, Any]:
    while "$ref" in schema:
        schema = defs[str(schema["$ref"]).rpartition("/")[2]]
    return schema


def _walk(
    obj: Any, schema: Mapping[str, Any], defs: Mapping[str, Any], at: Path, found: list[Violation]
) -> Any:
    schema = _resolved(schema, defs)
    if schema.get(schemas.QUANTITY_MARK):
        if obj is None:
            return obj
        try:
            text = canonical(obj)
        except QuantityError:
            found.append(Violation(at, f"{show(obj)} is not a quantity"))
            return obj
        return obj if text == obj else text
    if isinstance(obj, dict):
        props = schema.get("properties") or {}
        extra = schema.get("additionalProperties")
        changed = {}
        for key, value in obj.items():
            sub = props.get(key, extra if isinstance(extra, Mapping) else None)
            if sub is not None:
                new = _walk(value, sub, defs, (*at, key), found)
                if new is not value:
                    changed[key] = new
        return {**obj, **changed} if changed else obj
    if isinstance(obj, list) and isinstance(schema.get("items"), Mapping):
        items = [_walk(item, schema["items"], defs, (*at, i), found) for i, item in enumerate(obj)]
        return items if any(a is not b for a, b in zip(items, obj, strict=True)) else obj
    return obj


__all__ = ["JOB_SPEC", "POD_SET_TEMPLATE", "POD_TEMPLATE", "normalised", "problems",
           "template_problems"]  # fmt: skip
