"""Bursting a gang that requires one rack, through the live service on an injected clock:
the on-prem racks hold one node each, so a rack-required gang of three nodes fits no
member; a burst pool whose ``topologyLabels`` name a rack grows by three nodes that join
that rack, and the gang is placed on them by the usual topology placement. A pool that
names no rack is refused, and explain says so (code ``topology``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from builders import Clock
from test_burst_service import cycle

from broker.cli.render import render
from broker.config import parse_config
from broker.manifest import parse_manifest
from broker.service.facade import Service

RACK = "cloud.provider.com/topology-rack"

CONFIG = """
store: {{url: "sqlite:///{db}"}}
scheduler: {{cycleSeconds: 10, burstAfterSeconds: 30}}
clusters:
- name: onprem
  topologyLevels: [{rack}]
  source: {{simulated: {{
    shapes: [{{gpuType: A100, gpus: 8, cpu: "96", memory: 1152Gi, count: 4}}],
    topology: {{levels: [{rack}], nodesPerRack: 1}}}}}}
- name: cloud
  kind: cloud
  topologyLevels: [{rack}]
  source: {{simulated: {{}}}}
burstPools:
- name: a100
  cluster: cloud
  gpuType: A100
  gpus: 8
  cpu: "96"
  memory: 1152Gi
  maxNodes: 8
  provisionSeconds: 120
  {labels}
  source: {{simulated: {{}}}}
queues:
- {{name: training, policy: gang}}
tenants:
- {{name: team-a, defaultQueue: training, token: {{value: tok-a-00000000000000000000000000}}}}
"""


def service(tmp_path: Path, labels: str) -> Service:
    text = CONFIG.format(db=tmp_path / "jobs.db", rack=RACK, labels=labels)
    return Service(parse_config(text, "test config"), clock=Clock(1_000.0))


def rack_gang(name: str) -> Any:
    """Three 8-GPU pods that must share one rack (on-prem racks hold one node)."""
    body = {
        "apiVersion": "fedbroker.io/v1alpha1",
        "kind": "FederatedJob",
        "metadata": {"name": name},
        "spec": {
            "placement": {"gpuTypes": ["A100"], "allowBurst": True},
            "podSets": [{"name": "worker", "count": 3, "topology": {"required": RACK},
                         "resources": {"nvidia.com/gpu": 8, "cpu": "32", "memory": "256Gi"}}],
        },
    }  # fmt: skip
    return parse_manifest(json.dumps(body).encode(), "application/json")


async def test_a_rack_gang_bursts_into_the_rack_the_pool_names(tmp_path: Path) -> None:
    svc = service(tmp_path, f"topologyLabels: {{{RACK}: burst-r0}}")
    clock = svc.shared.clock
    assert isinstance(clock, Clock)
    await svc.start()
    try:
        await svc.submit("team-a", rack_gang("big"))
        for _ in range(30):
            await cycle(svc, clock)
            if (await svc.get("team-a", "big")).state == "Running":
                break
        record = await svc.get("team-a", "big")
        assert (record.state, record.cluster) == ("Running", "cloud")
        [pool] = svc.pools.rows()
        assert (pool.scale_ups, pool.nodes_added) == (1, 3)
        assert record.placement is not None
        placed = {pod["node"] for pod in record.placement["pods"]}
        nodes = svc.ledger.snapshot().clusters["cloud"].nodes
        assert len(placed) == 3 and placed == set(nodes)  # the new nodes, one pod each
        assert {nodes[n].node.labels[RACK] for n in placed} == {"burst-r0"}
    finally:
        await svc.close()


async def test_a_pool_naming_no_rack_is_refused_and_explain_says_so(tmp_path: Path) -> None:
    svc = service(tmp_path, "")
    clock = svc.shared.clock
    assert isinstance(clock, Clock)
    await svc.start()
    try:
        await svc.submit("team-a", rack_gang("big"))
        for _ in range(6):  # past burstAfterSeconds: the pool would be grown by now
            await cycle(svc, clock)
        assert (await svc.get("team-a", "big")).state == "Queued"
        assert svc.pools.rows()[0].scale_ups == 0
        doc = await svc.explain("team-a", "big")
        burst = doc["burst"]
        assert burst["status"] == "none"
        [refusal] = burst["refusals"]
        assert (refusal["pool"], refusal["code"]) == ("a100", "topology")
        said = f"pod set worker requires one rack ({RACK}), and its topologyLabels name no value"
        assert refusal["message"].startswith(said)
        assert said in render("explain", doc)
    finally:
        await svc.close()
