"""Cloud bursting in the replay protocol: exact timelines (a parked gang bursts, runs on the
new nodes, and the nodes go away once idle; held nodes are hidden from other jobs), the
generated workload's burst flags, the CLI's defaults and keys, and the acceptance run on the
openb node mix in two on-prem clusters plus one burst pool, audited cycle by cycle."""

from __future__ import annotations

import dataclasses
import json
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from adapters.simulated import OPENB_MIX, generate_nodes, generated_pod_mix
from broker.cli import main as cli
from broker.cli import simulate
from broker.core.burst import BurstController
from broker.core.ledger import Ledger
from broker.model import MILLI_PER_GPU, GpuType, Job, Node, PodSet, Resources
from broker.sim.arrivals import Arrival, Workload, build_workload
from broker.sim.replay import ReplayConfig, ReplayResult, replay, replay_policy
from broker.sim.replay_burst import (
    BURST_CLUSTER,
    DEFAULT_BURST_POOL,
    DEFAULT_BURST_SETTINGS,
    BurstConfig,
)
from broker.sim.traces import TracePod

BURST_KEYS = (
    "burst_scale_ups",
    "burst_nodes_added",
    "burst_placements",
    "burst_node_hours",
    "idle_burst_node_hours",
    "burst_cost",
    "burst_provision_failures",
)
SCALE_DOWN = DEFAULT_BURST_SETTINGS.scale_down_after_seconds
BURST_AFTER = DEFAULT_BURST_SETTINGS.burst_after_seconds
PROVISION = DEFAULT_BURST_POOL.provision_seconds


def g2_nodes(n: int) -> list[Node]:
    res = Resources(gpus=8, cpu_milli=96_000, memory_mib=393_216)
    return [Node(f"n-{i:03d}", GpuType("G2"), res) for i in range(n)]


def whole(name: str, pods: int, *, burst: bool = False, priority: int = 0) -> Job:
    res = Resources(gpus=8, cpu_milli=64_000, memory_mib=262_144)
    return Job(name, (PodSet("p", pods, res),), priority=priority, allow_burst=burst)


def timeline(horizon: float, *arrivals: tuple[float, Job, float]) -> Workload:
    return Workload(tuple(Arrival(at, j, run) for at, j, run in arrivals), horizon, 0, 0)


def waits(result: ReplayResult) -> dict[str, float]:
    return {key.split("/")[-1]: w for key, w in result.waits.items()}


@dataclass
class Auditor:
    """Checked after every cycle: no node of any cluster (the burst one included) is
    oversubscribed, the pool stays within its maximum, and no burst node the broker added
    sits idle (no pod at all) and unheld longer than scaleDownAfterSeconds plus one cycle."""

    cycle_seconds: float
    max_nodes: int
    idle_since: dict[str, float] = field(default_factory=dict)
    stretches: list[float] = field(default_factory=list)
    burst_nodes_seen: set[str] = field(default_factory=set)
    audits: int = 0

    def __call__(self, now: float, ledger: Ledger, burst: BurstController | None) -> None:
        self.audits += 1
        snapshot = ledger.snapshot()
        assert ledger.overcommitted_pods == 0
        for view in snapshot.clusters.values():
            for state in view.nodes.values():
                alloc = state.node.allocatable
                assert 0 <= state.cpu_free <= alloc.cpu_milli, state.node.name
                assert 0 <= state.memory_free <= alloc.memory_mib, state.node.name
                assert len(state.gpu_free) == alloc.gpus
                assert all(0 <= f <= MILLI_PER_GPU for f in state.gpu_free), state.node.name
        if burst is None:
            assert BURST_CLUSTER not in snapshot.clusters
            return
        nodes = snapshot.clusters[BURST_CLUSTER].nodes
        assert len(nodes) <= self.max_nodes
        self.burst_nodes_seen |= set(nodes)
        held = {n for by in burst.holds().values() for names in by.values() for n in names}
        for name, state in nodes.items():
            alloc = state.node.allocatable
            empty = (state.free_milli, state.cpu_free, state.memory_free) == (
                alloc.gpus * MILLI_PER_GPU,
                alloc.cpu_milli,
                alloc.memory_mib,
            )  # no pod at all on it
            if empty and name not in held:
                since = self.idle_since.setdefault(name, now)
                assert now - since <= SCALE_DOWN + self.cycle_seconds, (name, since, now)
            elif name in self.idle_since:
                self.stretches.append(now - self.idle_since.pop(name))
        for name in set(self.idle_since) - set(nodes):
            self.stretches.append(now - self.idle_since.pop(name))

    def finish(self, horizon: float) -> None:
        self.stretches += [horizon - since for since in self.idle_since.values()]
        self.idle_since.clear()


# -- exact timelines ----------------------------------------------------------------------


def parked_gang(horizon: float = 3000.0, *extra: tuple[float, Job, float]) -> Workload:
    """The only on-prem node is busy until t=5000; a 2-node gang arrives at t=10, runs 100 s."""
    return timeline(
        horizon, (0.0, whole("long", 1), 5000.0), (10.0, whole("g", 2, burst=True), 100.0), *extra
    )


def test_a_parked_gang_bursts_runs_and_its_nodes_are_given_back() -> None:
    config = ReplayConfig(burst=BurstConfig(), cycle_seconds=10.0, samples=10)
    audit = Auditor(10.0, DEFAULT_BURST_POOL.max_nodes)
    result = replay_policy(g2_nodes(1), parked_gang(), "gang", config, audit)
    # Seen waiting at t=10; bursts once it has waited 120 s; nodes up 300 s later: the gang,
    # parked since t=10, is unparked by the nodes' arrival and placed at once.
    assert waits(result) == {"long": 0.0, "g": BURST_AFTER + PROVISION}
    assert (result.burst_scale_ups, result.burst_nodes_added, result.burst_placements) == (1, 2, 1)
    # Billed from the scale-up (t=130) until removed, idle from the gang's end (t=530) for
    # scaleDownAfterSeconds, give or take the 10 s cycle.
    # (Figures are rounded to 4 decimals.)
    billed = 2 * (530 + SCALE_DOWN - 130) / 3600
    assert billed - 1e-4 <= result.burst_node_hours <= billed + 2 * 10 / 3600 + 1e-4
    idle = 2 * SCALE_DOWN / 3600
    assert idle - 1e-4 <= result.idle_burst_node_hours <= idle + 2 * 10 / 3600 + 1e-4
    assert result.burst_cost == pytest.approx(result.burst_node_hours * 32.77, abs=0.01)
    # On-prem utilisation only: the single node is busy all along, burst GPUs do not count.
    assert result.mean_gpu_util_pct == 100.0
    audit.finish(3000.0)
    assert len(audit.burst_nodes_seen) == 2 and audit.stretches


def test_without_a_pool_or_the_flag_the_gang_never_starts() -> None:
    no_pool = replay_policy(g2_nodes(1), parked_gang(), "gang", ReplayConfig(samples=10))
    assert waits(no_pool) == {"long": 0.0} and no_pool.unstarted_gangs == 1
    assert all(getattr(no_pool, key) == 0 for key in BURST_KEYS)
    work = timeline(3000.0, (0.0, whole("long", 1), 5000.0), (10.0, whole("g", 2), 100.0))
    result = replay_policy(g2_nodes(1), work, "gang", ReplayConfig(burst=BurstConfig()))
    assert result.unstarted_gangs == 1 and result.burst_scale_ups == 0


def test_held_nodes_are_hidden_from_a_job_ahead_in_the_queue() -> None:
    """A higher-priority one-node job that may burst arrives while the gang's nodes are
    coming up: it is examined first when they come up (t=430), but they are the gang's; it
    starts on one of them only once the gang has ended (t=530) and left them unheld. A job
    that may not burst never gets a burst node at all."""
    vip = (200.0, whole("vip", 1, priority=10, burst=True), 100.0)
    local = (210.0, whole("local", 1, priority=20), 100.0)
    result = replay_policy(
        g2_nodes(1), parked_gang(3000.0, vip, local), "gang", ReplayConfig(burst=BurstConfig())
    )
    assert waits(result) == {"long": 0.0, "g": BURST_AFTER + PROVISION, "vip": 530.0 - 200.0}
    # vip, waiting since t=200, asked for a node of its own at t=320 (due at t=620); it
    # started on the gang's freed node first, so that one came up unclaimed.
    assert (result.burst_nodes_added, result.burst_placements, result.conflicts) == (3, 2, 0)
    assert result.unstarted == 1  # "local": the on-prem node is busy until t=5000


def test_a_pool_that_never_provisions_times_out_and_the_gang_waits_on() -> None:
    config = ReplayConfig(burst=BurstConfig(failure_rate=1.0))
    result = replay_policy(g2_nodes(1), parked_gang(), "gang", config)
    assert "g" not in waits(result)
    assert result.burst_provision_failures >= 1 and result.burst_placements == 0
    assert result.idle_burst_node_hours == 0.0  # nothing ever came up, nothing sat idle


# -- the workload -----------------------------------------------------------------------


def test_generated_gangs_may_burst_single_pods_may_not() -> None:
    rng = random.Random(0)
    pods = [TracePod(f"p-{i}", generated_pod_mix(rng), frozenset()) for i in range(50)]
    work = build_workload(pods, 400, jobs=200, seed=3, time_scale=10.0, gang_load_pct=90.0)
    for a in work.arrivals:
        assert a.job.allow_burst == (a.job.name.startswith("gang-") and a.gang), a.job.name
    assert any(a.job.allow_burst for a in work.arrivals)


# -- the acceptance run: openb's mix, two on-prem clusters, one burst pool ------------------


def openb_small() -> tuple[list[Node], list[TracePod]]:
    """The openb node mix at 4 % (46 nodes, 236 GPUs) and 200 generated pods."""
    rng = random.Random(1)
    pods = [TracePod(f"p-{i:03d}", generated_pod_mix(rng), frozenset()) for i in range(200)]
    return generate_nodes(OPENB_MIX, "openb", scale=0.04), pods


ACCEPTANCE = ReplayConfig(
    clusters=2, seed=1, jobs=100, time_scale=10.0, gang_load_pct=100.0, samples=20
)


@pytest.mark.parametrize("policy", ["gang", "fgd"])
def test_bursting_cuts_gang_waits_within_its_cost_leak_bound(policy: str) -> None:
    nodes, pods = openb_small()
    config = dataclasses.replace(ACCEPTANCE, burst=BurstConfig())
    audit = Auditor(config.cycle_seconds, DEFAULT_BURST_POOL.max_nodes)
    work = build_workload(pods, 236, config.jobs, config.seed, 10.0, 100.0)
    bursting = replay_policy(nodes, work, policy, config, audit)
    audit.finish(work.horizon)
    baseline_audit = Auditor(config.cycle_seconds, DEFAULT_BURST_POOL.max_nodes)
    baseline = replay_policy(nodes, work, policy, ACCEPTANCE, baseline_audit)
    assert baseline_audit.audits > 0 and not baseline_audit.burst_nodes_seen
    assert bursting.conflicts == baseline.conflicts == 0
    assert bursting.gang_wait_p95_s is not None and baseline.gang_wait_p95_s is not None
    assert bursting.gang_wait_p95_s <= baseline.gang_wait_p95_s
    assert bursting.unstarted_gangs <= baseline.unstarted_gangs
    assert bursting.burst_node_hours > 0 and bursting.burst_placements > 0
    # Nodes cancelled while still coming up (their gang started on-prem first) never show.
    assert 0 < len(audit.burst_nodes_seen) <= bursting.burst_nodes_added
    # The cost leak: idle burst node-hours stay below scaleDownAfterSeconds x nodes added
    # (the bound), and every idle stretch of an added node ends within
    # scaleDownAfterSeconds + one cycle (audited above).
    bound = SCALE_DOWN * bursting.burst_nodes_added / 3600
    assert 0 < bursting.idle_burst_node_hours < bound
    assert bursting.idle_burst_node_hours <= bursting.burst_node_hours


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 1_000),
    failure_rate=st.sampled_from([0.0, 0.3]),
    max_nodes=st.integers(2, 12),
    provision=st.sampled_from([60.0, 300.0, 1200.0]),
)
def test_bursting_invariants_hold_for_any_seed_and_pool(
    seed: int, failure_rate: float, max_nodes: int, provision: float
) -> None:
    nodes = generate_nodes(OPENB_MIX, "openb", scale=0.02)
    pool = dataclasses.replace(DEFAULT_BURST_POOL, max_nodes=max_nodes, provision_seconds=provision)
    config = ReplayConfig(
        clusters=2,
        seed=seed,
        jobs=40,
        time_scale=20.0,
        gang_load_pct=120.0,
        samples=10,
        burst=BurstConfig(pool, failure_rate=failure_rate),
    )
    audit = Auditor(config.cycle_seconds, max_nodes)
    rng = random.Random(seed)
    pods = [TracePod(f"p-{i:03d}", generated_pod_mix(rng), frozenset()) for i in range(60)]
    work = build_workload(pods, sum(n.allocatable.gpus for n in nodes), 40, seed, 20.0, 120.0)
    result = replay_policy(nodes, work, "gang", config, audit)
    assert result.conflicts == 0
    assert result.placements + result.unstarted == result.jobs
    assert 0.0 <= result.idle_burst_node_hours <= result.burst_node_hours
    assert result.burst_node_hours <= max_nodes * work.horizon / 3600 + 1e-9
    assert result.burst_cost == pytest.approx(
        result.burst_node_hours * pool.cost_per_node_hour, abs=0.01
    )
    assert all(0.0 <= pct <= 100.0 for _, pct in result.util_series)


def test_a_bursting_replay_is_deterministic() -> None:
    nodes, pods = openb_small()
    config = dataclasses.replace(ACCEPTANCE, burst=BurstConfig(failure_rate=0.2), jobs=60)
    assert replay(nodes, pods, ["binpack"], config) == replay(nodes, pods, ["binpack"], config)


# -- the command line -------------------------------------------------------------------


def small_inputs(
    nodes_path: Path | None, pods_path: Path | None, seed: int
) -> tuple[list[Node], list[TracePod]]:
    """Stands in for the generated openb federation (1,155 nodes, 8,000 pods: ~25 s)."""
    assert (nodes_path, pods_path) == (None, None)
    rng = random.Random(seed)
    pods = [TracePod(f"p-{i:03d}", generated_pod_mix(rng), frozenset()) for i in range(100)]
    return generate_nodes(OPENB_MIX, "openb", scale=0.03), pods


def run_cli(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], *argv: str
) -> dict[str, object]:
    seeds: list[int] = []

    def inputs(
        nodes_path: Path | None, pods_path: Path | None, seed: int
    ) -> tuple[list[Node], list[TracePod]]:
        seeds.append(seed)
        return small_inputs(nodes_path, pods_path, seed)

    monkeypatch.setattr(simulate, "load_inputs", inputs)
    assert cli.main(["simulate", "--protocol", "replay", "--json", *argv]) == 0
    doc: dict[str, object] = json.loads(capsys.readouterr().out)
    assert seeds == [doc["seed"]]
    return doc


def rows(doc: dict[str, object]) -> Sequence[dict[str, object]]:
    results = doc["results"]
    assert isinstance(results, list)
    return results


def test_cli_replay_defaults_two_clusters_seed_one_and_a_pool(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    doc = run_cli(monkeypatch, capsys, "--jobs", "40")
    assert (doc["clusters"], doc["seed"]) == (2, 1)
    # The generated workload: a day in 2.4 simulated hours, gangs offering 130 % of the GPUs.
    assert (doc["time_scale"], doc["gang_load_pct"]) == (10.0, 130.0)
    assert doc["burst"] == {
        "pool": "cloud-a100", "cluster": BURST_CLUSTER, "gpu_type": "A100",
        "node": {"gpus": 8, "cpu_milli": 96_000, "memory_mib": 1_179_648},
        "max_nodes": 32, "cost_per_node_hour": 32.77, "provision_seconds": 300.0,
        "failure_rate": 0.0, "burst_after_seconds": 120.0,
        "scale_down_after_seconds": 600.0, "provision_timeout_seconds": 900.0,
    }  # fmt: skip
    assert [r["policy"] for r in rows(doc)] == ["binpack", "fgd"]
    for row in rows(doc):
        assert row["gang_wait_p95_s"] is None or isinstance(row["gang_wait_p95_s"], float)
        for key in BURST_KEYS:
            assert isinstance(row[key], (int, float)) and row[key] >= 0, key  # type: ignore[operator]


def test_cli_no_burst_has_the_same_keys_all_zero(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    with_pool = run_cli(monkeypatch, capsys, "--jobs", "40", "--policy", "gang")
    without = run_cli(monkeypatch, capsys, "--jobs", "40", "--policy", "gang", "--no-burst")
    assert without["burst"] is None
    (a,), (b,) = rows(with_pool), rows(without)
    assert set(a) == set(b)
    assert all(b[key] == 0 for key in BURST_KEYS)


def test_cli_burst_flags_reach_the_pool(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    doc = run_cli(
        monkeypatch, capsys, "--jobs", "20", "--policy", "gang", "--burst-max-nodes", "3",
        "--burst-provision-seconds", "90", "--burst-failure-rate", "0.5", "--seed", "7",
        "--clusters", "3",
    )  # fmt: skip
    pool = doc["burst"]
    assert isinstance(pool, dict)
    assert (pool["max_nodes"], pool["provision_seconds"], pool["failure_rate"]) == (3, 90.0, 0.5)
    assert (doc["seed"], doc["clusters"]) == (7, 3)


def test_cli_fill_keeps_one_cluster_and_seed_zero(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(simulate, "load_inputs", small_inputs)
    assert cli.main(["simulate", "--json", "--policy", "binpack", "--loads", "80"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert (doc["protocol"], doc["clusters"], doc["seed"]) == ("fill", 1, 0)


@pytest.mark.parametrize("option", ["--burst-failure-rate=1.5", "--burst-max-nodes=0"])
def test_cli_rejects_bad_burst_flags(option: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["simulate", "--protocol", "replay", option])
    assert exit_info.value.code == 2
    assert option.split("=", maxsplit=1)[0] in capsys.readouterr().err


def test_cli_table_shows_the_burst_columns(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(simulate, "load_inputs", small_inputs)
    assert cli.main(["simulate", "--protocol", "replay", "--jobs", "20", "--policy", "gang"]) == 0
    out = capsys.readouterr().out
    assert "burst pool cloud-a100: up to 32 x 8 A100 nodes" in out
    assert all(head in out for head in ("bursts", "burst h", "idle h", "cost $"))
