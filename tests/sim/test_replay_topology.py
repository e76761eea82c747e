"""The replay's synthetic topology: a rack-required gang stays in one rack where the same
gang without a request spans two, a rack gang bursts into the pool's own rack, and the CLI
lays racks and reports the spans in JSON."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from broker.cli.main import main
from broker.model import GpuType, Job, Node, PodSet, Resources
from broker.sim.arrivals import Arrival, Workload
from broker.sim.replay import ReplayConfig, ReplayResult, replay_policy
from broker.sim.replay_burst import BurstConfig
from broker.sim.replay_topology import RACK_LEVEL, RequestMode, TopologyConfig, with_requests


def nodes() -> list[Node]:
    res = Resources(gpus=8, cpu_milli=96_000, memory_mib=393_216)
    return [Node(f"n-{i}", GpuType("G2"), res) for i in range(4)]


def job(name: str, pods: int, gpus: int) -> Job:
    return Job(name, (PodSet("p", pods, Resources(gpus=gpus, cpu_milli=1000)),))


def workload() -> Workload:
    """a fills n-0 and b half of n-1 (rack r0 = n-0, n-1); then a gang of 2 x 4 GPUs,
    which binpack puts node by node on n-1's free half and on n-2 of rack r1."""
    arrivals = (
        Arrival(0.0, job("a", 1, 8), 1000.0),
        Arrival(1.0, job("b", 1, 4), 1000.0),
        Arrival(2.0, job("g", 2, 4), 100.0),
    )
    return Workload(arrivals, 2000.0, 0, 0)


def run(request: RequestMode) -> ReplayResult:
    topology = TopologyConfig(nodes_per_rack=2, racks_per_block=2, request=request)
    config = ReplayConfig(clusters=1, samples=10, topology=topology)
    return replay_policy(nodes(), workload(), "binpack", config)


def test_a_rack_required_gang_spans_one_rack_and_without_the_request_two() -> None:
    free, required = run("none"), run("required")
    assert (free.topology_gangs, required.topology_gangs) == (1, 1)
    assert (free.racks_spanned_max, required.racks_spanned_max) == (2.0, 1.0)
    # Both racks are in block b0: the gang spans one block either way.
    assert free.blocks_spanned_max == required.blocks_spanned_max == 1.0
    assert free.topology_gang_wait_p95_s == required.topology_gang_wait_p95_s == 0.0
    assert free.conflicts == required.conflicts == 0


def test_requests_go_to_gangs_only() -> None:
    asked = with_requests(workload(), TopologyConfig(2, 0, "preferred"))
    topologies = {a.job.name: a.job.pod_sets[0].topology for a in asked.arrivals}
    assert topologies["a"] is None and topologies["b"] is None
    assert topologies["g"] is not None and topologies["g"].preferred == RACK_LEVEL


NODES_CSV = "sn,cpu_milli,memory_mib,gpu,model\n" + "".join(
    f"node-{i:02d},96000,393216,8,G2\n" for i in range(8)
)
PODS_CSV = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,creation_time,deletion_time\n" + "".join(
    f"pod-{i:02d},2000,4096,1,1000,{60 * i},{60 * i + 600}\n" for i in range(10)
)


def test_cli_lays_racks_and_reports_the_spans_in_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "n.csv").write_text(NODES_CSV)
    (tmp_path / "p.csv").write_text(PODS_CSV)
    argv = [
        *("simulate", "--protocol", "replay", "--nodes", str(tmp_path / "n.csv")),
        *("--pods", str(tmp_path / "p.csv"), "--jobs", "12", "--clusters", "2", "--no-burst"),
        *("--racks-of", "2", "--blocks-of", "2", "--topology-request", "required"),
        *("--policy", "gang", "--json"),
    ]
    assert main(argv) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["topology"] == {
        "levels": ["cloud.provider.com/topology-block", RACK_LEVEL],
        "nodes_per_rack": 2,
        "racks_per_block": 2,
        "request": "required",
    }
    (row,) = doc["results"]
    assert row["conflicts"] == 0 and row["topology_gangs"] > 0
    assert row["racks_spanned_mean"] == row["racks_spanned_max"] == 1.0
    for key in ("blocks_spanned_p95", "topology_gang_wait_p50_s", "topology_gang_wait_p95_s"):
        assert isinstance(row[key], float), key


def test_cli_refuses_a_request_without_racks(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "--protocol", "replay", "--topology-request", "required"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--topology-request: needs --racks-of" in err


def test_a_rack_gang_too_big_for_any_rack_bursts_into_the_pools_own_rack() -> None:
    """Racks of one node cannot take a 2 x 8 gang that requires a rack; the burst pool's
    nodes join one rack of their own, so it starts there, in one rack."""
    gang = dataclasses.replace(job("g", 2, 8), allow_burst=True)
    work = Workload((Arrival(0.0, gang, 100.0),), 2000.0, 0, 0)
    topology = TopologyConfig(nodes_per_rack=1, request="required")
    config = ReplayConfig(clusters=1, samples=10, topology=topology, burst=BurstConfig())
    result = replay_policy(nodes()[:2], work, "gang", config)
    assert result.burst_placements == 1 and result.unstarted == 0
    assert result.racks_spanned_max == 1.0 and result.blocks_spanned_max is None
