"""A cluster's topology domains as read-model rows (``broker.service.domain_rows``): counts,
the largest gang inside one domain per GPU type, the bound on listed domains, and the rows
kept until the cluster's view changes."""

from __future__ import annotations

import pytest

from broker.core.ledger import Ledger
from broker.model import Cluster, GpuType, Node, Placement, PodPlacement, Resources
from broker.service.domain_rows import DomainRows, level_rows, natural_key, short_name

BLOCK, RACK = "example.com/topology-block", "example.com/topology-rack"


def node(name: str, gpu: str, gpus: int, rack: str | None, cordoned: bool = False) -> Node:
    labels = {} if rack is None else {BLOCK: rack.split("-")[0], RACK: rack}
    alloc = Resources(gpus=gpus, cpu_milli=64_000, memory_mib=2**19)
    return Node(name, GpuType(gpu), alloc, labels=labels, unschedulable=cordoned)


def ledger(*nodes: Node) -> Ledger:
    led = Ledger()
    led.add_cluster(Cluster("dc", topology_levels=(BLOCK, RACK)), nodes)
    return led


def take(led: Ledger, name: str, gpus: int) -> None:
    pod = PodPlacement(f"p-{name}", name, tuple(range(gpus)), Resources(gpus=gpus))
    led.assume(Placement(f"t/{name}", "dc", (pod,), "binpack"))


@pytest.mark.parametrize(
    ("value", "before"),
    [("r2", "r10"), ("b1-r9", "b1-r10"), ("b1-r10", "b2-r1"), ("a", "b"), ("r1", "r1a")],
)
def test_natural_order(value: str, before: str) -> None:
    assert natural_key(value) < natural_key(before)


@pytest.mark.parametrize(
    ("key", "name"),
    [
        ("cloud.provider.com/topology-rack", "rack"),
        ("kubernetes.io/hostname", "hostname"),
        ("nvidia.com/gpu.clique", "gpu.clique"),
        ("rack", "rack"),
    ],
)
def test_short_name(key: str, name: str) -> None:
    assert short_name(key) == name


def test_rows_count_free_whole_nodes_and_the_largest_gang_per_domain() -> None:
    led = ledger(
        node("n1", "A100", 8, "b1-r1"), node("n2", "A100", 8, "b1-r1"),
        node("n3", "A100", 8, "b1-r10"), node("n4", "A100", 8, "b1-r2"),
        node("n5", "T4", 4, "b2-r1"), node("n6", "A100", 8, None),
        node("n7", "A100", 8, "b1-r2", cordoned=True),
    )  # fmt: skip
    take(led, "n2", 3)
    view = led.snapshot().clusters["dc"]
    block, rack = level_rows(view)
    assert (rack.level, rack.name, rack.more, rack.unlabelled) == (RACK, "rack", 0, 1)
    got = [(d.domain, d.nodes, d.free_nodes, d.gpus, d.free_gpus) for d in rack.domains]
    assert got == [
        ("b1-r1", 2, 1, 16, 13.0), ("b1-r2", 1, 1, 8, 8.0), ("b1-r10", 1, 1, 8, 8.0),
        ("b2-r1", 1, 1, 4, 4.0),
    ]  # fmt: skip
    # n2's 5 free GPUs take no 8-GPU pod: every A100 rack takes one; T4 nodes none.
    gangs = {g.gpu_type: (g.largest_gang, g.domain) for g in rack.largest_gangs}
    assert gangs == {"A100": (1, "b1-r1"), "T4": (0, "")}
    gangs = {g.gpu_type: (g.largest_gang, g.domain) for g in block.largest_gangs}
    assert gangs == {"A100": (3, "b1"), "T4": (0, "")}
    assert [(d.domain, d.nodes, d.free_nodes) for d in block.domains] == [
        ("b1", 4, 3), ("b2", 1, 1),
    ]  # fmt: skip
    body = rack.as_json()
    assert body["domains"][0] == {
        "domain": "b1-r1", "nodes": 2, "freeNodes": 1, "gpus": 16, "freeGpus": 13.0
    }  # fmt: skip
    assert body["largestGangs"][0] == {"gpuType": "A100", "largestGang": 1, "domain": "b1-r1"}
    assert body["gangGpusPerPod"] == 8


def test_listed_domains_are_bounded_and_the_rest_counted() -> None:
    led = ledger(*(node(f"n{i}", "A100", 8, f"b0-r{i}") for i in range(10)))
    take(led, "n3", 8)
    [_, rack] = level_rows(led.snapshot().clusters["dc"], shown=4)
    assert [d.domain for d in rack.domains] == ["b0-r0", "b0-r1", "b0-r2", "b0-r3"]
    assert rack.more == 6
    # The largest gang is over every domain, listed or not.
    assert [(g.largest_gang, g.domain) for g in rack.largest_gangs] == [(1, "b0-r0")]


def test_no_levels_no_rows_and_rows_kept_while_the_view_is_unchanged() -> None:
    plain = Ledger()
    plain.add_cluster(Cluster("flat"), [node("n1", "A100", 8, "b0-r0")])
    rows = DomainRows()
    assert rows.of(plain.snapshot().clusters["flat"]) == ()
    led = ledger(node("n1", "A100", 8, "b0-r0"))
    first = rows.of(led.snapshot().clusters["dc"])
    assert rows.of(led.snapshot().clusters["dc"]) is first  # the same view: kept
    take(led, "n1", 8)
    after = rows.of(led.snapshot().clusters["dc"])
    assert after is not first
    assert after[1].domains[0].free_nodes == 0 and first[1].domains[0].free_nodes == 1
