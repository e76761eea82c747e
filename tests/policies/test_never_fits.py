"""A job that can never fit the federation at its largest (policies.never_fits): a table of
federations and jobs, each row the answer expected, "never" said only on proof."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import pytest
from builders import ClusterSpec, federation, gang, job, node, nodes, occupy, pod_set

from broker.core.ledger import Ledger
from broker.model import BurstPool, Cluster, GpuType, Job, PodSet, Resources, TopologyRequest
from policies.never_fits import NeverFits, maxima, never_fits

RACK = "topology.kubernetes.io/rack"
A100 = GpuType("A100")


def burst(j: Job) -> Job:
    return dataclasses.replace(j, allow_burst=True)


def pool(cluster: str, max_nodes: int, gpus: int = 8, gpu_type: str = "A100") -> BurstPool:
    node_shape = Resources(gpus=gpus, cpu_milli=64_000, memory_mib=512_000)
    return BurstPool(f"{cluster}-pool", cluster, GpuType(gpu_type), node_shape, 0, max_nodes)


def two_clusters() -> Ledger:
    return federation({"a": nodes("a", 50), "b": nodes("b", 52)})


def racks(per_rack: int, count: int) -> Ledger:
    ledger = Ledger()
    members = [
        node(f"n{r}-{i}", labels={RACK: f"r{r}"}) for r in range(count) for i in range(per_rack)
    ]
    ledger.add_cluster(Cluster("a", topology_levels=(RACK,)), members)
    return ledger


def in_one_rack(pods: int) -> Job:
    ps = pod_set("worker", pods, gpus=8)
    return job("ring", dataclasses.replace(ps, topology=TopologyRequest(required=RACK)))


def full() -> Ledger:
    ledger = two_clusters()
    for i in range(50):
        occupy(ledger, "a", f"a-{i}", range(8))
    return ledger


def two_sets() -> Job:
    return job("pair", pod_set("a", 2, gpus=8), pod_set("b", 1, gpus=8))


# (id, federation, pools, unread, job, expected)
Row = tuple[str, Callable[[], Ledger], list[BurstPool], set[str], Job, NeverFits | None]
ROWS: list[Row] = [
    ("400 x 8 GPUs on 50 and 52 nodes", two_clusters, [], set(), gang("big", 400, 8),
     NeverFits("worker", 400, 52, "b", False)),
    ("52 x 8 fits the larger", two_clusters, [], set(), gang("j", 52, 8), None),
    ("busy nodes count as empty", full, [], set(), gang("j", 50, 8), None),
    ("no node of the type", two_clusters, [], set(), gang("j", 1, 1, gpu_types=["H100"]),
     NeverFits("worker", 1, 0, "", False)),
    ("more GPUs a pod than a node has", two_clusters, [], set(), gang("j", 1, 16),
     NeverFits("worker", 1, 0, "", False)),
    ("CPU bounds the pods a node takes",
     lambda: federation({"a": nodes("a", 1)}), [], set(), gang("j", 2, 1, cpu=40_000),
     NeverFits("worker", 2, 1, "a", False)),
    ("shared GPUs: 2 pods a GPU", lambda: federation({"a": nodes("a", 1)}), [], set(),
     job("s", pod_set("p", 17, milli=500)), NeverFits("p", 17, 16, "a", False)),
    ("untolerated taint",
     lambda: federation({"a": [node("t", taints=["gpu"])]}), [], set(), gang("j", 1, 8),
     NeverFits("worker", 1, 0, "", False)),
    ("tolerated taint",
     lambda: federation({"a": [node("t", taints=["gpu"])]}), [], set(),
     gang("j", 1, 8, tolerations=["gpu"]), None),
    ("a selector no cluster matches", two_clusters, [], set(),
     gang("j", 1, 8, selector={"zone": "x"}), NeverFits("worker", 1, 0, "", False, 0)),
    ("burst pools at maxNodes", two_clusters, [pool("b", 348)], set(),
     burst(gang("big", 400, 8)), None),
    ("burst pools short of it", two_clusters, [pool("b", 300)], set(),
     burst(gang("big", 400, 8)), NeverFits("worker", 400, 352, "b", True)),
    ("pools not counted for a job that may not burst", two_clusters, [pool("b", 348)], set(),
     gang("big", 400, 8), NeverFits("worker", 400, 52, "b", False)),
    ("a stale cluster: unknown",
     lambda: federation({"a": nodes("a", 1), "b": ClusterSpec(nodes("b", 1), stale=True)}),
     [], set(), gang("big", 400, 8), None),
    ("a cluster not read yet: unknown", two_clusters, [], {"a"}, gang("big", 400, 8), None),
    ("a cluster with no nodes and no pools: unknown",
     lambda: federation({"a": nodes("a", 1), "b": []}), [], set(), gang("big", 400, 8), None),
    ("an unknown cluster the job may not go to does not matter",
     lambda: federation({"a": ClusterSpec(nodes("a", 1), {"zone": "x"}), "b": []}), [],
     set(), gang("big", 2, 8, selector={"zone": "x"}), NeverFits("worker", 2, 1, "a", False)),
    ("a required rack: its largest rack", lambda: racks(4, 2), [], set(), in_one_rack(6),
     NeverFits("worker", 6, 4, "a", False)),
    ("a required rack that fits", lambda: racks(4, 2), [], set(), in_one_rack(4), None),
    ("a level the cluster does not declare", two_clusters, [], set(), in_one_rack(1),
     NeverFits("worker", 1, 0, "", False)),
    ("pod sets fit alone, not together", lambda: federation({"a": nodes("a", 2)}), [], set(),
     two_sets(), NeverFits("", 3, 0, "", False)),
    ("elastic: minMember more than the largest cluster",
     lambda: federation({"a": nodes("a", 3)}), [], set(), gang("e", 8, 8, min_member=4),
     NeverFits("worker", 4, 3, "a", False)),
    ("elastic: minMember fits", lambda: federation({"a": nodes("a", 4)}), [], set(),
     gang("e", 8, 8, min_member=4), None),
]  # fmt: skip


@pytest.mark.parametrize(
    ("make", "pools", "unread", "j", "expected"),
    [row[1:] for row in ROWS],
    ids=[row[0] for row in ROWS],
)
def test_never_fits(
    make: Callable[[], Ledger],
    pools: list[BurstPool],
    unread: set[str],
    j: Job,
    expected: NeverFits | None,
) -> None:
    assert never_fits(j, maxima(make().snapshot(), pools, unread)) == expected


def test_the_maximum_groups_nodes_by_kind() -> None:
    """A thousand identical nodes are one kind: a list pays per kind, not per node."""
    found = maxima(federation({"a": nodes("a", 1000)}).snapshot(), [])
    assert list(found["a"].nodes.values()) == [1000]


def test_a_pod_set_without_gpus_fits_by_cpu() -> None:
    ps = PodSet("cpu", 3, Resources(cpu_milli=32_000))
    assert never_fits(job("c", ps), maxima(federation({"a": nodes("a", 1)}).snapshot(), [])) == (
        NeverFits("cpu", 3, 2, "a", False)
    )
