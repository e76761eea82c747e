"""Writes the schemas admission validates against (``kubernetes.json``, ``crds.json`` beside
this module) from their upstream sources; run it when a source changes, commit its output::

    .venv/bin/python -m broker.manifest.schemas.generate [--kubernetes 1.35] [--crds DIR]

* Kubernetes' own types: the definitions reachable from ``PodTemplateSpec`` and batch/v1
  ``Job`` in the OpenAPI-derived JSON schemas that the ``kubernetes-validate`` package ships
  (its ``local-strict`` flavour: unknown fields are errors), for the oldest Kubernetes
  version members are expected to run, so that a field newer than a member is refused
  rather than silently dropped by it.
* The workload kinds' CustomResourceDefinitions (one per kind in
  ``broker.manifest.workloads``), read from a folder of the real CRDs (``--crds``, default
  ``$FEDBROKER_CRDS`` or ``../shared/crds``) whose README names each file's repository,
  path and commit; those are recorded with each schema.

Both are turned into JSON Schema (2020-12) read as the API server reads them: descriptions
and CEL rules (``x-kubernetes-validations``, not evaluated) dropped; ``format: int32``
bounded; ``nullable`` as a type; every CRD object closed to fields its schema does not
name, unless it keeps unknown fields (the API server prunes them; admission refuses them,
so that nothing a tenant wrote is lost on the way); quantities marked
``x-fedbroker-quantity`` so that admission writes them in canonical form.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import json
import os
import re
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import yaml

from broker.manifest import workloads
from broker.manifest.workloads import batchjob

HERE = Path(__file__).resolve().parent
KUBERNETES_FILE = "kubernetes.json"
CRDS_FILE = "crds.json"
DEFAULT_KUBERNETES = "1.35"
KUBERNETES_ROOTS = ("io.k8s.api.core.v1.PodTemplateSpec", "io.k8s.api.batch.v1.Job")
QUANTITY_DEF = "io.k8s.apimachinery.pkg.api.resource.Quantity"
QUANTITY_MARK = "x-fedbroker-quantity"
BUILT_IN_GROUPS = (batchjob.API_VERSION,)  # served by every API server: no CRD
_INT32 = (-(2**31), 2**31 - 1)
_DROPPED = frozenset({"description", "x-kubernetes-validations", "example", "examples"})
# The quantity pattern controller-gen writes for resource.Quantity fields.
_QUANTITY_PATTERN = re.compile(r"\^\(\\\+\|-\)\?\(\(\[0-9\]\+")


def _refs(node: object) -> Iterator[str]:
    if isinstance(node, Mapping):
        for key, value in node.items():
            if key == "$ref" and isinstance(value, str):
                yield value.rpartition("/")[2]
            else:
                yield from _refs(value)
    elif isinstance(node, list):
        for item in node:
            yield from _refs(item)


def _bounded(node: object) -> Any:
    """``node`` without descriptions and CEL, its int32 fields bounded."""
    if isinstance(node, list):
        return [_bounded(item) for item in node]
    if not isinstance(node, Mapping):
        return node
    out = {k: _bounded(v) for k, v in node.items() if k not in _DROPPED}
    if out.get("format") == "int32":
        out.setdefault("minimum", _INT32[0])
        out.setdefault("maximum", _INT32[1])
    return out


def kubernetes_schemas(version: str, folder: Path | None = None) -> dict[str, Any]:
    """The definitions reachable from ``KUBERNETES_ROOTS`` in kubernetes-validate's strict
    schemas of Kubernetes ``version`` (``1.35``)."""
    if folder is None:
        spec = importlib.util.find_spec("kubernetes_validate")
        if spec is None or spec.origin is None:
            raise SystemExit(
                "generate: kubernetes-validate is not installed (make test installs it)"
            )
        folder = Path(spec.origin).parent / "kubernetes-json-schema"
    source = folder / f"v{version}.0-local-strict" / "_definitions.json"
    everything = json.loads(source.read_text())["$defs"]
    wanted: set[str] = set()
    stack = list(KUBERNETES_ROOTS)
    while stack:
        name = stack.pop()
        if name not in wanted:
            wanted.add(name)
            stack.extend(_refs(everything[name]))
    defs = {name: _bounded(everything[name]) for name in sorted(wanted)}
    defs[QUANTITY_DEF][QUANTITY_MARK] = True
    return {
        "source": {
            "package": "kubernetes-validate",
            "version": importlib.metadata.version("kubernetes-validate"),
            "kubernetes": f"{version}.0",
            "file": f"kubernetes-json-schema/v{version}.0-local-strict/_definitions.json",
        },
        "roots": list(KUBERNETES_ROOTS),
        "$defs": defs,
    }


def _structural(node: object) -> Any:
    """A CRD's openAPIV3Schema node as JSON Schema, read as the API server reads it."""
    if isinstance(node, list):
        return [_structural(item) for item in node]
    if not isinstance(node, Mapping):
        return node
    out = {k: _structural(v) for k, v in node.items() if k not in _DROPPED and k != "nullable"}
    if out.get("format") == "int32":
        out.setdefault("minimum", _INT32[0])
        out.setdefault("maximum", _INT32[1])
    if node.get("nullable") and isinstance(out.get("type"), str):
        out["type"] = [out["type"], "null"]
    if node.get("x-kubernetes-int-or-string") and _QUANTITY_PATTERN.match(str(node.get("pattern"))):
        out[QUANTITY_MARK] = True
    props_given = node.get("properties")
    if isinstance(props_given, Mapping) and isinstance(out.get("required"), list):
        # The API server writes each default in before it checks what is required.
        out["required"] = [r for r in out["required"]
                           if not (isinstance(props_given.get(r), Mapping)
                                   and "default" in props_given[r])]  # fmt: skip
    if node.get("x-kubernetes-embedded-resource"):
        props = out.setdefault("properties", {})
        for key in ("apiVersion", "kind"):
            props.setdefault(key, {"type": "string"})
        props.setdefault("metadata", {"type": "object"})
    is_object = out.get("type") == "object" or (
        isinstance(out.get("type"), list) and "object" in out["type"]
    )
    keeps_unknown = (
        node.get("x-kubernetes-preserve-unknown-fields") or "additionalProperties" in out
    )
    if is_object and not keeps_unknown:
        out["additionalProperties"] = False
    return out


_README_ROW = re.compile(r"^\|\s*(?P<files>[^|]+)\|[^|]*\|\s*(?P<source>[^|]+)\|\s*$")


def crd_sources(folder: Path) -> dict[str, dict[str, str]]:
    """File name -> its repository, path and commit, from the folder's README table
    (``| files | resource | repository, path, commit |``; "same as above" repeats the
    row before)."""
    found: dict[str, dict[str, str]] = {}
    previous: dict[str, str] | None = None
    for line in (folder / "README.md").read_text().splitlines():
        match = _README_ROW.match(line)
        if match is None:
            continue
        parts = [p.strip() for p in match["source"].split(",", 2)]
        if len(parts) == 3:
            previous = {"repository": parts[0], "path": parts[1], "commit": parts[2]}
        elif not (previous and match["source"].strip() == "same as above"):
            continue
        names = [n.strip() for n in match["files"].split(",")]
        for name in names:
            # "a_x.yaml, _y.yaml": a later name shares the first's prefix up to its last "_".
            full = name if not name.startswith("_") else names[0].rpartition("_")[0] + name
            found[full] = previous
    return found


def crd_schemas(folder: Path) -> dict[str, Any]:
    """``apiVersion/Kind`` -> the served version's spec schema and its source, for every
    workload kind that is not built into Kubernetes."""
    sources = crd_sources(folder)
    wanted = {(i.api_version, i.kind) for i in workloads.INTEGRATIONS}
    out: dict[str, Any] = {}
    for path in sorted(folder.glob("*.yaml")):
        crd = yaml.safe_load(path.read_text())
        group, kind = crd["spec"]["group"], crd["spec"]["names"]["kind"]
        for version in crd["spec"]["versions"]:
            api_version = f"{group}/{version['name']}"
            if (api_version, kind) not in wanted or not version.get("served"):
                continue
            if path.name not in sources:
                raise SystemExit(
                    f"generate: {folder / 'README.md'} names no source for {path.name}"
                )
            schema = version["schema"]["openAPIV3Schema"]
            out[f"{api_version}/{kind}"] = {
                "source": {"file": path.name, **sources[path.name]},
                "plural": crd["spec"]["names"]["plural"],
                "schema": _structural(schema["properties"]["spec"]),
            }
    missing = sorted(
        f"{v}/{k}" for v, k in wanted if v not in BUILT_IN_GROUPS and f"{v}/{k}" not in out
    )
    if missing:
        raise SystemExit(f"generate: no CRD in {folder} for {', '.join(missing)}")
    return dict(sorted(out.items()))


def write(target: Path, data: Mapping[str, Any]) -> None:
    target.write_text(json.dumps(data, indent=None, separators=(",", ":"), sort_keys=True) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kubernetes", default=DEFAULT_KUBERNETES, help="the Kubernetes minor")
    parser.add_argument(
        "--crds", type=Path, default=Path(os.environ.get("FEDBROKER_CRDS", "../shared/crds"))
    )
    parser.add_argument("--kubernetes-schemas", type=Path, default=None,
                        help="kubernetes-validate's kubernetes-json-schema folder")  # fmt: skip
    parser.add_argument("--out", type=Path, default=HERE)
    args = parser.parse_args(argv)
    write(args.out / KUBERNETES_FILE, kubernetes_schemas(args.kubernetes, args.kubernetes_schemas))
    write(args.out / CRDS_FILE, crd_schemas(args.crds))
    print(f"wrote {args.out / KUBERNETES_FILE} and {args.out / CRDS_FILE}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
