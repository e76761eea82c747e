"""Bursting: the pure planner (how many nodes, which pool) and the controller driving a
simulated Cluster API pool on a virtual clock, with the ledger and the gang policy."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from hypothesis import given
from hypothesis import strategies as st

from adapters.simulated import SimulatedPool
from broker.core.burst import BurstController, BurstSettings, RemoveNode, ScaleTo
from broker.core.ledger import Ledger
from broker.model import (
    BurstPlan,
    BurstPool,
    Cluster,
    GpuType,
    Job,
    Node,
    PodSet,
    PoolState,
    Resources,
)
from policies import make_policy
from policies.burst import NoBurst, nodes_needed, plan

A100 = GpuType("A100")
NODE8 = Resources(gpus=8, cpu_milli=96_000, memory_mib=1_179_648)


def gang(name: str = "g", pods: int = 4, gpus: int = 8, **kw: object) -> Job:
    resources = Resources(gpus=gpus, cpu_milli=8_000, memory_mib=65_536)
    return Job(name, (PodSet("worker", pods, resources),), allow_burst=True, **kw)  # type: ignore[arg-type]


def pool(
    name: str = "cloud", cost: float = 30.0, seconds: float = 300.0, **kw: object
) -> BurstPool:
    kw.setdefault("max_nodes", 16)
    return BurstPool(name, f"{name}-cluster", A100, NODE8, cost_per_node_hour=cost,
                     provision_seconds=seconds, **kw)  # type: ignore[arg-type]  # fmt: skip


# -- the planner ----------------------------------------------------------------------------


def test_nodes_needed_node_by_node() -> None:
    assert nodes_needed(gang(pods=4, gpus=8), NODE8) == 4
    assert nodes_needed(gang(pods=8, gpus=4), NODE8) == 4
    assert nodes_needed(gang(pods=3, gpus=3), NODE8) == 2  # 3+3 | 3: GPUs do not split
    assert nodes_needed(gang(pods=1, gpus=16), NODE8) is None
    elastic = Job("e", (PodSet("w", 8, Resources(gpus=8)),), min_member=2)
    assert nodes_needed(elastic, NODE8) == 2  # minMember pods are what must start


@given(
    pods=st.integers(1, 64),
    gpus=st.integers(1, 8),
    cpu=st.integers(0, 96_000),
)
def test_nodes_needed_is_exact_for_identical_pods(pods: int, gpus: int, cpu: int) -> None:
    job = Job("j", (PodSet("w", pods, Resources(gpus=gpus, cpu_milli=cpu)),))
    per_node = min(8 // gpus, 96_000 // cpu if cpu else 8)
    assert nodes_needed(job, NODE8) == math.ceil(pods / per_node)


def test_plan_cheapest_then_fastest_within_max() -> None:
    pools = [
        PoolState(pool("dear", cost=40.0), 0),
        PoolState(pool("slow", cost=30.0, seconds=900.0), 0),
        PoolState(pool("fast", cost=30.0, seconds=120.0), 0),
    ]
    chosen = plan(gang(pods=4), pools)
    assert isinstance(chosen, BurstPlan)
    assert (chosen.pool, chosen.nodes, chosen.cost_per_hour) == ("fast", 4, 120.0)
    full = [PoolState(pool("fast", max_nodes=5), 2), PoolState(pool("dear", cost=99.0), 0)]
    chosen = plan(gang(pods=4), full)
    assert isinstance(chosen, BurstPlan) and chosen.pool == "dear"


def test_plan_counts_unclaimed_nodes_coming_up() -> None:
    chosen = plan(gang(pods=4), [PoolState(pool(), 3, unclaimed=3)])
    assert isinstance(chosen, BurstPlan)
    assert (chosen.nodes, chosen.claimed, chosen.total) == (1, 3, 4)


def test_plan_says_why_not_per_pool() -> None:
    pools = [
        PoolState(pool("full", max_nodes=2), 0),
        PoolState(pool("broken"), 0, failing=True),
        PoolState(pool("eu", cluster_labels={"region": "eu"}), 0),
    ]
    job = gang(pods=4, cluster_selector={"region": "us"})
    result = plan(job, pools)
    assert isinstance(result, NoBurst)
    assert result.reasons == (
        "full: cluster full-cluster does not match the selector region=us",
        "broken: backing off after a provisioning failure",
        "eu: cluster eu-cluster does not match the selector region=us",
    )
    result = plan(gang(pods=4, gpu_types=frozenset({GpuType("H100")})), pools[:1])
    assert isinstance(result, NoBurst) and "GPU type A100 is not allowed" in result.reasons[0]
    result = plan(gang(pods=4), pools[:1])
    assert isinstance(result, NoBurst)
    assert result.reasons == ("full: needs 4 more nodes, only 2 below its maximum",)


# -- the controller on a virtual clock -----------------------------------------------------


@dataclass
class World:
    """An on-prem cluster too small for the gang, a burst pool, and a scheduler loop."""

    ledger: Ledger
    sim: SimulatedPool
    burst: BurstController
    now: float = 0.0
    waiting: dict[str, Job] = field(default_factory=dict)
    placed: dict[str, object] = field(default_factory=dict)
    scale_actions: list[ScaleTo] = field(default_factory=list)

    def cycle(self, dt: float = 10.0) -> None:
        """Advance, apply the pool's events, place what fits (holds respected), burst."""
        self.now += dt
        for event in self.sim.due(self.now):
            self.ledger.apply(event)
        holds = self.burst.holds(self.ledger.snapshot())
        policy = make_policy("gang")
        for key, job in sorted(self.waiting.items()):
            hidden: dict[str, set[str]] = {}
            for holder, by_cluster in holds.items():
                if holder != key:
                    for c, nodes in by_cluster.items():
                        hidden.setdefault(c, set()).update(nodes)
            decision = policy.decide(job, self.ledger.snapshot_hiding(hidden))
            if not isinstance(decision, NoBurst) and hasattr(decision, "pods"):
                self.ledger.assume(decision)  # type: ignore[arg-type]
                self.ledger.confirm(key)
                self.placed[key] = decision
                self.burst.placed(decision, self.now)  # type: ignore[arg-type]
                del self.waiting[key]
        for action in self.burst.tick(
            self.now, self.ledger.snapshot(), list(self.waiting.values())
        ):
            if isinstance(action, ScaleTo):
                self.scale_actions.append(action)
                if action.delta < 0:
                    self.sim.cancel_coming(-action.delta, self.now)
                else:
                    self.sim.scale_to(action.replicas, self.now)
            elif isinstance(action, RemoveNode):
                self.sim.remove_node(action.node, self.now)

    def finish(self, key: str) -> None:
        placement = self.placed.pop(key)
        self.ledger.release(key, placement)  # type: ignore[arg-type]
        self.burst.ended(key)


def world(failure_rate: float = 0.0, **settings: float) -> World:
    ledger = Ledger()
    # On-prem: one 4-GPU node, too small for any pod of 8 GPUs.
    ledger.add_cluster(Cluster("onprem"), [Node("small", A100, Resources(4, 0, 48_000, 500_000))])
    spec = pool("cloud", cost=32.0, seconds=120.0)
    ledger.add_cluster(Cluster("cloud-cluster", kind="cloud"))
    sim = SimulatedPool("cloud-cluster", "A100", NODE8, name="cloud", provision_seconds=120.0,
                        failure_rate=failure_rate)  # fmt: skip
    defaults = {"burst_after_seconds": 30.0, "scale_down_after_seconds": 300.0,
                "provision_timeout_seconds": 900.0, "failure_backoff_seconds": 600.0}  # fmt: skip
    burst = BurstController(BurstSettings(**(defaults | settings)))
    burst.add_pool(spec, replicas=0)
    return World(ledger, sim, burst)


def test_gang_bursts_exactly_once_runs_then_nodes_go_away() -> None:
    w = world()
    w.waiting["default/g"] = gang(pods=3)
    for _ in range(100):  # 1,000 s: nodes come up after 120 s; no second scale-up ever
        w.cycle()
        if "default/g" in w.placed:
            break
    placed_at = w.now
    assert [a.delta for a in w.scale_actions] == [3]  # exactly the nodes needed
    assert w.sim.scale_calls == 1
    # Unplaceable from t=10; planned once waited 30 s (t=40); up 120 s later; placed next cycle.
    assert placed_at <= 40 + 120 + 10
    assert w.placed["default/g"].cluster == "cloud-cluster"  # type: ignore[attr-defined]
    for _ in range(100):  # the gang runs on: nodes busy, nothing removed
        w.cycle()
    assert w.sim.replicas == 3 and w.sim.scale_calls == 1
    w.finish("default/g")
    ended = w.now
    while w.sim.replicas:
        w.cycle()
    # Gone within scaleDownAfterSeconds + one cycle of the end.
    assert w.now - ended <= 300 + 10
    w.cycle(dt=0.0)  # the pool's last NodeDeleted events reach the ledger
    assert not w.ledger.snapshot().clusters["cloud-cluster"].nodes
    stats = w.burst.stats("cloud")
    assert (stats.scale_ups, stats.nodes_added, stats.scale_downs) == (1, 3, 3)
    assert stats.idle_node_seconds <= 300 * 3 + 3 * 10
    assert w.burst.job_cost["default/g"] > 0


def test_held_nodes_are_not_taken_by_other_work() -> None:
    """A single-node job queued ahead of the gang (its key sorts first) and arriving once
    the pool is growing: the new nodes are the gang's, so it stays waiting."""
    w = world()
    w.waiting["default/g"] = gang(pods=2)
    while not w.scale_actions:
        w.cycle()
    first = Job("a-first", (PodSet("p", 1, Resources(gpus=8)),))
    w.waiting["default/a-first"] = first
    while "default/g" not in w.placed:
        w.cycle()
        assert w.now < 1000
    assert w.placed["default/g"].cluster == "cloud-cluster"  # type: ignore[attr-defined]
    assert "default/a-first" in w.waiting  # not allowed to burst, and the new nodes were held


def test_provisioning_timeout_scales_back_and_backs_off() -> None:
    w = world(failure_rate=1.0)  # machines never come up
    w.waiting["default/g"] = gang(pods=2)
    while not any(a.delta < 0 for a in w.scale_actions):
        w.cycle()
        assert w.now < 2000
    up, back = w.scale_actions
    assert (up.delta, back.delta, back.replicas) == (2, -2, 0)
    assert w.now - 40 >= 900  # not before the provisioning timeout
    assert w.sim.replicas == 0
    events = [e.kind for e in w.burst.events]
    assert events == ["scale-up", "provision-timeout"]
    assert w.burst.pool_rows(w.now)[0].failing is True
    assert "default/g" in w.waiting  # requeued: still waiting, never placed
    for _ in range(50):  # within the backoff: no new scale-up from this pool
        w.cycle()
    assert len(w.scale_actions) == 2


def test_a_pool_the_cluster_autoscaler_owns_is_never_scaled() -> None:
    w = world()
    w.burst = BurstController(BurstSettings(burst_after_seconds=0.0))
    w.burst.add_pool(pool("cloud"), replicas=0, owner="cluster-autoscaler")
    w.waiting["default/g"] = gang(pods=2)
    for _ in range(50):
        w.cycle()
    assert w.scale_actions == [] and w.sim.scale_calls == 0


def test_a_failed_scale_up_is_undone_and_the_pool_backs_off() -> None:
    w = world()
    w.waiting["default/g"] = gang(pods=2)
    while not w.scale_actions:
        w.cycle()
    [up] = w.scale_actions
    w.burst.failed(up, w.now, "scale machinedeployment: HTTP 503 after 6 attempts")
    [row] = w.burst.pool_rows(w.now)
    assert (row.replicas, row.scale_ups, row.nodes_added, row.failing) == (0, 0, 0, True)
    assert w.burst.requests() == []
    assert [e.kind for e in w.burst.events] == ["scale-up", "scale-failed"]
    w.sim.scale_to(0, w.now)  # the API call never happened
    for _ in range(50):  # 500 s, inside the 600 s backoff: no new attempt
        w.cycle()
    assert len(w.scale_actions) == 1
    for _ in range(20):  # past it: planned again
        w.cycle()
    assert len(w.scale_actions) == 2


def test_nodes_still_coming_for_a_gang_that_started_elsewhere_are_cancelled() -> None:
    w = world()
    blocker = Job("blocker", (PodSet("p", 1, Resources(gpus=4)),))
    taken = make_policy("binpack").decide(blocker, w.ledger.snapshot())
    w.ledger.assume(taken)  # type: ignore[arg-type]
    w.ledger.confirm("default/blocker")
    w.placed["default/blocker"] = taken
    w.waiting["default/g"] = gang(pods=1, gpus=4)  # fits on-prem once the blocker ends
    while not w.scale_actions:
        w.cycle()
    assert [a.delta for a in w.scale_actions] == [1]
    w.finish("default/blocker")
    w.cycle()  # placed on-prem, while its cloud node is still coming up
    assert w.placed["default/g"].cluster == "onprem"  # type: ignore[attr-defined]
    assert [a.delta for a in w.scale_actions] == [1, -1]  # cancelled at once
    assert w.sim.replicas == 0
    for _ in range(30):
        w.cycle()
    assert not w.ledger.snapshot().clusters["cloud-cluster"].nodes  # never came up
    assert w.burst.stats("cloud").idle_node_seconds == 0
