"""Registry completeness: every kind of ``broker.manifest.workloads.INTEGRATIONS`` has its
RBAC rule in the member's manifest, an example in deploy/examples that its CRD (batch Job:
Kubernetes' JobSpec) and admission take, its row in docs/workloads.md's kinds table (the
table is ``kinds_doc()``'s), and its name and API group as string literals nowhere in the
product code (broker/, adapters/, policies/) but its own module(s) and the registry: a kind
registered in one place and not another fails here."""

from __future__ import annotations

import ast
import importlib
import inspect
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from broker.cli.wrap import wrap
from broker.manifest import admit_templates, kubeschema, parse_manifest, to_job
from broker.manifest.workloads import INTEGRATIONS, Integration, batchjob, kinds_doc

REPO = Path(__file__).resolve().parents[2]
RBAC = REPO / "deploy" / "kustomize" / "member-roles" / "roles.yaml"
EXAMPLES = REPO / "deploy" / "examples"
WORKLOADS_DOC = REPO / "docs" / "workloads.md"
PACKAGE = REPO / "broker" / "manifest" / "workloads"
PRODUCT = ("broker", "adapters", "policies")
VERBS = ("create", "get", "list", "watch", "delete")
READ_VERBS = ("get", "list", "watch")
IDS = [i.name for i in INTEGRATIONS]

Doc = dict[str, Any]


def _rules() -> list[Doc]:
    """Every ClusterRole rule the member's RBAC manifest grants."""
    docs = [d for d in yaml.safe_load_all(RBAC.read_text()) if d]
    return [r for d in docs if d.get("kind") == "ClusterRole" for r in d.get("rules") or ()]


def _allows(rules: list[Doc], group: str, resource: str, verb: str) -> bool:
    return any(
        group in r.get("apiGroups", ()) and resource in r.get("resources", ())
        and verb in r.get("verbs", ())
        for r in rules
    )  # fmt: skip


@pytest.mark.parametrize("kind", INTEGRATIONS, ids=IDS)
def test_every_kind_has_its_rbac_rule(kind: Integration) -> None:
    rules = _rules()
    for verb in VERBS:
        assert _allows(rules, kind.group, kind.plural, verb), (kind.name, verb)
    for read in kind.reads:
        group, plural = read.group, read.plural
        for verb in READ_VERBS:
            assert _allows(rules, group, plural, verb), (kind.name, group, plural, verb)


def _examples() -> Iterator[tuple[Path, Doc]]:
    for path in sorted(EXAMPLES.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if isinstance(doc, dict):
                yield path, doc


# A member's runtime, for a kind whose pods a runtime shapes (as admission looks it up).
_NODE = {
    "metadata": {"labels": {"trainer.kubeflow.org/trainjob-ancestor-step": "trainer"}},
    "spec": {
        "template": {
            "spec": {"restartPolicy": "Never", "containers": [{"name": "node", "image": "x"}]}
        }
    },
}
RUNTIME = {
    "kind": "ClusterTrainingRuntime", "name": "torch-distributed", "clusters": ["east"],
    "spec": {"template": {"spec": {"replicatedJobs": [{"name": "node", "template": _NODE}]}}},
}  # fmt: skip


@pytest.mark.parametrize("kind", INTEGRATIONS, ids=IDS)
def test_every_kind_has_an_example_its_schema_and_admission_take(kind: Integration) -> None:
    found = [
        (path, doc) for path, doc in _examples()
        if (doc.get("apiVersion"), doc.get("kind")) == (kind.api_version, kind.kind)
    ]  # fmt: skip
    assert found, f"no example of {kind.name} in {EXAMPLES}"
    # The schema the broker ships (broker/manifest/schemas): the kind's CRD, or a batch
    # Job's JobSpec from Kubernetes' OpenAPI.
    plain = kind is batchjob.INTEGRATION
    root = kubeschema.JOB_SPEC if plain else f"crd:{kind.api_version}/{kind.kind}"
    for path, doc in found:
        assert kubeschema.problems(doc["spec"], root, ()) == [], path.name
        wrapped = wrap(doc, None, None)
        if kind.runtime_ref is not None:  # as admission writes in the member's runtime
            wrapped["spec"]["workload"]["runtime"] = RUNTIME
        manifest = parse_manifest(json.dumps(wrapped).encode(), None)
        job = to_job(admit_templates(manifest, "baseline", ["default"]), "team-a", "training")
        assert job.pod_sets, path.name


def test_the_docs_kinds_table_is_the_registrys() -> None:
    """docs/workloads.md's kinds table is ``broker.manifest.workloads.kinds_doc()``. To
    update it, paste
    ``python -c "from broker.manifest.workloads import kinds_doc; print(kinds_doc())"``."""
    page = WORKLOADS_DOC.read_text()
    table = kinds_doc()
    assert table in page
    for kind in INTEGRATIONS:
        assert f"| `{kind.api_version}` {kind.kind} | `{kind.plural}` |" in table


def _imports(path: Path) -> set[str]:
    """The modules of the workloads package that ``path`` imports (by their stems)."""
    stems = {p.stem for p in PACKAGE.glob("*.py")}
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            last = node.module.rpartition(".")[2]
            if node.module.startswith("broker.manifest.workloads.") and last in stems:
                out.add(last)
            if node.module == "broker.manifest.workloads":
                out |= {a.name for a in node.names if a.name in stems}
    return out


def _module_of(kind: Integration) -> str:
    """The stem of the module that defines the kind's ``INTEGRATION``."""
    for path in PACKAGE.glob("*.py"):
        module = importlib.import_module(f"broker.manifest.workloads.{path.stem}")
        if getattr(module, "INTEGRATION", None) is kind:
            return path.stem
    raise AssertionError(f"no module of the workloads package defines {kind.name}")


def _allowed(kind: Integration) -> set[Path]:
    """The kind's module, the helpers only kinds of its API group import (``raycommon``)
    among those it imports, and the registry."""
    own = {i.kind: _module_of(i) for i in INTEGRATIONS}
    group_of = {own[i.kind]: i.group for i in INTEGRATIONS}
    importers: dict[str, set[str]] = {}
    for path in PACKAGE.glob("*.py"):
        for stem in _imports(path):
            importers.setdefault(stem, set()).add(path.stem)
    mine = own[kind.kind]
    helpers = {
        stem for stem in _imports(PACKAGE / f"{mine}.py")
        if stem not in group_of
        and all(group_of.get(user) == kind.group for user in importers.get(stem, ()))
    }  # fmt: skip
    return {PACKAGE / f"{s}.py" for s in {mine, *helpers, "__init__"}}


def _literals(path: Path) -> Iterator[tuple[int, str]]:
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            yield node.lineno, node.value


@pytest.mark.parametrize("kind", INTEGRATIONS, ids=IDS)
def test_a_kind_is_named_in_product_code_only_in_its_module_and_registration(
    kind: Integration,
) -> None:
    allowed = _allowed(kind)
    assert inspect.getsourcefile(kind.pod_sets) in {str(p) for p in allowed}
    names = {kind.kind, kind.group, kind.api_version}
    found = [
        f"{path.relative_to(REPO)}:{line}: {value!r}"
        for top in PRODUCT
        for path in sorted((REPO / top).rglob("*.py"))
        if path not in allowed
        for line, value in _literals(path)
        if value in names
    ]
    assert found == [], f"{kind.name} named outside its module and registration"
