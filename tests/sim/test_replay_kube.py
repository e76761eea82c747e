"""kube-default in the replay: gangs placed pod by pod without atomicity hold GPUs while
they wait for their last pod, where the core places a gang whole or not at all; the
report's figures worked out by hand; the CLI prints them for both."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from broker.cli.main import main
from broker.model import GpuType, Job, Node, PodSet, Resources
from broker.sim.arrivals import Arrival, Workload
from broker.sim.replay import ReplayConfig, ReplayResult, federation, replay_policy
from broker.sim.replay_kube import KubeRun, run_events
from policies import make_policy


def one_node() -> list[Node]:
    return [Node("n-0", GpuType("G2"), Resources(gpus=8, cpu_milli=96_000, memory_mib=393_216))]


def job(name: str, pods: int, gpus: int) -> Job:
    return Job(name, (PodSet("p", pods, Resources(gpus=gpus, cpu_milli=1000)),))


# One node of 8 GPUs, 200 s. ``a`` holds half of it past the end; gang ``g`` (2 x 4 GPUs)
# finds room for one pod only; ``c`` (4 GPUs for 30 s) comes last.
STUCK = Workload(
    (
        Arrival(0.0, job("a", 1, 4), 1000.0),
        Arrival(10.0, job("g", 2, 4), 50.0),
        Arrival(20.0, job("c", 1, 4), 30.0),
    ),
    200.0,
    0,
    0,
)
# ``a`` ends at 100 s: the gang's second pod is bound then and the gang runs to 150 s.
RENDEZVOUS = Workload(
    (Arrival(0.0, job("a", 1, 4), 100.0), Arrival(10.0, job("g", 2, 4), 50.0)), 200.0, 0, 0
)


def run(workload: Workload, policy: str) -> ReplayResult:
    return replay_policy(one_node(), workload, policy, ReplayConfig(samples=20))


def test_kube_default_leaves_the_gang_partially_placed_holding_its_gpus() -> None:
    fed, ledger = federation(one_node(), 1)
    kube = KubeRun(make_policy("kube-default"), ledger, tuple(fed.clusters), 8000)
    run_events(kube, STUCK, 10)
    assert kube.partially_placed() == ["default/g"]
    assert ledger.snapshot().clusters["cluster-0"].free_milli() == 0  # a's 4 + g's 4
    assert [a.job.name for a in kube.unstarted()] == ["g", "c"]


def test_auto_places_the_gang_whole_or_not_at_all() -> None:
    auto = run(STUCK, "auto")
    assert "default/g" not in auto.waits and auto.partial_gang_gpu_hours == 0.0
    assert set(auto.waits) == {"default/a", "default/c"}  # c used the half g never held


def test_the_figures_of_a_stuck_gang_by_hand() -> None:
    kube, auto = run(STUCK, "kube-default"), run(STUCK, "auto")
    # Window: 8 GPUs x 200 s = 1,600 GPU-s. a runs 4 GPUs x 200 s = 800; g's first pod
    # holds 4 GPUs from 10 s to the end, 760 GPU-s (0.2111 h); c never starts.
    assert kube.gpu_util_pct == 50.0
    assert kube.mean_gpu_util_pct == 97.5  # (800 + 760) / 1,600: allocated, not running
    assert kube.partial_gang_gpu_hours == round(760 / 3600, 4)
    assert kube.jobs_never_started == kube.unstarted == 2 and kube.unstarted_gangs == 1
    # The gang never starts: it counts with its wait so far, 200 - 10 s.
    assert (kube.gang_wait_p50_s, kube.gang_wait_p95_s, kube.gang_wait_p99_s) == (190.0,) * 3
    # auto: a 800 + c 4 x 30 = 920 GPU-s, all of it running; only g never starts.
    assert auto.gpu_util_pct == auto.mean_gpu_util_pct == 57.5
    assert auto.jobs_never_started == 1
    assert auto.gang_wait_p99_s == 190.0


def test_a_partial_gang_starts_when_its_last_pod_is_bound() -> None:
    kube, auto = run(RENDEZVOUS, "kube-default"), run(RENDEZVOUS, "auto")
    assert kube.waits == auto.waits == {"default/a": 0.0, "default/g": 90.0}
    # Both: a 4 x 100 + g 8 x 50 = 800 GPU-s running of 1,600. kube-default also held
    # g's first pod's 4 GPUs from 10 s to 100 s: 360 GPU-s, 0.1 h.
    assert kube.gpu_util_pct == auto.gpu_util_pct == 50.0
    assert kube.partial_gang_gpu_hours == 0.1 and auto.partial_gang_gpu_hours == 0.0
    assert kube.mean_gpu_util_pct == 72.5 and auto.mean_gpu_util_pct == 50.0
    assert kube.jobs_never_started == auto.jobs_never_started == 0


def test_kube_default_spreads_single_pods_over_nodes() -> None:
    nodes = [*one_node(), Node("n-1", GpuType("G2"), one_node()[0].allocatable)]
    work = Workload(tuple(Arrival(0.0, job(f"s{i}", 1, 1), 1000.0) for i in range(2)), 200.0, 0, 0)
    fed, ledger = federation(nodes, 1)
    kube = KubeRun(make_policy("kube-default"), ledger, tuple(fed.clusters), 16_000)
    run_events(kube, work, 4)
    view = ledger.snapshot().clusters["cluster-0"]
    assert {name: state.free_milli for name, state in view.nodes.items()} == {
        "n-0": 7000,
        "n-1": 7000,
    }


NODES_CSV = "sn,cpu_milli,memory_mib,gpu,model\n" + "".join(
    f"node-{i:02d},96000,393216,8,G2\n" for i in range(4)
)
PODS_CSV = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,creation_time,deletion_time\n" + (
    "".join(f"pod-{i:03d},2000,4096,1,1000,,{60 * i},{60 * i + 900}\n" for i in range(20))
)
FIELDS = (
    "gpu_util_pct",
    "partial_gang_gpu_hours",
    "gang_wait_p50_s",
    "gang_wait_p95_s",
    "gang_wait_p99_s",
    "jobs_never_started",
)


def test_cli_prints_both_rows_with_the_figures(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    nodes, pods = tmp_path / "nodes.csv", tmp_path / "pods.csv"
    nodes.write_text(NODES_CSV)
    pods.write_text(PODS_CSV)
    argv = [
        *("simulate", "--protocol", "replay", "--nodes", str(nodes), "--pods", str(pods)),
        *("--jobs", "40", "--policy", "kube-default", "--policy", "auto"),
        *("--seed", "1", "--no-burst", "--json"),
    ]
    assert main(argv) == 0
    rows = json.loads(capsys.readouterr().out)["results"]
    assert [r["policy"] for r in rows] == ["kube-default", "auto"]
    for r in rows:
        assert all(key in r for key in FIELDS), r["policy"]
        assert 0.0 <= r["gpu_util_pct"] <= r["mean_gpu_util_pct"] <= 100.0
        assert r["jobs_never_started"] == r["unstarted"]
    kube, auto = rows
    assert auto["partial_gang_gpu_hours"] == 0.0
    assert auto["gpu_util_pct"] == auto["mean_gpu_util_pct"]
    assert kube["partial_gang_gpu_hours"] > 0.0


def test_simulate_help_lists_kube_default(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main(["simulate", "--help"])
    assert done.value.code == 0
    # argparse wraps lines at hyphens too: compare without the breaks.
    text = "".join(capsys.readouterr().out.split())
    assert (
        "fgd,fgd-share,fgd-cpu,fgd-lp,kube-default;kube-defaultiskube-scheduler'sdefaultprofile"
        in text
    )
