"""The bad-input holes of issue 13 in the manifest: deep nesting, lone surrogates, NULs,
huge integers and duplicate keys refused before pydantic; names checked with full matches
(no trailing newline); every Kubernetes quantity suffix, through the one parser."""

from __future__ import annotations

import copy
import json
from fractions import Fraction
from typing import Any

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from adapters.kubeapi.quantity import parse_quantity as adapters_parse_quantity
from broker.manifest import ManifestError, parse_manifest
from broker.manifest.documents import MAX_DEPTH
from broker.manifest.errors import field_path
from broker.quantity import QuantityError, parse_quantity

MINIMAL: dict[str, Any] = {
    "apiVersion": "fedbroker.io/v1alpha1",
    "kind": "FederatedJob",
    "metadata": {"name": "one"},
    "spec": {"podSets": [{"name": "main", "count": 1, "resources": {"nvidia.com/gpu": 1}}]},
}


def _nested(levels: int) -> dict[str, Any]:
    doc: dict[str, Any] = {}
    for _ in range(levels):
        doc = {"a": doc}
    return doc


def _with(path: tuple[str | int, ...], value: object) -> dict[str, Any]:
    doc = copy.deepcopy(MINIMAL)
    target: Any = doc
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return doc


TEMPLATE = ("spec", "podSets", 0, "template")
PLACEMENT = ("spec", "placement")

# (id, document, field path the message starts with, fragment)
HOSTILE: list[tuple[str, dict[str, Any], str, str]] = [
    ("template 256 deep", _with(TEMPLATE, _nested(256)), "spec.podSets[0].template.a.a.a.a...",
     f"more than {MAX_DEPTH} levels"),
    ("template 900 deep", _with(TEMPLATE, _nested(900)), "spec.podSets[0].template.a.a.a.a...",
     "levels deep"),
    ("lists 300 deep", _with(TEMPLATE, {"x": json.loads("[" * 300 + "]" * 300)}),
     "spec.podSets[0].template.x[0][0]", "levels deep"),
    ("lone surrogate in a template", _with(TEMPLATE, {"spec": {"x": "a\ud800b"}}),
     "spec.podSets[0].template.spec.x", "lone surrogate"),
    ("lone surrogate in a key", _with(TEMPLATE, {"\udfff": 1}), "spec.podSets[0].template",
     "key is not valid Unicode"),
    ("lone surrogate in the name", _with(("metadata", "name"), "\ud83d"), "metadata.name",
     "lone surrogate"),
    ("NUL in a template", _with(TEMPLATE, {"image": "a\x00b"}), "spec.podSets[0].template.image",
     "NUL"),
    ("integer beyond 64 bits", _with(TEMPLATE, {"n": 2**64}), "spec.podSets[0].template.n",
     "out of range"),
    ("negative integer beyond 64 bits", _with(TEMPLATE, {"n": -(2**70)}),
     "spec.podSets[0].template.n", "out of range"),
    # names: a trailing newline is not a DNS-1123 label (re.match with "$" let it through)
    ("name with a newline", _with(("metadata", "name"), "abc\n"), "metadata.name", "DNS-1123"),
    ("namespace with a newline", _with(("metadata", "namespace"), "team-a\n"),
     "metadata.namespace", "DNS-1123"),
    ("pod set with a newline", _with(("spec", "podSets", 0, "name"), "w\n"),
     "spec.podSets[0].name", "DNS-1123"),
    ("queue with a newline", _with(("spec", "queue"), "training\n"), "spec.queue", "DNS-1123"),
    ("gpu type with a newline", _with(PLACEMENT, {"gpuTypes": ["G2\n"]}),
     "spec.placement.gpuTypes[0]", "GPU type"),
    ("selector value with a newline", _with(PLACEMENT, {"clusterSelector": {"region": "eu\n"}}),
     "spec.placement.clusterSelector.region", "label value"),
    ("selector key with a newline", _with(PLACEMENT, {"clusterSelector": {"region\n": "eu"}}),
     "spec.placement.clusterSelector", "label key"),
    # quantities beyond the bounds name the field
    ("memory 1Ei", _with(("spec", "podSets", 0, "resources", "memory"), "1Ei"),
     "spec.podSets[0].resources.memory", "at most 16Ti"),
    ("cpu 1E", _with(("spec", "podSets", 0, "resources", "cpu"), "1E"),
     "spec.podSets[0].resources.cpu", "at most 1024 cores"),
]  # fmt: skip


def _bodies(doc: dict[str, Any]) -> list[tuple[bytes, str | None]]:
    # ensure_ascii keeps lone surrogates as \ud800 escapes, which JSON allows
    text = json.dumps(doc)
    bodies: list[tuple[bytes, str | None]] = [(text.encode(), "application/json")]
    if "\\ud" in text or text.count("{") > 400:
        return bodies  # YAML's reader refuses surrogates itself; its writer overflows
    return [*bodies, (yaml.safe_dump(doc).encode(), "application/yaml")]


@pytest.mark.parametrize(
    ("doc", "path", "fragment"), [h[1:] for h in HOSTILE], ids=[h[0] for h in HOSTILE]
)
def test_hostile_manifest_is_refused_naming_the_field(
    doc: dict[str, Any], path: str, fragment: str
) -> None:
    for body, content_type in _bodies(doc):
        with pytest.raises(ManifestError) as caught:
            parse_manifest(body, content_type)
        message = str(caught.value)
        assert "\n" not in message
        assert message.startswith(f"{path}"), message
        assert fragment in message, message


def test_cpu_in_nanocores_rounds_up_to_a_millicore() -> None:
    doc = _with(("spec", "podSets", 0, "resources", "cpu"), "1n")
    job = parse_manifest(json.dumps(doc).encode(), "application/json")
    assert (job.spec.pod_sets or [])[0].resources.cpu == "1n"


def test_nesting_up_to_the_bound_is_accepted() -> None:
    # the template sits 4 levels down (spec, podSets, [0], template)
    doc = _with(TEMPLATE, _nested(MAX_DEPTH - 5))
    pod_sets = parse_manifest(json.dumps(doc).encode(), "application/json").spec.pod_sets
    assert pod_sets is not None and pod_sets[0].template
    deeper = _with(TEMPLATE, _nested(MAX_DEPTH - 4))
    with pytest.raises(ManifestError, match="levels deep"):
        parse_manifest(json.dumps(deeper).encode(), "application/json")


@pytest.mark.parametrize(
    "body",
    [b'{"apiVersion": "a", "apiVersion": "fedbroker.io/v1alpha1"}',
     b'{"kind": "FederatedJob", "metadata": {"name": "a", "name": "b"}}'],
)  # fmt: skip
def test_duplicate_json_keys_are_refused(body: bytes) -> None:
    for content_type in ("application/json", None):
        with pytest.raises(ManifestError, match="duplicate key") as caught:
            parse_manifest(body, content_type)
        assert str(caught.value).startswith("manifest: ")


@pytest.mark.parametrize("body", [b"[]", b'"a"', b"1", b"1e999", b"null", b"true"])
def test_non_object_json_is_refused(body: bytes) -> None:
    with pytest.raises(ManifestError, match="must be a mapping"):
        parse_manifest(body, "application/json")


QUANTITIES: list[tuple[str, Fraction]] = [
    ("1n", Fraction(1, 10**9)),
    ("1u", Fraction(1, 10**6)),
    ("1m", Fraction(1, 1000)),
    ("1", Fraction(1)),
    ("1k", Fraction(10**3)),
    ("1M", Fraction(10**6)),
    ("1G", Fraction(10**9)),
    ("1T", Fraction(10**12)),
    ("1P", Fraction(10**15)),
    ("1E", Fraction(10**18)),
    ("1Ki", Fraction(2**10)),
    ("1Mi", Fraction(2**20)),
    ("1Gi", Fraction(2**30)),
    ("1Ti", Fraction(2**40)),
    ("1Pi", Fraction(2**50)),
    ("1Ei", Fraction(2**60)),
    ("1.5Ei", Fraction(3 * 2**59)),
    ("1e3", Fraction(1000)),
    ("1E3", Fraction(1000)),
    ("1e+3", Fraction(1000)),
    ("5e-1", Fraction(1, 2)),
    ("-1Ki", Fraction(-1024)),
]


@pytest.mark.parametrize(("text", "value"), QUANTITIES, ids=[q[0] for q in QUANTITIES])
def test_every_kubernetes_suffix(text: str, value: Fraction) -> None:
    assert parse_quantity(text) == value
    assert adapters_parse_quantity(text) == value  # the adapters read with the same parser


@pytest.mark.parametrize("text", ["1Ei\n", "1i", "1Eii", "1ki", "1N", "1U", "1e31", "1 "])
def test_not_quantities(text: str) -> None:
    with pytest.raises(QuantityError, match="not a quantity"):
        parse_quantity(text)


def test_there_is_one_parser() -> None:
    assert adapters_parse_quantity is parse_quantity


@given(st.integers(min_value=0, max_value=10**6), st.sampled_from(sorted(
    s for s in ("n", "u", "m", "", "k", "M", "G", "T", "P", "E", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei")
)))  # fmt: skip
def test_a_number_and_a_suffix_scale_exactly(number: int, suffix: str) -> None:
    assert parse_quantity(f"{number}{suffix}") == number * parse_quantity(f"1{suffix}")


@pytest.mark.parametrize(
    ("loc", "shown"),
    [
        (("spec", "podSets", 0, "name"), "spec.podSets[0].name"),
        (("spec", "resources", "limits", "nvidia.com/gpu"), "spec.resources.limits.nvidia.com/gpu"),
        (("spec", "template", ":memory:", 0), 'spec.template[":memory:"][0]'),
        (("spec", "a\nb: c"), 'spec["a\\nb: c"]'),
        (("spec", "\ud800"), 'spec["\\ud800"]'),
    ],
)
def test_odd_keys_are_quoted_in_field_paths(loc: tuple[str | int, ...], shown: str) -> None:
    assert field_path(loc) == shown
