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
as much per template).
"""

from __future__ import annotations

import copy
import functools
import json
from collections.abc import Mapping
from dataclasses import dataclass
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
def _document(root: str) -> dict[str, Any]:
    """The JSON Schema document of a Kubernetes definition, or of a CRD's spec
    (``crd:<apiVersion>/<Kind>``)."""
    if root.startswith("crd:"):
        schema = schemas.crds()[root[4:]]["schema"]
        return {"$schema": "https://json-schema.org/draft/2020-12/schema", **schema}
    return {"$schema": "https://json-schema.org/draft/2020-12/schema",
            "$ref": f"#/$defs/{root}", "$defs": _defs()}  # fmt: skip


@functools.cache
def _validator(root: str) -> Any:
    return jsonschema_rs.validator_for(_document(root))


def _kind_name(error: Any) -> str:
    return str(getattr(error.kind, "name", "") or "")


def _message(error: Any, root: str) -> tuple[Path, str]:
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
    if name in ("oneOf", "anyOf") and _refused_by(error, root).get(schemas.QUANTITY_MARK):
        return path, 'must be a quantity (a string such as "500m" or "16Gi", or a number)'
    if name in ("oneOf", "anyOf"):  # the other one: IntOrString (a CRD's int-or-string)
        return path, "must be an integer or a string"
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


def _refused_by(error: Any, root: str) -> Mapping[str, Any]:
    """The schema node whose ``oneOf``/``anyOf`` refused the value (its path's parent)."""
    node: Any = _document(root)
    for step in list(error.schema_path)[:-1]:
        node = node[step]
    return node if isinstance(node, Mapping) else {}


def problems(obj: object, root: str, base: Path) -> list[Violation]:
    """Every place ``obj`` breaks the schema ``root`` (a Kubernetes definition, or
    ``crd:<apiVersion>/<Kind>`` for a CRD's spec), at its path below ``base``; the deepest
    first, as that is where the fix is."""
    found = []
    for error in _validator(root).iter_errors(obj):
        path, message = _message(error, root)
        found.append(Violation((*base, *path), message))
    found.sort(key=lambda v: -len(v.path))
    return found


def template_problems(template: Mapping[str, Any], base: Path, *, pod_set: bool) -> list[Violation]:
    """``problems`` of a pod template (``pod_set``: a podSets template, whose containers
    the launcher supplies when it gives none)."""
    return problems(template, POD_SET_TEMPLATE if pod_set else POD_TEMPLATE, base)


# -- quantities ----------------------------------------------------------------------------


def normalised(obj: Any, root: str, base: Path) -> tuple[Any, list[Violation]]:
    """``obj`` (valid against ``root``) with every quantity its schema names written in
    canonical form (``1`` -> ``"1"``, ``0.5`` -> ``"500m"``), and a Violation for each that
    is no quantity (the schema takes any string there); the same object when nothing
    changed, so an unchanged manifest is not copied. Only the branches of the schema that
    hold a quantity are walked (``_Shape``)."""
    found: list[Violation] = []
    shape = _root_shape(root)
    return (obj if shape is None else _apply(obj, shape, base, found)), found


_QUANTITY = "quantity"


@dataclass(frozen=True, slots=True)
class _Shape:
    """The branches of a schema node that lead to a quantity: by property, for any other
    key (a map's values), for a list's items."""

    props: dict[str, _Shape | str]
    extra: _Shape | str | None
    items: _Shape | str | None


def _resolved(schema: Mapping[str, Any], defs: Mapping[str, Any]) -> Mapping[str, Any]:
    while "$ref" in schema:
        schema = defs[str(schema["$ref"]).rpartition("/")[2]]
    return schema


@functools.cache
def _root_shape(root: str) -> _Shape | str | None:
    if root.startswith("crd:"):
        return _shape(schemas.crds()[root[4:]]["schema"], {}, {})
    return _shape({"$ref": f"#/$defs/{root}"}, _defs(), {})


def _shape(
    schema: Mapping[str, Any], defs: Mapping[str, Any], memo: dict[int, _Shape | str | None]
) -> _Shape | str | None:
    """Where the quantities are below ``schema`` (None: nowhere). The schemas have no
    cycles (Kubernetes' pod types, CRDs' structural schemas)."""
    schema = _resolved(schema, defs)
    key = id(schema)
    if key not in memo:
        memo[key] = (
            _QUANTITY if schema.get(schemas.QUANTITY_MARK) else _branches(schema, defs, memo)
        )
    return memo[key]


def _branches(
    schema: Mapping[str, Any], defs: Mapping[str, Any], memo: dict[int, _Shape | str | None]
) -> _Shape | None:
    props = {}
    for name, sub in (schema.get("properties") or {}).items():
        found = _shape(sub, defs, memo)
        if found is not None:
            props[name] = found
    extra, items = schema.get("additionalProperties"), schema.get("items")
    extra_shape = _shape(extra, defs, memo) if isinstance(extra, dict) else None
    items_shape = _shape(items, defs, memo) if isinstance(items, dict) else None
    if not props and extra_shape is None and items_shape is None:
        return None
    return _Shape(props, extra_shape, items_shape)


def _apply(obj: Any, shape: _Shape | str, at: Path, found: list[Violation]) -> Any:
    if isinstance(shape, str):
        if obj is None:
            return obj
        try:
            text = canonical(obj)
        except QuantityError:
            found.append(Violation(at, f"{show(obj)} is not a quantity"))
            return obj
        return obj if text == obj else text
    if isinstance(obj, dict):
        keys = obj if shape.extra is not None else [k for k in shape.props if k in obj]
        changed = {}
        for key in keys:
            sub = shape.props.get(key, shape.extra)
            if sub is not None:
                value = obj[key]
                new = _apply(value, sub, (*at, key), found)
                if new is not value:
                    changed[key] = new
        return {**obj, **changed} if changed else obj
    if isinstance(obj, list) and shape.items is not None:
        items = [_apply(item, shape.items, (*at, i), found) for i, item in enumerate(obj)]
        return items if any(a is not b for a, b in zip(items, obj, strict=True)) else obj
    return obj


__all__ = ["JOB_SPEC", "POD_SET_TEMPLATE", "POD_TEMPLATE", "normalised", "problems",
           "template_problems"]  # fmt: skip
