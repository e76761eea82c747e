"""``fedbroker agent``: report one member cluster's capacity to the broker over MQTT.

Runs inside (or next to) a member cluster: watches it through a kubeconfig context with the
Kubernetes adapter and publishes node capacity and heartbeats to
``<prefix>/agents/<cluster>/...`` (topics and schema: ``adapters.mqtt.reports``). The
broker's config declares the cluster with ``source: {mqtt: {}}``.

The MQTT password is read from the environment (``FEDBROKER_MQTT_PASSWORD``), never from
the command line, and never logged. SIGTERM/SIGINT: publish ``offline`` and exit 0.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import re
import signal
import socket
import sys
from pathlib import Path
from typing import Any

from adapters.kube.kubeconfig import KubeconfigError, load_clients, read_kubeconfig
from adapters.kube.translate import GpuConfig
from adapters.mqtt.agent import Agent
from adapters.mqtt.publisher import MqttSettings
from broker.cli.runtime import configure_logging, supervise
from broker.process import run_loop

log = logging.getLogger("broker.agent")

EXIT_USAGE = 2
PASSWORD_ENV = "FEDBROKER_MQTT_PASSWORD"
_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_PREFIX = re.compile(r"^[^#+/\s]+(/[^#+/\s]+)*$")


def add_agent_command(sub: Any) -> None:
    cmd = sub.add_parser("agent", help="report a member cluster's capacity over MQTT")
    cmd.add_argument("--cluster", required=True, help="the cluster's name in the broker config")
    cmd.add_argument("--kubeconfig", required=True, type=Path, metavar="FILE")
    cmd.add_argument("--context", default=None, help="default: the current context")
    cmd.add_argument("--mqtt-host", required=True)
    cmd.add_argument("--mqtt-port", type=int, default=1883)
    cmd.add_argument("--mqtt-username", default=None, help=f"password: ${PASSWORD_ENV}")
    cmd.add_argument("--topic-prefix", default="fedbroker")
    cmd.add_argument("--client-id", default=None, help="default: fedbroker-agent-<cluster>")
    cmd.add_argument("--interval", type=float, default=10.0, help="heartbeat seconds")
    cmd.add_argument("--gpu-resource", action="append", default=None, metavar="NAME")
    cmd.add_argument("--gpu-type-label", default="nvidia.com/gpu.product")


def _check(args: argparse.Namespace) -> str | None:
    if not _LABEL.match(args.cluster):
        return f"--cluster must be a DNS label, not {args.cluster!r}"
    if not 1 <= args.mqtt_port <= 65_535:
        return f"--mqtt-port must be within 1..65535, not {args.mqtt_port}"
    if not 0.1 <= args.interval <= 3600:
        return f"--interval must be within 0.1..3600 seconds, not {args.interval}"
    if not _PREFIX.match(args.topic_prefix):
        return "--topic-prefix: topic levels without wildcards or surrounding slashes"
    return None


def run_agent_command(args: argparse.Namespace) -> int:
    problem = _check(args)
    if problem is not None:
        sys.stderr.write(f"fedbroker: error: {problem}\n")
        return EXIT_USAGE
    configure_logging()
    return run_loop(agent_main(args))


async def agent_main(args: argparse.Namespace) -> int:
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


__all__ = ["add_agent_command", "agent_main", "run_agent_command"]
