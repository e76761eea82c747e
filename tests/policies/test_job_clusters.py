"""A job that only some clusters may take (``Job.clusters``: the members that have the
runtime a TrainJob names): every other cluster is refused with what it lacks, by the
placement's filter and by the burst planner alike."""

from __future__ import annotations

from broker.core.ledger import Ledger
from broker.model import (
    BurstPool,
    Cluster,
    GpuType,
    Job,
    Node,
    PodSet,
    PoolState,
    ReasonCode,
    Resources,
)
from policies.burst import NoBurst, plan
from policies.framework import filter_cluster

BIG = Resources(gpus=8, cpu_milli=64000, memory_mib=262144)
GPU4 = Resources(gpus=4, cpu_milli=8000, memory_mib=32768)
JOB = Job("llm", (PodSet("node", 2, GPU4),), tenant="team-a", clusters=frozenset({"east"}),
          clusters_missing="ClusterTrainingRuntime torch making the pods admitted")  # fmt: skip


def test_only_the_named_clusters_pass_the_filter() -> None:
    ledger = Ledger()
    for name in ("east", "west"):
        node = Node(f"{name}-1", GpuType("A100"), BIG)
        ledger.add_cluster(Cluster(name), [node])
    snapshot = ledger.snapshot()
    assert filter_cluster(JOB, snapshot.clusters["east"]) == []
    [reason] = filter_cluster(JOB, snapshot.clusters["west"])
    assert reason.code == ReasonCode.MISSING and reason.cluster == "west"
    assert reason.message == (
        "cluster west has no ClusterTrainingRuntime torch making the pods admitted"
    )


def test_no_pool_of_another_cluster_is_grown_for_it() -> None:
    pool = BurstPool("west-a100", "west", GpuType("A100"), BIG, max_nodes=4)
    decided = plan(JOB, [PoolState(pool, 0)])
    assert isinstance(decided, NoBurst)
    [refusal] = decided.refusals
    assert refusal.code == "selector" and "cluster west has no ClusterTrainingRuntime" in (
        refusal.message
    )
