"""The allowlist of workload fields (broker.manifest.workloads.allowlist): the walker refuses
what a table does not list, with the path from the object's root; every path of every
kind's table is a real field of the kind (its CRD in ../shared/crds, batch/v1 from
Kubernetes' own API types); every pod template of an object is found, counted or not; the
pod template metadata rule; and what a controller adds, checked by the tenant's level."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import kubernetes.client
import pytest
import yaml
from crds import crds_dir
from hypothesis import given, settings
from hypothesis import strategies as st
from services import unavailable

from broker.manifest import parse_manifest
from broker.manifest.podsecurity import Level
from broker.manifest.workloads import (
    INTEGRATIONS,
    allowlist_doc,
    derive,
    injection_refusals,
    integration,
    templates,
)
from broker.manifest.workloads.allowlist import (
    ITEMS,
    LABELS,
    TEMPLATE,
    VALUES,
    Table,
    boolean,
    false_only,
    matches,
    one_of,
    refused,
    steps,
    string,
    template_metadata,
    violations,
    whole,
)
from broker.manifest.workloads.injection import made
from broker.manifest.workloads.pytorchjob import INJECTIONS

Obj = dict[str, Any]
TABLE: Table = (
    ("name", string()),
    ("mode", one_of("A", "B", why="only two")),
    ("retries", whole(0, 10, "bounded")),
    ("paused", false_only("never paused")),
    ("debug", boolean()),
    ("gone", refused("it was dangerous")),
    ("groups[*].size", whole(1)),
    ("groups[*].template", TEMPLATE),
    ("groups[*].labels", LABELS),
    ("params.*", string()),
)
# (id, spec, [(path from the object's root, words in the message)])
WALKS: list[tuple[str, Obj, list[tuple[tuple[str | int, ...], str]]]] = [
    ("all allowed", {"name": "x", "mode": "B", "retries": 10, "paused": False, "debug": True,
                     "groups": [{"size": 1, "template": {"spec": {}}, "labels": {"a": "b"}}],
                     "params": {"k": "v"}}, []),
    ("null is absent", {"gone": None, "retries": None, "groups": None}, []),
    ("unknown field", {"extra": 1}, [(("spec", "extra"), "not a field a tenant may set in a K")]),
    ("unknown field below", {"groups": [{"size": 1}, {"size": 1, "x": {}}]},
     [(("spec", "groups", 1, "x"), "not a field")]),
    ("refused", {"gone": {"deep": 1}}, [(("spec", "gone"), "not allowed: it was dangerous")]),
    ("enum", {"mode": "C"}, [(("spec", "mode"), "must be A or B: only two")]),
    ("above the bound", {"retries": 11}, [(("spec", "retries"), "must be <= 10: bounded")]),
    ("below the bound", {"groups": [{"size": 0}]}, [(("spec", "groups", 0, "size"), ">= 1")]),
    ("true where only false", {"paused": True}, [(("spec", "paused"), "must be false: never")]),
    ("bool is no integer", {"retries": True}, [(("spec", "retries"), "must be an integer")]),
    ("float is no integer", {"retries": 1.5}, [(("spec", "retries"), "must be an integer")]),
    ("string is no boolean", {"debug": "yes"}, [(("spec", "debug"), "must be a boolean")]),
    ("number is no string", {"name": 7}, [(("spec", "name"), "must be a string")]),
    ("not a list", {"groups": {"size": 1}}, [(("spec", "groups"), "must be a list")]),
    ("not a mapping", {"groups": [3]}, [(("spec", "groups", 0), "must be a mapping")]),
    ("map value typed", {"params": {"k": 1}}, [(("spec", "params", "k"), "must be a string")]),
    ("template not a mapping", {"groups": [{"template": "x"}]},
     [(("spec", "groups", 0, "template"), "must be a mapping")]),
    ("broker label", {"groups": [{"labels": {"x.fedbroker.io/job": "j", "ok": "v"}}]},
     [(("spec", "groups", 0, "labels", "x.fedbroker.io/job"), "the broker's")]),
    ("label value typed", {"groups": [{"labels": {"a": 1}}]},
     [(("spec", "groups", 0, "labels", "a"), "must be a string")]),
    ("every one, in order", {"zz": 1, "mode": "C", "aa": 2},
     [(("spec", "zz"), "not a field"), (("spec", "mode"), "must be"), (("spec", "aa"), "not")]),
]  # fmt: skip


@pytest.mark.parametrize(("spec", "expected"), [w[1:] for w in WALKS], ids=[w[0] for w in WALKS])
def test_the_walker_refuses_what_the_table_does_not_allow(
    spec: Obj, expected: list[tuple[tuple[str | int, ...], str]]
) -> None:
    found = violations(TABLE, spec, "K")
    assert [v.path for v in found] == [path for path, _ in expected]
    for v, (_, words) in zip(found, expected, strict=True):
        assert words in v.message, v.message


@pytest.mark.parametrize(
    "table",
    [(("a", string()), ("a", string())), (("a", string()), ("a.b", string())),
     (("a.b", string()), ("a", string()))],
    ids=["twice", "below a leaf", "a parent of another"],
)  # fmt: skip
def test_a_table_that_contradicts_itself_is_a_programming_error(table: Table) -> None:
    with pytest.raises(ValueError, match="a"):
        violations(table, {}, "K")


@pytest.mark.parametrize(
    ("pattern", "path", "expected"),
    [("a[*].t", ("spec", "a", 3, "t"), True), ("a[*].t", ("spec", "a", "3", "t"), False),
     ("m.*.t", ("spec", "m", "Worker", "t"), True), ("a.t", ("spec", "a"), False),
     ("a.t", ("spec", "a", "u"), False), ("a.t", ("other", "a", "t"), False)],
)  # fmt: skip
def test_matches(pattern: str, path: tuple[str | int, ...], expected: bool) -> None:
    assert matches(pattern, path) is expected


# -- every path of every table is a real field of its kind -------------------------------

CRDS = {"JobSet": "jobset.x-k8s.io_jobsets.yaml", "PyTorchJob": "kubeflow.org_pytorchjobs.yaml",
        "RayJob": "ray.io_rayjobs.yaml", "RayCluster": "ray.io_rayclusters.yaml",
        "TrainJob": "trainer.kubeflow.org_trainjobs.yaml",
        "MPIJob": "kubeflow.org_mpijobs-v2beta1.yaml",
        "LeaderWorkerSet": "leaderworkerset.x-k8s.io_leaderworkersets.yaml"}  # fmt: skip


def _crd_spec(kind: str, version: str) -> Mapping[str, Any]:
    path = crds_dir() / CRDS[kind]
    if not path.is_file():
        unavailable(f"the real CRD {path} is not there (set FEDBROKER_CRDS)")
    crd = yaml.safe_load(path.read_text())
    (served,) = [v for v in crd["spec"]["versions"] if v["name"] == version]
    return served["schema"]["openAPIV3Schema"]["properties"]["spec"]  # type: ignore[no-any-return]


def _in_crd(schema: Mapping[str, Any], path: str) -> bool:
    node: Any = schema
    for step in steps(path):
        if step == ITEMS:
            node = node.get("items")
        elif step in (node.get("properties") or {}):
            node = node["properties"][step]
        elif step == VALUES or isinstance(node.get("additionalProperties"), Mapping):
            node = node.get("additionalProperties")  # a map: its keys are free (or the row's)
        else:
            return False
        if not isinstance(node, Mapping):
            return False
    return True


_LIST = re.compile(r"^List\[(.+)\]$")
_DICT = re.compile(r"^Dict\[str, (.+)\]$")


def _in_kubernetes(model: str, path: str) -> bool:
    """Whether ``path`` names a field below the batch/v1 API type ``model`` (the kubernetes
    client's models, generated from Kubernetes' OpenAPI)."""
    kind = model
    for step in steps(path):
        if (found := _LIST.match(kind)) and step == ITEMS:
            kind = found.group(1)
            continue
        if (found := _DICT.match(kind)) and step == VALUES:
            kind = found.group(1)
            continue
        cls = getattr(kubernetes.client, kind, None)
        names = {v: k for k, v in getattr(cls, "attribute_map", {}).items()}
        if step not in names:
            return False
        kind = cls.openapi_types[names[step]]  # type: ignore[union-attr]
    return True


@pytest.mark.parametrize("found", INTEGRATIONS, ids=[i.kind for i in INTEGRATIONS])
def test_every_path_of_a_kinds_table_is_a_real_field(found: Any) -> None:
    version = found.api_version.rpartition("/")[2]
    if found.kind == "Job":
        missing = [p for p, _ in found.fields if not _in_kubernetes("V1JobSpec", p)]
    else:
        schema = _crd_spec(found.kind, version)
        missing = [p for p, _ in found.fields if not _in_crd(schema, p)]
    assert missing == []


def test_the_checker_of_field_names_can_fail() -> None:
    assert not _in_kubernetes("V1JobSpec", "podFailurePolicy.rules[*].onExitCode")
    assert _in_kubernetes("V1JobSpec", "podFailurePolicy.rules[*].onPodConditions[*].type")
    schema = _crd_spec("JobSet", "v1alpha2")
    assert not _in_crd(schema, "network.subDomain")
    assert _in_crd(schema, "replicatedJobs[*].template.spec.backoffLimit")


# -- every pod template, counted or not --------------------------------------------------

CPU: Obj = {"spec": {"containers": [{"name": "c", "image": "i", "resources": {
    "requests": {"cpu": "1"}}}]}}  # fmt: skip


def _group(i: int, replicas: int) -> Obj:
    return {"groupName": f"g{i}", "replicas": replicas, "minReplicas": 0, "maxReplicas": 8,
            "template": CPU}  # fmt: skip


@settings(max_examples=60, deadline=None)
@given(
    counts=st.lists(st.integers(0, 3), max_size=5),
    mode=st.sampled_from([None, "K8sJobMode", "HTTPMode"]),
    own_submitter=st.booleans(),
)
def test_every_template_is_found_and_every_counted_one_among_them(
    counts: list[int], mode: str | None, own_submitter: bool
) -> None:
    """A Ray job's templates: the head, every group whatever its count, the submitter in
    any mode; each derived pod set's template is one of them."""
    cluster = {"headGroupSpec": {"template": CPU},
               "workerGroupSpecs": [_group(i, n) for i, n in enumerate(counts)]}  # fmt: skip
    spec: Obj = {"entrypoint": "x", "rayClusterSpec": cluster}
    if mode is not None:
        spec["submissionMode"] = mode
    if own_submitter:
        spec["submitterPodTemplate"] = CPU
    obj = {"apiVersion": "ray.io/v1", "kind": "RayJob", "spec": spec}
    wire = parse_manifest(json.dumps({"apiVersion": "fedbroker.io/v1alpha1",
                                      "kind": "FederatedJob", "metadata": {"name": "r"},
                                      "spec": {"workload": obj}}).encode(), None)  # fmt: skip
    assert wire.spec.workload is not None
    admitted = wire.spec.workload.wire()
    found = [path for path, _ in templates(admitted)]
    rc = ("spec", "rayClusterSpec")
    expected: list[tuple[str | int, ...]] = [(*rc, "headGroupSpec", "template")]
    expected += [(*rc, "workerGroupSpecs", i, "template") for i in range(len(counts))]
    if "submitterPodTemplate" in admitted["spec"]:
        expected.append(("spec", "submitterPodTemplate"))
    assert sorted(found, key=str) == sorted(expected, key=str)
    assert {ps.path for ps in derive(admitted)} <= set(found)
    assert own_submitter or mode == "HTTPMode" or ("spec", "submitterPodTemplate") in found


@pytest.mark.parametrize("found", INTEGRATIONS, ids=[i.kind for i in INTEGRATIONS])
def test_every_kind_marks_its_pod_templates(found: Any) -> None:
    """Each table has its pod templates, and nothing else is one (a kind whose pods'
    templates are its member runtime's has none a tenant writes)."""
    rows = [path for path, rule in found.fields if rule.kind == "template"]
    if found.runtime_pod_sets is not None:
        assert rows == []
        return
    assert rows and all(path.endswith("emplate") for path in rows)


# -- template metadata --------------------------------------------------------------------

AT = ("spec", "podSets", 0, "template")
# (id, template, [path below AT, words])
METADATA: list[tuple[str, Obj, list[tuple[tuple[str | int, ...], str]]]] = [
    ("labels and annotations", {"metadata": {"labels": {"a": "b"}, "annotations": {"c": "d"}},
                                "spec": {}}, []),
    ("a name", {"metadata": {"name": "x"}}, [(("metadata", "name"), "only labels and")]),
    ("generateName", {"metadata": {"generateName": "x-"}}, [(("metadata", "generateName"), "")]),
    ("another key", {"spec": {}, "status": {}}, [(("status",), "only metadata and spec")]),
    ("broker annotation", {"metadata": {"annotations": {"fedbroker.io/slot": "w-0"}}},
     [(("metadata", "annotations", "fedbroker.io/slot"), "fedbroker.io annotations")]),
    ("deep", {"spec": {"volumes": [{"ephemeral": {"volumeClaimTemplate": {"metadata": {
        "labels": {"a.fedbroker.io/x": "y"}}}}}]}},
     [(("spec", "volumes", 0, "ephemeral", "volumeClaimTemplate", "metadata", "labels",
        "a.fedbroker.io/x"), "the broker's")]),
    ("not the broker's", {"metadata": {"labels": {"fedbroker.iox/a": "b", "xfedbroker.io/c": "d",
                                                  "fedbroker.io": "e"}}}, []),
]  # fmt: skip


@pytest.mark.parametrize(("template", "expected"), [m[1:] for m in METADATA],
                         ids=[m[0] for m in METADATA])  # fmt: skip
def test_template_metadata(
    template: Obj, expected: list[tuple[tuple[str | int, ...], str]]
) -> None:
    found = template_metadata(template, AT)
    assert [v.path for v in found] == [(*AT, *path) for path, _ in expected]
    for v, (_, words) in zip(found, expected, strict=True):
        assert words in v.message


# -- what controllers add ----------------------------------------------------------------

RESTRICTED = {
    "runAsNonRoot": True,
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
    "seccompProfile": {"type": "RuntimeDefault"},
}
OK_POD = {
    "spec": {
        "containers": [{"name": "pytorch", "image": "i", "securityContext": RESTRICTED}],
        "initContainers": [{"name": "fetch", "image": "i", "securityContext": RESTRICTED}],
    }
}


def _pytorch(*types: str) -> Obj:
    return {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
            "spec": {"pytorchReplicaSpecs": {t: {"template": OK_POD} for t in types}}}  # fmt: skip


# (id, object, level, [paths of the refusals])
INJECTED: list[tuple[str, Obj, Level, list[tuple[str | int, ...]]]] = [
    ("Master and Worker, restricted", _pytorch("Master", "Worker"), "restricted",
     [("spec", "pytorchReplicaSpecs", "Worker", "template", "spec", "initContainers")]),
    ("Master and Worker, baseline", _pytorch("Master", "Worker"), "baseline", []),
    ("Worker only, restricted", _pytorch("Worker"), "restricted", []),
    ("Master only, restricted", _pytorch("Master"), "restricted", []),
    ("Ray workers copy a restricted container's context", {
        "apiVersion": "ray.io/v1", "kind": "RayCluster", "spec": {
            "headGroupSpec": {"template": OK_POD},
            "workerGroupSpecs": [{"groupName": "g", "template": OK_POD}]}}, "restricted", []),
]  # fmt: skip


@pytest.mark.parametrize(("obj", "level", "expected"), [i[1:] for i in INJECTED],
                         ids=[i[0] for i in INJECTED])  # fmt: skip
def test_what_a_controller_adds_passes_the_tenants_level(
    obj: Obj, level: Level, expected: list[tuple[str | int, ...]]
) -> None:
    assert [v.path for v in injection_refusals(obj, level)] == expected


def test_the_container_is_added_after_the_tenants_own() -> None:
    (init,) = INJECTIONS
    pod = made(init, OK_POD)
    assert [c["name"] for c in pod["spec"]["initContainers"]] == ["fetch", "init-pytorch"]
    assert "securityContext" not in pod["spec"]["initContainers"][1]
    assert OK_POD["spec"]["initContainers"] == [pod["spec"]["initContainers"][0]]  # not edited
    refusal = injection_refusals(_pytorch("Master", "Worker"), "restricted")[0]
    assert "initContainers" in str(refusal.path[-1])
    assert '"init-pytorch"' in refusal.message and "securityContext." in refusal.message


def test_kuberay_copies_the_first_containers_security_context() -> None:
    (wait,) = integration("ray.io/v1", "RayCluster").injections
    pod = made(wait, OK_POD)
    assert pod["spec"]["initContainers"][-1]["name"] == "wait-gcs-ready"
    assert pod["spec"]["initContainers"][-1]["securityContext"] == RESTRICTED
    bare = {"spec": {"containers": [{"name": "ray", "image": "i"}]}}
    assert "securityContext" not in made(wait, bare)["spec"]["initContainers"][0]


# -- docs/security.md says what the tables say --------------------------------------------

SECURITY = Path(__file__).resolve().parents[2] / "docs" / "security.md"
BEGIN, END = "<!-- allowlist: generated -->", "<!-- allowlist: end -->"


def test_the_docs_allowlist_is_the_code_s() -> None:
    """docs/security.md carries every kind's table and what its controller adds, as
    ``broker.manifest.workloads.allowlist_doc()`` renders them. To update it, paste
    ``python -c "from broker.manifest.workloads import allowlist_doc; print(allowlist_doc())"``
    between the two markers."""
    text = SECURITY.read_text(encoding="utf-8")
    assert text.count(BEGIN) == 1 and text.count(END) == 1
    shown = text.split(BEGIN)[1].split(END)[0].strip()
    assert shown == allowlist_doc()
