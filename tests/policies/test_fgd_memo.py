"""FGD's memos change no decision: the fgd family decides, job by job, exactly as the same
chooser scoring every node afresh. Two memos are checked: a node's score by its state and
the pod's shape (the chooser's), and a node group's best node for a shape (in the cluster
view's memo, forgotten when a node of the group changes)."""

from __future__ import annotations

from collections.abc import Sequence

from hypothesis import given, settings
from hypothesis import strategies as st

from broker.core.decide import decide
from broker.model import GpuType, Job, Node, NodeGroup, Placement, PodSet, Resources
from broker.sim.fill import federation
from policies.fgd import _TAGS, _TAGS_LIMIT, FgdChooser, PodShape
from policies.fgd_cpu import FgdCpuChooser
from policies.fgd_lp import FgdLpChooser
from policies.fgd_share import FgdShareChooser
from policies.framework import Choice, Overlay, candidate_states
from policies.scoring import NodeScoringPolicy, by_name

WORKLOAD = (
    (PodShape(8000, 1000, 1), 0.4),
    (PodShape(4000, 500, 1), 0.3),
    (PodShape(16000, 0, 0), 0.2),
    (PodShape(32000, 1000, 4), 0.1),
)


def _afresh(cls: type[FgdChooser]) -> FgdChooser:
    """The chooser with both memos bypassed: every candidate node scored on every call."""

    class Afresh(cls):  # type: ignore[valid-type,misc]
        def _memo_for(self, res: Resources) -> dict:  # type: ignore[type-arg]
            return {}

        def __call__(
            self, overlay: Overlay, groups: Sequence[NodeGroup], res: Resources
        ) -> Choice | None:
            states = candidate_states(overlay, groups, res.gpu_request_milli)
            return self._best(states, res)  # type: ignore[no-any-return]

    return Afresh(WORKLOAD)


# Nodes alike in GPUs and CPU but not in memory share a score memo entry only where the
# pod's memory fits alike: the memory column checks that the key keeps them apart. Two GPU
# types and two clusters make several node groups, each with its own best node.
_NODES = st.lists(
    st.tuples(
        st.sampled_from([2, 4, 8]),
        st.sampled_from([16, 64]),
        st.sampled_from([8, 64]),
        st.sampled_from(["G2", "T4"]),
    ),
    min_size=2,
    max_size=10,
)
_JOBS = st.lists(
    st.tuples(
        st.sampled_from([(1, 0), (0, 250), (0, 500), (0, 750), (2, 0), (4, 0), (0, 0)]),
        st.sampled_from([1, 4, 8, 16]),
        st.sampled_from([1, 16, 48]),
        st.sampled_from([1, 1, 1, 2, 3]),  # pods: a gang's later pods see the earlier ones
    ),
    min_size=1,
    max_size=40,
)


@settings(max_examples=80, deadline=None)
@given(
    spec=_NODES,
    jobs=_JOBS,
    cls=st.sampled_from([FgdChooser, FgdShareChooser, FgdCpuChooser, FgdLpChooser]),
)
def test_memoised_choices_are_those_of_scoring_every_node_afresh(
    spec: list[tuple[int, int, int, str]],
    jobs: list[tuple[tuple[int, int], int, int, int]],
    cls: type[FgdChooser],
) -> None:
    spec = [(8, 64, 64, "G2"), *spec]  # the first pod always fits this one, empty
    nodes = [
        Node(f"n-{i}", GpuType(t), Resources(gpus=g, cpu_milli=c * 1000, memory_mib=m << 10))
        for i, (g, c, m, t) in enumerate(spec)
    ]
    memoised = NodeScoringPolicy("m", cls(WORKLOAD), by_name, best_cluster=True)
    afresh = NodeScoringPolicy("a", _afresh(cls), by_name, best_cluster=True)
    ledger = federation(nodes, 2)
    placed = 0
    for i, ((gpus, milli), cores, gib, count) in enumerate(jobs):
        res = Resources(gpus=gpus, gpu_milli=milli, cpu_milli=cores * 1000, memory_mib=gib << 10)
        job = Job(f"p-{i}", (PodSet("pod", count, res),))
        want = decide(job, ledger.snapshot(), afresh).decision
        got = decide(job, ledger.snapshot(), memoised).decision
        assert type(got) is type(want)
        if isinstance(want, Placement):
            assert isinstance(got, Placement)
            assert got.cluster == want.cluster
            assert [(p.node, p.gpus) for p in got.pods] == [(p.node, p.gpus) for p in want.pods]
            ledger.assume(got)
            placed += 1
    assert placed or jobs[0][3] > 1  # a single first pod always fits the big node


def test_choosers_made_again_and_again_keep_distinct_tags_and_a_bounded_table() -> None:
    # The service makes an fgd policy again whenever its pod mix moves: the table naming
    # the choosers' view-memo entries is forgotten past its limit, never reused.
    tags = [FgdChooser(((PodShape(1000 + i, 1000, 1), 1.0),))._tag for i in range(1_050)]
    assert len(set(tags)) == len(tags)
    assert len(_TAGS) <= _TAGS_LIMIT + 1
