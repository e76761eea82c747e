"""/metrics of a running broker (the real aiohttp app over the service) checked against the
ledger after a sequence of placements, a timeout and a requeue; every figure is computed here
independently from the ledger's nodes, not read back from the code that exports it."""

from __future__ import annotations

import asyncio
import json
from collections import defaultdict
from pathlib import Path
from typing import Any

from aiohttp.test_utils import TestClient, TestServer
from builders import Clock
from prometheus_client.parser import text_string_to_metric_families

from adapters.simulated import SimulatedLauncher
from broker.config import parse_config
from broker.http.app import make_app
from broker.manifest import parse_manifest
from broker.model import MILLI_PER_GPU
from broker.service.facade import Service

CONFIG = """
store: {{url: "sqlite:///{db}"}}
scheduler: {{backoffBaseSeconds: 60}}
clusters:
- name: a
  topologyLevels: [example.com/topology-rack]
  source:
    simulated:
      shapes: [{{gpuType: A100, gpus: 8, cpu: "96", memory: 1024Gi, count: 3}}]
      topology: {{levels: [example.com/topology-rack], nodesPerRack: 2}}
- name: b
  source:
    simulated: {{shapes: [{{gpuType: T4, gpus: 4, cpu: "32", memory: 128Gi, count: 2}}]}}
queues:
- {{name: training, policy: gang}}
- {{name: inference, policy: binpack}}
tenants:
- {{name: team-a, defaultQueue: training, queues: [inference],
   token: {{value: tok-a-00000000000000000000000000}}}}
"""


def job(name: str, pods: int, gpus: int, queue: str = "training", **placement: Any) -> Any:
    body = {
        "apiVersion": "fedbroker.io/v1alpha1",
        "kind": "FederatedJob",
        "metadata": {"name": name},
        "spec": {
            "queue": queue,
            "placement": placement,
            "gang": {"scheduleTimeoutSeconds": 60},
            "podSets": [{"name": "w", "count": pods,
                         "resources": {"nvidia.com/gpu": gpus, "cpu": "1", "memory": "1Gi"}}],
        },
    }  # fmt: skip
    return parse_manifest(json.dumps(body).encode(), "application/json")


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def value(found: dict[Any, float], name: str, **labels: str) -> float:
    return found[(name, tuple(sorted(labels.items())))]


async def test_metrics_match_the_ledger_after_placements(tmp_path: Path) -> None:
    config = parse_config(CONFIG.format(db=tmp_path / "jobs.db"), "test config")
    clock = Clock(10_000.0)
    launcher = SimulatedLauncher(never_start=["stuck"])
    service = Service(config, clock=clock, launcher=launcher)
    await service.start()
    client = TestClient(TestServer(make_app(service, config)))
    await client.start_server()
    try:
        # 2 A100 nodes taken whole by a gang, a 3-GPU pod, a T4 pod, a gang that never
        # starts, and a 16-GPU-per-pod job that fits nowhere.
        for manifest in (
            job("llama", 2, 8),
            job("single", 1, 3, "inference"),
            job("t4", 1, 2, "inference", gpuTypes=["T4"]),
            job("stuck", 2, 2, gpuTypes=["T4"]),
            job("huge", 2, 16),
        ):
            await service.submit("team-a", manifest)
        clock.now += 5
        await service.schedule_once()
        async with asyncio.timeout(10):  # all but "stuck", which never starts
            while len([la for la in service.lifecycle.launches() if la.running]) < 3:
                await asyncio.sleep(0)
        # The stuck gang times out: requeued with backoff, its capacity back.
        clock.now += 61
        await service.schedule_once()
        await service.launches_done(timeout=10)

        found = samples(await (await client.get("/metrics")).text())
        snapshot = service.ledger.snapshot()
        reserved: dict[tuple[str, str], float] = defaultdict(float)
        for placement in service.ledger.reservations().values():
            nodes = snapshot.clusters[placement.cluster].nodes
            for pod in placement.pods:
                key = (placement.cluster, str(nodes[pod.node].node.gpu_type))
                reserved[key] += pod.resources.gpu_request_milli / MILLI_PER_GPU
        for name, view in snapshot.clusters.items():
            by_type: dict[str, list[Any]] = defaultdict(list)
            for state in view.nodes.values():
                by_type[str(state.node.gpu_type)].append(state)
            for gpu_type, states in by_type.items():
                total = sum(s.node.allocatable.gpus for s in states)
                free = sum(s.free_milli for s in states) / MILLI_PER_GPU
                held = reserved[(name, gpu_type)]
                labels = {"cluster": name, "gpu_type": gpu_type}
                assert value(found, "fedbroker_cluster_gpus", **labels) == total
                assert value(found, "fedbroker_gpus", state="free", **labels) == free
                assert value(found, "fedbroker_gpus", state="reserved", **labels) == held
                allocated = value(found, "fedbroker_gpus", state="allocated", **labels)
                assert allocated == total - free - held
                whole = sum(sum(1 for f in s.gpu_free if f == MILLI_PER_GPU) // 8 for s in states)
                assert value(found, "fedbroker_largest_gang_gpus", **labels) == whole * 8
        # Per rack of cluster a (two racks: r0 of 2 nodes, r1 of 1): the largest gang inside
        # one rack; cluster b declares no level, so it has none.
        racks: dict[str, int] = defaultdict(int)
        for state in snapshot.clusters["a"].nodes.values():
            rack = state.node.labels["example.com/topology-rack"]
            racks[rack] += sum(1 for f in state.gpu_free if f == MILLI_PER_GPU) // 8
        assert sorted(racks) == ["r0", "r1"]
        in_rack = {"cluster": "a", "gpu_type": "A100", "level": "example.com/topology-rack"}
        topo = "fedbroker_topology_largest_gang_gpus"
        assert value(found, topo, **in_rack) == max(racks.values()) * 8
        assert {dict(ls)["cluster"] for n, ls in found if n == topo} == {"a"}
        # A100: the gang took two whole nodes, the 3-GPU pod 3 of the third: 5 free there.
        a100 = {"cluster": "a", "gpu_type": "A100"}
        assert value(found, "fedbroker_gpus", state="free", **a100) == 5
        assert value(found, "fedbroker_gpus", state="allocated", **a100) == 19
        # Pending: "huge" (32 GPUs) and "stuck" (4, in backoff). The only pods waiting need
        # 16 or 2 T4 GPUs: the A100 node's 5 free GPUs fit no pod of them; T4 GPUs do.
        assert value(found, "fedbroker_pending_jobs", queue="training") == 2
        assert value(found, "fedbroker_pending_gpus", queue="training") == 32 + 4
        assert value(found, "fedbroker_pending_gpus", queue="inference") == 0
        assert value(found, "fedbroker_stranded_gpus", **a100) == 5
        assert value(found, "fedbroker_stranded_gpus", cluster="b", gpu_type="T4") == 0
        assert value(found, "fedbroker_oldest_pending_gang_seconds", queue="training") == 66
        # Counters and histograms of what happened.
        placements = {
            pairs: v for (n, pairs), v in found.items() if n == "fedbroker_placements_total"
        }
        by_result: dict[str, float] = defaultdict(float)
        for pairs, v in placements.items():
            assert {k for k, _ in pairs} == {"policy", "result"}
            by_result[dict(pairs)["result"]] += v
        # Placed: llama, single, t4 and stuck (which then timed out and waits in backoff).
        assert by_result["placed"] == 4
        assert by_result["unplaceable"] >= 2  # huge, twice
        assert value(found, "fedbroker_gang_timeouts_total") == 1
        assert value(found, "fedbroker_requeues_total", reason="timeout") == 1
        assert value(found, "fedbroker_job_wait_seconds_count", queue="training") == 1
        assert value(found, "fedbroker_job_wait_seconds_count", queue="inference") == 2
        assert value(found, "fedbroker_job_wait_seconds_sum", queue="inference") == 2 * 5
        # Every decision a policy made was timed; the precheck's quick "no room" is not.
        timed = value(found, "fedbroker_placement_decision_seconds_count")
        assert 4 <= timed <= sum(by_result.values())
        # Every cycle was timed; a cycle that skipped or was cut short says so (how often
        # depends on what changed between cycles and on the machine's speed: present only).
        assert value(found, "fedbroker_scheduling_cycle_seconds_count") >= 2  # schedule_once x2
        assert value(found, "fedbroker_placements_skipped_total") >= 0
        assert value(found, "fedbroker_scheduling_cycles_cut_short_total") >= 0
        assert value(found, "fedbroker_leader") == 1
        assert value(found, "fedbroker_cluster_connected", cluster="a") == 1
        # No job name ever becomes a label value.
        names = {"llama", "single", "t4", "stuck", "huge", "team-a"}
        assert not {v for (_, ls), _ in found.items() for _, v in ls} & names
    finally:
        await client.close()
        await service.close()
