"""Node reports carry the node's labels (its topology domains): a round trip keeps them,
a node with more than 64 reports the topology ones first, an older agent's report without
them reads as a node without labels, and bad labels from the wire are refused."""

from __future__ import annotations

import json

import pytest

from adapters.kube.translate import translate_node
from adapters.mqtt.reports import (
    MAX_LABELS,
    CapacityState,
    Usage,
    node_report,
    parse_node_report,
    reported_labels,
)
from broker.model import GpuType, Node, NodeUpdated, Resources
from broker.ports import ReportError

RACK, BLOCK = "cloud.provider.com/topology-rack", "cloud.provider.com/topology-block"
LABELS = {RACK: "b0-r1", BLOCK: "b0", "kubernetes.io/hostname": "n1", "empty": ""}
NODE = Node("n1", GpuType("A100"), Resources(gpus=8, cpu_milli=1000, memory_mib=1024), LABELS)


def test_labels_round_trip_through_the_agents_report() -> None:
    state = CapacityState()
    state.apply([NodeUpdated("c", NODE)])
    report = state.report("n1", 1.0)
    assert report is not None and report["labels"] == LABELS
    node, _ = parse_node_report(json.dumps(report).encode(), "n1")
    assert node == NODE


def test_an_older_agents_report_without_labels_still_reads() -> None:
    report = node_report(NODE, Usage(), 0.0)
    del report["labels"]
    node, _ = parse_node_report(json.dumps(report).encode(), "n1")
    assert node.labels == {} and node.allocatable == NODE.allocatable


def test_a_node_with_too_many_labels_reports_its_topology_first() -> None:
    many = {f"feature.node.kubernetes.io/f{i:03d}": "true" for i in range(100)} | LABELS
    kept = reported_labels(many)
    assert len(kept) == MAX_LABELS
    assert {RACK, BLOCK, "kubernetes.io/hostname"} <= kept.keys()
    assert reported_labels(LABELS) == LABELS


@pytest.mark.parametrize(
    "labels",
    [
        "rack=r1",
        ["rack"],
        {f"k{i}": "v" for i in range(MAX_LABELS + 1)},
        {"bad key": "v"},
        {"a/" + "x" * 64: "v"},
        {"-x.com/rack": "v"},
        {RACK: "v" * 64},
        {RACK: "not a value"},
        {RACK: 1},
    ],
)
def test_bad_labels_are_refused_naming_the_field(labels: object) -> None:
    report = node_report(NODE, Usage(), 0.0) | {"labels": labels}
    with pytest.raises(ReportError) as error:
        parse_node_report(json.dumps(report).encode(), "n1")
    assert str(error.value).startswith("labels: ")


def test_a_kubernetes_members_nodes_keep_their_labels() -> None:
    """Topology domains are read from every node's labels: translate_node keeps them all."""
    obj = {
        "metadata": {"name": "n1", "labels": LABELS},
        "status": {"allocatable": {"nvidia.com/gpu": "8", "cpu": "1", "memory": "1Gi"}},
    }
    assert translate_node(obj).labels == LABELS
