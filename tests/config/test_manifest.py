"""FederatedJob manifests: valid ones become the right Job, bad ones a one-line error that
names the field path, and Kubernetes quantities parse exactly."""

from __future__ import annotations

import copy
import json
from fractions import Fraction
from typing import Any

import pytest
import yaml

from broker.manifest import (
    FederatedJob,
    ManifestError,
    cpu_millicores,
    json_schema,
    memory_mebibytes,
    parse_manifest,
    parse_quantity,
    to_job,
)
from broker.model import GpuType, Job, PodSet, Resources
from broker.taints import Toleration

# The example of DESIGN.md, verbatim.
DESIGN_EXAMPLE = b"""\
apiVersion: fedbroker.io/v1alpha1
kind: FederatedJob
metadata: {name: llama-pretrain, namespace: ml-research}
spec:
  queue: training            # default from the namespace / tenant
  priority: 100
  policy: auto               # gang | binpack | auto (gang when more than one pod)
  gang: {minMember: 8, scheduleTimeoutSeconds: 600}
  placement: {gpuTypes: [A100, H100], clusterSelector: {region: eu}, allowBurst: true}
  podSets:
  - name: worker
    count: 8
    resources: {nvidia.com/gpu: 8, cpu: "64", memory: 512Gi}
    template: {spec: {containers: [{name: main, image: trainer:1.0}]}}
"""

JSON_JOB: dict[str, Any] = {
    "apiVersion": "fedbroker.io/v1alpha1",
    "kind": "FederatedJob",
    "metadata": {"name": "mixed"},
    "spec": {
        "policy": "gang",
        "gang": {"minMember": 3, "scheduleTimeoutSeconds": 120, "backoffLimit": 4},
        "podSets": [
            {"name": "driver", "count": 1, "resources": {"cpu": 2, "memory": "4Gi"}},
            {
                "name": "worker",
                "count": 4,
                "resources": {"amd.com/gpu": 2, "cpu": "16", "memory": "64Gi"},
                "template": {"spec": {"tolerations": [{"key": "gpu", "operator": "Exists"}]}},
            },
        ],
    },
}

SHARED_JOB = b"""\
apiVersion: fedbroker.io/v1alpha1
kind: FederatedJob
metadata: {name: notebook}
spec:
  policy: binpack
  podSets:
  - name: main
    count: 2
    resources: {fedbroker.io/gpu-milli: 250, cpu: 500m, memory: 1G}
"""

MINIMAL: dict[str, Any] = {
    "apiVersion": "fedbroker.io/v1alpha1",
    "kind": "FederatedJob",
    "metadata": {"name": "one"},
    "spec": {"podSets": [{"name": "main", "count": 1, "resources": {"nvidia.com/gpu": 1}}]},
}


def _job(name: str, *pod_sets: PodSet, tenant: str = "team-a", **fields: Any) -> Job:
    return Job(name=name, pod_sets=pod_sets, tenant=tenant, **fields)


VALID: list[tuple[str, bytes, str | None, Job]] = [
    (
        "design example (YAML)",
        DESIGN_EXAMPLE,
        "application/yaml",
        _job(
            "llama-pretrain",
            PodSet("worker", 8, Resources(gpus=8, cpu_milli=64_000, memory_mib=512 * 1024)),
            queue="training",
            priority=100,
            gpu_types=frozenset({GpuType("A100"), GpuType("H100")}),
            cluster_selector={"region": "eu"},
            min_member=8,
            schedule_timeout_seconds=600,
            policy="auto",
            allow_burst=True,
        ),
    ),
    (
        "JSON, two pod sets, AMD GPUs, default queue",
        json.dumps(JSON_JOB).encode(),
        "application/json; charset=utf-8",
        _job(
            "mixed",
            PodSet("driver", 1, Resources(cpu_milli=2000, memory_mib=4096)),
            PodSet(
                "worker",
                4,
                Resources(gpus=2, cpu_milli=16_000, memory_mib=65_536),
                frozenset({Toleration("gpu", "Exists")}),
            ),
            queue="default-q",
            min_member=3,
            schedule_timeout_seconds=120,
            policy="gang",
        ),
    ),
    (
        "shared GPU pods",
        SHARED_JOB,
        None,
        _job(
            "notebook",
            PodSet("main", 2, Resources(gpu_milli=250, cpu_milli=500, memory_mib=954)),
            queue="default-q",
            policy="binpack",
        ),
    ),
    (
        "JSON without a content type",
        json.dumps(MINIMAL).encode(),
        None,
        _job("one", PodSet("main", 1, Resources(gpus=1)), queue="default-q"),
    ),
    (
        "YAML flow mapping sniffed after JSON fails",
        b"{apiVersion: fedbroker.io/v1alpha1, kind: FederatedJob, metadata: {name: one},"
        b" spec: {podSets: [{name: main, count: 1, resources: {nvidia.com/gpu: 1}}]}}",
        "application/x-www-form-urlencoded",
        _job("one", PodSet("main", 1, Resources(gpus=1)), queue="default-q"),
    ),
]


@pytest.mark.parametrize(
    ("body", "content_type", "expected"), [v[1:] for v in VALID], ids=[v[0] for v in VALID]
)
def test_valid_manifest_becomes_job(body: bytes, content_type: str | None, expected: Job) -> None:
    manifest = parse_manifest(body, content_type)
    assert to_job(manifest, "team-a", "default-q") == expected
    # The wire form parses back to the same manifest (the store keeps it, the API echoes it).
    assert parse_manifest(json.dumps(manifest.wire()).encode(), "application/json") == manifest


def test_fields_the_job_does_not_carry_stay_on_the_manifest() -> None:
    design = parse_manifest(DESIGN_EXAMPLE, None)
    assert design.spec.placement.allow_burst is True
    assert design.spec.gang.backoff_limit is None
    assert design.metadata.namespace == "ml-research"
    template = (design.spec.pod_sets or [])[0].template
    assert template["spec"]["containers"][0]["image"] == "trainer:1.0"
    mixed = parse_manifest(json.dumps(JSON_JOB).encode(), None)
    assert mixed.spec.gang.backoff_limit == 4
    assert mixed.spec.placement.allow_burst is False  # burst costs money: opt in


def test_tenant_comes_from_the_caller_not_the_namespace() -> None:
    job = to_job(parse_manifest(DESIGN_EXAMPLE, None), "team-b", "default-q")
    assert job.tenant == "team-b"
    assert job.key == "team-b/llama-pretrain"


DELETE = object()


def _with(*changes: tuple[tuple[str | int, ...], object]) -> dict[str, Any]:
    """MINIMAL (with an 8-pod first pod set) changed at the given key paths."""
    doc = copy.deepcopy(MINIMAL)
    doc["spec"]["podSets"][0]["count"] = 8
    for path, value in changes:
        target: Any = doc
        for key in path[:-1]:
            target = target[key]
        if value is DELETE:
            del target[path[-1]]
        else:
            target[path[-1]] = value
    return doc


PS0 = ("spec", "podSets", 0)
RES0 = (*PS0, "resources")
MILLI = (*RES0, "fedbroker.io/gpu-milli")
NO_GPUS = ((*RES0, "nvidia.com/gpu"), DELETE)
INT = "must be an integer"


def _pod_sets(*counts: int) -> list[dict[str, Any]]:
    return [{"name": f"p{i}", "count": c, "resources": {}} for i, c in enumerate(counts)]


BAD: list[tuple[str, dict[str, Any], str, str]] = [
    # bounds
    ("count 0", _with(((*PS0, "count"), 0)), "spec.podSets[0].count", "must be >= 1"),
    ("count 1025", _with(((*PS0, "count"), 1025)), "spec.podSets[0].count", "must be <= 1024"),
    ("no pod sets", _with((("spec", "podSets"), [])), "spec.podSets", "at least 1 item"),
    ("9 pod sets", _with((("spec", "podSets"), _pod_sets(*[1] * 9))), "spec.podSets", "at most 8"),
    ("4097 pods", _with((("spec", "podSets"), _pod_sets(1024, 1024, 1024, 1024, 1))),
     "spec.podSets", "at most 4096"),
    ("17 GPUs", _with(((*RES0, "nvidia.com/gpu"), 17)), "spec.podSets[0].resources.nvidia.com/gpu",
     "must be <= 16"),
    ("-1 GPUs", _with(((*RES0, "nvidia.com/gpu"), -1)), "spec.podSets[0].resources.nvidia.com/gpu",
     "must be >= 0"),
    ("milli 0", _with(NO_GPUS, (MILLI, 0)),
     "spec.podSets[0].resources.fedbroker.io/gpu-milli", "must be >= 1"),
    ("milli 1000", _with(NO_GPUS, (MILLI, 1000)),
     "spec.podSets[0].resources.fedbroker.io/gpu-milli", "must be <= 999"),
    ("minMember above pods", _with((("spec", "gang"), {"minMember": 9})), "spec.gang.minMember",
     "8 pods"),
    ("minMember -1", _with((("spec", "gang"), {"minMember": -1})), "spec.gang.minMember", ">= 0"),
    ("timeout 0", _with((("spec", "gang"), {"scheduleTimeoutSeconds": 0})),
     "spec.gang.scheduleTimeoutSeconds", ">= 1"),
    ("timeout a day and a second", _with((("spec", "gang"), {"scheduleTimeoutSeconds": 86_401})),
     "spec.gang.scheduleTimeoutSeconds", "<= 86400"),
    ("backoffLimit -1", _with((("spec", "gang"), {"backoffLimit": -1})), "spec.gang.backoffLimit",
     ">= 0"),
    ("priority too high", _with((("spec", "priority"), 1_000_001)), "spec.priority", "<= 1000000"),
    ("priority too low", _with((("spec", "priority"), -1_000_001)), "spec.priority", ">= -1000000"),
    ("cpu 0", _with(((*RES0, "cpu"), "0")), "spec.podSets[0].resources.cpu", "must be positive"),
    ("cpu negative", _with(((*RES0, "cpu"), "-1")), "spec.podSets[0].resources.cpu", "positive"),
    ("cpu 2000 cores", _with(((*RES0, "cpu"), "2000")), "spec.podSets[0].resources.cpu",
     "at most 1024 cores"),
    ("memory 17Ti", _with(((*RES0, "memory"), "17Ti")), "spec.podSets[0].resources.memory",
     "at most 16Ti"),
    ("memory 0", _with(((*RES0, "memory"), 0)), "spec.podSets[0].resources.memory", "positive"),
    # quantities and types
    ("bad quantity", _with(((*RES0, "cpu"), "lots")), "spec.podSets[0].resources.cpu",
     'not a quantity: "lots"'),
    ("memory with a space", _with(((*RES0, "memory"), "1 Gi")), "spec.podSets[0].resources.memory",
     "not a quantity"),
    ("boolean cpu", _with(((*RES0, "cpu"), True)), "spec.podSets[0].resources.cpu",
     "not a quantity"),
    ("count as text", _with(((*PS0, "count"), "8")), "spec.podSets[0].count", INT),
    ("count as float", _with(((*PS0, "count"), 8.0)), "spec.podSets[0].count", INT),
    ("priority boolean", _with((("spec", "priority"), True)), "spec.priority", INT),
    ("allowBurst as text", _with((("spec", "placement"), {"allowBurst": "yes"})),
     "spec.placement.allowBurst", "must be a boolean"),
    ("podSets a mapping", _with((("spec", "podSets"), {"main": 1})), "spec.podSets",
     "must be a list"),
    ("metadata a string", _with((("metadata",), "one")), "metadata", "must be a mapping"),
    ("gpuTypes a string", _with((("spec", "placement"), {"gpuTypes": "A100"})),
     "spec.placement.gpuTypes", "must be a list"),
    ("selector value a number", _with((("spec", "placement"), {"clusterSelector": {"zone": 1}})),
     "spec.placement.clusterSelector.zone", "must be a string"),
    ("template a list", _with(((*PS0, "template"), [])), "spec.podSets[0].template", "mapping"),
    # unknown and missing fields, wrong constants
    ("unknown resource", _with(((*RES0, "nvidia.com/gpus"), 1)),
     "spec.podSets[0].resources.nvidia.com/gpus", "unknown field"),
    ("unknown spec field", _with((("spec", "replicas"), 2)), "spec.replicas", "unknown field"),
    ("status given", _with((("status",), {})), "status", "unknown field"),
    ("python field name", _with((("spec", "pod_sets"), [])), "spec.pod_sets", "unknown field"),
    ("no name", _with((("metadata", "name"), DELETE)), "metadata.name", "required"),
    ("no count", _with(((*PS0, "count"), DELETE)), "spec.podSets[0].count", "required"),
    ("no apiVersion", _with((("apiVersion",), DELETE)), "apiVersion", "required"),
    ("wrong apiVersion", _with((("apiVersion",), "v1")), "apiVersion", "fedbroker.io/v1alpha1"),
    ("wrong kind", _with((("kind",), "Job")), "kind", "FederatedJob"),
    ("unknown policy", _with((("spec", "policy"), "best")), "spec.policy", "'binpack'"),
    # cross-field rules
    ("duplicate pod sets", _with((("spec", "podSets"), _pod_sets(1, 1) + _pod_sets(1))),
     "spec.podSets[2].name", "duplicate pod set name 'p0'"),
    ("gpus and milli", _with(((*RES0, "fedbroker.io/gpu-milli"), 500)),
     "spec.podSets[0].resources.fedbroker.io/gpu-milli", "not both"),
    ("nvidia and amd", _with(((*RES0, "amd.com/gpu"), 1)), "spec.podSets[0].resources.amd.com/gpu",
     "not both"),
    # names
    ("name with capitals", _with((("metadata", "name"), "Llama_Pretrain")), "metadata.name",
     "DNS-1123"),
    ("name of 64 characters", _with((("metadata", "name"), "a" * 64)), "metadata.name", "DNS-1123"),
    ("namespace starts with -", _with((("metadata", "namespace"), "-x")), "metadata.namespace",
     "DNS-1123"),
    ("pod set name", _with(((*PS0, "name"), "Worker")), "spec.podSets[0].name", "DNS-1123"),
    ("queue name", _with((("spec", "queue"), "Training")), "spec.queue", "DNS-1123"),
    ("gpu type with a space", _with((("spec", "placement"), {"gpuTypes": ["A 100"]})),
     "spec.placement.gpuTypes[0]", "GPU type"),
    ("selector key", _with((("spec", "placement"), {"clusterSelector": {"-x": "a"}})),
     "spec.placement.clusterSelector.-x", 'key "-x" is not a label key'),
    # rendezvous (issue 14)
    ("masterPort 0", _with((("spec", "rendezvous"), {"masterPort": 0})),
     "spec.rendezvous.masterPort", "must be >= 1"),
    ("masterPort 65536", _with((("spec", "rendezvous"), {"masterPort": 65536})),
     "spec.rendezvous.masterPort", "must be <= 65535"),
    ("masterPort as text", _with((("spec", "rendezvous"), {"masterPort": "29500"})),
     "spec.rendezvous.masterPort", INT),
    ("rendezvous unknown key", _with((("spec", "rendezvous"), {"port": 1})),
     "spec.rendezvous.port", ""),
    ("template not plain JSON", _with(((*PS0, "template"), {"spec": {"x": float("nan")}})),
     "spec.podSets[0].template.spec.x", "finite"),
]  # fmt: skip


@pytest.mark.parametrize(("doc", "path", "fragment"), [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_manifest_names_the_field(doc: dict[str, Any], path: str, fragment: str) -> None:
    for body, content_type in ((json.dumps(doc).encode(), "application/json"),
                               (yaml.safe_dump(doc).encode(), None)):  # fmt: skip
        with pytest.raises(ManifestError) as caught:
            parse_manifest(body, content_type)
        message = str(caught.value)
        assert "\n" not in message
        assert caught.value.path == path, message
        assert message.startswith(f"{path}: "), message
        assert fragment in message


RAW: list[tuple[str, bytes, str | None, str]] = [
    ("empty body", b"", None, "empty body"),
    ("blank body", b"  \n\t\n", "application/yaml", "empty body"),
    ("not UTF-8", b"\xff\xfe\x00a", None, "not UTF-8"),
    ("YAML list", b"- a\n- b\n", None, "must be a mapping (an object), got a list"),
    ("YAML scalar", b"hello", None, "got a string"),
    ("YAML null", b"~", "application/yaml", "got nothing"),
    ("JSON list", b"[1, 2]", "application/json", "got a list"),
    ("invalid YAML", b"spec: [1, 2\n", None, "invalid YAML at line"),
    ("tab-indented YAML", b"spec:\n\tqueue: a\n", "text/yaml", "invalid YAML"),
    ("invalid JSON", b'{"kind": }', "application/json", "invalid JSON at line 1, column 10"),
    ("invalid JSON sniffed", b'{"kind": "x",, }', None, "invalid JSON at line 1"),
    ("YAML body sent as JSON", DESIGN_EXAMPLE, "application/json", "invalid JSON"),
    ("YAML aliases", b"a: &x [1, 2]\nb: *x\n", None, "aliases"),
    ("deep JSON", b"[" * 100_000, "application/json", "invalid JSON"),
    ("deep YAML", b"[" * 100_000, "application/yaml", "invalid YAML"),
    ("huge integer", b"a: " + b"9" * 5000, None, "invalid YAML"),
    ("unhashable YAML key", b"? [1]\n: 2\n", None, "invalid YAML"),
]


@pytest.mark.parametrize(
    ("body", "content_type", "fragment"), [r[1:] for r in RAW], ids=[r[0] for r in RAW]
)
def test_unreadable_body_is_a_manifest_error(
    body: bytes, content_type: str | None, fragment: str
) -> None:
    with pytest.raises(ManifestError) as caught:
        parse_manifest(body, content_type)
    message = str(caught.value)
    assert caught.value.path == "manifest"
    assert message.startswith("manifest: ")
    assert "\n" not in message
    assert fragment in message


def test_more_errors_are_counted() -> None:
    doc = _with(((*PS0, "count"), 0), (("spec", "priority"), "high"))
    with pytest.raises(ManifestError, match=r"\(and 1 more\)$"):
        parse_manifest(json.dumps(doc).encode(), None)


def test_long_values_are_shortened_in_messages() -> None:
    doc = _with(((*RES0, "cpu"), "x" * 5000))
    with pytest.raises(ManifestError) as caught:
        parse_manifest(json.dumps(doc).encode(), None)
    assert len(str(caught.value)) < 200


QUANTITIES: list[tuple[object, Fraction]] = [
    ("64", Fraction(64)),
    ("500m", Fraction(1, 2)),
    ("0.5", Fraction(1, 2)),
    (".5", Fraction(1, 2)),
    ("5.", Fraction(5)),
    ("+1", Fraction(1)),
    ("-2k", Fraction(-2000)),
    (0.25, Fraction(1, 4)),
    (3, Fraction(3)),
    ("1k", Fraction(1000)),
    ("1M", Fraction(10**6)),
    ("1G", Fraction(10**9)),
    ("2T", Fraction(2 * 10**12)),
    ("1P", Fraction(10**15)),
    ("1E", Fraction(10**18)),
    ("1Ki", Fraction(1024)),
    ("1.5Mi", Fraction(3 * 2**19)),
    ("512Gi", Fraction(512 * 2**30)),
    ("1Ti", Fraction(2**40)),
    ("1e3", Fraction(1000)),
    ("1E3", Fraction(1000)),
    ("25e-2", Fraction(1, 4)),
    (1e-05, Fraction(1, 100_000)),
]


@pytest.mark.parametrize(("text", "value"), QUANTITIES, ids=[repr(q[0]) for q in QUANTITIES])
def test_quantity(text: object, value: Fraction) -> None:
    assert parse_quantity(text) == value


@pytest.mark.parametrize(
    "text",
    ["", "lots", "1.2.3", "1 Gi", " 1", "Gi", "1gi", "1KI", "1e", "1e999", "1e3Gi", "--1", "1Mi5",
     "0x10", "inf", "nan", "1_000", float("inf"), float("nan"), True, None, [1], "9" * 100],
)  # fmt: skip
def test_not_a_quantity(text: object) -> None:
    with pytest.raises(ValueError, match="not a quantity"):
        parse_quantity(text)


@pytest.mark.parametrize(
    ("text", "millicores"),
    [("64", 64_000), ("500m", 500), ("0.5", 500), ("0.1m", 1), ("1.0001", 1001), (2, 2000)],
)
def test_cpu_rounds_up_to_millicores(text: str, millicores: int) -> None:
    assert cpu_millicores(text) == millicores


@pytest.mark.parametrize(
    ("text", "mib"),
    [("512Gi", 524_288), ("1024Mi", 1024), ("1G", 954), ("1", 1), ("1Mi", 1), ("1049k", 2),
     ("128974848", 123), ("129e6", 124), ("0.5Gi", 512)],
)  # fmt: skip
def test_memory_rounds_up_to_mib(text: str, mib: int) -> None:
    assert memory_mebibytes(text) == mib


def test_json_schema_uses_wire_names() -> None:
    schema = json_schema(ref_template="#/components/schemas/{model}")
    assert schema["title"] == "FederatedJob"
    assert set(schema["required"]) == {"apiVersion", "kind", "metadata", "spec"}
    defs = schema["$defs"]
    resources = defs["ResourcesSpec"]["properties"]
    assert {"nvidia.com/gpu", "amd.com/gpu", "fedbroker.io/gpu-milli", "cpu", "memory"} == set(
        resources
    )
    assert {s["type"] for s in resources["cpu"]["anyOf"]} >= {"string", "number"}
    pod_sets = defs["JobSpec"]["properties"]["podSets"]["anyOf"]
    assert {"type": "array"}.items() <= pod_sets[0].items()
    assert pod_sets[0]["items"]["$ref"] == "#/components/schemas/PodSetSpec"
    workload = defs["JobSpec"]["properties"]["workload"]["anyOf"][0]["$ref"]
    assert workload == "#/components/schemas/WorkloadObject"
    assert set(defs["WorkloadObject"]["required"]) == {"apiVersion", "kind", "spec"}
    assert defs["PodSetSpec"]["properties"]["count"]["maximum"] == 1024
    assert defs["JobSpec"]["additionalProperties"] is False
    assert "additionalProperties" not in defs["PodSetSpec"]["properties"]["template"] or (
        defs["PodSetSpec"]["properties"]["template"]["additionalProperties"] is True
    )


def test_manifest_is_immutable() -> None:
    manifest = parse_manifest(DESIGN_EXAMPLE, None)
    with pytest.raises(ValueError, match="frozen"):
        manifest.spec.priority = 1
    assert isinstance(manifest, FederatedJob)
