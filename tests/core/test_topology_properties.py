"""Property tests of topology-aware placement over random labelled federations.

Gangs with required levels (and slices) are decided the way the scheduler decides them
(snapshot -> decide -> assume); after every step the independent recount of tests/audit.py
checks that no node holds more than it has, and the test checks from the node labels alone
that no gang spans a domain of its required level (nor a slice one of its slice level), and
that a gang is refused only when no domain of its level has room for it.

Without requests nothing may change. Two honest formulations, both against the unchanged
decision path: the same stream on the same federation stripped of its levels and labels
decides exactly the same (levels alone change nothing); and a stream whose every pod set
prefers a level no cluster declares (so it goes through the topology path, which must then
place on the whole cluster as today) decides exactly as the same stream without requests.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import pytest
from audit import Books, placement_problems, whole_free
from builders import node, pod_set
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from broker.core.decide import decide
from broker.core.ledger import Ledger
from broker.model import (
    Cluster,
    Job,
    Node,
    Placement,
    PodPlacement,
    PodSet,
    TopologyRequest,
    Unplaceable,
)
from policies import make_policy

BLOCK = "example.com/topology-block"
RACK = "example.com/topology-rack"
HOST = "kubernetes.io/hostname"
UNDECLARED = "example.com/topology-row"
SETTINGS = settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
POLICIES = ("gang", "binpack", "spread", "firstfit", "fgd")


@dataclass(frozen=True)
class Member:
    cluster: Cluster
    nodes: tuple[Node, ...]


@st.composite
def members(draw: st.DrawFn) -> tuple[Member, ...]:
    fed = []
    for c in range(draw(st.integers(1, 3))):
        levels = draw(st.sampled_from([(BLOCK, RACK, HOST), (BLOCK, RACK), (RACK,), ()]))
        made = []
        for b in range(draw(st.integers(1, 2))):
            for r in range(draw(st.integers(1, 3))):
                for n in range(draw(st.integers(1, 3))):
                    name = f"c{c}b{b}r{r}n{n}"
                    labels = {BLOCK: f"b{b}", HOST: name}
                    if draw(st.integers(0, 5)):  # now and then a node in no rack
                        labels[RACK] = f"b{b}r{r}"
                    gpus = draw(st.sampled_from([4, 8]))
                    made.append(node(name, gpus, labels=labels))
        fed.append(Member(Cluster(f"c{c}", topology_levels=levels), tuple(made)))
    return tuple(fed)


@st.composite
def gangs(draw: st.DrawFn) -> Job:
    gpus = draw(st.sampled_from([1, 2, 4, 8]))
    level = draw(st.sampled_from(["", BLOCK, RACK]))
    size = draw(st.sampled_from([0, 0, 1, 2]))
    count = draw(st.integers(1, 4)) * (size or 1)
    topo = TopologyRequest(required=level, slice_size=size, slice_level=HOST if size else "")
    ps = pod_set("w", count, gpus=gpus)
    return Job("j", (PodSet("w", count, ps.resources, topology=topo),))


def ledger_of(fed: tuple[Member, ...]) -> tuple[Ledger, Books]:
    ledger = Ledger()
    for m in fed:
        ledger.add_cluster(m.cluster, m.nodes)
    books = Books(
        {m.cluster.name: m.cluster for m in fed},
        {m.cluster.name: {n.name: n for n in m.nodes} for m in fed},
    )
    return ledger, books


def spans(books: Books, p: Placement, pods: Sequence[PodPlacement], key: str) -> set[str | None]:
    nodes = books.nodes[p.cluster]
    return {nodes[pod.node].labels.get(key) for pod in pods}


def room_in_some_domain(books: Books, j: Job) -> bool:
    """Whether some domain of the gang's level, in a cluster declaring it, has whole free
    GPUs for all its pods, by the recount (identical pods: node by node is exact)."""
    ps = j.pod_sets[0]
    topo = ps.topology
    assert topo is not None
    usage, _ = books.recount()
    for cluster, c in books.clusters.items():
        if topo.required not in c.topology_levels:
            continue
        room: dict[str, int] = {}
        for name, n in books.nodes[cluster].items():
            value = n.labels.get(topo.required)
            if value is not None:
                free = whole_free(n, usage[(cluster, name)])
                room[value] = room.get(value, 0) + free // ps.resources.gpus
        if any(r >= ps.count for r in room.values()):
            return True
    return False


@pytest.mark.parametrize("policy", POLICIES)
@SETTINGS
@given(fed=members(), stream=st.lists(gangs(), min_size=1, max_size=8))
def test_required_gangs_never_span_and_never_oversubscribe(
    policy: str, fed: tuple[Member, ...], stream: list[Job]
) -> None:
    ledger, books = ledger_of(fed)
    chosen = make_policy(policy)
    for step, template in enumerate(stream):
        j = dataclasses.replace(template, name=f"j{step}")
        topo = j.pod_sets[0].topology
        assert topo is not None
        decision = decide(j, ledger.snapshot(), chosen).decision
        if not isinstance(decision, Placement):
            if topo.required and not topo.slice_size:
                assert not room_in_some_domain(books, j), decision
            continue
        assert placement_problems(books, j, decision) == []
        if topo.required:
            assert topo.required in books.clusters[decision.cluster].topology_levels
            assert len(spans(books, decision, decision.pods, topo.required)) == 1
            assert None not in spans(books, decision, decision.pods, topo.required)
        for k in range(0, len(decision.pods), topo.slice_size or len(decision.pods)):
            one = decision.pods[k : k + (topo.slice_size or len(decision.pods))]
            if topo.slice_size:
                assert len(spans(books, decision, one, topo.slice_level)) == 1
        ledger.assume(decision)
        books.assumed[decision.job] = decision
        assert books.oversubscription() == []


def without_requests(j: Job) -> Job:
    return dataclasses.replace(
        j, pod_sets=tuple(dataclasses.replace(ps, topology=None) for ps in j.pod_sets)
    )


def preferring_undeclared(j: Job) -> Job:
    request = TopologyRequest(preferred=UNDECLARED)
    return dataclasses.replace(
        j, pod_sets=tuple(dataclasses.replace(ps, topology=request) for ps in j.pod_sets)
    )


def stripped(fed: tuple[Member, ...]) -> tuple[Member, ...]:
    """The federation with no levels and no labels."""
    return tuple(
        Member(
            Cluster(m.cluster.name),
            tuple(dataclasses.replace(n, labels={}) for n in m.nodes),
        )
        for m in fed
    )


@pytest.mark.parametrize("policy", POLICIES)
@SETTINGS
@given(fed=members(), stream=st.lists(gangs(), min_size=1, max_size=8))
def test_without_requests_placements_are_exactly_todays(
    policy: str, fed: tuple[Member, ...], stream: list[Job]
) -> None:
    runs = [
        (ledger_of(stripped(fed))[0], without_requests),  # today's path, no topology at all
        (ledger_of(fed)[0], without_requests),
        (ledger_of(fed)[0], preferring_undeclared),
    ]
    for step, template in enumerate(stream):
        base = dataclasses.replace(template, name=f"j{step}")
        decisions = []
        for ledger, variant in runs:
            decision = make_policy(policy).decide(variant(base), ledger.snapshot())
            if isinstance(decision, Placement):
                ledger.assume(decision)
            decisions.append(decision)
        assert decisions[1] == decisions[0]
        assert without_ignored(decisions[2]) == decisions[0]


def without_ignored(decision: Placement | Unplaceable) -> Placement | Unplaceable:
    """The decision without explain's notes that a preferred level is ignored (in the
    clusters that could not take the job at all), each naming that level."""
    if isinstance(decision, Placement):
        return decision
    notes = [r for r in decision.reasons if r.message.endswith("the preference is ignored here")]
    assert all(UNDECLARED in r.message for r in notes)
    kept = tuple(r for r in decision.reasons if r not in notes)
    return dataclasses.replace(decision, reasons=kept)
