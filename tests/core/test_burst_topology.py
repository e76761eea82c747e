"""The burst planner and topology requests: a pod set that requires one domain of a level
(or slices each in one) bursts only into a pool whose new nodes join a domain of that level
(its ``topology_labels`` name the level, its cluster declares it); a preferred level never
refuses a pool. The count of new nodes is what it is without a request."""

from __future__ import annotations

import pytest
from test_burst import gang, pool

from broker.core.burst import BurstController, BurstSettings, ScaleTo
from broker.core.ledger import Ledger
from broker.model import BurstPlan, BurstPool, Job, PodSet, PoolState, Resources, TopologyRequest
from policies.burst import NoBurst, plan

BLOCK, RACK = "cloud.provider.com/topology-block", "cloud.provider.com/topology-rack"
HOST = "kubernetes.io/hostname"
LEVELS = (BLOCK, RACK, HOST)
R8 = Resources(gpus=8, cpu_milli=8_000, memory_mib=65_536)


def asking(topology: TopologyRequest, pods: int = 4, name: str = "g") -> Job:
    return Job(name, (PodSet("worker", pods, R8, topology=topology),), allow_burst=True)


def racked(name: str = "cloud", labels: dict[str, str] | None = None, **kw: object) -> BurstPool:
    """A pool of a cluster declaring block, rack and host, its nodes joining ``labels``."""
    return pool(name, topology_levels=LEVELS, topology_labels=labels or {}, **kw)  # type: ignore[arg-type]


NAMED = {BLOCK: "b9", RACK: "b9-r0"}
PLANS = [
    # (request, the pool, the refusal's code or None: planned)
    (TopologyRequest(required=RACK), racked(labels=NAMED), None),
    (TopologyRequest(required=BLOCK), racked(labels={BLOCK: "b9"}), None),
    (TopologyRequest(required=RACK), racked(labels={BLOCK: "b9"}), "topology"),
    (TopologyRequest(required=RACK), racked(), "topology"),
    (TopologyRequest(required=RACK), pool(topology_labels=NAMED), "topology"),  # undeclared
    (TopologyRequest(preferred=RACK), racked(), None),
    (TopologyRequest(preferred=RACK), pool(), None),  # nothing declared, nothing named
    (TopologyRequest(required=BLOCK, preferred=RACK), racked(labels={BLOCK: "b9"}), None),
    (TopologyRequest(slice_size=2, slice_level=RACK), racked(labels=NAMED), None),
    (TopologyRequest(slice_size=2, slice_level=HOST), racked(labels=NAMED), "topology"),
    (TopologyRequest(), racked(), None),  # unconstrained: topology-aware, no level
]


@pytest.mark.parametrize(("topology", "spec", "code"), PLANS)
def test_a_required_level_needs_a_domain_the_new_nodes_join(
    topology: TopologyRequest, spec: BurstPool, code: str | None
) -> None:
    result = plan(asking(topology), [PoolState(spec, 0)])
    if code is None:
        assert isinstance(result, BurstPlan)
        assert (result.pool, result.nodes) == ("cloud", 4)  # as many as without a request
    else:
        assert isinstance(result, NoBurst)
        assert [(r.pool, r.code) for r in result.refusals] == [("cloud", code)]


def test_the_refusal_names_the_level_and_why() -> None:
    result = plan(asking(TopologyRequest(required=RACK)), [PoolState(racked(), 0)])
    assert isinstance(result, NoBurst)
    assert result.reasons == (
        f"cloud: pod set worker requires one rack ({RACK}), and its topologyLabels name no "
        "value of that level for the nodes it adds",
    )
    undeclared = PoolState(pool(topology_labels=NAMED), 0)
    result = plan(asking(TopologyRequest(slice_size=2, slice_level=RACK)), [undeclared])
    assert isinstance(result, NoBurst)
    assert result.reasons == (
        f"cloud: cluster cloud-cluster declares no topology level {RACK}, which pod set "
        "worker requires",
    )


def test_a_dearer_pool_that_names_the_rack_wins_over_a_cheaper_one_that_does_not() -> None:
    pools = [
        PoolState(racked("cheap", cost=10.0), 0),
        PoolState(racked("dear", NAMED, cost=50.0), 0),
    ]
    result = plan(asking(TopologyRequest(required=RACK)), pools)
    assert isinstance(result, BurstPlan) and result.pool == "dear"
    plain = plan(gang(pods=4), pools)  # no request: the cheaper one, as ever
    assert isinstance(plain, BurstPlan) and plain.pool == "cheap"


def test_a_pod_set_without_a_request_beside_one_with_is_no_obstacle() -> None:
    job = Job("g", (
        PodSet("launcher", 1, Resources(gpus=0, cpu_milli=1_000)),
        PodSet("worker", 2, R8, topology=TopologyRequest(required=RACK)),
    ), allow_burst=True)  # fmt: skip
    assert isinstance(plan(job, [PoolState(racked(labels=NAMED), 0)]), BurstPlan)
    result = plan(job, [PoolState(racked(), 0)])
    assert isinstance(result, NoBurst) and "pod set worker" in result.reasons[0]


def test_the_controller_never_grows_a_pool_the_gang_could_not_use() -> None:
    c = BurstController(BurstSettings(burst_after_seconds=0.0))
    c.add_pool(racked("plain"), 0)
    job = asking(TopologyRequest(required=RACK))
    empty = Ledger().snapshot()
    assert c.tick(0.0, empty, [job]) == []
    option = c.option(1.0, job)
    assert [(r.pool, r.code) for r in option.refusals] == [("plain", "topology")]
    named = BurstController(BurstSettings(burst_after_seconds=0.0))
    named.add_pool(racked("named", NAMED), 0)
    [scale] = named.tick(0.0, empty, [job])
    assert isinstance(scale, ScaleTo) and (scale.pool, scale.delta) == ("named", 4)
