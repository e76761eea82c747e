"""Topology requests in manifests: a pod set's ``topology``, and Kueue's and KAI's pod
template annotations on workloads (batch Job, JobSet) and podSets, into ``PodSet.topology``;
wrong ones are one-line errors naming the field or annotation."""

from __future__ import annotations

import json
from typing import Any

import pytest

from broker.manifest import ManifestError, admit_templates, parse_manifest, to_job
from broker.model import TopologyRequest

Obj = dict[str, Any]
RACK = "cloud.provider.com/topology-rack"
BLOCK = "cloud.provider.com/topology-block"
REQ, PREF = "kueue.x-k8s.io/podset-required-topology", "kueue.x-k8s.io/podset-preferred-topology"
UNC = "kueue.x-k8s.io/podset-unconstrained-topology"
SLICE, SIZE = "kueue.x-k8s.io/podset-slice-required-topology", "kueue.x-k8s.io/podset-slice-size"
KAI_REQ = "kai.scheduler/topology-required-placement"
KAI_PREF = "kai.scheduler/topology-preferred-placement"
LIMITS = {"nvidia.com/gpu": 8, "cpu": "8", "memory": "8Gi"}
POD = {"containers": [{"name": "m", "image": "x", "resources": {"limits": LIMITS}}],
       "restartPolicy": "Never"}  # fmt: skip


def template(annotations: Obj | None = None) -> Obj:
    return {"metadata": {"annotations": annotations}, "spec": POD} if annotations else {"spec": POD}


def federated(spec: Obj) -> bytes:
    return json.dumps({"apiVersion": "fedbroker.io/v1alpha1", "kind": "FederatedJob",
                       "metadata": {"name": "t"}, "spec": spec}).encode()  # fmt: skip


def pod_sets(topology: Obj | None = None, count: int = 4, annotations: Obj | None = None) -> bytes:
    ps: Obj = {"name": "w", "count": count, "resources": {"nvidia.com/gpu": 8}}
    if topology is not None:
        ps["topology"] = topology
    if annotations:
        ps["template"] = template(annotations)
    return federated({"podSets": [ps]})


def batch(annotations: Obj, parallelism: int = 4, owner: Obj | None = None) -> bytes:
    job: Obj = {"apiVersion": "batch/v1", "kind": "Job",
                "spec": {"parallelism": parallelism, "completions": parallelism,
                         "template": template(annotations)}}  # fmt: skip
    if owner:
        job["metadata"] = {"annotations": owner}
    return federated({"workload": job})


def jobset(*replicated: tuple[str, Obj]) -> bytes:
    rjs = [{"name": name, "replicas": 2,
            "template": {"spec": {"parallelism": 2, "completions": 2, "template": template(a)}}}
           for name, a in replicated]  # fmt: skip
    return federated({"workload": {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
                                   "spec": {"replicatedJobs": rjs}}})  # fmt: skip


def pytorch(worker: Obj) -> bytes:
    def replica(count: int, annotations: Obj) -> Obj:
        spec = {
            **POD,
            "containers": [{"name": "pytorch", "image": "x", "resources": {"limits": LIMITS}}],
        }
        meta = {"metadata": {"annotations": annotations}} if annotations else {}
        return {"replicas": count, "template": {**meta, "spec": spec}}

    specs = {"Master": replica(1, {}), "Worker": replica(3, worker)}
    return federated({"workload": {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
                                   "spec": {"pytorchReplicaSpecs": specs}}})  # fmt: skip


def topologies(body: bytes) -> list[TopologyRequest | None]:
    job = to_job(parse_manifest(body, "application/json"), "acme", "default")
    return [ps.topology for ps in job.pod_sets]


@pytest.mark.parametrize(
    ("body", "want"),
    [
        (pod_sets(), [None]),
        (pod_sets({"required": RACK}), [TopologyRequest(required=RACK)]),
        (pod_sets({"preferred": BLOCK}), [TopologyRequest(preferred=BLOCK)]),
        (pod_sets({"preferred": BLOCK, "sliceSize": 2, "sliceRequired": RACK}),
         [TopologyRequest(preferred=BLOCK, slice_size=2, slice_level=RACK)]),
        (pod_sets({"sliceSize": 4, "sliceRequired": RACK}),
         [TopologyRequest(slice_size=4, slice_level=RACK)]),
        # the template's annotations on a podSets job are read too, and may say the same
        (pod_sets(annotations={REQ: RACK}), [TopologyRequest(required=RACK)]),
        (pod_sets({"required": RACK}, annotations={REQ: RACK}), [TopologyRequest(required=RACK)]),
        (batch({REQ: RACK}), [TopologyRequest(required=RACK)]),
        (batch({PREF: BLOCK, SLICE: RACK, SIZE: "2"}),
         [TopologyRequest(preferred=BLOCK, slice_size=2, slice_level=RACK)]),
        (batch({UNC: "true"}), [TopologyRequest()]),
        (batch({UNC: "false"}), [None]),
        (batch({"example.com/other": "x"}), [None]),
        (batch({KAI_REQ: BLOCK, KAI_PREF: RACK}),
         [TopologyRequest(required=BLOCK, preferred=RACK)]),
        (batch({KAI_PREF: RACK}), [TopologyRequest(preferred=RACK)]),
        (batch({REQ: RACK, KAI_REQ: RACK}), [TopologyRequest(required=RACK)]),
        # KAI's annotations on the workload object (where its pod grouper reads them)
        (batch({}, owner={KAI_REQ: RACK}), [TopologyRequest(required=RACK)]),
        (jobset(("a", {REQ: RACK}), ("b", {})), [TopologyRequest(required=RACK), None]),
        (pytorch({SLICE: RACK, SIZE: "3"}),
         [None, TopologyRequest(slice_size=3, slice_level=RACK)]),
        (jobset(("a", {PREF: BLOCK}), ("b", {KAI_REQ: RACK})),
         [TopologyRequest(preferred=BLOCK), TopologyRequest(required=RACK)]),
    ],
)  # fmt: skip
def test_requests_translate_to_the_pod_sets(
    body: bytes, want: list[TopologyRequest | None]
) -> None:
    assert topologies(body) == want


A = "spec.workload.spec.template.metadata.annotations"


@pytest.mark.parametrize(
    ("body", "where", "why"),
    [
        (pod_sets({}), "spec.podSets[0].topology", "give required, preferred"),
        (pod_sets({"required": RACK, "preferred": BLOCK}), "spec.podSets[0].topology.preferred",
         "not both"),
        (pod_sets({"sliceSize": 2}), "spec.podSets[0].topology.sliceRequired", "together"),
        (pod_sets({"sliceRequired": RACK}), "spec.podSets[0].topology.sliceSize", "together"),
        (pod_sets({"sliceSize": 3, "sliceRequired": RACK}), "spec.podSets[0].topology.sliceSize",
         "must divide the pod set's 4 pods"),
        (pod_sets({"required": "Bad Key"}), "spec.podSets[0].topology.required", "not a label key"),
        (pod_sets({"required": "a/" + "x" * 64}), "spec.podSets[0].topology.required",
         "not a label key"),
        (pod_sets({"required": RACK, "level": 1}), "spec.podSets[0].topology.level", "unknown"),
        (pod_sets({"required": BLOCK}, annotations={REQ: RACK}),
         "spec.podSets[0].template.metadata.annotations", "conflicts with the pod set's topology"),
        (batch({REQ: RACK, PREF: BLOCK}), f"{A}.{PREF}", f"conflicts with {REQ}"),
        (batch({REQ: RACK, UNC: "true"}), f"{A}.{UNC}", f"conflicts with {REQ}"),
        (batch({UNC: "yes"}), f"{A}.{UNC}", "must be a boolean"),
        (batch({REQ: "rack level"}), f"{A}.{REQ}", "not a label key"),
        (batch({REQ: 1}), f"{A}", "must be a string"),
        (batch({SLICE: RACK}), f"{A}.{SIZE}", "together"),
        (batch({SIZE: "2"}), f"{A}.{SLICE}", "together"),
        (batch({SLICE: RACK, SIZE: "two"}), f"{A}.{SIZE}", "whole number"),
        (batch({SLICE: RACK, SIZE: "0"}), f"{A}.{SIZE}", "whole number"),
        (batch({SLICE: RACK, SIZE: "²"}), f"{A}.{SIZE}", "whole number"),
        (batch({SLICE: RACK, SIZE: "9" * 5000}), f"{A}.{SIZE}", "whole number"),
        (batch({UNC: ["true"]}), f"{A}.{UNC}", "must be a boolean"),
        (batch({SLICE: RACK, SIZE: "3"}), f"{A}.{SIZE}", "must divide the pod set's 4 pods"),
        (batch({REQ: RACK, KAI_REQ: BLOCK}), f"{A}.{KAI_REQ}", "conflicts"),
        (batch({REQ: RACK}, owner={KAI_PREF: RACK}),
         f"spec.workload.metadata.annotations.{KAI_PREF}", "conflicts"),
    ],
)  # fmt: skip
def test_wrong_requests_are_one_line_errors_naming_the_field(
    body: bytes, where: str, why: str
) -> None:
    with pytest.raises(ManifestError) as caught:
        parse_manifest(body, "application/json")
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith(where), message
    assert why in message, message


def test_the_annotations_pass_the_workload_template_rules() -> None:
    """They are Kueue's and KAI's keys, not the broker's: the template allowlist and the
    tenant's template policy let them through."""
    body = batch({REQ: RACK, SLICE: RACK, SIZE: "2"}, owner={KAI_REQ: RACK})
    admitted = admit_templates(parse_manifest(body, "application/json"), "baseline", ["default"])
    assert topologies(json.dumps(admitted.wire()).encode()) == [
        TopologyRequest(required=RACK, slice_size=2, slice_level=RACK)
    ]
