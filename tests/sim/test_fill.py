"""The fill protocol of the FGD paper on the broker's core: protocol rules on small inputs,
and the acceptance figures on the real openb trace (skipped when the traces are absent)."""

from __future__ import annotations

import io
import json
import random
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import pytest

from broker.model import GpuType, Node, Resources
from broker.sim.fill import FillResult, fill, mean_by_policy_and_load, tune
from broker.sim.traces import TracePod, read_openb_nodes, read_openb_pods

OPENB = "alibaba-gpu-v2023"
OpenB = tuple[list[Node], list[TracePod]]


@pytest.fixture
def openb(trace_file: Callable[[str], Path]) -> OpenB:
    """The openb GPU node list and default pod list (skips when the traces are absent)."""
    nodes = read_openb_nodes(trace_file(f"{OPENB}/openb_node_list_gpu_node.csv"))
    return nodes, read_openb_pods(trace_file(f"{OPENB}/openb_pod_list_default.csv"))


def pod(name: str, gpus: int = 0, milli: int = 0, cpu: int = 1000) -> TracePod:
    return TracePod(
        name, Resources(gpus=gpus, gpu_milli=milli, cpu_milli=cpu, memory_mib=1024), frozenset()
    )


def nodes(n: int, gpus: int = 8) -> list[Node]:
    res = Resources(gpus=gpus, cpu_milli=96_000, memory_mib=393_216)
    return [Node(f"n-{i:03d}", GpuType("G2"), res) for i in range(n)]


def test_tune_grows_to_just_below_130_percent_with_named_copies() -> None:
    pods = [pod("a", gpus=1), pod("b", milli=500), pod("c", gpus=2), pod("d")]
    total = 40_000
    tuned = tune(pods, total, random.Random(7))
    load = sum(p.resources.gpu_request_milli for p in tuned)
    assert load <= total * 1.3
    assert load > total * 1.3 - 2000  # the next copy would have passed 130 %
    names = [p.name for p in tuned]
    assert len(set(names)) == len(names)
    copies = [n for n in names if "#" in n]
    assert copies and all(n.split("#")[0] in "abcd" for n in copies)
    assert tune(pods, total, random.Random(7)) == tuned  # the seed decides
    assert tune(pods, total, random.Random(8)) != tuned


def test_tune_shrinks_a_list_above_130_percent() -> None:
    pods = [pod(f"p{i}", gpus=1) for i in range(100)]
    tuned = tune(pods, 50_000, random.Random(1))
    assert sum(p.resources.gpu_request_milli for p in tuned) == 65_000
    assert {p.name for p in tuned} <= {p.name for p in pods}


def test_recording_points_follow_arrivals() -> None:
    pods = [pod(f"p{i}", gpus=1 + i % 4) for i in range(60)]
    results = fill(nodes(4), pods, ["binpack"], 1, [3], loads=[50, 80, 130])
    assert [r.load_pct for r in results] == [50, 80, 130]
    allocs = [r.gpu_alloc_pct for r in results]
    assert allocs == sorted(allocs)
    # 32 GPUs: the list is tuned to 41.6 GPUs of demand, at most 32 can be placed.
    assert 50 <= allocs[-1] <= 100
    assert results[-1].placed + results[-1].failed == len(tune(pods, 32_000, random.Random(3)))


def test_parallel_runs_equal_serial_runs() -> None:
    pods = [pod(f"p{i}", gpus=i % 3, milli=0 if i % 3 else 300) for i in range(80)]
    args = (nodes(6), pods, ["fgd", "random", "binpack"], 2, [1, 2])
    assert fill(*args, workers=2) == fill(*args, workers=1)


def audit(dump: str, node_list: list[Node]) -> None:
    """Recompute every node's usage from the dumped placements alone."""
    alloc = {n.name: n.allocatable for n in node_list}
    cpu: dict[str, int] = defaultdict(int)
    mem: dict[str, int] = defaultdict(int)
    whole: dict[str, int] = defaultdict(int)
    shared: dict[tuple[str, int], int] = defaultdict(int)
    for line in dump.splitlines():
        p = json.loads(line)
        node = p["node"]
        cpu[node] += p["cpu_milli"]
        mem[node] += p["memory_mib"]
        if p["gpu_index"] is None:
            whole[node] += p["num_gpu"]
        else:
            shared[(node, p["gpu_index"])] += p["gpu_milli"]
    for node, res in alloc.items():
        assert cpu[node] <= res.cpu_milli and mem[node] <= res.memory_mib, node
        shared_gpus = {i for (n, i) in shared if n == node}
        assert whole[node] + len(shared_gpus) <= res.gpus, node
    assert all(milli <= 1000 for milli in shared.values())


@pytest.mark.slow
def test_dumped_placements_on_openb_never_oversubscribe(openb: OpenB) -> None:
    node_list, pods = openb
    for policy in ("binpack", "fgd", "gang"):
        out = io.StringIO()
        results = fill(node_list, pods, [policy], 4, [5], dump=out)
        assert len(out.getvalue().splitlines()) == results[-1].placed
        audit(out.getvalue(), node_list)


def mean_at_130(results: list[FillResult]) -> dict[str, float]:
    rows = mean_by_policy_and_load(results)
    return {str(r["policy"]): float(str(r["gpu_alloc_pct"])) for r in rows if r["load_pct"] == 130}


@pytest.mark.slow
def test_openb_default_reaches_the_papers_figures(openb: OpenB) -> None:
    """binpack >= 93.0 % (paper's BestFit 93.08) and fgd >= 95.3 % (paper's FGD 95.39) at
    130 % load over 10 seeds on one cluster; split into 4 clusters neither loses a point."""
    node_list, pods = openb
    seeds = list(range(10))
    one = mean_at_130(fill(node_list, pods, ["binpack", "fgd"], 1, seeds, workers=2))
    assert one["binpack"] >= 93.0
    assert one["fgd"] >= 95.3
    four = mean_at_130(fill(node_list, pods, ["binpack", "fgd"], 4, seeds, workers=2))
    for policy, alloc in one.items():
        assert four[policy] >= alloc - 1.0, policy


@pytest.mark.slow
def test_baselines_lose_at_most_a_point_when_split(openb: OpenB) -> None:
    node_list, pods = openb
    policies = ["gang", "spread", "firstfit", "random"]
    seeds = [0, 1, 2]
    one = mean_at_130(fill(node_list, pods, policies, 1, seeds, workers=2))
    four = mean_at_130(fill(node_list, pods, policies, 4, seeds, workers=2))
    for policy in policies:
        assert four[policy] >= one[policy] - 1.0, policy


@pytest.mark.slow
def test_fgd_lp_reaches_96_percent_on_openb_default(openb: OpenB) -> None:
    """The target fgd-lp was built for: 96.0 % at 130 % load, mean of seeds 1..5, one
    cluster (docs/simulator.md has the per-seed figures and the ablation)."""
    node_list, pods = openb
    one = mean_at_130(fill(node_list, pods, ["fgd-lp"], 1, [1, 2, 3, 4, 5], workers=2))
    assert one["fgd-lp"] >= 96.0


@pytest.mark.slow
@pytest.mark.parametrize("held_out", ["cpu250", "multigpu50", "gpushare40"])
def test_fgd_lp_loses_no_more_than_a_tenth_against_fgd_on_the_held_out_lists(
    openb: OpenB, trace_file: Callable[[str], Path], held_out: str
) -> None:
    node_list, _ = openb
    pods = read_openb_pods(trace_file(f"{OPENB}/openb_pod_list_{held_out}.csv"))
    both = mean_at_130(fill(node_list, pods, ["fgd", "fgd-lp"], 1, [1, 2, 3, 4, 5], workers=2))
    assert both["fgd-lp"] >= both["fgd"] - 0.1
