"""The fgd- variants: deterministic for a seed; fgd-share's one departure from fgd (the
fullest GPU among equally scored ones takes a shared pod). fgd-cpu's own: test_fgd_cpu."""

from __future__ import annotations

import io
import json
import random

import pytest

from broker.model import GpuType, Node, NodeState, Resources
from broker.sim.fill import fill
from broker.sim.traces import TracePod
from policies import POLICY_NAMES, make_policy
from policies.fgd import FgdChooser, PodShape
from policies.fgd_share import FgdShareChooser


def nodes(n: int) -> list[Node]:
    res = Resources(gpus=4, cpu_milli=32_000, memory_mib=131_072)
    return [Node(f"n-{i:02d}", GpuType("G2"), res) for i in range(n)]


def pods(n: int, seed: int) -> list[TracePod]:
    rng = random.Random(seed)
    shapes = [(1, 0), (0, 250), (0, 500), (2, 0), (0, 0)]
    out = []
    for i in range(n):
        gpus, milli = shapes[rng.randrange(len(shapes))]
        res = Resources(gpus=gpus, gpu_milli=milli, cpu_milli=rng.choice((1000, 4000)))
        out.append(TracePod(f"p-{i:03d}", res, frozenset()))
    return out


def placements(policy: str, seed: int) -> list[dict[str, object]]:
    out = io.StringIO()
    fill(nodes(4), pods(40, seed), [policy], 1, [seed], dump=out)
    return [json.loads(line) for line in out.getvalue().splitlines()]


VARIANTS = ("fgd-share", "fgd-cpu", "fgd-lp")


@pytest.mark.parametrize("policy", VARIANTS)
def test_same_seed_gives_the_same_placements(policy: str) -> None:
    first = placements(policy, 3)
    assert first  # something was placed
    assert placements(policy, 3) == first
    assert placements(policy, 4) != first  # the seed does drive the run


@pytest.mark.parametrize("policy", VARIANTS)
def test_is_a_known_policy_name(policy: str) -> None:
    assert policy in POLICY_NAMES
    assert make_policy(policy).name == policy


def test_a_shared_pod_takes_the_fullest_of_equally_scored_gpus() -> None:
    # With only quarter-GPU pods expected, either GPU leaves no fragment: FGD scores them
    # alike; fgd takes the lowest index, fgd-share the GPU that is already shared.
    state = NodeState.of(nodes(1)[0], 32_000, 131_072, (1000, 750, 1000, 1000))
    quarter = Resources(gpu_milli=250, cpu_milli=1000)
    workload = ((PodShape(1000, 250, 1), 1.0),)
    fgd_score = FgdChooser(workload).score(state, quarter)
    share_score = FgdShareChooser(workload).score(state, quarter)
    assert fgd_score is not None and share_score is not None
    assert fgd_score[0] == share_score[0]
    assert fgd_score[1] == (0,)
    assert share_score[1] == (1,)
