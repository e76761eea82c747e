"""The cluster agent: watch one member cluster, report its nodes' capacity over MQTT.

``Agent`` runs inside a member cluster (``fedbroker agent``). It watches the cluster with
the Kubernetes adapter's ``ClusterWatcher`` (list+watch of nodes and pods, relists,
reconnects), keeps each node's allocatable and the requests of the pods running on it, and
publishes through a ``Publisher`` whose status topic (and last will) is
``agents/<cluster>/status``. The topics and the JSON schema are in
``adapters.mqtt.reports``:

- ``<prefix>/agents/<cluster>/status``: retained ``online`` / ``offline`` (last will);
- ``<prefix>/agents/<cluster>/inventory``: retained ``{"nodes": [...]}``;
- ``<prefix>/agents/<cluster>/nodes/<node>``: retained node report, only when it changed
  (an empty retained payload clears a deleted node);
- ``<prefix>/agents/<cluster>/heartbeat``: every ``interval`` seconds while the watch is
  connected, ``{"at", "interval", "nodes", "seq"}``.

Reports are queued with ``Publisher.publish`` (waits for room, never dropped); after every
(re)connect everything is published again, so an MQTT broker that lost its retained
messages gets the whole state back.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from collections.abc import Callable
from typing import Any

from kubernetes.aio.client import ApiClient

from adapters.kube.translate import DEFAULT_GPU, GpuConfig
from adapters.kube.watch import ClusterWatcher
from adapters.mqtt.publisher import MqttSettings, Publisher
from adapters.mqtt.reports import node_report, usage_of
from broker.model import CapacityEvent, Node, NodeDeleted, NodeUpdated, PodBound, PodDeleted


class CapacityState:
    """Nodes and their running pods from the watcher's events; which nodes changed."""

    def __init__(self) -> None:
        self.nodes: dict[str, Node] = {}
        self.pods: dict[str, PodBound] = {}
        self.on_node: dict[str, set[str]] = {}
        self.dirty: set[str] = set()
        self.deleted: set[str] = set()
        self.inventory_changed = False

    def apply(self, events: list[CapacityEvent]) -> None:
        for ev in events:
            match ev:
                case NodeUpdated(_, node):
                    self.deleted.discard(node.name)
                    if node.name not in self.nodes:
                        self.inventory_changed = True
                    self.nodes[node.name] = node
                    self.dirty.add(node.name)
                case NodeDeleted(_, name):
                    if self.nodes.pop(name, None) is not None:
                        self.inventory_changed = True
                    self.dirty.add(name)
                    self.deleted.add(name)
                case PodBound(_, pod, node):
                    self._unbind(pod)
                    self.pods[pod] = ev
                    self.on_node.setdefault(node, set()).add(pod)
                    self.dirty.add(node)
                case PodDeleted(_, pod):
                    self._unbind(pod)

    def _unbind(self, pod: str) -> None:
        old = self.pods.pop(pod, None)
        if old is not None:
            self.on_node.get(old.node, set()).discard(pod)
            self.dirty.add(old.node)

    def report(self, name: str, at: float) -> dict[str, Any] | None:
        node = self.nodes.get(name)
        if node is None:
            return None
        usage = usage_of(self.pods[p].resources for p in self.on_node.get(name, ()))
        return node_report(node, usage, at)


class Agent:
    def __init__(
        self,
        cluster: str,
        api: ApiClient,
        settings: MqttSettings,
        *,
        interval: float = 10.0,
        gpu: GpuConfig = DEFAULT_GPU,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.cluster = cluster
        self.interval = interval
        self._clock = clock
        self.publisher = Publisher(
            dataclasses.replace(settings, status=f"agents/{cluster}/status"),
            on_connect=self.republish,
        )
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
        try:
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
            for task in done:
                task.result()
        finally:
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

    async def publish_changes(self) -> None:
        state = self.state
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


__all__ = ["Agent", "CapacityState"]
