"""Placement policies: where a job goes, and why it goes nowhere."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import pytest
from audit import Books, placement_problems
from builders import (
    ClusterSpec,
    as_placement,
    as_unplaceable,
    federation,
    gang,
    job,
    node,
    nodes,
    occupy,
    pod_set,
    shared,
    single,
)

from broker.core.ledger import Ledger
from broker.core.views import Snapshot
from broker.model import (
    MILLI_PER_GPU,
    Decision,
    Job,
    Node,
    Placement,
    ReasonCode,
)
from broker.taints import Taint
from policies import POLICY_NAMES, AutoPolicy, make_policy


def decide(name: str, j: Job, ledger: Ledger, seed: int = 0) -> Decision:
    return make_policy(name, seed).decide(j, ledger.snapshot())


def books_of(ledger: Ledger) -> Books:
    snap = ledger.snapshot()
    return Books(
        {c: v.cluster for c, v in snap.clusters.items()},
        {c: {n: s.node for n, s in v.nodes.items()} for c, v in snap.clusters.items()},
        {c for c, v in snap.clusters.items() if v.stale},
    )


def check_and_assume(ledger: Ledger, j: Job, decision: Decision) -> Placement:
    """The decision is a placement that breaks no rule and that the ledger accepts."""
    p = as_placement(decision)
    assert placement_problems(books_of(ledger), j, p) == []
    ledger.assume(p)
    return p


def allocation(snap: Snapshot, cluster: str) -> float:
    """Share of the cluster's schedulable GPU milli in use, recounted from the nodes."""
    states = [s for s in snap.clusters[cluster].nodes.values() if s.node.schedulable]
    total = sum(len(s.gpu_free) for s in states) * MILLI_PER_GPU
    return 1 - sum(s.free_milli for s in states) / total


def fits_whole(snap: Snapshot, cluster: str, gpus: int) -> list[str]:
    """Schedulable nodes of the cluster with ``gpus`` whole free GPUs."""
    return [
        n
        for n, s in snap.clusters[cluster].nodes.items()
        if s.node.schedulable and s.whole_free >= gpus
    ]


# -- (a) free GPUs spread thin do not make a big pod fit -------------------------------------


def _one_free_per_node(ledger: Ledger) -> Ledger:
    for i in range(8):
        occupy(ledger, "wide", f"n-{i}", range(7))
    return ledger


LAYOUTS = {
    "8 nodes x 1 GPU": lambda: federation({"wide": nodes("n", 8, gpus=1)}),
    "8 nodes x 8 GPUs, 7 taken": lambda: _one_free_per_node(
        federation({"wide": nodes("n", 8, gpus=8)})
    ),
}


@pytest.mark.parametrize("layout", LAYOUTS.values(), ids=LAYOUTS.keys())
@pytest.mark.parametrize("name", POLICY_NAMES)
def test_eight_gpus_one_per_node_do_not_host_one_eight_gpu_pod(
    name: str, layout: Callable[[], Ledger]
) -> None:
    ledger = layout()
    assert ledger.snapshot().clusters["wide"].free_milli() == 8 * MILLI_PER_GPU

    result = as_unplaceable(decide(name, single("big", gpus=8), ledger))

    reasons = result.for_cluster("wide")
    assert [r.code for r in reasons] == [ReasonCode.NODE_FIT]
    assert reasons[0].message
    assert result.largest_fit["wide"] == 0


# -- (b) a gang goes where it fits node by node ----------------------------------------------


def _thin_a(ledger: Ledger) -> Ledger:
    for i in range(12):
        occupy(ledger, "a", f"a-{i}", range(7))
    return ledger


GANG_LAYOUTS = {
    "a: 12 x 1-GPU nodes": lambda: federation(
        {"a": nodes("a", 12, gpus=1), "b": nodes("b", 2, gpus=4)}
    ),
    "a: 12 x 8-GPU nodes, 7 taken": lambda: _thin_a(
        federation({"a": nodes("a", 12, gpus=8), "b": nodes("b", 2, gpus=4)})
    ),
}


@pytest.mark.parametrize("layout", GANG_LAYOUTS.values(), ids=GANG_LAYOUTS.keys())
@pytest.mark.parametrize("name", POLICY_NAMES)
def test_a_gang_goes_where_it_fits_node_by_node_not_where_most_gpus_are_free(
    name: str, layout: Callable[[], Ledger]
) -> None:
    ledger = layout()
    snap = ledger.snapshot()
    assert snap.clusters["a"].free_milli() > snap.clusters["b"].free_milli()
    j = gang("train", pods=4, gpus=2)

    p = check_and_assume(ledger, j, decide(name, j, ledger))

    assert p.cluster == "b"
    assert len(p.pods) == 4


# -- (c) binpack: the fullest cluster that fits, the fullest node, the fullest GPU ------------


def _binpack_federation() -> Ledger:
    ledger = federation(
        {
            "idle": nodes("i", 2, gpus=8),
            "busy": nodes("b", 3, gpus=8),
            "full": nodes("f", 1, gpus=8),
        }
    )
    occupy(ledger, "busy", "b-0", range(7))  # 1 free
    occupy(ledger, "busy", "b-1", range(4))  # 4 free
    occupy(ledger, "full", "f-0", range(8))  # 0 free: the fullest cluster, but nothing fits
    return ledger


@pytest.mark.parametrize(
    ("gpus", "want_node"), [(1, "b-0"), (2, "b-1"), (4, "b-1"), (5, "b-2"), (8, "b-2")]
)
def test_binpack_picks_the_fullest_cluster_that_fits_and_its_fullest_node(
    gpus: int, want_node: str
) -> None:
    ledger = _binpack_federation()
    snap = ledger.snapshot()
    j = single("s", gpus=gpus)

    p = check_and_assume(ledger, j, decide("binpack", j, ledger))

    fitting = [c for c in snap.clusters if fits_whole(snap, c, gpus)]
    assert p.cluster == max(fitting, key=lambda c: allocation(snap, c)) == "busy"
    fullest = min(fits_whole(snap, "busy", gpus), key=lambda n: snap.node("busy", n).free_milli)
    assert p.pods[0].node == fullest == want_node


def test_binpack_moves_on_to_the_next_fullest_cluster_when_the_fullest_is_too_small() -> None:
    ledger = _binpack_federation()
    occupy(ledger, "busy", "b-2", (0,), milli=1)
    j = single("s", gpus=8)
    p = check_and_assume(ledger, j, decide("binpack", j, ledger))
    assert p.cluster == "idle"


@pytest.mark.parametrize("gpus", [1, 4, 8])
def test_spread_picks_the_emptiest_cluster_that_fits_and_its_emptiest_node(gpus: int) -> None:
    ledger = _binpack_federation()
    occupy(ledger, "idle", "i-0", (0,))
    snap = ledger.snapshot()
    j = single("s", gpus=gpus)

    p = check_and_assume(ledger, j, decide("spread", j, ledger))

    fitting = [c for c in snap.clusters if fits_whole(snap, c, gpus)]
    assert p.cluster == min(fitting, key=lambda c: allocation(snap, c)) == "idle"
    emptiest = max(fits_whole(snap, "idle", gpus), key=lambda n: snap.node("idle", n).free_milli)
    assert p.pods[0].node == emptiest == "i-1"


def test_binpack_puts_a_shared_pod_on_the_fullest_gpu_of_the_fullest_node() -> None:
    ledger = federation({"c": [node("empty", 4), node("s1", 4), node("s2", 4)]})
    for gpu, milli in ((0, 300), (1, 600), (2, 450)):  # free: 700, 400, 550, 1000
        occupy(ledger, "c", "s1", (gpu,), milli=milli)
    occupy(ledger, "c", "s2", (0,), milli=200)  # free: 800, 1000, 1000, 1000
    snap = ledger.snapshot()
    j = shared("half", milli=500)

    p = check_and_assume(ledger, j, decide("binpack", j, ledger))

    (placed,) = p.pods
    assert placed.node == "s1"  # the fullest node that has a GPU with 500 free
    frees = snap.node("c", "s1").gpu_free
    fitting = [i for i, f in enumerate(frees) if f >= 500]
    assert placed.gpus == (min(fitting, key=lambda i: frees[i]),) == (2,)


def test_shared_pods_fill_one_gpu_before_opening_another() -> None:
    ledger = federation({"c": [node("n", 2)]})
    for k in range(4):
        j = shared(f"q{k}", milli=250)
        check_and_assume(ledger, j, decide("binpack", j, ledger))
    assert ledger.snapshot().node("c", "n").gpu_free in ((0, MILLI_PER_GPU), (MILLI_PER_GPU, 0))


# -- (d) every "no" carries a reason for every cluster ---------------------------------------


EU = {"region": "eu"}
NO_KINDS: dict[str, tuple[ClusterSpec, ReasonCode]] = {
    "stale": (ClusterSpec(nodes("st", 2), EU, stale=True), ReasonCode.STALE),
    "elsewhere": (ClusterSpec(nodes("us", 2), {"region": "us"}), ReasonCode.SELECTOR),
    "wrongtype": (ClusterSpec(nodes("h", 2, gpu_type="H100"), EU), ReasonCode.GPU_TYPE),
    "tainted": (
        ClusterSpec([node(f"t-{i}", 8, taints=["reserved"]) for i in range(2)], EU),
        ReasonCode.TAINT,
    ),
    "small": (ClusterSpec(nodes("sm", 1, gpus=2), EU), ReasonCode.INSUFFICIENT_GPUS),
    "fragmented": (ClusterSpec(nodes("fr", 12, gpus=1), EU), ReasonCode.NODE_FIT),
    "toolarge": (
        ClusterSpec(nodes("tl2", 3, gpus=2) + nodes("tl1", 4, gpus=1), EU),
        ReasonCode.GANG_TOO_LARGE,
    ),
    "cpu": (ClusterSpec(nodes("cp", 1, gpus=8, cpu=4_000), EU), ReasonCode.CPU_MEMORY),
    "cordoned": (
        ClusterSpec([node("co", 8, unschedulable=True)], EU),
        ReasonCode.INSUFFICIENT_GPUS,
    ),
}
NO_JOB = gang("train", pods=4, gpus=2, cpu=2_000, gpu_types=["A100"], selector=EU)


@pytest.mark.parametrize("name", POLICY_NAMES)
def test_every_no_names_every_cluster_with_the_right_reason(name: str) -> None:
    ledger = federation({c: spec for c, (spec, _) in NO_KINDS.items()})

    result = as_unplaceable(decide(name, NO_JOB, ledger))

    assert result.job == NO_JOB.key
    for cluster, (_, code) in NO_KINDS.items():
        reasons = result.for_cluster(cluster)
        assert {r.code for r in reasons} == {code}, (cluster, reasons)
        assert all(r.message for r in reasons)
    assert {r.cluster for r in result.reasons} == set(NO_KINDS)
    assert result.largest_fit["toolarge"] == 3  # three 2-GPU nodes
    assert result.largest_fit["fragmented"] == 0
    assert result.largest_fit["stale"] == 0


@pytest.mark.parametrize("name", POLICY_NAMES)
def test_each_kind_of_no_alone_is_the_only_reason(name: str) -> None:
    """The same reasons come out when each cluster is alone in the federation."""
    for cluster, (spec, code) in NO_KINDS.items():
        ledger = federation({cluster: spec})
        result = as_unplaceable(decide(name, NO_JOB, ledger))
        assert [r.code for r in result.reasons] == [code], cluster


@pytest.mark.parametrize("name", POLICY_NAMES)
def test_an_empty_federation_says_so(name: str) -> None:
    result = as_unplaceable(decide(name, single("s"), federation({})))
    assert [r.code for r in result.reasons] == [ReasonCode.NO_CLUSTERS]


@pytest.mark.parametrize("name", POLICY_NAMES)
def test_a_tolerated_taint_opens_the_cluster(name: str) -> None:
    ledger = federation(
        {
            "tainted": [node("t", 8, taints=["reserved"])],
            "soft": [
                node(f"s{i}", 8, taints=[Taint("p", effect="PreferNoSchedule")]) for i in (1, 2)
            ],
        }
    )
    tolerant = gang("ok", pods=2, gpus=4, tolerations=["reserved"])
    p = check_and_assume(ledger, tolerant, decide(name, tolerant, ledger))
    assert p.cluster in {"tainted", "soft"}
    # A PreferNoSchedule taint never blocks, so an intolerant job still fits somewhere.
    intolerant = gang("plain", pods=2, gpus=4)
    p2 = check_and_assume(ledger, intolerant, decide(name, intolerant, ledger))
    assert p2.cluster == "soft"


# -- (e) elastic gangs -----------------------------------------------------------------------


@pytest.mark.parametrize("name", POLICY_NAMES)
def test_an_elastic_gang_takes_what_fits_when_at_least_min_member_does(name: str) -> None:
    ledger = federation({"c": nodes("n", 5, gpus=1)})
    j = gang("el", pods=8, gpus=1, min_member=4)

    p = check_and_assume(ledger, j, decide(name, j, ledger))

    assert 4 <= len(p.pods) <= 8
    assert len(p.pods) == 5  # every free GPU: nothing else stops the sixth pod
    assert len({pp.node for pp in p.pods}) == 5


@pytest.mark.parametrize("name", POLICY_NAMES)
def test_an_elastic_gang_below_min_member_is_unplaceable(name: str) -> None:
    ledger = federation({"c": nodes("n", 3, gpus=1)})
    result = as_unplaceable(decide(name, gang("el", pods=8, gpus=1, min_member=4), ledger))
    assert [r.code for r in result.for_cluster("c")] == [ReasonCode.INSUFFICIENT_GPUS]
    assert result.largest_fit["c"] == 3


@pytest.mark.parametrize("name", ["gang", "auto"])
def test_gang_prefers_the_cluster_that_takes_the_whole_elastic_gang(name: str) -> None:
    ledger = federation({"a": nodes("a", 5, gpus=1), "b": nodes("b", 8, gpus=1)})
    j = gang("el", pods=8, gpus=1, min_member=4)
    p = check_and_assume(ledger, j, decide(name, j, ledger))
    assert (p.cluster, len(p.pods)) == ("b", 8)


# -- gang specifics ---------------------------------------------------------------------------


def test_gang_packs_onto_as_few_nodes_as_it_can() -> None:
    ledger = federation({"c": nodes("n", 4, gpus=8)})
    j = gang("g", pods=4, gpus=2)
    p = check_and_assume(ledger, j, decide("gang", j, ledger))
    assert len({pp.node for pp in p.pods}) == 1


def test_gang_picks_the_cluster_it_fills_best() -> None:
    ledger = federation({"roomy": nodes("r", 1, gpus=8), "snug": nodes("s", 1, gpus=8)})
    occupy(ledger, "snug", "s-0", range(4))
    j = gang("g", pods=2, gpus=2)
    p = check_and_assume(ledger, j, decide("gang", j, ledger))
    assert p.cluster == "snug"  # leaves no GPU stranded there, and 8 whole ones in roomy


def test_gang_keeps_to_one_gpu_type() -> None:
    ledger = federation({"mixed": nodes("a", 1, gpus=4) + nodes("h", 1, gpus=4, gpu_type="H100")})
    j = gang("g", pods=3, gpus=2)
    result = decide("gang", j, ledger)
    # 6 GPUs fit only across both types; one type per gang means no.
    assert as_unplaceable(result).for_cluster("mixed")
    ok = gang("g2", pods=2, gpus=2)
    p = check_and_assume(ledger, ok, decide("gang", ok, ledger))
    snap = ledger.snapshot()
    assert len({snap.node("mixed", pp.node).node.gpu_type for pp in p.pods}) == 1


def test_gang_places_shared_and_mixed_pod_sets_on_one_cluster() -> None:
    ledger = federation({"a": nodes("a", 2, gpus=2), "b": nodes("b", 2, gpus=4)})
    j = job(
        "mixed",
        pod_set("launcher", 1, cpu=2_000),
        pod_set("worker", 3, gpus=2),
        pod_set("sidecar", 2, milli=300),
    )
    p = check_and_assume(ledger, j, decide("gang", j, ledger))
    assert p.cluster == "b"
    assert len(p.pods) == 6


@pytest.mark.parametrize("name", POLICY_NAMES)
def test_a_gang_without_gpus_runs_on_cpu_nodes(name: str) -> None:
    ledger = federation({"cpu": [node("c1", 0, None), node("c2", 0, None)]})
    j = job("prep", pod_set("p", 2, cpu=4_000))
    p = check_and_assume(ledger, j, decide(name, j, ledger))
    assert p.cluster == "cpu"


def test_auto_uses_binpack_for_one_pod_and_gang_for_more() -> None:
    ledger = federation({"c": nodes("n", 4, gpus=8)})
    auto = AutoPolicy()
    one = single("one")
    many = gang("many", pods=2, gpus=1)
    assert as_placement(auto.decide(one, ledger.snapshot())).policy == "binpack"
    assert as_placement(auto.decide(many, ledger.snapshot())).policy == "gang"


def test_make_policy_names_the_known_policies_when_asked_for_another() -> None:
    with pytest.raises(ValueError, match="binpack"):
        make_policy("nonsense")


# -- (f) every policy handles easy jobs ---------------------------------------------------------


def _easy_federation() -> Ledger:
    return federation(
        {
            "a": nodes("a", 4, gpus=8),
            "b": [*nodes("b", 2, gpus=4, gpu_type="H100"), node("cpu", 0, None)],
        }
    )


EASY_JOBS: dict[str, Job] = {
    "one GPU": single("one"),
    "a whole node": single("node", gpus=8),
    "a quarter GPU": shared("quarter", milli=250),
    "a gang of 4 x 2": gang("g42", pods=4, gpus=2),
    "a gang of 2 x 8": gang("g28", pods=2, gpus=8),
    "an elastic gang": gang("el", pods=6, gpus=4, min_member=2),
    "an H100 job": gang("h", pods=2, gpus=2, gpu_types=["H100"]),
    "a cpu-only pod": job("cpu", pod_set("p", 1, cpu=4_000)),
}


@pytest.mark.parametrize("j", EASY_JOBS.values(), ids=EASY_JOBS.keys())
@pytest.mark.parametrize("name", POLICY_NAMES)
def test_every_policy_places_an_easy_job_validly(name: str, j: Job) -> None:
    ledger = _easy_federation()
    books = books_of(ledger)

    p = check_and_assume(ledger, j, decide(name, j, ledger))

    books.assumed[p.job] = p
    assert books.oversubscription() == []
    assert books.disagreements(ledger.snapshot()) == []
    assert p.policy


@pytest.mark.parametrize("name", POLICY_NAMES)
def test_every_policy_fills_the_federation_without_oversubscribing_it(name: str) -> None:
    ledger = _easy_federation()
    books = books_of(ledger)
    placed = 0
    for k in range(40):
        j = [single(f"s{k}", gpus=2), shared(f"h{k}", milli=600), gang(f"g{k}", 2, 3)][k % 3]
        decision = decide(name, j, ledger)
        if isinstance(decision, Placement):
            check_and_assume(ledger, j, decision)
            books.assumed[decision.job] = decision
            placed += 1
    assert placed >= 10
    assert books.oversubscription() == []
    assert books.disagreements(ledger.snapshot()) == []


# -- (g) deterministic for a seed ------------------------------------------------------------


def _run(name: str, seed: int) -> list[Decision]:
    ledger = federation({f"c{i}": nodes(f"c{i}", 4, gpus=8) for i in range(4)})
    policy = make_policy(name, seed)
    out: list[Decision] = []
    for k in range(24):
        j = [single(f"s{k}"), shared(f"h{k}", milli=300), gang(f"g{k}", 2, 2)][k % 3]
        decision = policy.decide(j, ledger.snapshot())
        out.append(decision)
        if isinstance(decision, Placement):
            ledger.assume(decision)
    return out


@pytest.mark.parametrize("name", POLICY_NAMES)
def test_every_policy_is_deterministic_for_a_seed(name: str) -> None:
    assert _run(name, 7) == _run(name, 7)


def test_the_random_policy_depends_on_its_seed() -> None:
    runs = {seed: _run("random", seed) for seed in (1, 2, 3)}
    assert runs[1] == _run("random", 1)
    assert runs[1] != runs[2] or runs[1] != runs[3]


def _spec_nodes(spec: Sequence[Node] | ClusterSpec) -> Sequence[Node]:
    return spec.nodes if isinstance(spec, ClusterSpec) else spec


def test_the_reason_table_is_what_it_claims() -> None:
    """Guards the table above: each cluster of it would take the job if not for its one
    flaw, so a policy that ignored that check would place the job there."""
    fixed: Mapping[str, Sequence[Node]] = {
        "stale": _spec_nodes(NO_KINDS["stale"][0]),
        "elsewhere": _spec_nodes(NO_KINDS["elsewhere"][0]),
        "wrongtype": nodes("h", 2),
        "tainted": nodes("t", 2),
    }
    for cluster, ns in fixed.items():
        ledger = federation({cluster: ClusterSpec(ns, EU)})
        p = as_placement(decide("gang", NO_JOB, ledger))
        assert p.cluster == cluster
