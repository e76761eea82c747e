"""``fedbroker agent``: report one member cluster's capacity to the broker over MQTT and,
in pull mode, launch, follow and delete the broker's jobs there.

A composition root: runs inside (or next to) a member cluster with that cluster's own
credentials (a kubeconfig context, or without ``--kubeconfig`` the pod's service account)
and needs no inbound port. ``broker.agent.capacity.Agent`` does the work: the capacity
reports (topics and schema there and in ``adapters.mqtt.reports``) and, given
``--launch-config FILE`` (``broker.agent.config``) and the command key in
``FEDBROKER_AGENT_KEY``, the broker's signed commands (``broker.agent.commands``). Without
both the agent only reports (its retained capabilities say ``launch: false``). The broker's
config declares the cluster with ``source: {mqtt: {}}``.

MQTT over TLS (``--mqtt-tls``, implied by any of ``--mqtt-ca-file``, ``--mqtt-cert-file``
and ``--mqtt-key-file``): the MQTT broker verified with the CA file (else the system's
trust store) and, given the pair, a client certificate (its CN the cluster's name, for
mosquitto's ``use_identity_as_username``). Every file is loaded before anything connects.

The MQTT password (``FEDBROKER_MQTT_PASSWORD``) and the command key are read from the
environment, never from the command line, and never logged: they, the kubeconfig's
secrets (or the service account's token as read at start) and the TLS key's content are
given to the log redactor. SIGTERM/SIGINT: publish ``offline`` and exit 0.
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
from typing import TYPE_CHECKING, Any

from adapters.kube.translate import GpuConfig
from adapters.mqtt.publisher import MqttSettings
from adapters.mqtt.tls import MqttTls, MqttTlsError
from broker.agent.capacity import Agent
from broker.cli.args import UsageError
from broker.cli.logs import key_file_secrets, kubeconfig_secrets
from broker.cli.runtime import configure_logging, supervise
from broker.ports import KubeconfigError
from broker.process import run_loop

if TYPE_CHECKING:
    from kubernetes.aio.client import ApiClient

    from broker.agent.config import AgentLaunchConfig

log = logging.getLogger("broker.agent")

EXIT_USAGE = 2
PASSWORD_ENV = "FEDBROKER_MQTT_PASSWORD"
KEY_ENV = "FEDBROKER_AGENT_KEY"
MIN_KEY_LENGTH = 32
_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_PREFIX = re.compile(r"^[^#+/\s]+(/[^#+/\s]+)*$")


def add_agent_command(sub: Any) -> None:
    cmd = sub.add_parser(
        "agent", help="report a member cluster's capacity over MQTT (and launch its jobs)"
    )
    cmd.add_argument("--cluster", required=True, help="the cluster's name in the broker config")
    cmd.add_argument("--kubeconfig", type=Path, default=None, metavar="FILE",
                     help="the kubeconfig of the cluster to report (default: in-cluster, the "
                     "pod's service account)")  # fmt: skip
    cmd.add_argument("--context", default=None,
                     help="with --kubeconfig; default: the current context")  # fmt: skip
    cmd.add_argument("--mqtt-host", required=True, help="the MQTT broker's host")
    cmd.add_argument("--mqtt-port", type=int, default=1883, help="the MQTT broker's port")
    cmd.add_argument("--mqtt-username", default=None, help=f"password: ${PASSWORD_ENV}")
    cmd.add_argument("--mqtt-tls", action="store_true",
                     help="TLS to the MQTT broker (implied by the three file flags "
                     "below)")  # fmt: skip
    cmd.add_argument("--mqtt-ca-file", default=None, metavar="FILE",
                     help="CA certificates (PEM) the MQTT broker is verified with "
                     "(default: the system's trust store)")  # fmt: skip
    cmd.add_argument("--mqtt-cert-file", default=None, metavar="FILE",
                     help="client certificate (PEM; its CN: the cluster's name), with "
                     "--mqtt-key-file")  # fmt: skip
    cmd.add_argument("--mqtt-key-file", default=None, metavar="FILE",
                     help="the client certificate's unencrypted key (PEM)")  # fmt: skip
    cmd.add_argument("--topic-prefix", default="fedbroker", help="prefix of the MQTT topics")
    cmd.add_argument("--client-id", default=None, help="default: fedbroker-agent-<cluster>")
    cmd.add_argument("--interval", type=float, default=10.0, help="heartbeat seconds")
    cmd.add_argument("--gpu-resource", action="append", default=None, metavar="NAME",
                     help="an extended resource counted as GPUs (repeat; default: the launch "
                     "config's gpuResources, else nvidia.com/gpu and amd.com/gpu)")  # fmt: skip
    cmd.add_argument("--gpu-type-label", default=None,
                     help="node label with the GPU type (default: the launch config's "
                     "gpuTypeLabel, else nvidia.com/gpu.product)")  # fmt: skip
    cmd.add_argument("--launch-config", type=Path, default=None, metavar="FILE",
                     help=f"launch the broker's jobs here as FILE says (YAML; commands are "
                     f"verified with ${KEY_ENV}); without it the agent only reports")  # fmt: skip


def _check(args: argparse.Namespace) -> str | None:
    if not _LABEL.fullmatch(args.cluster):
        return f"--cluster must be a DNS label, not {args.cluster!r}"
    if not 1 <= args.mqtt_port <= 65_535:
        return f"--mqtt-port must be within 1..65535, not {args.mqtt_port}"
    if not 0.1 <= args.interval <= 3600:
        return f"--interval must be within 0.1..3600 seconds, not {args.interval}"
    if not _PREFIX.fullmatch(args.topic_prefix):
        return "--topic-prefix: topic levels without wildcards or surrounding slashes"
    if args.context is not None and args.kubeconfig is None:
        return "--context needs --kubeconfig (in-cluster there is one context)"
    for flag in ("--mqtt-ca-file", "--mqtt-cert-file", "--mqtt-key-file"):
        path = getattr(args, flag[2:].replace("-", "_"))
        if path is not None and not Path(path).is_file():
            return f"{flag}: no such file: {path}"
    if (args.mqtt_cert_file is None) != (args.mqtt_key_file is None):
        return "--mqtt-cert-file and --mqtt-key-file go together"
    return None


def mqtt_tls(args: argparse.Namespace) -> MqttTls | None:
    """The agent's TLS to the MQTT broker from its flags (None: plain TCP)."""
    if not (args.mqtt_tls or args.mqtt_ca_file or args.mqtt_cert_file or args.mqtt_key_file):
        return None
    return MqttTls(args.mqtt_ca_file, args.mqtt_cert_file, args.mqtt_key_file,
                   labels=("--mqtt-ca-file", "--mqtt-cert-file/--mqtt-key-file"))  # fmt: skip


def _launching(args: argparse.Namespace) -> tuple[AgentLaunchConfig | None, bytes | None]:
    """The launch config and the command key; ``UsageError`` (one line) when either is
    wrong. Without both the agent only reports."""
    from broker.agent.config import load_launch_config
    from broker.config import ConfigError

    key = os.environ.get(KEY_ENV) or None
    if args.launch_config is None:
        return None, None
    try:
        config = load_launch_config(args.launch_config)
    except ConfigError as exc:
        raise UsageError(f"--launch-config {exc}") from None
    if key is None:
        log.warning("%s is not set: the agent only reports, it launches nothing", KEY_ENV)
        return config, None
    if len(key) < MIN_KEY_LENGTH:
        raise UsageError(f"{KEY_ENV} must be at least {MIN_KEY_LENGTH} characters")
    return config, key.encode()


def run_agent_command(args: argparse.Namespace) -> int:
    problem = _check(args)
    if problem is not None:
        sys.stderr.write(f"fedbroker: error: {problem}\n")
        return EXIT_USAGE
    password = os.environ.get(PASSWORD_ENV)
    key = os.environ.get(KEY_ENV)
    configure_logging(secrets=[*_credential_secrets(args), *filter(None, [password, key])])
    try:
        tls = mqtt_tls(args)
        if tls is not None:
            tls.context()  # loaded here for a one-line error before anything starts
        launch, command_key = _launching(args)
    except (UsageError, MqttTlsError) as exc:
        sys.stderr.write(f"fedbroker: error: {exc}\n")
        return EXIT_USAGE
    return run_loop(agent_main(args, launch, command_key))


def _credential_secrets(args: argparse.Namespace) -> list[str]:
    """For the redactor: the kubeconfig's secrets, else the service account's token; the
    MQTT client key's content."""
    from adapters.kubeapi.kubeconfig import SERVICE_ACCOUNT_DIR

    found = (kubeconfig_secrets(args.kubeconfig) if args.kubeconfig is not None
             else key_file_secrets(SERVICE_ACCOUNT_DIR / "token"))  # fmt: skip
    if args.mqtt_key_file is not None:
        found.extend(key_file_secrets(args.mqtt_key_file))
    return found


async def agent_main(
    args: argparse.Namespace,
    launch: AgentLaunchConfig | None = None,
    key: bytes | None = None,
) -> int:
    """The agent until SIGTERM/SIGINT; it launches given both ``launch`` and ``key``."""
    try:
        client, context = await _kube_client(args)
    except KubeconfigError as exc:  # scrubbed of the kubeconfig's secrets
        log.error("%s", exc)
        return EXIT_USAGE
    settings = MqttSettings(
        host=args.mqtt_host,
        port=args.mqtt_port,
        client_id=args.client_id or f"fedbroker-agent-{args.cluster}",
        username=args.mqtt_username,
        password=os.environ.get(PASSWORD_ENV) or None,
        prefix=args.topic_prefix,
        tls=mqtt_tls(args),
    )
    commands = None
    if launch is not None and key is not None:
        from broker.agent.launching import executor_factory

        commands = executor_factory(args.cluster, client, launch, key)
    agent = Agent(args.cluster, client, settings, interval=args.interval,
                  gpu=_gpu(args, launch), commands=commands)  # fmt: skip
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    log.info(
        "agent for cluster %s on %s (%s) -> mqtt%s %s:%s, %s",
        args.cluster, socket.gethostname(), context, "s" if settings.tls else "",
        args.mqtt_host, args.mqtt_port, "launching" if commands is not None else "report-only",
    )  # fmt: skip
    try:
        return await supervise({"agent": agent.run()}, stop)
    finally:
        await client.close()  # type: ignore[no-untyped-call]


async def _kube_client(args: argparse.Namespace) -> tuple[ApiClient, str]:
    """The member's client and how it was made (for the start's log line): the kubeconfig's
    context, else the pod's service account."""
    # Imported here: every fedbroker command imports this module, and only the agent
    # needs kubernetes (the heaviest import of a start).
    from adapters.kubeapi.kubeconfig import in_cluster_client, load_clients, read_kubeconfig

    if args.kubeconfig is None:
        return in_cluster_client(), "in-cluster service account"
    doc, _ = read_kubeconfig(args.kubeconfig)
    context = args.context or str(doc.get("current-context") or "")
    if not context:
        raise KubeconfigError(f"kubeconfig {args.kubeconfig}: no --context and no current")
    clients, _ = await load_clients(args.kubeconfig, [context])
    return clients[context], f"context {context}"


def _gpu(args: argparse.Namespace, launch: AgentLaunchConfig | None) -> GpuConfig:
    """What the watcher counts as GPUs: the flags, else the launch config's, else defaults."""
    resources = args.gpu_resource or (launch.gpu_resources if launch is not None else None)
    label = args.gpu_type_label or (launch.gpu_type_label if launch is not None else None)
    shared = launch.shared_gpu_resource if launch is not None else None
    return GpuConfig(
        tuple(resources or ("nvidia.com/gpu", "amd.com/gpu")),
        label or "nvidia.com/gpu.product",
        shared,
    )


__all__ = ["Agent", "add_agent_command", "agent_main", "run_agent_command"]
