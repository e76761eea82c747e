"""The real CustomResourceDefinitions (../shared/crds, found through ``FEDBROKER_CRDS``):
what an object the broker builds must satisfy, read from its version's ``openAPIV3Schema``.

The schema is checked with ``jsonschema`` (installed with kubernetes-validate) as the API
server's structural schema reads it: types, required fields, enums, formats' patterns,
bounds; an object's fields outside its ``properties`` count as errors (the API server
would prune them silently: a misspelled field is lost) unless the schema keeps unknown
fields (``x-kubernetes-preserve-unknown-fields``) or gives ``additionalProperties``.
``x-kubernetes-validations`` (CEL rules) are not evaluated. When the folder is absent the
test is skipped with a reason, except under FEDBROKER_REQUIRE_SERVICES=1 (it fails)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema  # type: ignore[import-untyped]
import yaml
from services import unavailable

REPO = Path(__file__).resolve().parents[1]


def crds_dir() -> Path:
    """``FEDBROKER_CRDS`` (relative paths: to the repository root), default ``../shared/crds``."""
    return REPO / os.environ.get("FEDBROKER_CRDS", "../shared/crds")


def closed(schema: Any) -> Any:
    """The schema with every object of known ``properties`` closed to other fields."""
    if isinstance(schema, list):
        return [closed(s) for s in schema]
    if not isinstance(schema, Mapping):
        return schema
    out = {k: closed(v) for k, v in schema.items()}
    if (
        "properties" in out
        and "additionalProperties" not in out
        and not out.get("x-kubernetes-preserve-unknown-fields")
    ):
        out["additionalProperties"] = False
    return out


@cache
def _schema(path: Path, version: str) -> Mapping[str, Any]:
    crd = yaml.safe_load(path.read_text())
    for served in crd["spec"]["versions"]:
        if served["name"] == version:
            return closed(served["schema"]["openAPIV3Schema"])  # type: ignore[no-any-return]
    raise LookupError(f"{path.name} has no version {version}")


def schema_problems(obj: Mapping[str, Any], crd_file: str) -> list[str]:
    """Where ``obj`` breaks its CRD's schema (at the version its ``apiVersion`` names), as
    ``path: message`` lines; [] when it validates. Skips (or fails) without the CRDs."""
    path = crds_dir() / crd_file
    if not path.is_file():
        unavailable(f"the real CRD {path} is not there (set FEDBROKER_CRDS)")
    version = str(obj["apiVersion"]).rpartition("/")[2]
    validator = jsonschema.Draft7Validator(_schema(path, version))
    return sorted(
        f"{'.'.join(str(p) for p in error.absolute_path) or '<root>'}: {error.message}"
        for error in validator.iter_errors(obj)
    )
