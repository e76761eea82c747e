"""Explain's burst option (issue 16, acceptance 5): the controller's next step for a waiting
gang, asked of the controller itself: the pool it will grow, by how many nodes, at what
cost and from when (and that it then does exactly that), the request once open, and one
test per reason no pool can take the gang."""

from __future__ import annotations

import pytest
from test_burst import gang, pool

from broker.core.burst import BurstController, BurstSettings, ScaleTo
from broker.core.burst_option import BurstOption
from broker.core.ledger import Ledger
from broker.model import GpuType, Job, PodSet, Resources, TopologyRequest

T0 = 1_000.0
RACK = "cloud.provider.com/topology-rack"
RACK_GANG = Job(
    "rack", (PodSet("worker", 2, Resources(gpus=8), topology=TopologyRequest(required=RACK)),),
    allow_burst=True,
)  # fmt: skip
EMPTY = Ledger().snapshot()  # the pools' clusters have no nodes yet


def controller(*pools: tuple[str, float, float, float], **add: object) -> BurstController:
    """Pools as (name, $/node-hour, provisioning seconds, burstAfterSeconds)."""
    c = BurstController(BurstSettings(burst_after_seconds=30.0))
    for name, cost, seconds, after in pools:
        c.add_pool(pool(name, cost, seconds), 0, burst_after_seconds=after, **add)  # type: ignore[arg-type]
    return c


def test_planned_names_pool_nodes_provisioning_cost_and_when_then_the_controller_does_it() -> None:
    # "quick" opens to the gang after 60 s, "cheap" (cheaper) only after 300 s: the
    # controller will grow "quick" at 60 s, so that is the option, not the cheapest pool.
    c = controller(("quick", 40.0, 120.0, 60.0), ("cheap", 30.0, 600.0, 300.0))
    job = gang("big", pods=3)
    assert c.tick(T0, EMPTY, [job]) == []
    option = c.option(T0 + 10, job)
    assert option == BurstOption(
        "planned", "quick", "quick-cluster", nodes=3, new_nodes=3,
        provision_seconds=120.0, cost_per_node_hour=40.0, waiting_since=T0,
        burst_after_seconds=60.0, eligible_at=T0 + 60,
    )  # fmt: skip
    assert option.cost_per_hour == 120.0
    assert option.as_json()["costPerHour"] == 120.0 and option.as_json()["refusals"] == []
    assert c.tick(T0 + 59, EMPTY, [job]) == []  # not yet eligible
    [scale] = c.tick(T0 + 60, EMPTY, [job])
    assert isinstance(scale, ScaleTo) and (scale.pool, scale.delta) == ("quick", 3)
    requested = c.option(T0 + 61, job)
    assert (requested.status, requested.pool, requested.nodes, requested.arrived) == (
        "requested", "quick", 3, 0,
    )  # fmt: skip
    assert requested.deadline == T0 + 60 + 900.0 and requested.cost_per_hour == 120.0


def test_pools_opening_together_are_planned_together_cheapest_first() -> None:
    c = controller(("dear", 40.0, 120.0, 60.0), ("cheap", 30.0, 600.0, 60.0))
    option = c.option(T0, gang("big", pods=2))  # never seen waiting: counted from now
    assert (option.status, option.pool, option.eligible_at, option.waiting_since) == (
        "planned", "cheap", T0 + 60, T0,
    )  # fmt: skip


def _codes(option: BurstOption) -> list[tuple[str, str]]:
    assert option.status == "none" and option.pool is None
    return [(r.pool, r.code) for r in option.refusals]


@pytest.mark.parametrize(
    ("job", "code"),
    [
        (Job("local", gang().pod_sets), "not-allowed"),  # allowBurst not set
        (gang(gpu_types=frozenset({GpuType("H100")})), "gpu-type"),
        (gang(cluster_selector={"region": "us"}), "selector"),
        (RACK_GANG, "topology"),  # its cluster declares no rack, its nodes join none
        (gang(pods=1, gpus=16), "node-shape"),
        (gang(pods=17), "maximum"),  # the pool's maximum is 16 nodes
    ],
)
def test_why_the_one_pool_cannot_take_it(job: Job, code: str) -> None:
    c = controller(("cloud", 30.0, 300.0, 30.0))
    option = c.option(T0, job)
    assert _codes(option) == [("" if code == "not-allowed" else "cloud", code)]
    assert option.refusals[0].message  # said to a person too
    if code == "gpu-type":
        assert "A100" in option.refusals[0].message


def test_no_pools_at_all() -> None:
    assert _codes(controller().option(T0, gang())) == [("", "no-pools")]


def test_a_pool_the_autoscaler_owns_is_never_offered() -> None:
    c = controller(("cloud", 30.0, 300.0, 30.0), owner="cluster-autoscaler")
    assert _codes(c.option(T0, gang())) == [("cloud", "autoscaler")]


def test_a_pool_backing_off_says_until_when() -> None:
    c = controller(("cloud", 30.0, 300.0, 0.0))
    job = gang("big")
    [scale] = c.tick(T0, EMPTY, [job])
    assert isinstance(scale, ScaleTo)
    c.failed(scale, T0 + 5, "the API said no")  # backs off 600 s
    option = c.option(T0 + 10, job)
    assert _codes(option) == [("cloud", "backing-off")]
    assert option.refusals[0].until == T0 + 5 + 600.0
