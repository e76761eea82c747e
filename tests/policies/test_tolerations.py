"""Tolerations as Kubernetes matches them (broker.taints), and the placement honouring them:
the matcher against the upstream rules (k8s.io/api core/v1 toleration.go ``ToleratesTaint``
and its table test), properties over random tolerations, taints and federations, and
decisions of every policy on tainted nodes."""

from __future__ import annotations

import pytest
from audit import Books, placement_problems
from builders import as_placement, as_unplaceable, federation, gang, node, shared
from hypothesis import given
from hypothesis import strategies as st

from broker.model import Decision, Job, Placement, ReasonCode
from broker.taints import Taint, TaintEffect, Toleration, TolerationOperator, blocking, tolerated
from policies import POLICY_NAMES, make_policy
from policies.framework import usable_groups
from policies.stranded import fit_shapes, stranded_gpus

NS: TaintEffect = "NoSchedule"
NE: TaintEffect = "NoExecute"
PNS: TaintEffect = "PreferNoSchedule"

# (id, toleration, taint, tolerated): upstream's own cases first, then one per rule.
MATCHES: list[tuple[str, Toleration, Taint, bool]] = [
    ("Exists: any value", Toleration("memory-pressure", "Exists", "ignored", NS),
     Taint("memory-pressure", "high", NS), True),
    ("Equal: the same value", Toleration("memory-pressure", "Equal", "high", NS),
     Taint("memory-pressure", "high", NS), True),
    ("Equal: another value", Toleration("memory-pressure", "Equal", "low", NS),
     Taint("memory-pressure", "high", NS), False),
    ("another key", Toleration("other", "Exists", "", NS),
     Taint("memory-pressure", "high", NS), False),
    ("another effect", Toleration("memory-pressure", "Exists", "", NE),
     Taint("memory-pressure", "high", NS), False),
    ("no effect: every effect (NoExecute)", Toleration("k", "Exists"), Taint("k", "v", NE), True),
    ("no effect: every effect (PreferNoSchedule)", Toleration("k", "Equal", "v"),
     Taint("k", "v", PNS), True),
    ("keyless Exists: every taint", Toleration("", "Exists"), Taint("node-role", "x", NE), True),
    ("keyless Exists with an effect: that effect only", Toleration("", "Exists", "", NS),
     Taint("any", "x", NE), False),
    ("keyless Exists with an effect: any key of it", Toleration("", "Exists", "", NS),
     Taint("any", "x", NS), True),
    ("Equal with no value: a taint with no value", Toleration("k"), Taint("k", "", NS), True),
    ("Equal with no value: not a valued taint", Toleration("k"), Taint("k", "v", NS), False),
    ("keyless Equal (the API refuses it) matches by value alone", Toleration("", "Equal", "v"),
     Taint("k", "v", NS), True),
    ("Lt: a smaller taint value", Toleration("tier", "Lt", "5"), Taint("tier", "3", NS), True),
    ("Lt: an equal taint value", Toleration("tier", "Lt", "5"), Taint("tier", "5", NS), False),
    ("Gt: a larger taint value", Toleration("tier", "Gt", "-2"), Taint("tier", "+7", NS), True),
    ("Gt: a value that is no integer", Toleration("tier", "Gt", "1"), Taint("tier", "7x", NS),
     False),
    ("Lt: a value past int64", Toleration("tier", "Lt", "9223372036854775808"),
     Taint("tier", "1", NS), False),
    ("Lt: an integer Python reads but Go does not", Toleration("tier", "Lt", "1_0"),
     Taint("tier", "1", NS), False),
]  # fmt: skip


@pytest.mark.parametrize(
    ("toleration", "taint", "expected"), [r[1:] for r in MATCHES], ids=[r[0] for r in MATCHES]
)
def test_a_toleration_tolerates_a_taint_as_kubernetes_says(
    toleration: Toleration, taint: Taint, expected: bool
) -> None:
    assert toleration.tolerates(taint) is expected
    assert tolerated(frozenset({toleration}), frozenset({taint})) is expected


def test_tolerating_a_set_of_taints_needs_each_one_tolerated() -> None:
    taints = frozenset({Taint("a"), Taint("b", "x", NE)})
    assert not tolerated(frozenset({Toleration("a", "Exists")}), taints)
    assert tolerated(frozenset({Toleration("a", "Exists"), Toleration("b", "Equal", "x")}), taints)
    assert tolerated(frozenset(), frozenset())
    assert not tolerated(frozenset(), taints)
    assert blocking((Taint("a"), Taint("p", effect=PNS), Taint("b", effect=NE))) == {
        Taint("a"),
        Taint("b", effect=NE),
    }


keys = st.sampled_from(["", "gpu", "spot", "node-role.kubernetes.io/control-plane"])
values = st.sampled_from(["", "x", "7", "-3"])
effects: st.SearchStrategy[TaintEffect] = st.sampled_from([NS, NE, PNS])
operators: st.SearchStrategy[TolerationOperator] = st.sampled_from(["Equal", "Exists", "Lt", "Gt"])
taints = st.builds(Taint, keys.filter(bool), values, effects)
tolerations = st.builds(Toleration, keys, operators, values, st.sampled_from(["", NS, NE, PNS]))


@given(taints)
def test_a_keyless_exists_tolerates_any_taint(taint: Taint) -> None:
    assert Toleration("", "Exists").tolerates(taint)
    assert tolerated(frozenset({Toleration("", "Exists")}), frozenset({taint}))


@given(st.frozensets(tolerations, max_size=4), st.frozensets(taints, max_size=4))
def test_the_remembered_answer_is_the_rule(
    mine: frozenset[Toleration], theirs: frozenset[Taint]
) -> None:
    expected = all(any(t.tolerates(taint) for t in mine) for taint in theirs)
    assert tolerated(mine, theirs) is expected
    assert tolerated(mine, theirs) is expected  # asked again: from the table


node_taints = st.lists(taints, max_size=3).map(tuple)


@given(
    st.lists(node_taints, min_size=1, max_size=6),
    st.frozensets(tolerations, max_size=3),
    tolerations,
)
def test_adding_a_toleration_never_makes_fewer_nodes_usable(
    per_node: list[tuple[Taint, ...]], given_: frozenset[Toleration], extra: Toleration
) -> None:
    ledger = federation({"c": [node(f"n{i}", 8, taints=list(ts)) for i, ts in enumerate(per_node)]})
    view = ledger.snapshot().clusters["c"]
    before, after = gang("a", 1, tolerations=given_), gang("b", 1, tolerations=given_ | {extra})
    usable = set(usable_groups(view, before, before.pod_sets[0]))
    assert usable <= set(usable_groups(view, after, after.pod_sets[0]))
    # A node whose taints only steer (PreferNoSchedule) is usable whatever a pod tolerates.
    for i, ts in enumerate(per_node):
        if all(t.effect == PNS for t in ts):
            assert (view.nodes[f"n{i}"].node.gpu_type, frozenset()) in usable


def decide(name: str, j: Job, taint: Taint) -> Decision:
    """``name``'s decision for ``j`` on two nodes with ``taint``; a placement breaks no rule
    (tests/audit.py matches each taint by itself, not through the node groups)."""
    ledger = federation({"tainted": [node(f"t{i}", 8, taints=[taint]) for i in range(2)]})
    snap = ledger.snapshot()
    decision = make_policy(name, 0).decide(j, snap)
    if isinstance(decision, Placement):
        nodes = {c: {n: s.node for n, s in v.nodes.items()} for c, v in snap.clusters.items()}
        books = Books({c: v.cluster for c, v in snap.clusters.items()}, nodes, set())
        assert placement_problems(books, j, decision) == []
    return decision


CONTROL = Taint("node-role.kubernetes.io/control-plane", "", NS)
# (id, the gang's tolerations, the nodes' taint, placed)
PLACED: list[tuple[str, list[Toleration], Taint, bool]] = [
    ("a keyless Exists goes anywhere", [Toleration("", "Exists")], CONTROL, True),
    ("a keyless Exists for NoExecute does not tolerate NoSchedule",
     [Toleration("", "Exists", "", NE)], CONTROL, False),
    ("Equal with the taint's value", [Toleration("gpu", "Equal", "a100")], Taint("gpu", "a100"),
     True),
    ("Equal with another value", [Toleration("gpu", "Equal", "h100")], Taint("gpu", "a100"),
     False),
    ("the key for another effect", [Toleration("gpu", "Exists", "", NS)],
     Taint("gpu", "a100", NE), False),
    ("none: a PreferNoSchedule taint never blocks", [], Taint("gpu", "", PNS), True),
]  # fmt: skip


@pytest.mark.parametrize(
    ("given_", "taint", "placed"), [r[1:] for r in PLACED], ids=[r[0] for r in PLACED]
)
@pytest.mark.parametrize("name", POLICY_NAMES)
def test_every_policy_places_by_kubernetes_tolerations(
    name: str, given_: list[Toleration], taint: Taint, placed: bool
) -> None:
    j = gang("g", 2, 4, tolerations=given_)
    decision = decide(name, j, taint)
    if placed:
        assert as_placement(decision).cluster == "tainted"
    else:
        reasons = as_unplaceable(decision).reasons
        assert [r.code for r in reasons] == [ReasonCode.TAINT]


def test_a_gpu_on_a_node_only_a_keyless_exists_tolerates_is_not_stranded_for_it() -> None:
    ledger = federation({"c": [node("t", 8, taints=[CONTROL])]})
    waiting = shared("w", 500, tolerations=[Toleration("", "Exists")])
    assert stranded_gpus(ledger.snapshot(), fit_shapes(waiting)) == {}
    others = shared("o", 500, tolerations=[Toleration("gpu", "Exists")])
    assert stranded_gpus(ledger.snapshot(), fit_shapes(others)) == {("c", "A100"): 8.0}
