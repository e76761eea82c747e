"""FGD's per-shape memo of node scores changes no decision: the fgd family decides, pod by
pod, exactly as the same chooser scoring every node afresh."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from broker.core.decide import decide
from broker.model import GpuType, Job, Node, Placement, PodSet, Resources
from broker.sim.fill import federation
from policies.fgd import FgdChooser, PodShape
from policies.fgd_cpu import FgdCpuChooser
from policies.fgd_share import FgdShareChooser
from policies.scoring import NodeScoringPolicy, by_name

WORKLOAD = (
    (PodShape(8000, 1000, 1), 0.4),
    (PodShape(4000, 500, 1), 0.3),
    (PodShape(16000, 0, 0), 0.2),
    (PodShape(32000, 1000, 4), 0.1),
)


def _unmemoised(cls: type[FgdChooser]) -> FgdChooser:
    class Afresh(cls):  # type: ignore[valid-type,misc]
        def _memo_for(self, res: Resources) -> dict:  # type: ignore[type-arg]
            return {}

    return Afresh(WORKLOAD)


# Nodes alike in GPUs and CPU but not in memory share a memo entry only with nodes where
# the pod's memory fits alike: the memory column checks that the key keeps them apart.
_NODES = st.lists(
    st.tuples(st.sampled_from([2, 4, 8]), st.sampled_from([16, 64]), st.sampled_from([8, 64])),
    min_size=2,
    max_size=8,
)
_PODS = st.lists(
    st.tuples(
        st.sampled_from([(1, 0), (0, 250), (0, 500), (0, 750), (2, 0), (4, 0), (0, 0)]),
        st.sampled_from([1, 4, 8, 16]),
        st.sampled_from([1, 16, 48]),
    ),
    min_size=1,
    max_size=40,
)


@settings(max_examples=60, deadline=None)
@given(
    spec=_NODES,
    pods=_PODS,
    cls=st.sampled_from([FgdChooser, FgdShareChooser, FgdCpuChooser]),
)
def test_memoised_choices_are_those_of_scoring_every_node_afresh(
    spec: list[tuple[int, int, int]],
    pods: list[tuple[tuple[int, int], int, int]],
    cls: type[FgdChooser],
) -> None:
    spec = [(8, 64, 64), *spec]  # the first pod always fits this one, empty
    nodes = [
        Node(f"n-{i}", GpuType("G2"), Resources(gpus=g, cpu_milli=c * 1000, memory_mib=m << 10))
        for i, (g, c, m) in enumerate(spec)
    ]
    memoised = NodeScoringPolicy("m", cls(WORKLOAD), by_name, best_cluster=True)
    afresh = NodeScoringPolicy("a", _unmemoised(cls), by_name, best_cluster=True)
    ledger = federation(nodes, 1)
    placed = 0
    for i, ((gpus, milli), cores, gib) in enumerate(pods):
        res = Resources(gpus=gpus, gpu_milli=milli, cpu_milli=cores * 1000, memory_mib=gib << 10)
        job = Job(f"p-{i}", (PodSet("pod", 1, res),))
        want = decide(job, ledger.snapshot(), afresh).decision
        got = decide(job, ledger.snapshot(), memoised).decision
        assert type(got) is type(want)
        if isinstance(want, Placement):
            assert isinstance(got, Placement)
            assert [(p.node, p.gpus) for p in got.pods] == [(p.node, p.gpus) for p in want.pods]
            ledger.assume(got)
            placed += 1
    assert placed
