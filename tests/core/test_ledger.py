"""The ledger: atomic assume/forget/confirm, copy-on-write snapshots, capacity events, and
indexes that agree with a brute-force recount of the nodes."""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable
from dataclasses import dataclass

import pytest
from audit import index_problems
from builders import (
    federation,
    node,
    occupy,
    pod,
    resources,
)
from builders import (
    placement as make_placement,
)

from broker.core.ledger import ConflictError, Ledger
from broker.core.views import Snapshot
from broker.model import (
    MILLI_PER_GPU,
    Cluster,
    GpuType,
    NodeDeleted,
    NodeState,
    NodeUpdated,
    Placement,
    PodBound,
    PodDeleted,
    Resources,
)
from broker.taints import Taint

NodeKey = tuple[str, str]
Free = tuple[int, int, tuple[int, ...]]


def base() -> Ledger:
    """Cluster a: a1 (4 GPUs), a2 (2 GPUs, little CPU), a3 (CPU only), a4 (cordoned);
    cluster b: one 8-GPU H100 node. a1 GPU 3 already holds a foreign 400-milli pod."""
    ledger = federation(
        {
            "a": [
                node("a1", 4, cpu=16_000, mem=64_000),
                node("a2", 2, cpu=8_000, mem=32_000),
                node("a3", 0, None, cpu=4_000, mem=8_000),
                node("a4", 4, unschedulable=True),
            ],
            "b": [node("b1", 8, "H100", cpu=32_000, mem=128_000)],
        }
    )
    occupy(ledger, "a", "a1", (3,), milli=400, cpu=2_000, mem=4_000, name="foreign-a1")
    return ledger


def free(ledger: Ledger) -> dict[NodeKey, Free]:
    snap = ledger.snapshot()
    return {
        (c, n): (s.cpu_free, s.memory_free, s.gpu_free)
        for c, view in snap.clusters.items()
        for n, s in view.nodes.items()
    }


def minus(before: dict[NodeKey, Free], placement: Placement) -> dict[NodeKey, Free]:
    """The free capacity ``before`` with ``placement`` taken, by plain arithmetic."""
    after = dict(before)
    for p in placement.pods:
        cpu, mem, gpus = after[(placement.cluster, p.node)]
        frees = list(gpus)
        for i in p.gpus:
            frees[i] -= p.resources.per_gpu_milli
        after[(placement.cluster, p.node)] = (
            cpu - p.resources.cpu_milli,
            mem - p.resources.memory_mib,
            tuple(frees),
        )
    return after


def whole(n: int, cpu: int = 1_000, mem: int = 1_024) -> Resources:
    return resources(gpus=n, cpu=cpu, mem=mem)


def share(milli: int, cpu: int = 1_000, mem: int = 1_024) -> Resources:
    return resources(milli=milli, cpu=cpu, mem=mem)


def state(ledger: Ledger, cluster: str, name: str) -> NodeState:
    return ledger.snapshot().node(cluster, name)


# -- assume, then forget -------------------------------------------------------------------

ROUND_TRIPS = {
    "gang over two nodes": make_placement(
        "default/g",
        "a",
        pod("g-w-0", "a1", (0, 1)),
        pod("g-w-1", "a1", (2,)),
        pod("g-w-2", "a2", (0, 1)),
    ),
    "shares filling one GPU": make_placement(
        "default/s",
        "a",
        pod("s-p-0", "a1", (0,), share(300)),
        pod("s-p-1", "a1", (0,), share(700)),
    ),
    "share next to a foreign share": make_placement(
        "default/t", "a", pod("t-p-0", "a1", (3,), share(600, cpu=14_000, mem=60_000))
    ),
    "share and whole GPU on one node": make_placement(
        "default/m",
        "a",
        pod("m-p-0", "a2", (0,), share(250)),
        pod("m-p-1", "a2", (1,), whole(1)),
    ),
    "cpu-only pod filling a CPU node": make_placement(
        "default/c", "a", pod("c-p-0", "a3", (), resources(cpu=4_000, mem=8_000))
    ),
    "a whole 8-GPU node": make_placement(
        "default/w", "b", pod("w-p-0", "b1", tuple(range(8)), whole(8, 32_000, 128_000))
    ),
}


@pytest.mark.parametrize("placement", ROUND_TRIPS.values(), ids=ROUND_TRIPS.keys())
def test_assume_takes_exactly_the_placement_and_forget_gives_it_back(placement: Placement) -> None:
    ledger = base()
    before = free(ledger)

    ledger.assume(placement)

    assert free(ledger) == minus(before, placement)
    assert dict(ledger.reservations()) == {placement.job: placement}
    assert index_problems(ledger.snapshot()) == []

    ledger.forget(placement.job)

    assert free(ledger) == before
    assert dict(ledger.reservations()) == {}
    assert index_problems(ledger.snapshot()) == []


def test_forget_of_an_unknown_job_changes_nothing() -> None:
    ledger = base()
    before = free(ledger)
    ledger.forget("default/nobody")
    assert free(ledger) == before


# -- assume is atomic ------------------------------------------------------------------------


@dataclass(frozen=True)
class Broken:
    placement: Placement
    prefix_fits: bool = True  # every pod but the last one fits on its own


def _held() -> Placement:
    return make_placement("default/held", "a", pod("held-w-0", "a1", (0,)))


ATOMIC = {
    "last pod takes a GPU an earlier pod took": Broken(
        make_placement("default/x", "a", pod("x-0", "a1", (1,)), pod("x-1", "a1", (1,)))
    ),
    "last pod takes a GPU another job holds": Broken(
        make_placement("default/x", "a", pod("x-0", "a1", (1,)), pod("x-1", "a1", (0,)))
    ),
    "last share overflows its GPU": Broken(
        make_placement(
            "default/x",
            "a",
            pod("x-0", "a1", (2,), share(600)),
            pod("x-1", "a1", (2,), share(600)),
        )
    ),
    "last share overflows a foreign share": Broken(
        make_placement("default/x", "a", pod("x-0", "a1", (1,)), pod("x-1", "a1", (3,), share(700)))
    ),
    "last pod lacks cpu": Broken(
        make_placement(
            "default/x",
            "a",
            pod("x-0", "a2", (0,), whole(1, cpu=4_000)),
            pod("x-1", "a2", (1,), whole(1, cpu=5_000)),
        )
    ),
    "last pod lacks memory": Broken(
        make_placement(
            "default/x",
            "a",
            pod("x-0", "a2", (0,), whole(1, mem=30_000)),
            pod("x-1", "a2", (1,), whole(1, mem=3_000)),
        )
    ),
    "last pod names a GPU the node lacks": Broken(
        make_placement("default/x", "a", pod("x-0", "a2", (0,)), pod("x-1", "a2", (2,)))
    ),
    "last pod lists one GPU twice": Broken(
        make_placement("default/x", "a", pod("x-0", "a1", (1,)), pod("x-1", "a1", (2, 2), whole(2)))
    ),
    "last pod lists fewer GPUs than it asks": Broken(
        make_placement("default/x", "a", pod("x-0", "a1", (1,)), pod("x-1", "a1", (2,), whole(2)))
    ),
    "last pod on an unknown node": Broken(
        make_placement("default/x", "a", pod("x-0", "a1", (1,)), pod("x-1", "zz", (0,)))
    ),
    "last pod on a cordoned node": Broken(
        make_placement("default/x", "a", pod("x-0", "a1", (1,)), pod("x-1", "a4", (0,)))
    ),
    "last pod reuses a held pod's name": Broken(
        make_placement("default/x", "a", pod("x-0", "a1", (1,)), pod("held-w-0", "a1", (2,)))
    ),
    "cluster is not a member": Broken(
        make_placement("default/x", "nope", pod("x-0", "a1", (1,))), prefix_fits=False
    ),
    "job already holds a reservation": Broken(
        make_placement("default/held", "a", pod("held2-0", "a1", (1,))), prefix_fits=False
    ),
}


@pytest.mark.parametrize("case", ATOMIC.values(), ids=ATOMIC.keys())
def test_assume_is_all_or_nothing(case: Broken) -> None:
    ledger = base()
    ledger.assume(_held())
    before = free(ledger)
    held_before = dict(ledger.reservations())

    with pytest.raises(ConflictError):
        ledger.assume(case.placement)

    assert free(ledger) == before
    assert dict(ledger.reservations()) == held_before
    assert index_problems(ledger.snapshot()) == []
    if case.prefix_fits:
        # Nothing of the failed attempt lingers: the pods that did fit can be assumed now.
        prefix = dataclasses.replace(case.placement, pods=case.placement.pods[:-1])
        ledger.assume(prefix)
        assert free(ledger) == minus(before, prefix)


def test_a_stale_cluster_refuses_assume_until_it_is_fresh_again() -> None:
    ledger = base()
    p = ROUND_TRIPS["gang over two nodes"]
    before = free(ledger)
    ledger.set_stale("a", True)

    with pytest.raises(ConflictError, match="stale"):
        ledger.assume(p)
    assert free(ledger) == before
    assert dict(ledger.reservations()) == {}

    ledger.set_stale("a", False)
    ledger.assume(p)
    assert free(ledger) == minus(before, p)


def test_a_stale_cluster_does_not_block_the_others() -> None:
    ledger = base()
    ledger.set_stale("a", True)
    ledger.assume(ROUND_TRIPS["a whole 8-GPU node"])
    assert set(ledger.reservations()) == {"default/w"}


# -- snapshots are copy-on-write -------------------------------------------------------------


def fingerprint(snap: Snapshot) -> dict[str, object]:
    """Everything a policy can read from a snapshot, as plain values."""
    out: dict[str, object] = {}
    for name, view in snap.clusters.items():
        groups = sorted(view.groups(), key=repr)
        out[name] = (
            view.stale,
            dict(view.nodes),
            sorted(view.gpu_types(), key=repr),
            view.gpus_total(),
            view.free_milli(),
            [
                (
                    g,
                    view.whole_histogram(g),
                    [(k, sorted(ns)) for k, ns in view.by_free_at_least(g, 0)],
                    [(k, sorted(ns)) for k, ns in view.by_whole_at_least(g, 0)],
                )
                for g in groups
            ],
        )
    return out


def _held_on_b() -> Placement:
    return make_placement("default/hb", "b", pod("hb-0", "b1", (0, 1), whole(2)))


WRITES: dict[str, Callable[[Ledger], object]] = {
    "assume": lambda ledger: ledger.assume(ROUND_TRIPS["gang over two nodes"]),
    "forget": lambda ledger: ledger.forget("default/hb"),
    "release": lambda ledger: ledger.release("default/hb", _held_on_b()),
    "foreign pod bound": lambda ledger: ledger.apply(PodBound("a", "f-1", "a2", whole(1), None)),
    "foreign pod deleted": lambda ledger: ledger.apply(PodDeleted("a", "foreign-a1")),
    "node added": lambda ledger: ledger.apply(NodeUpdated("a", node("a5", 2))),
    "node cordoned": lambda ledger: ledger.apply(
        NodeUpdated("a", node("a1", 4, unschedulable=True))
    ),
    "node tainted": lambda ledger: ledger.apply(
        NodeUpdated("b", node("b1", 8, "H100", taints=["x"]))
    ),
    "node deleted": lambda ledger: ledger.apply(NodeDeleted("a", "a2")),
    "cluster goes stale": lambda ledger: ledger.set_stale("b", True),
    "cluster added": lambda ledger: ledger.add_cluster(Cluster("c"), [node("c1")]),
}


@pytest.mark.parametrize("write", WRITES.values(), ids=WRITES.keys())
def test_a_snapshot_does_not_see_later_writes(write: Callable[[Ledger], object]) -> None:
    ledger = base()
    ledger.assume(_held_on_b())
    snap = ledger.snapshot()
    seen = fingerprint(snap)

    write(ledger)

    assert fingerprint(snap) == seen
    assert fingerprint(ledger.snapshot()) != seen, "the write should be visible to new snapshots"


def test_snapshots_in_a_row_each_keep_their_own_moment() -> None:
    ledger = base()
    first = ledger.snapshot()
    seen_first = fingerprint(first)
    ledger.assume(ROUND_TRIPS["shares filling one GPU"])
    second = ledger.snapshot()
    seen_second = fingerprint(second)
    ledger.forget("default/s")
    ledger.apply(PodBound("a", "f-2", "a1", whole(2), None))

    assert fingerprint(first) == seen_first
    assert fingerprint(second) == seen_second
    assert seen_first != seen_second
    assert second.version > first.version


def test_a_write_copies_only_the_cluster_it_touches() -> None:
    ledger = base()
    snap = ledger.snapshot()
    ledger.assume(ROUND_TRIPS["a whole 8-GPU node"])
    after = ledger.snapshot()
    assert after.clusters["a"] is snap.clusters["a"]
    assert after.clusters["b"] is not snap.clusters["b"]


# -- confirm -----------------------------------------------------------------------------------


def test_confirm_turns_the_reservation_into_bound_usage() -> None:
    ledger = base()
    before = free(ledger)
    p = ROUND_TRIPS["gang over two nodes"]
    ledger.assume(p)
    taken = free(ledger)

    ledger.confirm(p.job)

    assert dict(ledger.reservations()) == {}
    assert free(ledger) == taken
    ledger.forget(p.job)  # nothing to forget any more: the pods are running
    assert free(ledger) == taken
    with pytest.raises(KeyError):
        ledger.confirm(p.job)
    ledger.release(p.job, p)
    assert free(ledger) == before


def test_confirmed_pods_leave_one_by_one_as_the_cluster_deletes_them() -> None:
    ledger = base()
    before = free(ledger)
    p = ROUND_TRIPS["gang over two nodes"]
    ledger.assume(p)
    ledger.confirm(p.job)
    for i, pp in enumerate(p.pods):
        assert ledger.apply(PodDeleted("a", pp.pod)) == []
        remaining = dataclasses.replace(p, pods=p.pods[i + 1 :])
        assert free(ledger) == minus(before, remaining)


def test_our_pod_reported_bound_where_we_put_it_changes_no_capacity() -> None:
    ledger = base()
    p = ROUND_TRIPS["gang over two nodes"]
    ledger.assume(p)
    taken = free(ledger)
    for pp in p.pods:
        assert ledger.apply(PodBound("a", pp.pod, pp.node, pp.resources, pp.gpus)) == []
    assert free(ledger) == taken
    ledger.confirm(p.job)
    assert free(ledger) == taken


def test_confirm_of_an_unknown_job_raises() -> None:
    with pytest.raises(KeyError):
        base().confirm("default/nobody")


# -- capacity events ---------------------------------------------------------------------------


def test_a_foreign_pod_takes_free_capacity_and_gives_it_back_when_deleted() -> None:
    ledger = base()
    before = free(ledger)
    assert ledger.apply(PodBound("b", "f", "b1", whole(3, cpu=5_000, mem=7_000), None)) == []
    s = state(ledger, "b", "b1")
    assert (s.cpu_free, s.memory_free) == (32_000 - 5_000, 128_000 - 7_000)
    assert s.whole_free == 5
    assert s.free_milli == 5 * MILLI_PER_GPU

    ledger.apply(PodDeleted("b", "f"))
    assert free(ledger) == before


def test_deleting_an_unknown_pod_or_binding_on_an_unknown_node_changes_nothing() -> None:
    ledger = base()
    before = free(ledger)
    assert ledger.apply(PodDeleted("a", "never-seen")) == []
    assert ledger.apply(PodBound("a", "f", "not-a-gpu-node", whole(1), None)) == []
    assert free(ledger) == before


def test_a_foreign_pod_beside_a_reservation_evicts_nothing() -> None:
    ledger = base()
    p = make_placement("default/r", "b", pod("r-0", "b1", (0, 1, 2, 3), whole(4)))
    ledger.assume(p)
    taken = free(ledger)
    assert ledger.apply(PodBound("b", "f", "b1", whole(4), None)) == []
    assert set(ledger.reservations()) == {"default/r"}
    s = state(ledger, "b", "b1")
    assert s.gpu_free == (0,) * 8
    assert s.cpu_free == taken[("b", "b1")][0] - 1_000


@dataclass(frozen=True)
class Landing:
    reservation: Placement
    foreign: PodBound
    # a2's free milli per GPU after the eviction, from the foreign pod alone, in any order:
    # for whole GPUs the ledger may book a foreign pod on any free GPU.
    want_gpu_free: tuple[int, ...]


# a2 has 2 GPUs, 8 cores, 32000 MiB. Each reservation also holds a1 GPU 0, which the
# eviction must release as well.
LANDINGS = {
    "whole GPU, ledger picks it": Landing(
        make_placement(
            "default/r",
            "a",
            pod("r-0", "a2", (0,)),
            pod("r-1", "a2", (1,)),
            pod("r-2", "a1", (0,)),
        ),
        PodBound("a", "f", "a2", whole(1), None),
        (0, MILLI_PER_GPU),
    ),
    "whole GPU, cluster names a reserved one": Landing(
        make_placement(
            "default/r",
            "a",
            pod("r-0", "a2", (0, 1), whole(2)),
            pod("r-1", "a1", (0,)),
        ),
        PodBound("a", "f", "a2", whole(1), (1,)),
        (MILLI_PER_GPU, 0),
    ),
    "share onto a GPU our share sat on": Landing(
        make_placement(
            "default/r",
            "a",
            pod("r-0", "a2", (0,), share(600)),
            pod("r-1", "a2", (1,)),
            pod("r-2", "a1", (0,)),
        ),
        PodBound("a", "f", "a2", share(500), None),
        (500, MILLI_PER_GPU),
    ),
    "cpu squeeze, no GPU": Landing(
        make_placement(
            "default/r",
            "a",
            pod("r-0", "a2", (0,), whole(1, cpu=3_000)),
            pod("r-1", "a2", (1,), whole(1, cpu=3_000)),
            pod("r-2", "a1", (0,)),
        ),
        PodBound("a", "f", "a2", resources(cpu=4_000), None),
        (MILLI_PER_GPU, MILLI_PER_GPU),
    ),
}


@pytest.mark.parametrize("case", LANDINGS.values(), ids=LANDINGS.keys())
def test_a_foreign_pod_landing_on_a_reservation_evicts_and_returns_it(case: Landing) -> None:
    ledger = base()
    before = free(ledger)
    ledger.assume(case.reservation)

    evicted = ledger.apply(case.foreign)

    assert evicted == [case.reservation.job]
    assert dict(ledger.reservations()) == {}
    res = case.foreign.resources
    a2 = state(ledger, "a", "a2")
    # Reality wins: a2 holds the foreign pod and nothing of ours; a1 is back as it was.
    assert (a2.cpu_free, a2.memory_free) == (8_000 - res.cpu_milli, 32_000 - res.memory_mib)
    assert sorted(a2.gpu_free) == sorted(case.want_gpu_free)
    assert free(ledger)[("a", "a1")] == before[("a", "a1")]
    assert index_problems(ledger.snapshot()) == []
    # And the capacity is really there: the foreign pod alone can be deleted to empty a2.
    ledger.apply(PodDeleted("a", "f"))
    assert free(ledger) == before


def test_a_foreign_pod_keeps_the_gpus_bound_pods_hold() -> None:
    """A confirmed share sits on GPU 0; a reservation holds GPU 1; a foreign whole-GPU pod
    arrives. The confirmed share stays on GPU 0 in the books, and the foreign pod takes GPU 1
    (the only GPU free in reality), so GPU 0 still has exactly 400 milli free."""
    ledger = base()
    mine = make_placement("default/c", "a", pod("c-0", "a2", (0,), share(600)))
    ledger.assume(mine)
    ledger.confirm(mine.job)
    ledger.assume(make_placement("default/r", "a", pod("r-0", "a2", (1,))))

    assert ledger.apply(PodBound("a", "f", "a2", whole(1), None)) == ["default/r"]

    assert state(ledger, "a", "a2").gpu_free == (400, 0)


def test_capacity_freed_on_an_overcommitted_node_is_recounted() -> None:
    """Reality overcommits a2: a confirmed pod and a foreign pod want 12 of its 8 cores.
    When the confirmed pod ends, only what the foreign pod leaves is free, not 6 cores."""
    ledger = base()
    mine = make_placement("default/c", "a", pod("c-0", "a2", (0,), whole(1, cpu=6_000)))
    ledger.assume(mine)
    ledger.confirm(mine.job)
    assert ledger.apply(PodBound("a", "f", "a2", resources(cpu=6_000), None)) == []
    assert ledger.overcommitted_pods == 1

    ledger.release(mine.job, mine)

    a2 = state(ledger, "a", "a2")
    assert (a2.cpu_free, a2.gpu_free) == (8_000 - 6_000, (MILLI_PER_GPU, MILLI_PER_GPU))
    with pytest.raises(ConflictError):
        ledger.assume(make_placement("default/x", "a", pod("x-0", "a2", (0,), whole(1, cpu=5_000))))
    ledger.apply(PodDeleted("a", "f"))
    assert state(ledger, "a", "a2") == NodeState.empty(a2.node)


def test_a_cordoned_node_keeps_its_reservations_but_takes_no_new_ones() -> None:
    ledger = base()
    p = ROUND_TRIPS["gang over two nodes"]
    ledger.assume(p)
    taken = free(ledger)

    assert (
        ledger.apply(NodeUpdated("a", node("a1", 4, cpu=16_000, mem=64_000, unschedulable=True)))
        == []
    )

    assert set(ledger.reservations()) == {p.job}
    assert free(ledger) == taken
    snap = ledger.snapshot()
    assert all(
        "a1" not in names
        for g in snap.clusters["a"].groups()
        for _, names in snap.clusters["a"].by_free_at_least(g, 0)
    )
    assert index_problems(snap) == []
    with pytest.raises(ConflictError):
        ledger.assume(make_placement("default/y", "a", pod("y-0", "a1", (3,), share(100))))


def test_a_shrunk_node_evicts_the_reservations_that_no_longer_fit() -> None:
    ledger = base()
    before = free(ledger)
    occupy(ledger, "b", "b1", (2,), cpu=1_000)
    keep = make_placement("default/k", "b", pod("k-0", "b1", (0, 1), whole(2)))
    gone = make_placement(
        "default/r", "b", pod("r-0", "b1", (5,)), pod("r-1", "b1", (6, 7), whole(2))
    )
    ledger.assume(keep)
    ledger.assume(gone)

    evicted = ledger.apply(NodeUpdated("b", node("b1", 4, "H100", cpu=32_000, mem=128_000)))

    assert evicted == ["default/r"]
    assert set(ledger.reservations()) == {"default/k"}
    b1 = state(ledger, "b", "b1")
    assert b1.gpu_free == (0, 0, 0, MILLI_PER_GPU)  # ours on 0 and 1, the foreign pod on 2
    assert (b1.cpu_free, b1.memory_free) == (32_000 - 2_000, 128_000 - 1_024)
    assert free(ledger)[("a", "a1")] == before[("a", "a1")]
    assert index_problems(ledger.snapshot()) == []


def test_a_retyped_or_tainted_node_moves_between_index_groups() -> None:
    ledger = base()
    ledger.assume(make_placement("default/r", "b", pod("r-0", "b1", (0,))))
    snap = ledger.snapshot()
    old = (GpuType("H100"), frozenset[Taint]())
    assert snap.clusters["b"].whole_histogram(old) == [(7, 1)]

    retyped = node(
        "b1",
        8,
        "A100",
        cpu=32_000,
        mem=128_000,
        taints=["spot", Taint("soft", effect="PreferNoSchedule")],
    )
    assert ledger.apply(NodeUpdated("b", retyped)) == []

    view = ledger.snapshot().clusters["b"]
    assert view.whole_histogram(old) == []
    assert view.whole_histogram((GpuType("A100"), frozenset({Taint("spot")}))) == [(7, 1)]
    assert view.gpu_types() == {GpuType("A100")}
    assert set(ledger.reservations()) == {"default/r"}
    assert index_problems(ledger.snapshot()) == []


def test_a_deleted_node_evicts_its_reservations_and_frees_their_other_nodes() -> None:
    ledger = base()
    before = free(ledger)
    p = make_placement("default/r", "a", pod("r-0", "a1", (0,)), pod("r-1", "a2", (0, 1), whole(2)))
    other = make_placement("default/o", "a", pod("o-0", "a1", (1,)))
    ledger.assume(p)
    ledger.assume(other)
    ledger.apply(PodBound("a", "f", "a2", resources(cpu=1_000), None))

    assert ledger.apply(NodeDeleted("a", "a2")) == ["default/r"]

    assert set(ledger.reservations()) == {"default/o"}
    assert "a2" not in ledger.snapshot().clusters["a"].nodes
    after = free(ledger)
    assert after[("a", "a1")] == minus(before, other)[("a", "a1")]
    assert ledger.apply(NodeDeleted("a", "a2")) == []
    # Back again, the node is empty: its old pods went with it.
    ledger.apply(NodeUpdated("a", node("a2", 2, cpu=8_000, mem=32_000)))
    assert free(ledger)[("a", "a2")] == before[("a", "a2")]
    assert index_problems(ledger.snapshot()) == []


def test_adding_a_cluster_twice_is_refused() -> None:
    ledger = base()
    with pytest.raises(ValueError, match="already"):
        ledger.add_cluster(Cluster("a"))


# -- indexes against a brute-force recount ----------------------------------------------------


def _random_walk(seed: int, steps: int = 150) -> Ledger:
    """Random writes of every kind; returns the ledger, checking the indexes as it goes."""
    rng = random.Random(seed)
    ledger = federation(
        {
            "a": [
                node(f"a{i}", rng.choice((1, 2, 4, 8)), rng.choice(("A100", "H100")))
                for i in range(6)
            ],
            "b": [
                node(f"b{i}", rng.choice((2, 8)), "V100", taints=["spot"] if i % 2 else [])
                for i in range(4)
            ],
        }
    )
    jobs = 0
    for _ in range(steps):
        snap = ledger.snapshot()
        cluster = rng.choice(("a", "b"))
        names = sorted(snap.clusters[cluster].nodes)
        roll = rng.random()
        if roll < 0.4 and names:
            name = rng.choice(names)
            res = (
                share(rng.choice((100, 500, 900)))
                if rng.random() < 0.4
                else whole(rng.choice((1, 2)))
            )
            gpus = snap.node(cluster, name).gpus_for(res)
            if gpus is not None and snap.node(cluster, name).node.schedulable:
                jobs += 1
                ledger.assume(
                    make_placement(f"default/j{jobs}", cluster, pod(f"j{jobs}-0", name, gpus, res))
                )
        elif roll < 0.55 and ledger.reservations():
            job = rng.choice(sorted(ledger.reservations()))
            if rng.random() < 0.5:
                ledger.forget(job)
            else:
                ledger.confirm(job)
        elif roll < 0.7 and names:
            ledger.apply(PodBound(cluster, f"f{rng.random()}", rng.choice(names), whole(1), None))
        elif roll < 0.85 and names:
            old = snap.node(cluster, rng.choice(names)).node
            ledger.apply(
                NodeUpdated(
                    cluster,
                    dataclasses.replace(
                        old,
                        unschedulable=rng.random() < 0.3,
                        gpu_type=GpuType(rng.choice(("A100", "H100", "V100"))),
                        taints=(Taint("spot"),) if rng.random() < 0.3 else (),
                    ),
                )
            )
        elif names:
            name = rng.choice(names)
            ledger.apply(NodeDeleted(cluster, name))
            ledger.apply(NodeUpdated(cluster, node(name, rng.choice((1, 4)))))
        problems = index_problems(ledger.snapshot())
        assert problems == [], problems
    return ledger


@pytest.mark.parametrize("seed", range(6))
def test_indexes_agree_with_a_recount_after_every_kind_of_write(seed: int) -> None:
    ledger = _random_walk(seed)
    view = ledger.snapshot().clusters["a"]
    assert view.gpus_total() > 0  # the walk kept some capacity to index


def test_the_histogram_counts_whole_free_gpus_node_by_node() -> None:
    ledger = federation({"a": [node("n1", 8), node("n2", 8), node("n3", 4), node("n4", 8, "H100")]})
    occupy(ledger, "a", "n1", (0, 1, 2))
    occupy(ledger, "a", "n2", (5,), milli=100)
    occupy(ledger, "a", "n3", (0, 1, 2, 3))
    view = ledger.snapshot().clusters["a"]
    a100 = (GpuType("A100"), frozenset[Taint]())

    # n1: 5 whole free, n2: 7, n3: 0; the H100 node is in its own group.
    assert view.whole_histogram(a100) == [(0, 1), (5, 1), (7, 1)]
    assert [(k, sorted(ns)) for k, ns in view.by_whole_at_least(a100, 5)] == [
        (5, ["n1"]),
        (7, ["n2"]),
    ]
    assert [(k, sorted(ns)) for k, ns in view.by_free_at_least(a100, 6_000)] == [(7_900, ["n2"])]
    assert view.free_milli(a100) == 5_000 + 7_900
    assert view.gpus_total(a100) == 20
    assert view.allocation() == pytest.approx(1 - (5_000 + 7_900 + 8_000) / 28_000)
    assert index_problems(ledger.snapshot()) == []


def test_a_placements_gpu_types_are_read_without_freezing_a_view() -> None:
    """A restart restores every running job and reads its nodes' GPU types: that reading
    takes no snapshot, so the next reservation writes the view in place instead of copying
    the cluster's nodes (a snapshot, the contrast, freezes it)."""
    ledger = base()
    first = make_placement("default/x", "a", pod("x-0", "a1", (0,)), pod("x-1", "a2", (0,)))
    ledger.assume(first)
    view = ledger._views["a"]
    assert ledger.gpu_types(first) == {"a1": "A100", "a2": "A100"}
    assert ledger.gpu_types(make_placement("default/y", "a", pod("y-0", "gone"))) == {"gone": None}
    ledger.assume(make_placement("default/z", "a", pod("z-0", "a1", (1,))))
    assert ledger._views["a"] is view  # written in place: nothing was frozen
    ledger.snapshot()
    ledger.assume(make_placement("default/w", "a", pod("w-0", "a1", (2,))))
    assert ledger._views["a"] is not view  # frozen by the snapshot, so copied to write
