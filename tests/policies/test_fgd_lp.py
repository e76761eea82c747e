"""fgd-lp: a shared pod takes the GPU that loses the least pattern value of the share mix,
in the whole federation; every other pod is placed as fgd-cpu places it."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from broker.core.decide import decide
from broker.model import GpuType, Job, Node, NodeState, Placement, PodSet, Resources
from broker.sim.fill import federation
from policies.fgd import PodShape
from policies.fgd_cpu import FgdCpuChooser
from policies.fgd_lp import FgdLpChooser, share_mix
from policies.scoring import NodeScoringPolicy, by_name

# One 650, one 550, one 220 for every two 320s and two 230s: at the programme's prices
# (2/3, 2/3, 1/12, 1/3, 1/4) 650 + 320, 550 + 230 + 220, 3 x 320 and 4 x 230 fill a GPU.
MIX = {650: 1, 550: 1, 320: 2, 230: 2, 220: 1}
WORKLOAD = (
    (PodShape(8000, 1000, 1), 0.4),
    *((PodShape(4000, size, 1), 0.6 * n / 7) for size, n in MIX.items()),
    (PodShape(16000, 0, 0), 0.0),
)


def _node(name: str, gpus: int = 4, cores: int = 64) -> Node:
    return Node(
        name, GpuType("G2"), Resources(gpus=gpus, cpu_milli=cores * 1000, memory_mib=1 << 18)
    )


def test_the_share_mix_is_the_workloads_shared_shapes() -> None:
    mix = share_mix(WORKLOAD)
    assert set(mix) == set(MIX)
    assert mix[320] == 2 * mix[650]


def test_a_230_goes_beside_the_550_not_the_650() -> None:
    # GPU 0 has a 650 on it (350 free), GPU 1 a 550 (450 free). FGD and fgd-cpu take the
    # tighter GPU 0 and leave 120 milli nothing in the mix fits; fgd-lp keeps GPU 0 for a
    # 320 and puts the 230 where a 220 completes the GPU.
    state = NodeState.of(_node("n"), 64_000, 1 << 18, (350, 450, 1000, 1000))
    pod = Resources(gpu_milli=230, cpu_milli=4000)
    cpu = FgdCpuChooser(WORKLOAD).score(state, pod)
    lp = FgdLpChooser(WORKLOAD).score(state, pod)
    assert cpu is not None and cpu[1] == (0,)
    assert lp is not None and lp[1] == (1,)


_NODES = st.lists(
    st.tuples(st.sampled_from([1, 2, 4, 8]), st.sampled_from([8, 32, 96])), min_size=1, max_size=6
)
_PODS = st.lists(
    st.tuples(
        st.sampled_from(
            [(0, 650), (0, 550), (0, 320), (0, 230), (0, 220), (0, 100), (1, 0), (2, 0), (0, 0)]
        ),
        st.sampled_from([1, 4, 12]),
    ),
    min_size=1,
    max_size=60,
)


@settings(max_examples=60, deadline=None)
@given(spec=_NODES, pods=_PODS)
def test_a_share_loses_the_least_of_any_gpu_that_fits_and_other_pods_place_as_fgd_cpu(
    spec: list[tuple[int, int]], pods: list[tuple[tuple[int, int], int]]
) -> None:
    spec = [(8, 96), *spec]  # the first pod, a share, always fits this one, empty
    pods = [((0, 650), 1), *pods]
    lp_chooser = FgdLpChooser(WORKLOAD)
    lp = NodeScoringPolicy("fgd-lp", lp_chooser, by_name, best_cluster=True)
    cpu = NodeScoringPolicy("fgd-cpu", FgdCpuChooser(WORKLOAD), by_name, best_cluster=True)
    ledger = federation([_node(f"n-{i}", g, c) for i, (g, c) in enumerate(spec)], 2)
    shares = 0
    for i, ((gpus, milli), cores) in enumerate(pods):
        res = Resources(gpus=gpus, gpu_milli=milli, cpu_milli=cores * 1000)
        job = Job(f"p-{i}", (PodSet("pod", 1, res),))
        snapshot = ledger.snapshot()
        got = decide(job, snapshot, lp).decision
        if not res.shared:
            want = decide(job, snapshot, cpu).decision
            assert type(got) is type(want)
            if isinstance(want, Placement):
                assert isinstance(got, Placement)
                assert (got.cluster, got.pods[0].node, got.pods[0].gpus) == (
                    want.cluster,
                    want.pods[0].node,
                    want.pods[0].gpus,
                )
        else:
            fits = [
                lp_chooser.loss.milli(free, milli)
                for view in snapshot.clusters.values()
                for state in view.nodes.values()
                if state.gpus_for(res) is not None
                for free in state.gpu_free
                if free >= milli
            ]
            assert isinstance(got, Placement) == bool(fits)
            if isinstance(got, Placement):
                pod = got.pods[0]
                free = snapshot.clusters[got.cluster].nodes[pod.node].gpu_free[pod.gpus[0]]
                assert lp_chooser.loss.milli(free, milli) == min(fits)
                shares += 1
        if isinstance(got, Placement):
            ledger.assume(got)
    assert shares >= 1
