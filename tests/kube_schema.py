"""What the test member's API server makes of a body before its own rules run: decoding
into the kind's schema, pruning the fields the schema does not know, and (custom
resources) the schema's validation.

Built-in kinds (Pod, batch/v1 Job) use Kubernetes' OpenAPI as kubernetes-validate ships it,
at ``KUBERNETES`` (1.35: the oldest minor upstream still supports, so the member is no newer
than the clusters the broker meets). As the API server decodes them into Go structs
(``staging/src/k8s.io/apiserver/pkg/endpoints/handlers/create.go``, ``transformDecodeError``):
a value of the wrong JSON type is a 400 BadRequest (``... cannot be handled as a Pod: json:
cannot unmarshal string into Go struct field ...``); a bare JSON number is a quantity
(``Quantity.UnmarshalJSON``) and is stored canonical (``kube_quantity``); a JSON null is the
field's absence; an unknown field is dropped, with a warning, under the default
``fieldValidation=Warn``. Required fields are the kind's validation's (422, ``Required
value``).

Custom resources use their CRD's ``openAPIV3Schema`` (``tests/crds.py``), as apiextensions
does (``staging/src/k8s.io/apiextensions-apiserver/pkg/apiserver/schema/pruning``): unknown
fields are pruned (except under ``x-kubernetes-preserve-unknown-fields``; the root and an
embedded resource keep ``apiVersion``, ``kind`` and ``metadata``), nulls dropped where the
schema is not ``nullable``, then every type, enum, pattern, bound and required field is
checked, each failure a 422 cause. CEL rules (``x-kubernetes-validations``) are not
evaluated, nor are ``format``s other than int32/int64 bounds.

Each pruned field is recorded by its path, so a test can fail when the broker sent a field
a real server drops. Schemas are loaded and resolved once per kind (``functools.cache``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import kube_quantity
import kubernetes_validate  # type: ignore[import-untyped]
import yaml
from crds import crds_dir
from services import unavailable

KUBERNETES = "1.35"
_SCHEMAS = Path(kubernetes_validate.__file__).parent / "kubernetes-json-schema"
_REF = "#/$defs/"
QUANTITY = "io.k8s.apimachinery.pkg.api.resource.Quantity"
INT_OR_STRING = "io.k8s.apimachinery.pkg.util.intstr.IntOrString"
_JSON_TYPE = {
    bool: "bool",
    int: "number",
    float: "number",
    str: "string",
    list: "array",
    dict: "object",
}
_GO_TYPE = {
    "string": "string",
    "integer": "int64",
    "number": "float64",
    "boolean": "bool",
    "array": "[]",
    "object": "map",
}


@dataclass(frozen=True, slots=True)
class Cause:
    """One ``details.causes[]`` entry of a 422: ``field`` as the API server prints it,
    ``reason`` (FieldValueInvalid, FieldValueRequired...) and ``message``."""

    field: str
    reason: str
    message: str

    def line(self) -> str:
        return f"{self.field}: {self.message}"


def invalid(path: str, value: object, detail: str) -> Cause:
    return Cause(path, "FieldValueInvalid", f"Invalid value: {_shown(value)}: {detail}")


def required(path: str, detail: str = "") -> Cause:
    return Cause(path, "FieldValueRequired", "Required value" + (f": {detail}" if detail else ""))


def forbidden(path: str, detail: str) -> Cause:
    return Cause(path, "FieldValueForbidden", f"Forbidden: {detail}")


def unsupported(path: str, value: object, supported: list[str]) -> Cause:
    listed = ", ".join(json.dumps(s) for s in supported)
    return Cause(
        path,
        "FieldValueNotSupported",
        f"Unsupported value: {_shown(value)}: supported values: {listed}",
    )


def duplicate(path: str, value: object) -> Cause:
    return Cause(path, "FieldValueDuplicate", f"Duplicate value: {_shown(value)}")


def _shown(value: object) -> str:
    return json.dumps(value, separators=(",", ":"), default=str)


class DecodeError(ValueError):
    """A body a built-in kind cannot be decoded from (the API server's 400 BadRequest)."""


@dataclass
class Decoded:
    """A body as the server keeps it: ``obj`` (pruned, quantities canonical), the paths
    of the fields it dropped, and the schema's causes (422 when any)."""

    obj: Any
    pruned: list[str] = field(default_factory=list)
    causes: list[Cause] = field(default_factory=list)


# -- the schemas ---------------------------------------------------------------------------


@cache
def _definitions() -> Mapping[str, Any]:
    path = _SCHEMAS / f"v{KUBERNETES}.0-local" / "_definitions.json"
    return json.loads(path.read_text())["$defs"]  # type: ignore[no-any-return]


@cache
def builtin_schema(kind: str, api_version: str) -> Mapping[str, Any]:
    """The OpenAPI schema of a built-in kind (``Pod``/``v1``, ``Job``/``batch/v1``)."""
    group = api_version.replace("/", "-").split(".")[0] if "/" in api_version else api_version
    path = _SCHEMAS / f"v{KUBERNETES}.0-local" / f"{kind.lower()}-{group}.json"
    return json.loads(path.read_text())  # type: ignore[no-any-return]


@cache
def crd_schema(crd_file: str, version: str) -> Mapping[str, Any]:
    """The ``openAPIV3Schema`` of ``version`` in a real CRD (skips or fails without them)."""
    path = crds_dir() / crd_file
    if not path.is_file():
        unavailable(f"the real CRD {path} is not there (set FEDBROKER_CRDS)")
    # libyaml's parser where built: the pure-Python one takes seconds over a 1 MB CRD, and
    # the first test to need it parses it inside its event loop, which stalls its member
    crd = yaml.load(path.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    for served in crd["spec"]["versions"]:
        if served["name"] == version:
            return served["schema"]["openAPIV3Schema"]  # type: ignore[no-any-return]
    raise LookupError(f"{crd_file} has no version {version}")


def _resolve(schema: Mapping[str, Any]) -> tuple[Mapping[str, Any], str]:
    ref = schema.get("$ref")
    if isinstance(ref, str) and _REF in ref:
        name = ref.partition(_REF)[2]
        return _definitions()[name], name
    return schema, ""


def _types(schema: Mapping[str, Any]) -> set[str]:
    given = schema.get("type")
    return set(given) - {"null"} if isinstance(given, list) else ({given} if given else set())


# -- built-in kinds ----------------------------------------------------------------------


def decode_builtin(body: Any, kind: str, api_version: str) -> Decoded:
    """``body`` decoded as the built-in ``kind``; ``DecodeError`` (400) on a wrong type."""
    out = Decoded(None)
    out.obj = _builtin(body, builtin_schema(kind, api_version), "", out, kind)
    return out


def _go_path(path: str) -> str:
    return re.sub(r"\[[^]]*\]", "", path)


def _decode_error(kind: str, path: str, value: object, wanted: str) -> DecodeError:
    got = _JSON_TYPE.get(type(value), "value")
    return DecodeError(
        f'{kind} in version "v1" cannot be handled as a {kind}: json: cannot unmarshal {got} '
        f"into Go struct field {kind}{'.' if path else ''}{_go_path(path)} of type {wanted}"
    )


def _builtin(value: Any, schema: Mapping[str, Any], path: str, out: Decoded, kind: str) -> Any:
    schema, name = _resolve(schema)
    if name == QUANTITY:
        try:
            return kube_quantity.normalised(value)
        except ValueError as exc:
            raise DecodeError(f"{_go_path(path)}: {exc}") from None
    if name == INT_OR_STRING:
        if isinstance(value, bool) or not isinstance(value, int | str):
            raise _decode_error(kind, path, value, "intstr.IntOrString")
        return value
    types = _types(schema)
    if not types and "properties" not in schema:
        return value  # free-form (e.g. RawExtension)
    wanted = next(iter(types)) if types else "object"
    if not _is(value, wanted):
        go_type = schema.get("format") if wanted == "integer" else None
        raise _decode_error(kind, path, value, str(go_type or _GO_TYPE.get(wanted, wanted)))
    if wanted == "integer" and schema.get("format") == "int32" and not -(2**31) <= value < 2**31:
        raise _decode_error(kind, path, value, "int32")
    if wanted == "array":
        items = schema.get("items") or {}
        return [_builtin(v, items, f"{path}[{i}]", out, kind) for i, v in enumerate(value)]
    if wanted != "object":
        return value
    return _builtin_object(value, schema, path, out, kind)


def _builtin_object(
    value: dict[str, Any], schema: Mapping[str, Any], path: str, out: Decoded, kind: str
) -> dict[str, Any]:
    props = schema.get("properties")
    extra = schema.get("additionalProperties")
    kept: dict[str, Any] = {}
    for key, item in value.items():
        here = f"{path}.{key}" if path else key
        if item is None:
            continue
        if props is not None and key in props:
            kept[key] = _builtin(item, props[key], here, out, kind)
        elif isinstance(extra, Mapping):
            kept[key] = _builtin(item, extra, f"{path}[{key}]", out, kind)
        elif props is None and extra is None:
            kept[key] = item
        else:
            out.pruned.append(here)
    for key in schema.get("required") or ():
        if key not in kept and not (path == "" and key in ("apiVersion", "kind")):
            out.causes.append(required(f"{path}.{key}" if path else key))
    return kept


def _is(value: Any, wanted: str) -> bool:
    if wanted == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if wanted == "number":
        return isinstance(value, int | float) and not isinstance(value, bool)
    kinds = {"string": str, "boolean": bool, "array": list, "object": dict}
    return isinstance(value, kinds.get(wanted, object))


# -- custom resources ----------------------------------------------------------------------


def decode_custom(body: Any, crd_file: str, version: str) -> Decoded:
    """``body`` pruned and validated against its CRD's schema at ``version``."""
    out = Decoded(None)
    out.obj = _custom(body, crd_schema(crd_file, version), "", out, embedded=True)
    return out


def _custom(
    value: Any, schema: Mapping[str, Any], path: str, out: Decoded, embedded: bool = False
) -> Any:
    if schema.get("x-kubernetes-int-or-string"):
        if isinstance(value, bool) or not isinstance(value, int | str):
            out.causes.append(
                invalid(path, value, f"{path} in body must be of type integer or string")
            )
        elif isinstance(value, str):
            _scalar(value, schema, path, out)
        return value
    wanted = schema.get("type")
    if isinstance(wanted, str) and not _is(value, wanted):
        message = f"{path} in body must be of type {wanted}: {_shown(value)}"
        out.causes.append(invalid(path, value, message))
        return value
    if isinstance(value, dict):
        return _custom_object(value, schema, path, out, embedded)
    if isinstance(value, list):
        items = schema.get("items")
        _bounds(len(value), schema, "minItems", "maxItems", path, out, "items")
        if isinstance(items, Mapping):
            return [_custom(v, items, f"{path}[{i}]", out) for i, v in enumerate(value)]
        return value
    _scalar(value, schema, path, out)
    return value


def _custom_object(
    value: dict[str, Any], schema: Mapping[str, Any], path: str, out: Decoded, embedded: bool
) -> dict[str, Any]:
    embedded = embedded or bool(schema.get("x-kubernetes-embedded-resource"))
    preserve = bool(schema.get("x-kubernetes-preserve-unknown-fields"))
    props: Mapping[str, Any] = schema.get("properties") or {}
    extra = schema.get("additionalProperties")
    kept: dict[str, Any] = {}
    for key, item in value.items():
        here = f"{path}.{key}" if path else key
        sub = props.get(key) if key in props else extra if isinstance(extra, Mapping) else None
        if item is None and not (isinstance(sub, Mapping) and sub.get("nullable")):
            continue  # a null where the schema is not nullable is dropped, not refused
        if embedded and key in ("apiVersion", "kind", "metadata"):
            kept[key] = item
        elif key in props:
            kept[key] = _custom(item, props[key], here, out)
        elif isinstance(extra, Mapping):
            kept[key] = _custom(item, extra, f"{path}[{key}]", out)
        elif extra is True or preserve or (not props and extra is None and not schema.get("type")):
            kept[key] = item
        else:
            out.pruned.append(here)
    for key in schema.get("required") or ():
        if key not in kept:
            out.causes.append(required(f"{path}.{key}" if path else key))
    _bounds(len(kept), schema, "minProperties", "maxProperties", path, out, "properties")
    return kept


def _bounds(
    size: int, schema: Mapping[str, Any], low: str, high: str, path: str, out: Decoded, what: str
) -> None:
    if low in schema and size < schema[low]:
        out.causes.append(
            invalid(path, size, f"{path} in body should have at least {schema[low]} {what}")
        )
    if high in schema and size > schema[high]:
        out.causes.append(
            Cause(
                path,
                "FieldValueTooMany",
                f"Too many: {size}: must have at most {schema[high]} {what}",
            )
        )


def _scalar(value: Any, schema: Mapping[str, Any], path: str, out: Decoded) -> None:
    enum = schema.get("enum")
    if isinstance(enum, list) and value not in enum:
        out.causes.append(unsupported(path, value, [str(e) for e in enum]))
    if isinstance(value, str):
        pattern = schema.get("pattern")
        if isinstance(pattern, str) and re.search(pattern, value) is None:
            out.causes.append(invalid(path, value, f"{path} in body should match '{pattern}'"))
        _bounds(len(value), schema, "minLength", "maxLength", path, out, "chars")
    elif isinstance(value, int | float) and not isinstance(value, bool):
        low, high = schema.get("minimum"), schema.get("maximum")
        if low is not None and (value < low or (schema.get("exclusiveMinimum") and value == low)):
            out.causes.append(
                invalid(path, value, f"{path} in body should be greater than or equal to {low}")
            )
        if high is not None and (
            value > high or (schema.get("exclusiveMaximum") and value == high)
        ):
            out.causes.append(
                invalid(path, value, f"{path} in body should be less than or equal to {high}")
            )
        if schema.get("format") == "int32" and not -(2**31) <= value < 2**31:
            out.causes.append(invalid(path, value, f"{path} in body must be of type int32"))
