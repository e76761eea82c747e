"""``fedbroker agent``: report one member cluster's capacity to the broker over MQTT.

A composition root: runs inside (or next to) a member cluster, watches it through a
kubeconfig context with the Kubernetes adapter's ``ClusterWatcher`` (list+watch of nodes and
pods, relists, reconnects), keeps each node's allocatable and the requests of the pods
running on it (``adapters.mqtt.reports.CapacityState``), and publishes through the MQTT
adapter's ``Publisher``, whose status topic (and last will) is ``agents/<cluster>/status``.
The broker's config declares the cluster with ``source: {mqtt: {}}``. Topics, below the
prefix (JSON schema: ``adapters.mqtt.reports``):

- ``<prefix>/agents/<cluster>/status``: retained ``online`` / ``offline`` (last will);
- ``<prefix>/agents/<cluster>/inventory``: retained ``{"nodes": [...]}``;
- ``<prefix>/agents/<cluster>/nodes/<node>``: retained node report, only when it changed
  (an empty retained payload clears a deleted node);
- ``<prefix>/agents/<cluster>/heartbeat``: every ``interval`` seconds while the watch is
  connected, ``{"at", "interval", "nodes", "seq"}``.

Reports are queued with ``Publisher.publish`` (waits for room, never dropped); after every
(re)connect everything is published again, so an MQTT broker that lost its retained
messages gets the whole state back.

The MQTT password is read from the environment (``FEDBROKER_MQTT_PASSWORD``), never from
the command line, and never logged: it and the kubeconfig's secrets are given to the log
redactor. SIGTERM/SIGINT: publish ``offline`` and exit 0.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import logging
import os
import re
import signal
import socket
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from adapters.kube.translate import DEFAULT_GPU, GpuConfig
from adapters.kube.watch import ClusterWatcher
from adapters.mqtt.publisher import MqttSettings, Publisher
from adapters.mqtt.reports import CapacityState
from broker.cli.logs import kubeconfig_secrets
from broker.cli.runtime import configure_logging, supervise
from broker.model import CapacityEvent
from broker.ports import KubeconfigError
from broker.process import run_loop

if TYPE_CHECKING:
    from kubernetes.aio.client import ApiClient

log = logging.getLogger("broker.agent")

EXIT_USAGE = 2
PASSWORD_ENV = "FEDBROKER_MQTT_PASSWORD"
_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_PREFIX = re.compile(r"^[^#+/\s]+(/[^#+/\s]+)*$")


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


def add_agent_command(sub: Any) -> None:
    cmd = sub.add_parser("agent", help="report a member cluster's capacity over MQTT")
    cmd.add_argument("--cluster", required=True, help="the cluster's name in the broker config")
    cmd.add_argument("--kubeconfig", required=True, type=Path, metavar="FILE",
                     help="the kubeconfig of the cluster to report")  # fmt: skip
    cmd.add_argument("--context", default=None, help="default: the current context")
    cmd.add_argument("--mqtt-host", required=True, help="the MQTT broker's host")
    cmd.add_argument("--mqtt-port", type=int, default=1883, help="the MQTT broker's port")
    cmd.add_argument("--mqtt-username", default=None, help=f"password: ${PASSWORD_ENV}")
    cmd.add_argument("--topic-prefix", default="fedbroker", help="prefix of the MQTT topics")
    cmd.add_argument("--client-id", default=None, help="default: fedbroker-agent-<cluster>")
    cmd.add_argument("--interval", type=float, default=10.0, help="heartbeat seconds")
    cmd.add_argument("--gpu-resource", action="append", default=None, metavar="NAME",
                     help="an extended resource counted as GPUs (repeat; default: "
                     "nvidia.com/gpu and amd.com/gpu)")  # fmt: skip
    cmd.add_argument("--gpu-type-label", default="nvidia.com/gpu.product",
                     help="node label with the GPU type")  # fmt: skip


def _check(args: argparse.Namespace) -> str | None:
    if not _LABEL.fullmatch(args.cluster):
        return f"--cluster must be a DNS label, not {args.cluster!r}"
    if not 1 <= args.mqtt_port <= 65_535:
        return f"--mqtt-port must be within 1..65535, not {args.mqtt_port}"
    if not 0.1 <= args.interval <= 3600:
        return f"--interval must be within 0.1..3600 seconds, not {args.interval}"
    if not _PREFIX.fullmatch(args.topic_prefix):
        return "--topic-prefix: topic levels without wildcards or surrounding slashes"
    return None


def run_agent_command(args: argparse.Namespace) -> int:
    problem = _check(args)
    if problem is not None:
        sys.stderr.write(f"fedbroker: error: {problem}\n")
        return EXIT_USAGE
    password = os.environ.get(PASSWORD_ENV)
    configure_logging(secrets=[*kubeconfig_secrets(args.kubeconfig), *filter(None, [password])])
    return run_loop(agent_main(args))


async def agent_main(args: argparse.Namespace) -> int:
    # Imported here: every fedbroker command imports this module, and only the agent
    # needs kubernetes (the heaviest import of a start).
    from adapters.kubeapi.kubeconfig import load_clients, read_kubeconfig

    try:
        doc, _ = read_kubeconfig(args.kubeconfig)
        context = args.context or str(doc.get("current-context") or "")
        if not context:
            raise KubeconfigError(f"kubeconfig {args.kubeconfig}: no --context and no current")
        clients, _ = await load_clients(args.kubeconfig, [context])
    except KubeconfigError as exc:  # scrubbed of the kubeconfig's secrets
        log.error("%s", exc)
        return EXIT_USAGE
    client = clients[context]
    settings = MqttSettings(
        host=args.mqtt_host,
        port=args.mqtt_port,
        client_id=args.client_id or f"fedbroker-agent-{args.cluster}",
        username=args.mqtt_username,
        password=os.environ.get(PASSWORD_ENV) or None,
        prefix=args.topic_prefix,
    )
    gpu = GpuConfig(
        tuple(args.gpu_resource or ("nvidia.com/gpu", "amd.com/gpu")), args.gpu_type_label
    )
    agent = Agent(args.cluster, client, settings, interval=args.interval, gpu=gpu)
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    log.info(
        "agent for cluster %s on %s (context %s) -> mqtt %s:%s",
        args.cluster, socket.gethostname(), context, args.mqtt_host, args.mqtt_port,
    )  # fmt: skip
    try:
        return await supervise({"agent": agent.run()}, stop)
    finally:
        await client.close()  # type: ignore[no-untyped-call]


__all__ = ["Agent", "add_agent_command", "agent_main", "run_agent_command"]
