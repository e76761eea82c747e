"""Node reports keep the broker's own pods apart (adapters/mqtt/reports.py): an agent's
``used`` counts only the others, ``ours`` names the broker's pods under their ledger names,
and the broker's ledger matches those to their gang's reservation instead of counting them
twice. Reports of older agents (no ``ours``) read as before."""

from __future__ import annotations

import json

import pytest

from adapters.mqtt.reports import (
    CapacityState,
    OurPod,
    Usage,
    node_report,
    parse_node_report,
    report_events,
)
from broker.core.ledger import Ledger
from broker.model import (
    Cluster,
    GpuType,
    Node,
    NodeUpdated,
    Placement,
    PodBound,
    PodDeleted,
    PodPlacement,
    Resources,
)
from broker.ports import ReportError

NODE = Node("n1", GpuType("A100"), Resources(gpus=4, cpu_milli=64_000, memory_mib=65_536))
ONE = Resources(gpus=1, cpu_milli=1000, memory_mib=1024)


def state() -> CapacityState:
    s = CapacityState()
    s.apply([
        NodeUpdated("edge", NODE),
        PodBound("edge", "ml/other", "n1", Resources(gpus=2, cpu_milli=500)),
        PodBound("edge", "acme.train-worker-0", "n1", ONE, (3,)),
        PodBound("edge", "acme.train-worker-1", "n1", ONE, None),
    ])  # fmt: skip
    return s


def test_the_agent_reports_the_brokers_pods_apart() -> None:
    report = state().report("n1", 5.0)
    assert report is not None
    assert report["used"] == {"gpus": 2, "sharedGpuMilli": [], "cpuMilli": 500,
                              "memoryMib": 0, "pods": 1}  # fmt: skip
    resources = {"gpus": 1, "gpuMilli": 0, "cpuMilli": 1000, "memoryMib": 1024}
    assert report["ours"] == [
        {"pod": "acme.train-worker-0", "resources": resources, "gpus": [3]},
        {"pod": "acme.train-worker-1", "resources": resources, "gpus": None},
    ]
    node, usage = parse_node_report(json.dumps(report).encode(), "n1")
    assert node == NODE
    assert usage.ours == (OurPod("acme.train-worker-0", ONE, (3,)),
                          OurPod("acme.train-worker-1", ONE, None))  # fmt: skip


def test_an_older_agents_report_has_no_pods_of_ours() -> None:
    report = node_report(NODE, Usage(gpus=2, pods=1), 0.0)
    del report["ours"]
    _, usage = parse_node_report(json.dumps(report).encode(), "n1")
    assert usage == Usage(gpus=2, pods=1)


@pytest.mark.parametrize(
    ("ours", "field"),
    [
        ("x", "ours: not a list"),
        ([{"pod": "ml/other", "resources": {}}], "ours[0].pod"),
        ([{"pod": "a.b-c-0", "resources": {}}, {"pod": "a.b-c-0", "resources": {}}], "ours[1].pod"),
        ([{"pod": "a.b-c-0", "resources": {}, "gpus": [-1]}], "ours[0].gpus"),
        ([{"pod": "a.b-c-0", "resources": {"gpus": "1"}}], "ours[0].resources.gpus"),
        ([{"pod": "a.b-c-0"}], "ours[0].resources: not an object"),
    ],
)
def test_a_bad_list_of_ours_is_refused_naming_the_field(ours: object, field: str) -> None:
    report = node_report(NODE, Usage(), 0.0) | {"ours": ours}
    with pytest.raises(ReportError, match=None) as error:
        parse_node_report(json.dumps(report).encode(), "n1")
    assert str(error.value).startswith(field)


def test_the_ledger_matches_our_pods_to_their_reservation_across_reports() -> None:
    ledger = Ledger()
    ledger.add_cluster(Cluster("edge"))
    placement = Placement("acme/train", "edge", (
        PodPlacement("acme.train-worker-0", "n1", (3,), ONE),
        PodPlacement("acme.train-worker-1", "n1", (2,), ONE),
    ))  # fmt: skip
    payload = json.dumps(state().report("n1", 0.0)).encode()
    node, usage = parse_node_report(payload, "n1")
    events, names = report_events("edge", node, Usage(), [])
    for ev in events:
        ledger.apply(ev)
    ledger.assume(placement)
    assert ledger.snapshot().clusters["edge"].free_milli() == 2000
    events, names = report_events("edge", node, usage, names)
    assert not any(isinstance(e, PodDeleted) for e in events)
    assert PodBound("edge", "acme.train-worker-0", "n1", ONE, (3,)) in events
    for ev in events:
        assert ledger.apply(ev) == []
    ledger.confirm("acme/train")
    # 2 GPUs of the others, 2 of ours: counted once
    assert ledger.snapshot().clusters["edge"].free_milli() == 0
    assert ledger.counted("edge", "acme.train-worker-0") == ("n1", (3,))
    # the same report again changes nothing; one of ours gone: only it is deleted
    again, names = report_events("edge", node, usage, names)
    assert [e for e in again if isinstance(e, PodDeleted)] == [PodDeleted("edge", "agent:n1")]
    fewer = Usage(2, (), 500, 0, 1, usage.ours[:1])
    events, names = report_events("edge", node, fewer, names)
    deleted = [e for e in events if isinstance(e, PodDeleted)]
    assert PodDeleted("edge", "acme.train-worker-1") in deleted
    assert "acme.train-worker-1" not in names
