"""fgd-cpu: the stranded-GPU measure, computed by hand, and where it moves a pod.

Determinism for a seed is in test_fgd_variants."""

from __future__ import annotations

import io
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.model import GpuType, Job, Node, Placement, PodSet, Resources
from broker.sim.fill import federation, fill
from broker.sim.traces import TracePod
from policies import make_policy
from policies.fgd import PodShape
from policies.fgd_cpu import cpu_per_gpu_milli, stranded

G2 = GpuType("G2")


def test_the_ratio_is_every_pods_cpu_over_every_pods_gpu_request() -> None:
    workload = (
        (PodShape(10_000, 1000, 1), 0.5),  # 10 cores for one GPU
        (PodShape(4_000, 500, 1), 0.25),  # 4 cores for half a GPU
        (PodShape(16_000, 0, 0), 0.25),  # CPU-only: its CPU counts, it asks no GPU
    )
    cpu = 0.5 * 10_000 + 0.25 * 4_000 + 0.25 * 16_000
    gpu = 0.5 * 1000 + 0.25 * 500
    assert cpu_per_gpu_milli(workload) == pytest.approx(cpu / gpu)
    assert cpu_per_gpu_milli(((PodShape(16_000, 0, 0), 1.0),)) is None


@pytest.mark.parametrize(
    ("cpu_free", "gpu_free", "ratio", "expected"),
    [
        (40_000, 4000, 10.0, 0.0),  # 10 cores per GPU: exactly fed
        (20_000, 4000, 10.0, 2000.0),  # half the CPU: half the GPUs stranded
        (0, 3000, 10.0, 3000.0),  # no CPU: every free GPU stranded
        (100_000, 2000, 10.0, 0.0),  # CPU to spare is not negative stranding
        (5_000, 0, 10.0, 0.0),  # no free GPU: nothing to strand
    ],
)
def test_stranded_gpu_milli(cpu_free: int, gpu_free: int, ratio: float, expected: float) -> None:
    assert stranded(cpu_free, gpu_free, ratio) == pytest.approx(expected)


def _node(name: str, gpus: int, cores: int) -> Node:
    return Node(name, G2, Resources(gpus=gpus, cpu_milli=cores * 1000, memory_mib=1 << 20))


def _node_of(policy: str, job: Job, nodes: list[Node], busy: dict[str, Job]) -> str:
    """Where ``policy`` puts ``job`` once ``busy`` (node name: the job filling it) is bound."""
    workload = ((PodShape(10_000, 1000, 1), 1.0),)  # 10 cores per GPU
    ledger = federation(nodes, 1)
    for node, filler in busy.items():
        chosen = make_policy("firstfit").decide(filler, ledger.snapshot())
        assert isinstance(chosen, Placement) and chosen.pods[0].node == node
        ledger.assume(chosen)
    placement = make_policy(policy, workload=workload).decide(job, ledger.snapshot())
    assert isinstance(placement, Placement)
    return placement.pods[0].node


def test_a_cpu_only_pod_goes_where_it_strands_no_gpu() -> None:
    # a-busy: 2 GPUs taken, 120 cores free. b-free: 2 GPUs free and 24 cores, 4 more than
    # the 20 they need. An 8-core CPU-only pod on b-free still leaves a 10-core pod room
    # (FGD sees no change there), but strands 400 milli at 10 cores per GPU. BestFit, FGD's
    # tie-break, prefers b-free (fewer free resources left); fgd-cpu prefers a-busy.
    nodes = [_node("a-busy", 2, 122), _node("b-free", 2, 24)]
    busy = {"a-busy": Job("filler", (PodSet("p", 1, Resources(gpus=2, cpu_milli=2000)),))}
    cpu_pod = Job("cpu", (PodSet("p", 1, Resources(cpu_milli=8000)),))
    assert _node_of("fgd", cpu_pod, nodes, busy) == "b-free"
    assert _node_of("fgd-cpu", cpu_pod, nodes, busy) == "a-busy"


def _dump(policy: str, nodes: list[Node], pods: list[TracePod]) -> list[dict[str, object]]:
    out = io.StringIO()
    fill(nodes, pods, [policy], 1, [0], dump=out)
    return [json.loads(line) for line in out.getvalue().splitlines()]


_SHAPES = st.sampled_from([(1, 0), (0, 250), (0, 500), (2, 0), (0, 0), (4, 0)])


@settings(max_examples=40, deadline=None)
@given(
    gpus=st.lists(st.sampled_from([2, 4, 8]), min_size=1, max_size=5),
    shapes=st.lists(st.tuples(_SHAPES, st.integers(1, 16)), min_size=1, max_size=30),
)
def test_with_cpu_to_spare_everywhere_it_places_exactly_as_fgd(
    gpus: list[int], shapes: list[tuple[tuple[int, int], int]]
) -> None:
    # 1,000 cores a node: no placement strands a GPU, so only FGD's score decides.
    nodes = [_node(f"n-{i}", g, 1000) for i, g in enumerate(gpus)]
    shapes = [((1, 0), 8), *shapes]  # the protocol tunes the list by GPU request
    pods = [
        TracePod(f"p-{i:02d}", Resources(gpus=n, gpu_milli=m, cpu_milli=cores * 1000), frozenset())
        for i, ((n, m), cores) in enumerate(shapes)
    ]
    assert _dump("fgd-cpu", nodes, pods) == _dump("fgd", nodes, pods)
