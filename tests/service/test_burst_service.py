"""Bursting through the live service on an injected clock: a gang that fits nowhere locally
runs on burst nodes within provisioning + one cycle, exactly the nodes it needs are added
(no second scale-up in 100 cycles), and they are gone within scaleDownAfterSeconds + one
cycle of its end. Also: the pools in /v1/clusters' neighbour API and in /metrics."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer
from builders import Clock

from broker.config import Config, parse_config
from broker.http.app import make_app
from broker.manifest import parse_manifest
from broker.service.facade import Service

CYCLE = 10.0
PROVISION = 120.0
SCALE_DOWN = 300.0
TOKEN_A, TOKEN_B = "tok-a-" + "0" * 26, "tok-b-" + "0" * 26
BURST_AFTER = 30.0

CONFIG = """
store: {{url: "sqlite:///{db}"}}
scheduler: {{cycleSeconds: {cycle}, burstAfterSeconds: {burst_after}}}
clusters:
- name: onprem
  source: {{simulated: {{shapes: [{{gpuType: G2, gpus: 8, cpu: "96", memory: 384Gi, count: 2}}]}}}}
- name: cloud
  kind: cloud
  source: {{simulated: {{}}}}
burstPools:
- name: a100
  cluster: cloud
  gpuType: A100
  gpus: 8
  cpu: "96"
  memory: 1152Gi
  maxNodes: 8
  costPerNodeHour: 32.77
  provisionSeconds: {provision}
  scaleDownAfterSeconds: {scale_down}
  source: {{simulated: {{failureRate: {failure_rate}}}}}
queues:
- {{name: training, policy: gang}}
tenants:
- {{name: team-a, defaultQueue: training, token: {{value: tok-a-00000000000000000000000000}}}}
"""


def make_config(tmp_path: Path, failure_rate: float = 0.0) -> Config:
    text = CONFIG.format(
        db=tmp_path / "jobs.db", cycle=CYCLE, burst_after=BURST_AFTER, provision=PROVISION,
        scale_down=SCALE_DOWN, failure_rate=failure_rate,
    )  # fmt: skip
    return parse_config(text, "test config")


def gang(name: str, pods: int = 3, allow_burst: bool = True) -> Any:
    body = {
        "apiVersion": "fedbroker.io/v1alpha1",
        "kind": "FederatedJob",
        "metadata": {"name": name},
        "spec": {
            "placement": {"gpuTypes": ["A100"], "allowBurst": allow_burst},
            "podSets": [{"name": "worker", "count": pods,
                         "resources": {"nvidia.com/gpu": 8, "cpu": "32", "memory": "256Gi"}}],
        },
    }  # fmt: skip
    return parse_manifest(json.dumps(body).encode(), "application/json")


async def cycle(service: Service, clock: Clock) -> None:
    """One scheduling cycle at the next tick, with its pool calls and launches done."""
    clock.now += CYCLE
    await service.schedule_once()
    await service.pools.drain()
    await service.launches_done(timeout=10)


def cloud_nodes(service: Service) -> set[str]:
    return set(service.ledger.snapshot().clusters["cloud"].nodes)


async def test_gang_bursts_runs_and_the_nodes_go_away(tmp_path: Path) -> None:
    clock = Clock(1_000.0)
    service = Service(make_config(tmp_path), clock=clock)
    await service.start()
    try:
        submitted = clock.now
        await service.submit("team-a", gang("big"))
        running_at = None
        for _ in range(100):
            await cycle(service, clock)
            if running_at is None and (await service.get("team-a", "big")).state == "Running":
                running_at = clock.now
        assert running_at is not None
        # Waited burstAfterSeconds, then provisioning, then one cycle to place it.
        assert running_at - submitted <= BURST_AFTER + CYCLE + PROVISION + CYCLE
        record = await service.get("team-a", "big")
        assert record.cluster == "cloud"
        [pool] = service.pools.rows()
        assert (pool.scale_ups, pool.nodes_added, pool.replicas) == (1, 3, 3)
        assert service.pools.simulated[0].scale_calls == 1  # one scale-up in 100 cycles
        assert len(cloud_nodes(service)) == 3

        await service.cancel("team-a", "big")
        ended = clock.now
        while cloud_nodes(service):
            await cycle(service, clock)
            assert clock.now - ended <= SCALE_DOWN + 2 * CYCLE
        # Removed (replicas lowered) within scaleDownAfterSeconds + one cycle of the end;
        # the ledger hears of it at the next cycle.
        [pool] = service.pools.rows()
        assert (pool.replicas, pool.scale_downs, pool.ready) == (0, 3, 0)
        assert pool.node_hours > 0 and pool.cost > 0
        assert service.pools.controller.job_cost["team-a/big"] > 0
    finally:
        await service.close()


async def test_gang_not_allowed_to_burst_waits(tmp_path: Path) -> None:
    clock = Clock(1_000.0)
    service = Service(make_config(tmp_path), clock=clock)
    await service.start()
    try:
        await service.submit("team-a", gang("local", allow_burst=False))
        for _ in range(30):
            await cycle(service, clock)
        assert (await service.get("team-a", "local")).state == "Queued"
        [pool] = service.pools.rows()
        assert pool.scale_ups == 0 and service.pools.simulated[0].scale_calls == 0
    finally:
        await service.close()


async def test_provisioning_timeout_requeues_scales_back_marks_failing(tmp_path: Path) -> None:
    clock = Clock(1_000.0)
    service = Service(make_config(tmp_path, failure_rate=1.0), clock=clock)  # never come up
    await service.start()
    try:
        await service.submit("team-a", gang("stuck", pods=2))
        sim = service.pools.simulated[0]
        for _ in range(200):
            await cycle(service, clock)
            if sim.scale_calls == 2:
                break
        [pool] = service.pools.rows()
        assert (sim.replicas, pool.replicas, pool.provision_failures) == (0, 0, 1)
        assert pool.failing is True
        kinds = [e.kind for e in service.pools.controller.events]
        assert kinds == ["scale-up", "provision-timeout"]
        # The job's history (``get``) tells both.
        said = [t.reason for t in service.burst_history("team-a", "stuck", 0.0)]
        assert [r.split(":")[0] for r in said] == [
            "burst scale-up in pool a100", "burst provision-timeout in pool a100",
        ]  # fmt: skip
        assert (await service.get("team-a", "stuck")).state == "Queued"
        for _ in range(30):  # backing off: no new scale-up meanwhile
            await cycle(service, clock)
        assert sim.scale_calls == 2
    finally:
        await service.close()


async def test_pools_in_the_api_and_metrics(tmp_path: Path) -> None:
    text = CONFIG.format(
        db=tmp_path / "jobs.db", cycle=CYCLE, burst_after=BURST_AFTER, provision=PROVISION,
        scale_down=SCALE_DOWN, failure_rate=0.0,
    ).replace(  # a second tenant, who must not see team-a's burst cost
        "tenants:\n",
        "tenants:\n- {name: team-b, defaultQueue: training,\n"
        f"   token: {{value: {TOKEN_B}}}}}\n",
    )  # fmt: skip
    config = parse_config(text, "test config")
    clock = Clock(1_000.0)
    service = Service(config, clock=clock)
    await service.start()
    client = TestClient(TestServer(make_app(service, config)))
    await client.start_server()
    try:
        await service.submit("team-a", gang("big"))
        while (await service.get("team-a", "big")).state != "Running":
            await cycle(service, clock)
        for _ in range(6):  # an hour of the job on three nodes, in ten-minute cycles
            clock.now += 600
            await service.schedule_once()
        got = await client.get("/v1/jobs/big", headers={"Authorization": f"Bearer {TOKEN_A}"})
        history = [(h["state"], h["cluster"], h["reason"]) for h in
                   (await got.json())["status"]["history"]]  # fmt: skip
        # The scale-up for it, between its submission and its placement, in time order.
        assert [h[0] for h in history][:3] == ["Queued", "Queued", "Placed"]
        assert history[1][1:] == ("cloud", "burst scale-up in pool a100: +3 nodes for "
                                  "team-a/big (98.31/h)")  # fmt: skip
        a = await client.get("/v1/pools", headers={"Authorization": f"Bearer {TOKEN_A}"})
        assert a.status == 200
        doc = await a.json()
        [pool] = doc["pools"]
        assert (pool["pool"], pool["replicas"], pool["ready"], pool["scaleUps"]) == (
            "a100",
            3,
            3,
            1,
        )
        # Billed from the scale-up: at least the hour on three nodes, at 32.77 per node-hour.
        assert pool["nodeHours"] >= 3.0
        assert pool["cost"] == pytest.approx(pool["nodeHours"] * 32.77, abs=0.01)
        [job] = doc["jobs"]
        assert job["job"] == "team-a/big" and job["nodeHours"] >= 3.0 and job["cost"] > 0
        b = await (
            await client.get("/v1/pools", headers={"Authorization": f"Bearer {TOKEN_B}"})
        ).json()
        assert b["pools"] == doc["pools"] and b["jobs"] == []
        text = await (await client.get("/metrics")).text()
        samples = {
            line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith("fedbroker_burst")
        }
        assert samples['fedbroker_burst_scale_ups_total{pool="a100"}'] == 1
        assert samples['fedbroker_burst_nodes{pool="a100",state="ready"}'] == 3
        assert samples['fedbroker_burst_node_seconds_total{pool="a100"}'] >= 3 * 3600
        assert samples['fedbroker_burst_cost_total{pool="a100"}'] == pool["cost"]
        assert samples['fedbroker_burst_pool_available{pool="a100"}'] == 1  # simulated: at once
    finally:
        await client.close()
        await service.close()
