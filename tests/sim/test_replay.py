"""The replay protocol: exact waits in hand-made timelines, the generated workload's
calibration, well-formed and deterministic results on a small generated federation, the
CLI's JSON and PNG output, and a short replay on the real openb inventory."""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from pathlib import Path

import pytest

from adapters.simulated import GANG_MIX, OPENB_MIX, generate_nodes, generated_pod_mix
from broker.cli.main import main
from broker.model import GpuType, Job, Node, PodSet, Resources
from broker.sim.arrivals import Arrival, Workload, build_workload
from broker.sim.replay import ReplayConfig, ReplayResult, percentile, replay, replay_policy
from broker.sim.traces import TracePod, read_openb_nodes, read_openb_pods

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def g2_nodes(n: int) -> list[Node]:
    res = Resources(gpus=8, cpu_milli=96_000, memory_mib=393_216)
    return [Node(f"n-{i:03d}", GpuType("G2"), res) for i in range(n)]


def job(name: str, pods: int, gpus: int) -> Job:
    return Job(name, (PodSet("p", pods, Resources(gpus=gpus, cpu_milli=1000)),))


def timeline(horizon: float, *arrivals: tuple[float, Job, float]) -> Workload:
    return Workload(tuple(Arrival(at, j, run) for at, j, run in arrivals), horizon, 0, 0)


def waits(result: ReplayResult) -> dict[str, float]:
    return {key.split("/")[-1]: w for key, w in result.waits.items()}


# -- exact timelines --------------------------------------------------------------------


@pytest.mark.parametrize("policy", ["gang", "binpack", "fgd", "auto"])
def test_gang_waits_for_the_departure_that_frees_its_node(policy: str) -> None:
    work = timeline(
        500.0,
        (0.0, job("a", 1, 8), 100.0),  # holds the only node until t=100
        (10.0, job("b", 2, 4), 50.0),  # must wait 90 s, then runs to t=150
    )
    result = replay_policy(g2_nodes(1), work, policy, ReplayConfig(samples=50))
    assert waits(result) == {"a": 0.0, "b": 90.0}
    assert result.placements == 2 and result.unstarted == 0
    assert result.gang_wait_p50_s == 90.0
    # 8 GPUs busy for [0, 150], then idle until 500.
    assert result.mean_gpu_util_pct == pytest.approx(100.0 * 150 / 500, abs=0.01)
    assert result.late_gpu_util_pct == 0.0  # idle over the second half, [250, 500]
    by_time = dict(result.util_series)
    assert by_time[0.0] == 100.0 and by_time[140.0] == 100.0 and by_time[160.0] == 0.0


def test_a_waiting_gang_does_not_block_smaller_jobs_behind_it() -> None:
    work = timeline(
        500.0,
        (0.0, job("a", 1, 6), 100.0),
        (1.0, job("b", 2, 4), 10.0),  # 8 GPUs: waits for a
        (2.0, job("c", 1, 2), 50.0),  # fits beside a at once (best-effort FIFO)
    )
    result = replay_policy(g2_nodes(1), work, "gang", ReplayConfig())
    assert waits(result) == {"a": 0.0, "b": 99.0, "c": 0.0}
    # Nothing runs after b ends at t=110, so the second half of the window is idle.
    assert result.late_gpu_util_pct == 0.0
    assert result.mean_gpu_util_pct == pytest.approx(
        100.0 * (6 * 100 + 2 * 50 + 8 * 10) / (8 * 500), abs=0.01
    )


def test_utilisation_means_weigh_time_over_the_window_and_its_second_half() -> None:
    work = timeline(500.0, (0.0, job("a", 1, 4), 400.0), (300.0, job("b", 1, 4), 1000.0))
    result = replay_policy(g2_nodes(1), work, "binpack", ReplayConfig())
    # a: 4 of 8 GPUs over [0, 400]; b: 4 of 8 over [300, 500] (it runs past the horizon).
    assert result.mean_gpu_util_pct == pytest.approx(100.0 * (4 * 400 + 4 * 200) / (8 * 500))
    assert result.late_gpu_util_pct == pytest.approx(100.0 * (4 * 150 + 4 * 200) / (8 * 250))


def test_the_series_ends_with_a_sample_at_the_horizon() -> None:
    horizon = 12_902_960 / 60  # openb's span at the default scale: h * 200 / 200 > h
    work = timeline(horizon, (0.0, job("a", 1, 8), 2 * horizon))
    series = replay_policy(g2_nodes(1), work, "gang", ReplayConfig(samples=200)).util_series
    assert len(series) == 201
    assert series[-1] == (round(horizon, 3), 100.0)


@pytest.mark.parametrize(("scan_misses", "c_wait"), [(1, 58.0), (2, 48.0)])
def test_a_cycle_stops_after_scan_misses_and_the_next_cycle_goes_on(
    scan_misses: int, c_wait: float
) -> None:
    work = timeline(
        500.0,
        (0.0, job("a", 1, 8), 50.0),
        (1.0, job("b", 2, 8), 10.0),  # never fits one 8-GPU node: a miss in every cycle
        (2.0, job("c", 1, 1), 10.0),  # behind b; examined at t=50 only if b's miss is allowed
    )
    config = ReplayConfig(scan_misses=scan_misses, cycle_seconds=10.0)
    result = replay_policy(g2_nodes(1), work, "gang", config)
    assert waits(result) == {"a": 0.0, "c": c_wait}
    assert result.unstarted == 1 and result.unstarted_gangs == 1
    # b never started: it counts with its wait so far (a lower bound), 500 - 1.
    assert result.gang_wait_p99_s == 499.0


def test_percentile_is_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert (percentile(values, 50), percentile(values, 95), percentile(values, 99)) == (
        50.0,
        95.0,
        99.0,
    )
    assert percentile([7.0], 99) == 7.0
    assert percentile([], 50) is None


# -- the generated workload -------------------------------------------------------------


def timed_pods(count: int, seed: int, span: int = 20_000) -> list[TracePod]:
    rng = random.Random(seed)
    pods = []
    for i in range(count):
        created = rng.randrange(span)
        ends = created + rng.randrange(1, 2_000) if i % 10 else None  # some lack an end
        pods.append(TracePod(f"pod-{i:04d}", generated_pod_mix(rng), frozenset(), created, ends))
    return pods


def test_generated_gangs_offer_the_requested_load_within_the_span() -> None:
    pods = timed_pods(200, seed=3)
    work = build_workload(
        pods, federation_gpus=400, jobs=300, seed=5, time_scale=10.0, gang_load_pct=80.0
    )
    gangs = [a for a in work.arrivals if a.job.name.startswith("gang-")]
    assert len(gangs) == work.generated_jobs == 300 and work.trace_jobs == 200
    latest = max(t for p in pods for t in (p.creation_time, p.deletion_time) if t is not None)
    assert work.horizon == latest / 10.0
    assert all(0.0 <= a.at <= work.horizon for a in work.arrivals)
    assert [a.at for a in work.arrivals] == sorted(a.at for a in work.arrivals)
    offered = sum(a.job.gpu_request_milli / 1000 * a.run_seconds for a in gangs)
    assert offered == pytest.approx(0.80 * 400 * work.horizon)
    shapes = {(g.pods, g.gpus_per_pod) for g in GANG_MIX}
    for a in gangs:
        (ps,) = a.job.pod_sets
        assert (ps.count, ps.resources.gpus) in shapes
        assert ps.resources.cpu_milli == 8_000 * ps.resources.gpus


def test_trace_times_are_compressed_and_missing_ones_generated() -> None:
    pods = timed_pods(50, seed=1)
    work = build_workload(pods, 64, jobs=0, seed=0, time_scale=4.0, gang_load_pct=90.0)
    by_name = {a.job.name: a for a in work.arrivals}
    for p in pods:
        a = by_name[p.name]
        assert p.creation_time is not None
        assert a.at == p.creation_time / 4.0
        if p.deletion_time is not None:
            assert a.run_seconds == (p.deletion_time - p.creation_time) / 4.0
        else:
            assert a.run_seconds >= 0.0


# -- a small generated federation ---------------------------------------------------------


SMALL = ReplayConfig(clusters=3, seed=11, jobs=120, time_scale=5.0, samples=40)
POLICIES = ["gang", "binpack", "fgd", "auto"]


@pytest.fixture(scope="module")
def small_run() -> tuple[Workload, list[ReplayResult]]:
    nodes = generate_nodes(OPENB_MIX, "sim", scale=0.04)
    return replay(nodes, timed_pods(300, seed=11), POLICIES, SMALL)


def test_results_are_well_formed(small_run: tuple[Workload, list[ReplayResult]]) -> None:
    work, results = small_run
    assert [r.policy for r in results] == POLICIES
    for r in results:
        assert r.jobs == len(work.arrivals) == 420
        assert r.gangs == sum(1 for a in work.arrivals if a.job.total_pods > 1) > 0
        assert r.placements + r.unstarted == r.jobs
        assert len(r.waits) == r.placements
        assert r.conflicts == 0
        assert 0.0 < r.mean_gpu_util_pct <= 100.0
        assert r.gang_wait_p50_s is not None and r.gang_wait_p99_s is not None
        assert 0.0 <= r.gang_wait_p50_s <= r.gang_wait_p99_s
        times = [t for t, _ in r.util_series]
        assert len(times) == SMALL.samples + 1 and times == sorted(times)
        assert times[0] == 0.0 and times[-1] == pytest.approx(work.horizon, abs=0.001)


def test_utilisation_never_exceeds_100_percent(
    small_run: tuple[Workload, list[ReplayResult]],
) -> None:
    for r in small_run[1]:
        assert all(0.0 <= pct <= 100.0 for _, pct in r.util_series), r.policy
        assert any(pct > 0.0 for _, pct in r.util_series), r.policy


def test_every_started_job_waited_zero_or_more(
    small_run: tuple[Workload, list[ReplayResult]],
) -> None:
    for r in small_run[1]:
        assert r.waits and all(w >= 0.0 for w in r.waits.values()), r.policy


def test_a_replay_is_deterministic_for_a_seed(
    small_run: tuple[Workload, list[ReplayResult]],
) -> None:
    nodes = generate_nodes(OPENB_MIX, "sim", scale=0.04)
    again = replay(nodes, timed_pods(300, seed=11), POLICIES, SMALL)
    assert again == small_run


# -- the command line -------------------------------------------------------------------


NODES_CSV = "sn,cpu_milli,memory_mib,gpu,model\n" + "".join(
    f"node-{i:02d},96000,393216,{g},{m}\n" for i, (g, m) in enumerate([(8, "G2"), (2, "T4")] * 4)
)
PODS_CSV = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,creation_time,deletion_time\n" + (
    "".join(
        f"pod-{i:03d},2000,4096,{n},{m},{spec},{60 * i},{60 * i + 600 + 37 * (i % 11)}\n"
        for i, (n, m, spec) in enumerate(
            [(1, 1000, ""), (1, 500, ""), (2, 1000, "G2"), (0, 0, "")] * 10
        )
    )
)


@pytest.fixture
def csv_inputs(tmp_path: Path) -> tuple[Path, Path]:
    nodes, pods = tmp_path / "nodes.csv", tmp_path / "pods.csv"
    nodes.write_text(NODES_CSV)
    pods.write_text(PODS_CSV)
    return nodes, pods


def replay_args(inputs: tuple[Path, Path], *extra: str) -> list[str]:
    nodes, pods = inputs
    return [
        *("simulate", "--protocol", "replay", "--nodes", str(nodes), "--pods", str(pods)),
        *("--jobs", "30", "--clusters", "2", "--seed", "4", *extra),
    ]


def test_cli_replay_json_schema(
    csv_inputs: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    code = main([*replay_args(csv_inputs), "--policy", "gang", "--policy", "binpack", "--json"])
    assert code == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["protocol"] == "replay"
    assert (doc["nodes"], doc["gpus"], doc["clusters"], doc["seed"]) == (8, 40, 2, 4)
    assert [r["policy"] for r in doc["results"]] == ["gang", "binpack"]
    for r in doc["results"]:
        assert r["conflicts"] == 0 and "waits" not in r
        for key in ("placements", "unstarted", "jobs", "gangs"):
            assert isinstance(r[key], int), key
        assert isinstance(r["mean_gpu_util_pct"], float)
        assert 0.0 <= r["late_gpu_util_pct"] <= 100.0
        for key in ("gang_wait_p50_s", "gang_wait_p95_s", "gang_wait_p99_s", "job_wait_p50_s"):
            assert r[key] is None or (isinstance(r[key], float) and r[key] >= 0.0), key
        assert r["jobs"] == 40 + 30
        series = r["util_series"]
        assert series and all(len(p) == 2 and 0.0 <= p[1] <= 100.0 for p in series)


def test_cli_replay_table(
    csv_inputs: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([*replay_args(csv_inputs), "--policy", "fgd"]) == 0
    out = capsys.readouterr().out
    assert "replay protocol: 8 nodes, 40 GPUs, 2 cluster(s)" in out
    assert any(line.startswith("fgd ") for line in out.splitlines())


def test_cli_replay_plot_writes_a_png(
    csv_inputs: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    png = tmp_path / "replay.png"
    assert main([*replay_args(csv_inputs), "--policy", "gang", "--plot", str(png)]) == 0
    assert png.read_bytes()[:8] == PNG_SIGNATURE
    assert f"plot written to {png}" in capsys.readouterr().out


def test_replay_legend_names_both_means_when_partial_gangs_hold_gpus() -> None:
    from broker.sim.plot import replay_label

    atomic = {"policy": "auto", "mean_gpu_util_pct": 77.74, "gpu_util_pct": 77.74}
    partial = {"policy": "kube-default", "mean_gpu_util_pct": 66.1, "gpu_util_pct": 65.3}
    assert replay_label(atomic) == "auto (mean 77.7 %)"
    assert replay_label(partial) == "kube-default (mean 66.1 % allocated, 65.3 % running)"
    assert replay_label({"policy": "fgd"}) == "fgd"


def test_cli_fill_plot_writes_a_png(
    csv_inputs: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    png = tmp_path / "fill.png"
    nodes, pods = csv_inputs
    argv = [
        *("simulate", "--nodes", str(nodes), "--pods", str(pods)),
        *("--policy", "binpack", "--policy", "fgd", "--json", "--plot", str(png)),
    ]
    assert main(argv) == 0
    assert json.loads(capsys.readouterr().out)["protocol"] == "fill"
    assert png.read_bytes()[:8] == PNG_SIGNATURE


def test_cli_rejects_a_non_positive_time_scale(
    csv_inputs: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main([*replay_args(csv_inputs), "--time-scale", "0"])
    assert exit_info.value.code == 2
    assert "--time-scale must be a positive number" in capsys.readouterr().err


# -- the real openb inventory -------------------------------------------------------------


def test_short_replay_on_the_real_openb_trace(trace_file: Callable[[str], Path]) -> None:
    nodes = read_openb_nodes(trace_file("alibaba-gpu-v2023/openb_node_list_gpu_node.csv"))
    pods = read_openb_pods(trace_file("alibaba-gpu-v2023/openb_pod_list_default.csv"))[:400]
    config = ReplayConfig(clusters=4, seed=1, jobs=150, samples=20)
    work, (result,) = replay(nodes, pods, ["gang"], config)
    assert (work.trace_jobs, work.generated_jobs, len(nodes)) == (400, 150, 1213)
    assert result.placements + result.unstarted == 550
    assert all(0.0 <= pct <= 100.0 for _, pct in result.util_series)
    assert all(w >= 0.0 for w in result.waits.values())
    assert result.mean_gpu_util_pct > 0.0
