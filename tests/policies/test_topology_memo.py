"""The memo of topology domains a cluster view keeps between decisions: forgotten for the
node groups a write touches (and kept for the others), and never changing a decision."""

from __future__ import annotations

import random
from types import MappingProxyType

from builders import node, occupy

from broker.core.ledger import Ledger
from broker.core.views import Snapshot
from broker.model import Cluster, GpuType, Job, Node, Placement, PodSet, Resources, TopologyRequest
from policies import make_policy

BLOCK = "cloud.provider.com/topology-block"
RACK = "cloud.provider.com/topology-rack"


def racked(cluster: int, count: int, rng: random.Random) -> list[Node]:
    made = []
    for i in range(count):
        rack = i // 3
        labels = {BLOCK: f"b{rack // 2}", RACK: f"r{rack}"}
        kind = rng.choice(["A100", "H100"])
        made.append(node(f"c{cluster}-n{i:02d}", 8, kind, labels=labels))
    return made


def test_a_write_forgets_the_memos_of_its_group_only() -> None:
    ledger = Ledger()
    ledger.add_cluster(Cluster("dc"), [node("a", 8, "A100"), node("h", 8, "H100")])
    before = ledger.snapshot().clusters["dc"]
    a100_group = next(g for g in before.groups() if g[0] == GpuType("A100"))
    h100 = next(g for g in before.groups() if g[0] == GpuType("H100"))
    before.memo_for((a100_group,))["k"] = 1
    before.memo_for((h100,))["k"] = 2
    before.memo_for((a100_group, h100))["k"] = 3
    before.memo_for(None)["k"] = 4
    occupy(ledger, "dc", "a", [0])
    after = ledger.snapshot().clusters["dc"]
    assert after is not before
    assert after.memo_for((h100,)) == {"k": 2}  # kept: no H100 node changed
    assert after.memo_for((a100_group,)) == {}
    assert after.memo_for((a100_group, h100)) == {}
    assert after.memo_for(None) == {}
    assert before.memo_for((a100_group,)) == {"k": 1}  # a snapshot's view keeps its own


def cold(snapshot: Snapshot) -> Snapshot:
    """The snapshot on copies of its views that remember nothing."""
    views = {}
    for name, view in snapshot.clusters.items():
        copy = view._copy()
        copy._memo = {}
        views[name] = copy
    return Snapshot(MappingProxyType(views), snapshot.version)


def test_decisions_reading_the_memo_are_those_of_views_that_remember_nothing() -> None:
    rng = random.Random(5)
    ledger = Ledger()
    for c in range(2):
        levels = (BLOCK, RACK)
        ledger.add_cluster(Cluster(f"c{c}", topology_levels=levels), racked(c, 24, rng))
    held: list[str] = []
    for step in range(120):
        policy = make_policy(rng.choice(["gang", "binpack", "fgd"]))
        level = rng.choice([RACK, BLOCK])
        request = rng.choice([TopologyRequest(required=level), TopologyRequest(preferred=level)])
        res = Resources(gpus=rng.choice([2, 4, 8]), cpu_milli=1000, memory_mib=1000)
        types = frozenset({GpuType("H100")}) if rng.random() < 0.3 else frozenset()
        j = Job(f"j{step}", (PodSet("w", rng.randint(1, 4), res, topology=request),),
                gpu_types=types)  # fmt: skip
        warm = policy.decide(j, ledger.snapshot())
        assert warm == policy.decide(j, cold(ledger.snapshot())), step
        if isinstance(warm, Placement):
            ledger.assume(warm)
            held.append(warm.job)
            if rng.random() < 0.4:
                ledger.forget(held.pop(rng.randrange(len(held))))
    assert held  # the stream placed gangs, so later decisions read memos of written views


def test_outcomes_kept_in_the_memo_decide_as_the_level_by_level_search_does() -> None:
    """Each scoring policy's decision with every candidate's outcome kept in the memo
    (``remember``) is the one of the search that walks the candidates level by level,
    skipping what cannot win, as a shuffling policy's is."""
    from policies.scoring import NodeScoringPolicy
    from policies.topology_decide import by_order, decide

    rng = random.Random(11)
    ledger = Ledger()
    for c in range(3):
        ledger.add_cluster(Cluster(f"c{c}", topology_levels=(BLOCK, RACK)), racked(c, 18, rng))
    seen: set[type] = set()
    for step in range(90):
        policy = make_policy(rng.choice(["binpack", "spread", "firstfit"]))
        assert isinstance(policy, NodeScoringPolicy)
        level = rng.choice([RACK, BLOCK])
        request = rng.choice([TopologyRequest(required=level), TopologyRequest(preferred=level)])
        res = Resources(gpus=rng.choice([2, 4, 8]), cpu_milli=1000, memory_mib=1000)
        j = Job(f"j{step}", (PodSet("w", rng.randint(1, 6), res, topology=request),))
        snapshot = ledger.snapshot()
        views = [(j, v) for v in policy.order(list(snapshot.clusters.values()))]
        decisions = [
            decide(j, snapshot, views, policy.chooser, policy.name, {}, by_order, remember)
            for remember in (True, True, False)  # the second reads what the first kept
        ]
        assert decisions[0] == decisions[1] == decisions[2], step
        seen.add(type(decisions[0]))
        if isinstance(decisions[0], Placement):
            ledger.assume(decisions[0])
    assert len(seen) == 2  # placed and explained both
