"""One member cluster's capacity reported to the broker over MQTT, and in pull mode the
broker's commands carried out on the same connection.

``Agent`` watches the cluster with the Kubernetes adapter's ``ClusterWatcher`` (list+watch
of nodes and pods, relists, reconnects), keeps each node's allocatable and the requests of
the pods running on it (``adapters.mqtt.reports.CapacityState``: the broker's own pods
apart), and publishes through the MQTT adapter's ``Publisher``, whose status topic (and
last will) is ``agents/<cluster>/status``. Topics, below the prefix (JSON schema:
``adapters.mqtt.reports`` and ``adapters.mqtt.commands``):

- ``agents/<cluster>/status``: retained ``online`` / ``offline`` (last will);
- ``agents/<cluster>/capabilities``: retained, what the agent carries out
  (``{"v": 1, "launch": false}`` when it only reports);
- ``agents/<cluster>/inventory``: retained ``{"nodes": [...]}``;
- ``agents/<cluster>/nodes/<node>``: retained node report, only when it changed
  (an empty retained payload clears a deleted node);
- ``agents/<cluster>/heartbeat``: every ``interval`` seconds while the watch is
  connected, ``{"at", "interval", "nodes", "seq"}``;
- ``agents/<cluster>/commands`` in, ``agents/<cluster>/replies`` out: pull mode
  (``broker.agent.commands``).

Reports are queued with ``Publisher.publish`` (waits for room, never dropped); after every
(re)connect everything is published again, capabilities first, so an MQTT broker that lost
its retained messages gets the whole state back.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from adapters.kube.translate import DEFAULT_GPU, GpuConfig
from adapters.kube.watch import ClusterWatcher
from adapters.mqtt.commands import capabilities_topic
from adapters.mqtt.publisher import MqttSettings, Publisher
from adapters.mqtt.reports import CapacityState
from broker.model import CapacityEvent

if TYPE_CHECKING:
    from kubernetes.aio.client import ApiClient

    from broker.agent.commands import CommandExecutor


class Agent:
    """One cluster's watcher feeding the capacity state, reported over one MQTT
    connection: on every change, and as heartbeats while the watch is connected."""

    def __init__(
        self,
        cluster: str,
        api: ApiClient,
        settings: MqttSettings,
        *,
        interval: float = 10.0,
        gpu: GpuConfig = DEFAULT_GPU,
        clock: Callable[[], float] = time.time,
        commands: Callable[[Publisher], CommandExecutor] | None = None,
    ) -> None:
        self.cluster = cluster
        self.interval = interval
        self._clock = clock
        self.publisher = Publisher(
            dataclasses.replace(settings, status=f"agents/{cluster}/status"),
            on_connect=self.republish,
        )
        # Pull mode: the executor of the broker's commands, on the same connection.
        self.commands = None if commands is None else commands(self.publisher)
        if self.commands is not None:
            self.commands.subscribe()
        self._capabilities_due = True
        self.watcher = ClusterWatcher(cluster, api, self.emit, gpu, on_status=self.on_status)
        self.state = CapacityState()
        self._sent: dict[str, dict[str, Any]] = {}  # node -> last report published (no "at")
        self._wake = asyncio.Event()
        self.watching = False
        self.heartbeats = 0
        self.beat_now = asyncio.Event()  # set: send a heartbeat at once (tests, operators)

    # -- inputs ---------------------------------------------------------------------------

    def emit(self, events: list[CapacityEvent]) -> None:
        self.state.apply(events)
        self._wake.set()

    def on_status(self, _cluster: str, connected: bool) -> None:
        self.watching = connected
        self._wake.set()

    def republish(self) -> None:
        """After a (re)connect: everything again (retained state may have been lost)."""
        self._sent.clear()
        self._capabilities_due = True
        self.state.dirty.update(self.state.nodes)
        self.state.inventory_changed = True
        self._wake.set()

    # -- the loop -------------------------------------------------------------------------

    async def run(self) -> None:
        """The publisher, the watcher and the report loop, until cancelled or one fails;
        then ``offline`` is published (retained) and the connection closed cleanly."""
        tasks = [
            self.publisher.start(),
            asyncio.create_task(self.watcher.run(), name="watch"),
            asyncio.create_task(self._report_loop(), name="report"),
        ]
        if self.commands is not None:
            tasks.append(asyncio.create_task(self.commands.run(), name="replies"))
        try:
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
            for task in done:
                task.result()
        finally:
            if self.commands is not None:
                await self.commands.close()
            for task in tasks[1:]:
                task.cancel()
            await asyncio.gather(*tasks[1:], return_exceptions=True)
            await self.publisher.close()

    async def _report_loop(self) -> None:
        loop = asyncio.get_running_loop()
        next_beat = loop.time()
        beat_waiter = asyncio.ensure_future(self.beat_now.wait())
        try:
            while True:
                timeout = max(0.0, next_beat - loop.time()) if self.watching else None
                waker = asyncio.ensure_future(self._wake.wait())
                await asyncio.wait({waker, beat_waiter}, timeout=timeout,
                                   return_when=asyncio.FIRST_COMPLETED)  # fmt: skip
                waker.cancel()
                self._wake.clear()
                await self.publish_changes()
                forced = beat_waiter.done()
                if forced:
                    self.beat_now.clear()
                    beat_waiter = asyncio.ensure_future(self.beat_now.wait())
                if self.watching and (forced or loop.time() >= next_beat):
                    await self.heartbeat()
                    next_beat = loop.time() + self.interval
        finally:
            beat_waiter.cancel()

    def capabilities(self) -> dict[str, Any]:
        """What this agent carries out (retained: the broker reads the latest)."""
        if self.commands is None:
            return {"v": 1, "launch": False}
        return self.commands.capabilities()

    async def publish_changes(self) -> None:
        state = self.state
        if self._capabilities_due:
            self._capabilities_due = False
            body = json.dumps(self.capabilities())
            await self.publisher.publish(capabilities_topic(self.cluster), body, retain=True)
        if state.inventory_changed:
            # Before the reports: the broker ignores reports of nodes not in the inventory.
            state.inventory_changed = False
            body = json.dumps({"nodes": sorted(state.nodes)})
            await self.publisher.publish(self._topic("inventory"), body, retain=True)
        dirty, state.dirty = state.dirty, set()
        deleted, state.deleted = state.deleted, set()
        for name in sorted(dirty):
            report = state.report(name, 0.0)
            if report is None:
                if self._sent.pop(name, None) is not None or name in deleted:
                    await self.publisher.publish(self._topic(f"nodes/{name}"), b"", retain=True)
                continue
            if self._sent.get(name) == report:
                continue
            self._sent[name] = report
            body = json.dumps({**report, "at": self._clock()})
            await self.publisher.publish(self._topic(f"nodes/{name}"), body, retain=True)

    async def heartbeat(self) -> None:
        self.heartbeats += 1
        body = {"at": self._clock(), "interval": self.interval,
                "nodes": len(self.state.nodes), "seq": self.heartbeats}  # fmt: skip
        await self.publisher.publish(self._topic("heartbeat"), json.dumps(body))

    def _topic(self, suffix: str) -> str:
        return f"agents/{self.cluster}/{suffix}"


__all__ = ["Agent"]
