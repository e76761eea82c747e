"""The oldest starving gang's hold lies inside one domain of its required level."""

from __future__ import annotations

from builders import node, occupy, pod_set

from broker.core.holds import nodes_to_hold
from broker.core.ledger import Ledger
from broker.model import Cluster, Job, PodSet, TopologyRequest

RACK = "cloud.provider.com/topology-rack"


def racks(levels: tuple[str, ...] = (RACK,)) -> Ledger:
    ledger = Ledger()
    made = [node(f"{rack}-{i}", 8, labels={RACK: rack}) for rack in ("r1", "r2") for i in range(2)]
    ledger.add_cluster(Cluster("dc", topology_levels=levels), made)
    occupy(ledger, "dc", "r1-0", [0, 1, 2, 3])
    occupy(ledger, "dc", "r2-0", [0, 1, 2, 3, 4, 5])
    return ledger


def rack_gang(required: str = RACK) -> Job:
    ps = pod_set("w", 2, gpus=8)
    topo = TopologyRequest(required=required) if required else None
    return Job("g", (PodSet("w", 2, ps.resources, topology=topo),))


def test_a_required_rack_gang_holds_nodes_of_one_rack() -> None:
    view = racks().snapshot().clusters["dc"]
    plain = nodes_to_hold(rack_gang(""), view, ())
    assert sorted(plain) == ["r1-1", "r2-1"]  # most free first: across racks
    held = nodes_to_hold(rack_gang(), view, ())
    assert sorted(held) == ["r1-0", "r1-1"]
    assert nodes_to_hold(rack_gang(), view, {"r1-1"}) == ["r2-1", "r2-0"]


def test_no_hold_in_a_cluster_without_the_level() -> None:
    view = racks(levels=()).snapshot().clusters["dc"]
    assert nodes_to_hold(rack_gang(), view, ()) == []
