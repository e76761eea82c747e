"""``fedbroker agent``: a member cluster served by kmock (real HTTP, the real Kubernetes
watcher), reported over the real mosquitto to a Service whose cluster has ``source: mqtt``.

Staleness is driven by the Service's injected clock, not by waiting.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import subprocess
import sys
from pathlib import Path
from typing import Any

import kmock
import kmock as kmocklib
import pytest
from builders import Clock, until
from test_kube_service import foreign_pod as pod_obj
from test_kube_service import node_obj
from test_mqtt import (
    MQTT_HOST,
    MQTT_PORT,
    ROOT,
    require_mqtt,
    subscriber,
    unique_prefix,
)

from adapters.kubeapi.kubeconfig import load_clients
from adapters.mqtt.publisher import MqttSettings
from broker.cli.agent import Agent
from broker.cli.main import main
from broker.config import parse_config
from broker.service.facade import Service

NODES = kmock.resource("", "v1", "nodes")
PODS = kmock.resource("", "v1", "pods")
CANARY = "canary-token-5e1d0b7a"


def write_kubeconfig(path: Path, server: str) -> Path:
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": "edge",
        "contexts": [{"name": "edge", "context": {"cluster": "c-edge", "user": "u"}}],
        "clusters": [{"name": "c-edge", "cluster": {"server": server}}],
        "users": [{"name": "u", "user": {"token": CANARY}}],
    }
    path.write_text(json.dumps(doc))
    return path


@pytest.fixture
def k8s(kmock: kmock.KubernetesEmulator) -> kmock.KubernetesEmulator:
    kmock.resources["v1/pods"] = kmocklib.ResourceInfo(namespaced=True)
    kmock.resources["v1/nodes"] = kmocklib.ResourceInfo(namespaced=False)
    kmock.objects[NODES, None, "n1"] = node_obj("n1")
    kmock.objects[PODS, "ml", "other"] = pod_obj("other", "n1", gpus=2)
    return kmock


async def watching(km: kmock.KubernetesEmulator) -> None:
    """Until both watch streams are subscribed to kmock's event bus (yields only)."""
    async with asyncio.timeout(10):
        while not (km._buses[NODES].consumer_count and km._buses[PODS].consumer_count):
            await asyncio.sleep(0)


def broker_config(tmp_path: Path, prefix: str) -> str:
    return f"""
store: {{url: "sqlite:///{tmp_path / "jobs.db"}"}}
scheduler: {{staleAfterSeconds: 60}}
events:
  mqtt: {{host: "{MQTT_HOST}", port: {MQTT_PORT}, clientId: fbtest-broker-{secrets.token_hex(4)},
          topicPrefix: "{prefix}"}}
clusters:
- name: edge
  labels: {{region: eu}}
  source: {{mqtt: {{staleAfterSeconds: 30}}}}
queues:
- {{name: training, policy: gang}}
tenants:
- {{name: team-a, defaultQueue: training, token: {{value: tok-a-00000000000000000000000000}}}}
"""


def edge(service: Service) -> dict[str, Any]:
    return next(c for c in service.clusters() if c["cluster"] == "edge")


def stale(service: Service) -> bool:
    return service.ledger.snapshot().clusters["edge"].stale


def gpus(service: Service) -> tuple[int, float]:
    """Total and used GPUs of the edge cluster in the ledger."""
    view = service.ledger.snapshot().clusters["edge"]
    return view.gpus_total(), view.gpus_total() - view.free_milli() / 1000


async def test_agent_capacity_reaches_the_ledger_and_goes_stale(
    k8s: kmock.KubernetesEmulator, tmp_path: Path
) -> None:
    await require_mqtt()
    prefix = unique_prefix()
    clock = Clock()
    service = Service(parse_config(broker_config(tmp_path, prefix), "test config"), clock=clock)
    await service.start()
    assert service.mqtt is not None
    members = service.mqtt.members
    clients, _ = await load_clients(write_kubeconfig(tmp_path / "kc", str(k8s.url)))
    settings = MqttSettings(
        MQTT_HOST, MQTT_PORT, client_id=f"fbtest-agent-{secrets.token_hex(4)}", prefix=prefix
    )
    agent = Agent("edge", clients["edge"], settings, interval=3600)  # one heartbeat only
    task: asyncio.Task[None] | None = None
    try:
        # No report yet: stale, not connected, no capacity.
        assert stale(service) and edge(service)["connected"] is False
        assert gpus(service) == (0, 0)
        async with subscriber(f"{prefix}/agents/edge/#") as seen:
            task = asyncio.create_task(agent.run())
            await until(lambda: gpus(service) == (4, 2.0) and not stale(service))
            row = edge(service)
            assert row["connected"] is True
            assert (
                row["gpuTypes"][0] | {"gpuType": "A100", "total": 4, "free": 2.0}
                == row["gpuTypes"][0]
            )
            # What went over the wire: retained report, inventory, status; a heartbeat.
            await seen.wait(lambda: bool(seen.payloads(f"{prefix}/agents/edge/heartbeat")))
            [report] = seen.json(f"{prefix}/agents/edge/nodes/n1")[-1:]
            assert report["allocatable"]["gpus"] == 4 and report["used"]["gpus"] == 2
            assert seen.json(f"{prefix}/agents/edge/inventory")[-1] == {"nodes": ["n1"]}
            assert seen.payloads(f"{prefix}/agents/edge/status")[-1] == b"online"
            # A report-only agent says it launches nothing (the broker never sends it work).
            caps = seen.json(f"{prefix}/agents/edge/capabilities")
            assert caps and caps[-1] == {"v": 1, "launch": False}

        # Changes in the cluster reach the ledger through MQTT.
        await watching(k8s)
        await k8s.post("/api/v1/namespaces/ml/pods", json=pod_obj("more", "n1", gpus=1))
        await until(lambda: gpus(service) == (4, 3.0))
        await k8s.post("/api/v1/nodes", json=node_obj("n2", gpus=8))
        await until(lambda: gpus(service) == (12, 3.0))
        await k8s.request("DELETE", "/api/v1/nodes/n2")
        await until(lambda: gpus(service) == (4, 3.0))

        # No heartbeat for longer than staleAfterSeconds (the broker's clock): stale.
        clock.now += 29
        members.check_stale()
        assert not stale(service)
        clock.now += 2
        members.check_stale()
        assert stale(service) and edge(service)["connected"] is False
        agent.beat_now.set()  # the agent speaks again
        await until(lambda: not stale(service))
        assert edge(service)["connected"] is True

        # The agent stops: its status says offline, stale at once (no clock needed).
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await until(lambda: stale(service))
        assert gpus(service) == (4, 3.0)  # the last known capacity, but no placements there
    finally:
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        await clients["edge"].close()  # type: ignore[no-untyped-call]
        await service.close()


async def test_a_restarted_broker_learns_the_capacity_from_retained_reports(
    k8s: kmock.KubernetesEmulator, tmp_path: Path
) -> None:
    await require_mqtt()
    prefix = unique_prefix()
    clients, _ = await load_clients(write_kubeconfig(tmp_path / "kc", str(k8s.url)))
    settings = MqttSettings(
        MQTT_HOST, MQTT_PORT, client_id=f"fbtest-agent-{secrets.token_hex(4)}", prefix=prefix
    )
    agent = Agent("edge", clients["edge"], settings, interval=3600)
    task = asyncio.create_task(agent.run())
    try:
        await until(lambda: agent.heartbeats == 1 and not agent.publisher.backlog)
        # The broker starts after the agent published: the retained reports fill the
        # ledger; without a fresh heartbeat the cluster stays stale.
        service = Service(parse_config(broker_config(tmp_path, prefix), "test config"))
        await service.start()
        try:
            await until(lambda: gpus(service) == (4, 2.0))
            assert stale(service)
            agent.beat_now.set()
            await until(lambda: not stale(service))
        finally:
            await service.close()
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await clients["edge"].close()  # type: ignore[no-untyped-call]


def test_agent_command_rejects_bad_arguments(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["agent", "--cluster", "Not_A_Label", "--kubeconfig", "kc", "--mqtt-host", "h"]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--cluster must be a DNS label" in err


def test_agent_command_with_a_bad_context_exits_2_without_secrets(tmp_path: Path) -> None:
    kc = write_kubeconfig(tmp_path / "kc", "http://127.0.0.1:9")
    proc = subprocess.run(
        [sys.executable, "-m", "broker.cli", "agent", "--cluster", "edge", "--kubeconfig",
         str(kc), "--context", "nope", "--mqtt-host", "127.0.0.1"],
        cwd=ROOT, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert proc.returncode == 2
    assert "no context 'nope'" in proc.stderr
    assert CANARY not in proc.stderr + proc.stdout
