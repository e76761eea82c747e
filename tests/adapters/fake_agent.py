"""A stand-in for an agent-fed cluster's agent, in the test's process: it hears the
broker's commands on the real mosquitto, decodes them with the real codec
(``adapters.mqtt.commands``) and answers as the test scripts it (``auto``: an answer per
op, given at once; anything else waits for the test's ``answer``). It also reports
capacity (status, heartbeat, inventory, one node) and capabilities, as ``fedbroker agent``
does."""

from __future__ import annotations

import asyncio
import json
import secrets
from collections.abc import Callable, Mapping
from typing import Any

from adapters.mqtt.commands import (
    Command,
    Reply,
    Status,
    capabilities_topic,
    commands_topic,
    decode_command,
    encode_reply,
    replies_topic,
)
from adapters.mqtt.publisher import Backoff, MqttSettings, Publisher
from adapters.mqtt.reports import Usage, node_report
from broker.model import GpuType, Node, Resources

Answer = Callable[[Command], tuple[Status, Mapping[str, Any]] | None]


def done(result: Mapping[str, Any] | None = None) -> Answer:
    return lambda command: ("done", result or {})


class FakeAgent:
    def __init__(
        self, cluster: str, key: bytes, prefix: str, port: int, host: str = "127.0.0.1"
    ) -> None:
        self.cluster, self.key = cluster, key
        settings = MqttSettings(
            host, port, client_id=f"fbtest-agent-{secrets.token_hex(4)}", prefix=prefix,
            status=f"agents/{cluster}/status", keepalive=5, timeout=3.0,
        )  # fmt: skip
        self.publisher = Publisher(settings, backoff=Backoff(base=0.05, cap=0.5))
        self.publisher.subscribe(f"{prefix}/{commands_topic(cluster)}", self._on_command)
        self.commands: list[Command] = []  # every one heard, resent ones again
        self.auto: dict[str, Answer] = {}
        self.kinds: list[str] | None = None  # what ``report`` says it launches by default
        self.silent: set[str] = set()  # ops it does not even acknowledge
        self.changed = asyncio.Event()

    async def start(self) -> None:
        self.publisher.start()
        await self.publisher.wait_connected()

    async def close(self) -> None:
        await self.publisher.close()

    def _on_command(self, topic: str, payload: bytes, retained: bool) -> None:
        command = decode_command(payload, self.key)
        self.commands.append(command)
        self.changed.set()
        if command.op in self.silent:
            return
        self.reply(command, "accepted")
        answer = self.auto.get(command.op)
        said = answer(command) if answer is not None else None
        if said is not None:
            self.reply(command, said[0], said[1])

    def reply(
        self,
        command: Command,
        status: Status,
        result: Mapping[str, Any] | None = None,
        *,
        error: str = "",
        permanent: bool = False,
        key: bytes | None = None,
    ) -> None:
        reply = Reply(command.id, self.cluster, command.op, status, error, permanent, result or {})
        payload = encode_reply(reply, key or self.key)
        self.publisher.publish_nowait(replies_topic(self.cluster), payload)

    def ops(self, op: str) -> list[Command]:
        return [c for c in self.commands if c.op == op]

    async def heard(self, predicate: Callable[[], bool], timeout: float = 10.0) -> None:
        async with asyncio.timeout(timeout):
            while not predicate():
                self.changed.clear()
                await self.changed.wait()

    def report(self, gpus: int = 8, kinds: list[str] | None = None) -> None:
        """Capacity (one node ``n1``), a heartbeat, and capabilities: launching ``kinds``
        (None: report-only)."""
        c = self.cluster
        node = Node("n1", GpuType("A100"), Resources(gpus=gpus, cpu_milli=64_000,
                                                     memory_mib=256_000))  # fmt: skip
        publish = self.publisher.publish_nowait
        publish(f"agents/{c}/inventory", json.dumps({"nodes": ["n1"]}), retain=True)
        publish(f"agents/{c}/nodes/n1", json.dumps(node_report(node, Usage(), 0.0)), retain=True)
        caps: dict[str, Any] = {"v": 1, "launch": kinds is not None}
        if kinds is not None:
            caps |= {"kinds": kinds, "mode": "pin"}
        publish(capabilities_topic(c), json.dumps(caps), retain=True)
        publish(f"agents/{c}/heartbeat", "{}")


__all__ = ["Answer", "FakeAgent", "done"]
