"""Topology in the config: a cluster's ``topologyLevels``, node labels on simulated shapes,
racks and blocks laid over simulated nodes, and the domains a burst pool's nodes join;
wrong ones are one-line errors naming the key."""

from __future__ import annotations

from collections import Counter

import pytest

from adapters.simulated import NodeShape, SimulatedPool, generate_nodes, lay_topology
from broker.config import ConfigError, parse_config
from broker.model import Cluster, NodeUpdated, Resources

BLOCK, RACK = "cloud.provider.com/topology-block", "cloud.provider.com/topology-rack"
SHAPE = "{gpuType: A100, gpus: 8, cpu: '64', memory: 1Ti, count: 5}"
POOL = ("burstPools: [{{name: p, cluster: c, gpuType: A100, gpus: 8, cpu: '8', memory: 8Gi, "
        "maxNodes: 2, source: {{simulated: {{}}}}, {}}}]\n")  # fmt: skip


def cluster(extra: str = "", source: str = f"shapes: [{SHAPE}]") -> str:
    return f"clusters: [{{name: c, {extra}source: {{simulated: {{{source}}}}}}}]\n"


def test_levels_reach_the_model_cluster() -> None:
    text = cluster(f"topologyLevels: [{BLOCK}, {RACK}, kubernetes.io/hostname], ")
    config = parse_config(text, "b.yaml", {})
    assert config.clusters[0].to_cluster() == Cluster(
        "c", topology_levels=(BLOCK, RACK, "kubernetes.io/hostname")
    )
    assert parse_config(cluster(), "b.yaml", {}).clusters[0].to_cluster().topology_levels == ()


def test_simulated_nodes_carry_shape_labels_and_racks_and_blocks() -> None:
    clique = "labels: {nvidia.com/gpu.clique: c1}"
    t4 = f"{{gpuType: T4, gpus: 2, cpu: '8', memory: 64Gi, count: 2, {clique}}}"
    racks = f"{{levels: [{BLOCK}, {RACK}], nodesPerRack: 2, racksPerBlock: 2}}"
    shapes = f"shapes: [{SHAPE}, {t4}], topology: {racks}"
    source = parse_config(cluster(source=shapes), "b.yaml", {}).clusters[0].source.simulated
    assert source is not None
    nodes = source.nodes("c")
    placed = {(n.gpu_type, n.labels[BLOCK], n.labels[RACK]) for n in nodes}
    # 5 A100 nodes fill racks b0-r0, b0-r1 (2 each) and b1-r0 (1); the T4s a rack of their own
    assert sorted(Counter((n.labels[BLOCK], n.labels[RACK]) for n in nodes).items()) == [
        (("b0", "b0-r0"), 2), (("b0", "b0-r1"), 2), (("b1", "b1-r0"), 1), (("b1", "b1-r1"), 2)
    ]  # fmt: skip
    assert ("T4", "b1", "b1-r1") in placed
    assert all(n.labels["nvidia.com/gpu.clique"] == "c1" for n in nodes if n.gpu_type == "T4")
    assert all("nvidia.com/gpu.clique" not in n.labels for n in nodes if n.gpu_type == "A100")


def test_racks_without_blocks() -> None:
    nodes = generate_nodes([NodeShape("G2", 8, 1, 1, 3)], "n")
    laid = lay_topology(nodes, [RACK], 2)
    assert [n.labels[RACK] for n in laid] == ["r0", "r0", "r1"]
    assert [n.labels["gpu-type"] for n in laid] == ["G2"] * 3


def test_a_burst_pools_nodes_join_its_domains() -> None:
    text = cluster() + POOL.format(f"topologyLabels: {{{BLOCK}: b9, {RACK}: b9-r0}}")
    (pool,) = parse_config(text, "b.yaml", {}).burst_pools
    assert pool.topology_labels == {BLOCK: "b9", RACK: "b9-r0"}
    sim = SimulatedPool("c", "A100", Resources(gpus=8), name="p", provision_seconds=0,
                        labels=pool.topology_labels)  # fmt: skip
    sim.scale_to(1, 0.0)
    (event,) = sim.due(0.0)
    assert isinstance(event, NodeUpdated)
    assert event.node.labels == {"gpu-type": "A100", BLOCK: "b9", RACK: "b9-r0"}


LEVELS = "clusters[0].topologyLevels"
TOP = "clusters[0].source.simulated.topology"
ERRORS = [
    (cluster("topologyLevels: [rack level], "), LEVELS, "not a label key"),
    (cluster("topologyLevels: ['-bad.com/rack'], "), LEVELS, "not a label key"),
    (cluster(f"topologyLevels: [a/{'x' * 64}], "), LEVELS, "not a label key"),
    (cluster(f"topologyLevels: [{RACK}, {RACK}], "), LEVELS, "duplicate label key"),
    (cluster(f"topologyLevels: [{', '.join(f'l{i}' for i in range(9))}], "), LEVELS,
     "at most 8"),
    (cluster(source=f"shapes: [{SHAPE}], topology: {{levels: [{RACK}]}}"),
     f"{TOP}.nodesPerRack", "required"),
    (cluster(source=f"shapes: [{SHAPE}], topology: {{levels: [{BLOCK}, {RACK}], nodesPerRack: 2}}"),
     f"{TOP}.racksPerBlock", "[block, rack]"),
    (cluster(source=f"shapes: [{SHAPE}], topology: {{levels: [{RACK}], nodesPerRack: 0}}"),
     f"{TOP}.nodesPerRack", ">= 1"),
    (cluster(source=f"shapes: [{SHAPE}], topology: {{levels: [], nodesPerRack: 2}}"),
     f"{TOP}.levels", "at least 1"),
    (cluster(source="shapes: [{gpuType: A100, gpus: 8, cpu: '64', memory: 1Ti, count: 5, "
             "labels: {rack: 'a b'}}]"), "clusters[0].source.simulated.shapes[0].labels.rack",
     "label value"),
    (cluster() + POOL.format("topologyLabels: {rack level: x}"), "burstPools[0].topologyLabels",
     "not a label key"),
    (cluster() + POOL.format(f"topologyLabels: {{{RACK}: 'r 1'}}"),
     f"burstPools[0].topologyLabels.{RACK}", "label value"),
]  # fmt: skip


@pytest.mark.parametrize(("text", "path", "fragment"), ERRORS, ids=[e[1] for e in ERRORS])
def test_errors_name_the_key(text: str, path: str, fragment: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config(text, "b.yaml", {})
    message = str(caught.value)
    assert message.startswith(f"b.yaml: {path}"), message
    assert fragment in message, message
    assert "\n" not in message
