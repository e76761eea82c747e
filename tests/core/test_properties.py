"""Property tests of the placement core over random federations and job streams.

Every policy is driven the way the scheduler drives it (snapshot -> decide -> assume), with
forgets, confirms and releases interleaved, and, in the second test, with the clusters'
own events (foreign pods, cordons, taints, nodes leaving and coming back, staleness). After
every step an independent audit (tests/audit.py) recounts each node's usage from the
placements and pods the test holds and checks it against allocatable, and checks that the
ledger's books and indexes say the same.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from dataclasses import dataclass

import pytest
from audit import Books, could_host, index_problems, placement_problems, whole_free
from builders import job, node, nodes, pod_set
from hypothesis import (
    HealthCheck,
    Phase,
    currently_in_test_context,
    event,
    find,
    given,
    settings,
)
from hypothesis import strategies as st

from broker.core.ledger import Ledger
from broker.model import (
    Cluster,
    Job,
    Node,
    NodeDeleted,
    NodeUpdated,
    Placement,
    PodBound,
    PodDeleted,
    PodSet,
    ReasonCode,
    Resources,
    Unplaceable,
)
from broker.taints import Taint
from policies import POLICY_NAMES, make_policy

GPU_TYPES = ("A100", "H100", "V100")
TAINT_KEYS = ("spot", "reserved")
SETTINGS = settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


# -- federations ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Member:
    cluster: Cluster
    nodes: tuple[Node, ...]
    stale: bool


@st.composite
def members(draw: st.DrawFn) -> tuple[Member, ...]:
    types = draw(st.lists(st.sampled_from(GPU_TYPES), min_size=2, max_size=3, unique=True))
    out = []
    for c in range(draw(st.integers(2, 4))):
        ns = []
        for i in range(draw(st.integers(1, 6))):
            gpus = draw(st.sampled_from((1, 2, 4, 8, 8, 0)))
            ns.append(
                node(
                    f"c{c}-n{i}",
                    gpus,
                    draw(st.sampled_from(types)),
                    cpu=draw(st.sampled_from((8_000, 32_000, 64_000, 128_000))),
                    mem=draw(st.sampled_from((32_768, 131_072, 524_288))),
                    taints=draw(st.sampled_from(((), (), (), ("spot",), ("reserved",)))),
                    unschedulable=draw(st.sampled_from((False,) * 9 + (True,))),
                )
            )
        region = draw(st.sampled_from(("eu", "us")))
        stale = draw(st.sampled_from((False,) * 6 + (True,)))
        out.append(Member(Cluster(f"c{c}", {"region": region}), tuple(ns), stale))
    return tuple(out)


# -- jobs ------------------------------------------------------------------------------------


@st.composite
def jobs(draw: st.DrawFn) -> Job:
    kind = draw(st.sampled_from(("single", "shared", "gang", "elastic", "mixed", "cpu")))
    cpu = draw(st.sampled_from((0, 1_000, 1_000, 4_000, 16_000, 48_000)))
    mem = draw(st.sampled_from((0, 1_024, 1_024, 16_384, 131_072)))
    tolerations = draw(st.lists(st.sampled_from(TAINT_KEYS), max_size=2, unique=True))

    def ps(name: str, count: int, gpus: int = 0, milli: int = 0) -> PodSet:
        return pod_set(
            name, count, gpus=gpus, milli=milli, cpu=cpu, mem=mem, tolerations=tolerations
        )

    whole = st.sampled_from((1, 2, 4, 8))
    share = st.sampled_from((100, 250, 500, 700, 900))
    min_member = 0
    if kind == "single":
        sets = [ps("pod", 1, gpus=draw(whole))]
    elif kind == "shared":
        sets = [ps("pod", 1, milli=draw(share))]
    elif kind == "gang":
        sets = [ps("worker", draw(st.integers(2, 6)), gpus=draw(whole))]
    elif kind == "elastic":
        pods = draw(st.integers(2, 8))
        sets = [ps("worker", pods, gpus=draw(st.sampled_from((1, 2, 4))))]
        min_member = draw(st.integers(1, pods - 1))
    elif kind == "mixed":
        sets = [
            ps("launcher", 1),
            ps("worker", draw(st.integers(1, 4)), gpus=draw(st.sampled_from((1, 2, 4)))),
            ps("helper", draw(st.integers(1, 3)), milli=draw(share)),
        ]
        if draw(st.booleans()):
            min_member = draw(st.integers(1, sum(s.count for s in sets)))
    else:
        sets = [ps("pod", draw(st.integers(1, 3)))]
    return job(
        "template",
        *sets,
        min_member=min_member,
        gpu_types=draw(st.sampled_from(((), (), (), ("A100",), ("H100", "V100")))),
        selector=draw(st.sampled_from((None, None, None, {"region": "eu"}))),
    )


# -- operations ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Submit:
    job: Job


@dataclass(frozen=True)
class Forget:
    pick: int


@dataclass(frozen=True)
class Confirm:
    pick: int


@dataclass(frozen=True)
class Release:
    pick: int
    by_events: bool  # the cluster reports each pod deleted, instead of ledger.release()


@dataclass(frozen=True)
class Foreign:
    cluster: int
    node: int
    gpus: int
    cpu: int
    aim: bool  # at a node holding a reservation (if any), where evictions happen


@dataclass(frozen=True)
class ForeignGone:
    pick: int


@dataclass(frozen=True)
class Relabel:
    cluster: int
    node: int
    unschedulable: bool
    taint: str | None


@dataclass(frozen=True)
class NodeDown:
    cluster: int
    node: int
    aim: bool  # at a node holding a reservation (if any)


@dataclass(frozen=True)
class NodeUp:
    pick: int


@dataclass(frozen=True)
class Staleness:
    cluster: int
    stale: bool


Op = (
    Submit
    | Forget
    | Confirm
    | Release
    | Foreign
    | ForeignGone
    | Relabel
    | NodeDown
    | NodeUp
    | Staleness
)

_pick = st.integers(0, 99)
_submit = st.builds(Submit, jobs())
CORE_OPS: st.SearchStrategy[Op] = st.one_of(
    _submit,
    _submit,
    _submit,
    st.builds(Forget, _pick),
    st.builds(Confirm, _pick),
    st.builds(Release, _pick, st.booleans()),
)
EVENT_OPS: st.SearchStrategy[Op] = st.one_of(
    CORE_OPS,
    CORE_OPS,
    st.builds(
        Foreign,
        _pick,
        _pick,
        st.sampled_from((0, 1, 2, 4)),
        st.sampled_from((0, 8_000)),
        st.booleans(),
    ),
    st.builds(ForeignGone, _pick),
    st.builds(
        Relabel,
        _pick,
        _pick,
        st.booleans(),
        st.sampled_from((None, None, *TAINT_KEYS)),
    ),
    st.builds(NodeDown, _pick, _pick, st.booleans()),
    st.builds(NodeUp, _pick),
    st.builds(Staleness, _pick, st.booleans()),
)


# -- the driver ------------------------------------------------------------------------------


class Run:
    """One policy driven over one federation, audited after every step."""

    def __init__(self, fed: tuple[Member, ...], policy: str, seed: int) -> None:
        self.ledger = Ledger()
        for m in fed:
            self.ledger.add_cluster(m.cluster, m.nodes)
            self.ledger.set_stale(m.cluster.name, m.stale)
        self.books = Books(
            {m.cluster.name: m.cluster for m in fed},
            {m.cluster.name: {n.name: n for n in m.nodes} for m in fed},
            {m.cluster.name for m in fed if m.stale},
        )
        self.policy_name = policy
        self.policy = make_policy(policy, seed)
        self.down: list[tuple[str, Node]] = []
        self.steps = 0
        self.seen: Counter[str] = Counter()

    def note(self, what: str) -> None:
        """Count what happened, so the guards below can tell the streams do something."""
        self.seen[what] += 1
        if currently_in_test_context():
            event(what)

    def run(self, ops: list[Op]) -> None:
        self.audit()
        for op in ops:
            self.steps += 1
            self.step(op)
            self.audit()

    def step(self, op: Op) -> None:
        match op:
            case Submit(template):
                self.submit(dataclasses.replace(template, name=f"j{self.steps}"))
            case Forget(pick):
                if self.books.assumed:
                    key = sorted(self.books.assumed)[pick % len(self.books.assumed)]
                    self.ledger.forget(key)
                    del self.books.assumed[key]
            case Confirm(pick):
                if self.books.assumed:
                    key = sorted(self.books.assumed)[pick % len(self.books.assumed)]
                    self.ledger.confirm(key)
                    self.books.confirm(key)
            case Release(pick, by_events):
                if self.books.confirmed:
                    key = sorted(self.books.confirmed)[pick % len(self.books.confirmed)]
                    p = self.books.release(key)
                    if by_events:
                        for pod in p.pods:
                            assert self.ledger.apply(PodDeleted(p.cluster, pod.pod)) == []
                    else:
                        self.ledger.release(key, p)
            case Foreign():
                self.foreign(op)
            case ForeignGone(pick):
                if self.books.foreign:
                    gone = sorted(self.books.foreign)[pick % len(self.books.foreign)]
                    assert self.ledger.apply(PodDeleted(gone[0], gone[1])) == []
                    del self.books.foreign[gone]
            case Relabel(c, n, unschedulable, taint):
                found = self.node_at(c, n)
                if found is not None:
                    cluster, old = found
                    new = dataclasses.replace(
                        old,
                        unschedulable=unschedulable,
                        taints=(Taint(taint),) if taint else (),
                    )
                    # Allocatable is unchanged, so every reservation still fits.
                    assert self.ledger.apply(NodeUpdated(cluster, new)) == []
                    self.books.nodes[cluster][new.name] = new
            case NodeDown():
                self.node_down(op)
            case NodeUp(pick):
                if self.down:
                    cluster, back = self.down.pop(pick % len(self.down))
                    assert self.ledger.apply(NodeUpdated(cluster, back)) == []
                    self.books.nodes[cluster][back.name] = back
            case Staleness(c, stale):
                cluster = sorted(self.books.nodes)[c % len(self.books.nodes)]
                self.ledger.set_stale(cluster, stale)
                if stale:
                    self.books.stale.add(cluster)
                else:
                    self.books.stale.discard(cluster)

    # -- deciding ------------------------------------------------------------------------

    def submit(self, j: Job) -> None:
        decision = self.policy.decide(j, self.ledger.snapshot())
        if isinstance(decision, Unplaceable):
            self.note("refused")
            self.check_no(j, decision)
            return
        problems = placement_problems(self.books, j, decision)
        assert problems == [], problems
        if self.policy_name == "gang" or (self.policy_name == "auto" and j.total_pods > 1):
            self.check_one_gpu_type(decision)
        self.ledger.assume(decision)  # decided on a fresh snapshot: must not conflict
        self.books.assumed[decision.job] = decision
        self.note("placed a gang" if j.total_pods > 1 else "placed one pod")
        if len(decision.pods) < j.total_pods:
            self.note("placed part of an elastic gang")

    def check_one_gpu_type(self, p: Placement) -> None:
        nodes = self.books.nodes[p.cluster]
        types = {nodes[pod.node].gpu_type for pod in p.pods if pod.resources.gpu_request_milli}
        assert len(types) <= 1, f"gang {p.job} spans GPU types {types}"

    def check_no(self, j: Job, no: Unplaceable) -> None:
        clusters = set(self.books.nodes)
        by_cluster = {c: {r.code for r in no.for_cluster(c)} for c in clusters}
        assert {r.cluster for r in no.reasons} <= clusters
        for cluster, codes in by_cluster.items():
            assert codes, f"no reason given for {cluster}"
            labels = self.books.clusters[cluster].labels
            if cluster in self.books.stale:
                assert codes == {ReasonCode.STALE}
            elif any(labels.get(k) != v for k, v in j.cluster_selector.items()):
                assert codes == {ReasonCode.SELECTOR}
        if j.total_pods == 1:
            # One pod: "no" must mean that no node anywhere could take it.
            usage, _ = self.books.recount()
            (ps,) = j.pod_sets
            for cluster, nodes in self.books.nodes.items():
                if cluster in self.books.stale or any(
                    self.books.clusters[cluster].labels.get(k) != v
                    for k, v in j.cluster_selector.items()
                ):
                    continue
                for name, n in nodes.items():
                    assert not could_host(n, usage[(cluster, name)], j, ps), (
                        f"{j.key} was refused, but {cluster}/{name} could host it"
                    )

    # -- the clusters' own events --------------------------------------------------------

    def node_at(self, c: int, n: int) -> tuple[str, Node] | None:
        cluster = sorted(self.books.nodes)[c % len(self.books.nodes)]
        names = sorted(self.books.nodes[cluster])
        if not names:
            return None
        return cluster, self.books.nodes[cluster][names[n % len(names)]]

    def target(self, c: int, n: int, aim: bool) -> tuple[str, Node] | None:
        """A node by index; with ``aim``, one holding a reservation if there is one."""
        reserved = sorted(
            {(p.cluster, pp.node) for p in self.books.assumed.values() for pp in p.pods}
        )
        if aim and reserved:
            cluster, name = reserved[n % len(reserved)]
            return cluster, self.books.nodes[cluster][name]
        return self.node_at(c, n)

    def foreign(self, op: Foreign) -> None:
        found = self.target(op.cluster, op.node, op.aim)
        if found is None:
            return
        cluster, n = found
        res = Resources(gpus=op.gpus, cpu_milli=op.cpu)
        key = (cluster, n.name)
        # The cluster runs a pod only where reality (running pods, not our reservations)
        # has room for it.
        real, _ = self.books.recount(assumed=False)
        if real[key].cpu + op.cpu > n.allocatable.cpu_milli or op.gpus > whole_free(n, real[key]):
            return
        usage, _ = self.books.recount()
        beside = usage[key].cpu + op.cpu <= n.allocatable.cpu_milli and op.gpus <= whole_free(
            n, usage[key]
        )
        held = set(self.books.assumed)
        pod = f"foreign-{self.steps}"

        evicted = self.ledger.apply(PodBound(cluster, pod, n.name, res, None))

        self.books.foreign[(cluster, pod)] = (n.name, res)
        assert evicted == sorted(set(evicted))
        assert set(evicted) == held - set(self.ledger.reservations())
        if beside:
            assert evicted == [], "a pod that fits beside the reservations evicted some"
        if evicted:
            self.note("a foreign pod evicted a reservation")
        for job_key in evicted:
            p = self.books.assumed.pop(job_key)
            assert p.cluster == cluster and any(pp.node == n.name for pp in p.pods)

    def node_down(self, op: NodeDown) -> None:
        found = self.target(op.cluster, op.node, op.aim)
        if found is None:
            return
        cluster, gone = found
        expected = {
            key
            for key, p in self.books.assumed.items()
            if p.cluster == cluster and any(pp.node == gone.name for pp in p.pods)
        }
        assert set(self.ledger.apply(NodeDeleted(cluster, gone.name))) == expected
        if expected:
            self.note("a deleted node evicted a reservation")
        for key in expected:
            del self.books.assumed[key]
        self.books.drop_node(cluster, gone.name)
        self.down.append((cluster, gone))

    # -- the audit -------------------------------------------------------------------------

    def audit(self) -> None:
        problems = self.books.oversubscription()
        assert problems == [], problems
        snap = self.ledger.snapshot()
        assert dict(self.ledger.reservations()) == self.books.assumed
        problems = self.books.disagreements(snap)
        assert problems == [], problems
        problems = index_problems(snap)
        assert problems == [], problems


@pytest.mark.parametrize("policy", POLICY_NAMES)
@SETTINGS
@given(
    fed=members(),
    ops=st.lists(CORE_OPS, min_size=5, max_size=30),
    seed=st.integers(0, 2**16),
)
def test_decide_then_assume_never_oversubscribes_and_keeps_gangs_whole(
    policy: str, fed: tuple[Member, ...], ops: list[Op], seed: int
) -> None:
    Run(fed, policy, seed).run(ops)


@pytest.mark.parametrize("policy", POLICY_NAMES)
@SETTINGS
@given(
    fed=members(),
    ops=st.lists(EVENT_OPS, min_size=5, max_size=40),
    seed=st.integers(0, 2**16),
)
def test_cluster_events_interleaved_with_decisions_keep_the_books_true(
    policy: str, fed: tuple[Member, ...], ops: list[Op], seed: int
) -> None:
    Run(fed, policy, seed).run(ops)


def test_the_driver_sees_what_it_places() -> None:
    roomy = tuple(
        Member(Cluster(f"c{c}", {"region": "eu"}), tuple(nodes(f"c{c}", 4, gpus=8)), False)
        for c in range(2)
    )
    run = Run(roomy, "auto", 0)
    run.run([Submit(job("x", pod_set("w", 2, gpus=2))) for _ in range(20)])
    assert run.seen == {"placed a gang": 16, "refused": 4}  # 64 GPUs, 4 per job


RICH = {
    "placed a gang",
    "placed one pod",
    "placed part of an elastic gang",
    "refused",
}


@pytest.mark.parametrize(
    ("ops", "wanted"),
    [
        (CORE_OPS, RICH),
        (EVENT_OPS, {*RICH, "a foreign pod evicted a reservation"}),
        (EVENT_OPS, {*RICH, "a deleted node evicted a reservation"}),
    ],
    ids=["decisions", "foreign pods", "deleted nodes"],
)
def test_the_streams_reach_the_interesting_cases(
    ops: st.SearchStrategy[Op], wanted: set[str]
) -> None:
    """Guards the strategies: the properties above would pass vacuously on streams that
    never place a gang, never refuse, or never evict; these streams do all of it."""

    def rich(example: tuple[tuple[Member, ...], list[Op]]) -> bool:
        fed, stream = example
        run = Run(fed, "gang", 0)
        run.run(stream)
        return wanted <= set(run.seen)

    find(
        st.tuples(members(), st.lists(ops, min_size=20, max_size=60)),
        rich,
        # Derandomized, so the guard gives the same answer on every run.
        settings=settings(
            max_examples=300,
            deadline=None,
            database=None,
            phases=[Phase.generate],
            derandomize=True,
        ),
    )
