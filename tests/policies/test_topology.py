"""Topology-aware placement: gangs inside one rack or block, slices, fallback, explain."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from builders import as_placement, as_unplaceable, node, occupy, pod_set

from broker.core.ledger import Ledger
from broker.core.shapes import shape_of
from broker.model import (
    Cluster,
    Job,
    Node,
    Placement,
    PodSet,
    ReasonCode,
    TopologyRequest,
    Unplaceable,
)
from policies import make_policy
from policies.topology import level_name

BLOCK = "cloud.provider.com/topology-block"
RACK = "cloud.provider.com/topology-rack"
HOST = "kubernetes.io/hostname"
LEVELS = (BLOCK, RACK, HOST)
POLICIES = ("gang", "binpack", "spread", "firstfit", "fgd")


def topo_nodes(layout: dict[str, dict[str, int]], gpus: int = 8) -> list[Node]:
    """block -> rack -> node count; nodes named <rack>-<i>, labelled with all three levels."""
    made = []
    for block, racks in layout.items():
        for rack, count in racks.items():
            for i in range(count):
                name = f"{rack}-{i}"
                labels = {BLOCK: block, RACK: rack, HOST: name}
                made.append(node(name, gpus, labels=labels))
    return made


def fed(clusters: dict[str, list[Node]], levels: Sequence[str] = LEVELS) -> Ledger:
    ledger = Ledger()
    for name, ns in clusters.items():
        ledger.add_cluster(Cluster(name, topology_levels=tuple(levels)), ns)
    return ledger


def tgang(name: str, pods: int, gpus: int, **topo: str | int) -> Job:
    ps = pod_set("worker", pods, gpus=gpus)
    request = TopologyRequest(**topo)  # type: ignore[arg-type]
    return Job(name, (PodSet(ps.name, ps.count, ps.resources, topology=request),))


def place(policy: str, j: Job, ledger: Ledger) -> Placement:
    p = as_placement(make_policy(policy).decide(j, ledger.snapshot()))
    ledger.assume(p)
    return p


def where(ledger: Ledger, p: Placement, key: str) -> set[str]:
    nodes = ledger.snapshot().clusters[p.cluster].nodes
    return {nodes[pod.node].node.labels[key] for pod in p.pods}


DC = {"b1": {"b1-r1": 2, "b1-r2": 2}, "b2": {"b2-r1": 2, "b2-r2": 2}}


@pytest.mark.parametrize("policy", POLICIES)
def test_a_required_rack_gang_never_spans_racks(policy: str) -> None:
    ledger = fed({"dc": topo_nodes(DC)})
    # Half-full nodes in two racks: packing alone would take both and span two racks.
    occupy(ledger, "dc", "b1-r1-0", [0, 1, 2, 3])
    occupy(ledger, "dc", "b1-r2-0", [0, 1, 2, 3])
    occupy(ledger, "dc", "b1-r1-1", list(range(8)))
    occupy(ledger, "dc", "b1-r2-1", list(range(8)))
    plain = as_placement(make_policy("gang").decide(tgang("p", 2, 4), ledger.snapshot()))
    assert len(where(ledger, plain, RACK)) == 2  # the case the request exists for
    p = place(policy, tgang("g", 2, 4, required=RACK), ledger)
    assert len(where(ledger, p, RACK)) == 1


@pytest.mark.parametrize("policy", POLICIES)
def test_preferred_falls_back_to_the_block_then_the_cluster(policy: str) -> None:
    ledger = fed({"dc": topo_nodes(DC)})
    in_block = place(policy, tgang("b", 3, 8, preferred=RACK), ledger)
    assert len(where(ledger, in_block, RACK)) == 2
    assert len(where(ledger, in_block, BLOCK)) == 1
    anywhere = place(policy, tgang("c", 5, 8, preferred=RACK), ledger)
    assert len(where(ledger, anywhere, BLOCK)) == 2
    assert len(anywhere.pods) == 5


@pytest.mark.parametrize("policy", POLICIES)
def test_required_and_preferred_together_prefer_the_narrower_and_never_span_the_wider(
    policy: str,
) -> None:
    """KAI's two annotations: a rack if one takes it, else the block, never two blocks."""
    ledger = fed({"dc": topo_nodes(DC)})
    in_rack = place(policy, tgang("r", 2, 8, required=BLOCK, preferred=RACK), ledger)
    assert len(where(ledger, in_rack, RACK)) == 1
    in_block = place(policy, tgang("b", 3, 8, required=BLOCK, preferred=RACK), ledger)
    assert len(where(ledger, in_block, RACK)) == 2
    assert len(where(ledger, in_block, BLOCK)) == 1
    over = tgang("o", 4, 8, required=BLOCK, preferred=RACK)  # 3 free nodes per block at most
    assert isinstance(make_policy(policy).decide(over, ledger.snapshot()), Unplaceable)


@pytest.mark.parametrize("policy", POLICIES)
def test_a_preferred_level_the_cluster_does_not_declare_is_ignored_and_explain_says_so(
    policy: str,
) -> None:
    ledger = fed({"dc": topo_nodes(DC)}, levels=(RACK,))
    p = place(policy, tgang("g", 3, 8, preferred=BLOCK), ledger)
    assert len(p.pods) == 3
    no = as_unplaceable(
        make_policy(policy).decide(tgang("h", 6, 8, preferred=BLOCK), ledger.snapshot())
    )
    assert [r.code for r in no.for_cluster("dc")] == [
        ReasonCode.INSUFFICIENT_GPUS,
        ReasonCode.TOPOLOGY,
    ]
    assert no.for_cluster("dc")[1].message == (
        f"pod set worker: cluster dc declares no topology level {BLOCK}; "
        "the preference is ignored here"
    )


@pytest.mark.parametrize("policy", POLICIES)
def test_slices_each_land_in_one_host_inside_one_block(policy: str) -> None:
    ledger = fed({"dc": topo_nodes(DC)})
    for rack in ("b1-r1", "b2-r1"):  # every node of these racks with 6 GPUs taken
        for i in range(2):
            occupy(ledger, "dc", f"{rack}-{i}", [0, 1, 2, 3, 4, 5])
    j = tgang("s", 6, 2, required=BLOCK, slice_size=3, slice_level=HOST)
    p = place(policy, j, ledger)
    assert len(where(ledger, p, BLOCK)) == 1
    by_slice = [p.pods[k * 3 : k * 3 + 3] for k in range(2)]
    for pods in by_slice:
        assert len({pod.node for pod in pods}) == 1


def test_a_slice_that_fits_no_host_is_unplaceable_with_the_level_named() -> None:
    ledger = fed({"dc": topo_nodes(DC)})
    no = as_unplaceable(
        make_policy("gang").decide(
            tgang("s", 4, 8, slice_size=2, slice_level=HOST), ledger.snapshot()
        )
    )
    (reason,) = no.for_cluster("dc")
    assert reason.code == ReasonCode.TOPOLOGY
    assert f"each in one domain of {HOST}" in reason.message


@pytest.mark.parametrize("policy", POLICIES)
def test_a_gang_larger_than_any_rack_is_unplaceable_with_the_level_named(policy: str) -> None:
    ledger = fed({"dc": topo_nodes(DC), "flat": topo_nodes(DC)}, levels=(BLOCK, RACK))
    ledger.add_cluster(Cluster("nolevels"), topo_nodes({"b9": {"b9-r1": 4}}))
    no = as_unplaceable(
        make_policy(policy).decide(tgang("w", 3, 8, required=RACK), ledger.snapshot())
    )
    (reason,) = no.for_cluster("dc")
    assert reason.code == ReasonCode.TOPOLOGY
    assert reason.message == (
        f"pod set worker: no rack ({RACK}) in dc has room for 3 pods of 8 GPUs; "
        "the largest has room for 2 (b1-r1)"
    )
    (other,) = no.for_cluster("nolevels")
    assert other.message == f"pod set worker: cluster nolevels declares no topology level {RACK}"


@pytest.mark.parametrize("policy", POLICIES)
def test_rack_gangs_share_a_block_so_a_block_gang_still_fits(policy: str) -> None:
    layout = {
        "b1": {"a1": 2, "a2": 2, "a3": 2},
        "b2": {"x1": 2, "x2": 2, "x3": 2},
    }
    ledger = fed({"dc": topo_nodes(layout)})
    for i in range(2):
        occupy(ledger, "dc", f"x1-{i}", list(range(8)))
    first = place(policy, tgang("r1", 2, 8, required=RACK), ledger)
    second = place(policy, tgang("r2", 2, 8, required=RACK), ledger)
    assert where(ledger, first, BLOCK) == where(ledger, second, BLOCK) == {"b2"}
    block = place(policy, tgang("blk", 5, 8, required=BLOCK), ledger)
    assert where(ledger, block, BLOCK) == {"b1"}


@pytest.mark.parametrize("policy", ["gang", "binpack", "firstfit"])
def test_the_cluster_whose_domain_is_tightest_wins(policy: str) -> None:
    ledger = fed({"a": topo_nodes(DC), "b": topo_nodes(DC)})
    occupy(ledger, "b", "b1-r1-0", [0, 1, 2, 3])
    # Two 4-GPU pods packed: in a they share a node and their rack keeps one whole free
    # node; in b one fills the half-used node, the other its rack's last whole node.
    p = place(policy, tgang("g", 2, 4, required=RACK), ledger)
    assert p.cluster == "b"


def test_level_names_in_explain() -> None:
    assert level_name(RACK) == f"rack ({RACK})"
    assert level_name("nvidia.com/gpu.clique") == "domain of nvidia.com/gpu.clique"


@pytest.mark.parametrize(
    ("topo", "said"),
    [
        (TopologyRequest(slice_size=3, slice_level=HOST), "not a multiple of topology sliceSize 3"),
        (TopologyRequest(slice_size=2), "sliceSize and its slice level go together"),
    ],
)
def test_a_pod_set_with_an_impossible_request_is_refused(topo: TopologyRequest, said: str) -> None:
    res = pod_set("w", 4, gpus=1).resources
    with pytest.raises(ValueError, match=said):
        PodSet("w", 4, res, topology=topo)


def test_a_refused_rack_gang_does_not_stand_for_the_same_gang_without_a_request() -> None:
    plain, racked = tgang("g", 3, 8), tgang("g", 3, 8, required=RACK)
    assert shape_of(plain, "gang", None) != shape_of(racked, "gang", None)
    ledger = fed({"dc": topo_nodes(DC)})
    assert isinstance(make_policy("gang").decide(racked, ledger.snapshot()), Unplaceable)
    assert isinstance(make_policy("gang").decide(plain, ledger.snapshot()), Placement)
