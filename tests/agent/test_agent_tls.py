"""An agent and the broker over TLS, each known to mosquitto by its client certificate alone.

The shipped mosquitto configuration and ACL (deploy/mosquitto, run as
tests/deploy/test_mosquitto_acl.py does) on a private mosquitto; certificates of a test CA:
the agent's CN is its cluster's name, the broker's ``fedbroker.broker``. The member is
served by kmock (real HTTP) as in tests/cli/test_agent.py. That another cluster's
certificate hears none of this cluster's commands, and that a client without a certificate
of the CA is refused: tests/deploy/test_mosquitto_acl.py.
"""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

import kmock
from builders import until
from test_agent import gpus, k8s, stale, write_kubeconfig
from test_mosquitto_acl import make_pki, shipped_mosquitto

from adapters.kubeapi.kubeconfig import load_clients
from adapters.mqtt.publisher import MqttSettings
from adapters.mqtt.tls import MqttTls
from broker.agent.capacity import Agent
from broker.config import parse_config
from broker.service.facade import Service

__all__ = ["k8s"]  # the fixture, used by name

CONFIG = """
store: {{url: "sqlite:///{db}"}}
events:
  mqtt:
    host: 127.0.0.1
    port: {port}
    tls: {{caFile: {pki}/ca.crt, certFile: {pki}/fedbroker.broker.crt,
           keyFile: {pki}/fedbroker.broker.key}}
clusters:
- name: edge
  source: {{mqtt: {{staleAfterSeconds: 30}}}}
queues:
- {{name: training, policy: gang}}
tenants:
- {{name: team-a, defaultQueue: training, token: {{value: tok-a-00000000000000000000000000}}}}
"""


async def test_an_agent_with_its_certificate_reports_to_the_broker_with_its_own(
    k8s: kmock.KubernetesEmulator, tmp_path: Path
) -> None:
    pki = make_pki(tmp_path / "pki", ("fedbroker.broker", "edge"))
    passwd = tmp_path / "passwd"
    passwd.write_text("")  # nobody logs in with a password here
    mosquitto, ports = await shipped_mosquitto(tmp_path / "mosquitto", passwd, pki)
    port = ports[8883]
    text = CONFIG.format(db=tmp_path / "jobs.db", port=port, pki=pki)
    service = Service(parse_config(text, "broker.yaml", {}))
    clients, _ = await load_clients(write_kubeconfig(tmp_path / "kc", str(k8s.url)))
    tls = MqttTls(str(pki / "ca.crt"), str(pki / "edge.crt"), str(pki / "edge.key"))
    agent = Agent("edge", clients["edge"], MqttSettings("127.0.0.1", port, tls=tls))
    task: asyncio.Task[None] | None = None
    try:
        await service.start()
        assert service.mqtt is not None
        # The agent's first heartbeat is not retained: the broker must have subscribed
        # (connected is set after the SUBACK) before the agent sends it, or the next one is
        # an interval (10 s) away.
        mqtt = service.mqtt
        await until(lambda: mqtt.publisher.connected)
        task = asyncio.create_task(agent.run())
        # The broker hears the agent's reports and heartbeats: the ACL knew both by the
        # CN of their certificates (the agent writes only below agents/edge/).
        await until(lambda: gpus(service) == (4, 2.0) and not stale(service))
        assert service.mqtt.publisher.connected and agent.publisher.connected
    finally:
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        await clients["edge"].close()  # type: ignore[no-untyped-call]
        await service.close()
        mosquitto.kill(signal.SIGTERM)
