"""``fedbroker bench`` on tiny federations: the output's shape, and that the measured loop
(snapshot + decide + assume + forget) leaves the federation as it found it. No test here
looks at how fast anything is: a slow machine must not fail the suite."""

from __future__ import annotations

import gc
import json
import random
from collections.abc import Iterator
from typing import get_args

import pytest

from broker.bench import decisions as bench
from broker.bench.decisions import (
    build_federation,
    gang_jobs,
    ledger_state,
    measure,
    single_pod_jobs,
    snapshot_state,
)
from broker.cli.bench import SINGLE_POLICIES
from broker.cli.main import main
from broker.model import MILLI_PER_GPU, PolicyName
from policies import make_policy

TINY = ["bench", "--clusters", "2", "--nodes-per-cluster", "20", "--decisions", "6"]
POINT_KEYS = {
    "clusters": int,
    "nodes_per_cluster": int,
    "nodes": int,
    "gpus": int,
    "gpu_alloc_pct": float,
    "build_s": float,
    "prefill_s": float,
    "single_pod_decisions_per_s": float,
    "gang_decisions_per_s": float,
    "single_pod_decisions_per_cpu_s": float,
    "gang_decisions_per_cpu_s": float,
    "single_pod_unplaceable": int,
    "gang_unplaceable": int,
    "max_rss_mib": float,
}


def run_json(capsys: pytest.CaptureFixture[str], *extra: str) -> dict[str, object]:
    assert main([*TINY, *extra, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert isinstance(doc, dict)
    return doc


def test_json_has_the_issue_keys_with_positive_figures(
    capsys: pytest.CaptureFixture[str],
) -> None:
    doc = run_json(capsys)
    assert doc["clusters"] == 2
    assert doc["nodes"] == 40
    for key in (
        "single_pod_decisions_per_s",
        "gang_decisions_per_s",
        "single_pod_decisions_per_cpu_s",
        "gang_decisions_per_cpu_s",
        "max_rss_mib",
    ):
        value = doc[key]
        assert isinstance(value, float), key
        assert value > 0, key
    assert isinstance(doc["build_s"], float)
    assert isinstance(doc["prefill_s"], float)
    assert "scaling" not in doc


def test_single_pods_can_be_timed_with_any_policy_the_service_offers(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # The bench's choices are the service's policies that place single pods themselves.
    assert set(SINGLE_POLICIES) == set(get_args(PolicyName)) - {"auto", "gang"}
    assert run_json(capsys)["single_pod_policy"] == "binpack"
    doc = run_json(capsys, "--single-policy", "fgd-cpu")
    assert doc["single_pod_policy"] == "fgd-cpu"
    assert isinstance(doc["single_pod_decisions_per_s"], float)
    assert doc["single_pod_decisions_per_s"] > 0
    assert main([*TINY, "--single-policy", "fgd-cpu"]) == 0
    assert "by fgd-cpu;" in capsys.readouterr().out


def test_scaling_reports_every_size_in_node_order(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(bench, "SCALING_NODES", (20, 80))
    doc = run_json(capsys, "--scaling")
    scaling = doc["scaling"]
    assert isinstance(scaling, list)
    assert [p["nodes"] for p in scaling] == [20, 40, 80]
    assert [p["clusters"] for p in scaling] == [1, 2, 4]
    for point in scaling:
        assert set(point) == set(POINT_KEYS)
        for key, kind in POINT_KEYS.items():
            assert isinstance(point[key], kind), key
        assert point["single_pod_decisions_per_s"] > 0
        assert point["gang_decisions_per_s"] > 0
    main_point = next(p for p in scaling if p["nodes"] == 40)
    assert main_point["single_pod_decisions_per_s"] == doc["single_pod_decisions_per_s"]


def test_human_output_is_a_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(TINY) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    header = next(line for line in lines if "single/s" in line)
    assert "gang/s" in header
    assert "max RSS MiB" in header
    assert any(line.split()[:2] == ["40", "2"] for line in lines)


@pytest.mark.parametrize("target", [0.3, 0.6])
def test_measured_loop_leaves_no_residue(target: float) -> None:
    fed = build_federation(2, 60, seed=3, target=target)
    ledger = fed.ledger
    before = ledger_state(ledger)
    held = ledger.snapshot()
    held_before = snapshot_state(held)
    rng = random.Random(4)
    singles = measure(ledger, make_policy("binpack"), single_pod_jobs(rng, 16), 40, warmup=5)
    gangs = measure(ledger, make_policy("gang"), gang_jobs(rng, 4), 12, warmup=2)

    assert ledger_state(ledger) == before
    assert snapshot_state(held) == held_before  # a snapshot taken earlier never changes
    assert ledger.reservations() == {}
    assert singles.unplaceable < singles.decisions  # the loop did assume and forget
    if target < 0.5:
        assert gangs.unplaceable < gangs.decisions


def test_prefill_is_near_the_target_and_varied() -> None:
    fed = build_federation(4, 50, seed=1)
    assert 50 <= fed.gpu_alloc_pct <= 70
    assert fed.gpus == 4 * 50 * 8
    snapshot = fed.ledger.snapshot()
    states = [s for view in snapshot.clusters.values() for s in view.nodes.values()]
    # Whole free GPUs from none to all, and shared GPUs part used: varied buckets.
    assert {s.whole_free for s in states} >= {0, 8}
    assert len({s.whole_free for s in states}) >= 5
    assert any(0 < f < MILLI_PER_GPU for s in states for f in s.gpu_free)
    assert len({s.node.gpu_type for s in states}) == 4


def test_the_federation_depends_only_on_the_seed() -> None:
    first = ledger_state(build_federation(2, 20, seed=7).ledger)
    assert ledger_state(build_federation(2, 20, seed=7).ledger) == first
    assert ledger_state(build_federation(2, 20, seed=8).ledger) != first


def test_the_measured_jobs_have_the_issue_shapes() -> None:
    rng = random.Random(0)
    sizes = {
        (job.pod_sets[0].resources.gpus, job.pod_sets[0].resources.shared)
        for job in single_pod_jobs(rng)
    }
    assert {(1, False), (2, False), (4, False), (0, True)} <= sizes
    for job in gang_jobs(rng):
        assert [(ps.count, ps.resources.gpus) for ps in job.pod_sets] == [(8, 8)]


@pytest.fixture
def gc_restored() -> Iterator[None]:
    """The benches settle the heap (``gc.freeze``, the young threshold) as ``serve`` does;
    in the test process that is undone afterwards."""
    threshold = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*threshold)


@pytest.mark.usefixtures("gc_restored")
def test_cycle_bench_places_until_full_and_accounts_for_every_job(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["bench", "--cycle", "--clusters", "2", "--nodes-per-cluster", "20"]
    assert main([*argv, "--queued", "3000", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    cycles = doc["cycles"]
    placed = sum(c["placed"] for c in cycles)
    assert placed > 0 and cycles[0]["placed"] > 0
    assert placed + doc["still_queued"] == doc["queued"] == 3000
    assert cycles[-1]["placed"] == 0  # it ran until the federation took nothing more
    # maxJobsPerCycle bounds the decisions; jobs of a shape known not to fit wait undecided.
    assert all(c["placed"] <= c["decided"] <= 1000 for c in cycles)
    assert cycles[-1]["decided"] == 0 and cycles[-1]["waiting"] == doc["still_queued"]
    assert doc["max_cycle_s"] >= doc["steady_cycle_s"] > 0
    assert doc["max_rss_mib"] > 0


def test_topology_bench_times_the_same_gangs_with_and_without_requests(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["bench", "--topology", "--clusters", "2", "--nodes-per-cluster", "40"]
    assert main([*argv, "--decisions", "6", "--rack-nodes", "4", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert set(doc["per_s"]) == {"none", "required_rack", "preferred_rack"}
    assert all(v > 0 for v in doc["per_s"].values())
    assert set(doc["ratio"]) == {"required_rack", "preferred_rack"}
    assert doc["nodes"] == 80 and doc["rack_nodes"] == 4 and doc["block_racks"] == 8


def test_the_topology_federation_lays_racks_of_alike_nodes_inside_blocks() -> None:
    from broker.bench.topology import BLOCK, RACK, build_topology_federation

    ledger = build_topology_federation(1, 40, 0, rack_nodes=4, block_racks=3)
    view = ledger.snapshot().clusters["cluster-000"]
    assert view.cluster.topology_levels == (BLOCK, RACK)
    racks: dict[str, set[object]] = {}
    for state in view.nodes.values():
        node = state.node
        assert node.labels[RACK].startswith(node.labels[BLOCK] + "-")
        racks.setdefault(node.labels[RACK], set()).add((node.gpu_type, node.allocatable))
    assert all(len(kinds) == 1 for kinds in racks.values())  # a rack holds one kind of node
    assert len(racks) >= 40 // 4
