"""Pull mode end to end: a member the broker cannot reach, run by ``fedbroker agent``.

The pieces, each real: the member is a kmock ``NamespacedEmulator`` (the API server's rules
enforced) served over HTTP by the test process, serving what the workload matrix serves
(``workload_matrix.serve``: every kind, a few 4-GPU nodes) plus pod logs, with its
controllers, scheduler and kubelet played in pin mode or a gang scheduler's
(``controllers.Member``; the scheduler can be paused, so that a gang's pods stay
Pending). The agent is a SUBPROCESS (``python -m broker.cli agent``, ``AgentProcess``)
that reaches the member through a kubeconfig over real HTTP and the broker through a
private mosquitto (``services.PrivateMosquitto``: killed and restarted at will). The
broker is the real ``Service`` in the test process, on an injected clock, whose cluster
``edge`` is ``source: {mqtt: ...}``.

The agent talks to the member served by this process: a test must keep its event loop
serving while the agent runs, so every wait here awaits (``PullMode.until``, the
subprocess), none blocks. A wait that fails says what the agent logged.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import os
import re
import secrets
import signal
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import aiohttp.web
from builders import Clock
from controllers import Member
from controllers.base import PODS, Obj
from controllers.schedulers import Mode, Schedulers
from kmock_namespaces import NamespacedEmulator
from services import PrivateMosquitto
from test_mqtt import subscriber
from workload_matrix import serve

from adapters.mqtt.commands import capabilities_topic
from broker.config import parse_config
from broker.service.facade import Service
from broker.service.mqtt import MqttMembers

ROOT = Path(__file__).resolve().parents[1]
CLUSTER = "edge"
NS = "fedbroker-team-a"  # team-a's namespace under the default pattern
TENANT = "team-a"
TOKEN = "tok-a-00000000000000000000000000"  # team-a's, for the HTTP API
STALE_AFTER = 5.0  # the edge cluster's staleAfterSeconds (on the broker's clock)
INTERVAL = 0.2  # the agent's heartbeat seconds (wall time: it is another process)
BOUND = 30.0  # seconds any one condition may take (a bound, not a synchronisation)
# Secrets the agent and the broker must never log (checked by the tests)
COMMAND_KEY = "pull-mode-command-key-" + "k3y" * 8
MEMBER_TOKEN = "member-token-canary-7f3a9c"
AGENT_KEY_ENV = "FEDBROKER_AGENT_KEY"
PASSWORD_ENV = "FEDBROKER_MQTT_PASSWORD"
_LOG = re.compile(r"/api/v1/namespaces/([^/]+)/pods/([^/]+)/log")


def log_line(pod: str, i: int) -> str:
    return f"{pod}: step {i} of 3\n"


class PullMember(NamespacedEmulator):
    """The enforcing member, plus pod logs (``pods/<name>/log``): three lines per pod
    (``log_line``), the last ``tailLines`` of them when asked; 404 for a pod it has not."""

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        self.log_reads: list[tuple[str, str, dict[str, str]]] = []  # namespace, pod, query

    async def __call__(self, raw: aiohttp.web.BaseRequest) -> aiohttp.web.StreamResponse:
        found = _LOG.fullmatch(raw.path)
        if found is None or raw.method != "GET":
            return await super().__call__(raw)
        namespace, pod = found.groups()
        self.log_reads.append((namespace, pod, dict(raw.query)))
        live = [
            o for (r, ns, n), o in list(self.objects.items())
            if r == PODS and ns == namespace and n == pod and not o.deleted
        ]  # fmt: skip
        if not live:
            body = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 404,
                    "reason": "NotFound", "message": f'pods "{pod}" not found'}  # fmt: skip
            return aiohttp.web.json_response(body, status=404)
        lines = [log_line(pod, i) for i in (1, 2, 3)]
        tail = raw.query.get("tailLines")
        if tail is not None and tail.isdigit():
            lines = lines[len(lines) - min(int(tail), len(lines)) :]
        return aiohttp.web.Response(text="".join(lines), content_type="text/plain")


class PausableSchedulers(Schedulers):
    """The pin scheduler and kubelet, which bind and run nothing while ``paused`` (a gang
    whose pods never start; a launch caught between its pods' creation and their run)."""

    paused = False

    async def step(self) -> None:
        if not self.paused:
            await super().step()


def member_of(k8s: PullMember, nodes: int = 3, mode: Mode = "pin") -> Member:
    """The member in ``mode``: ``nodes`` nodes of 4 GPUs, every kind served, its
    controllers and a pausable scheduler."""
    member = Member(serve(k8s, mode, nodes), mode)
    member.schedulers = PausableSchedulers(member.c, mode)
    return member


def write_kubeconfig(path: Path, server: str) -> Path:
    """The agent's kubeconfig for the member (its only credentials: the broker never has
    them)."""
    doc = {
        "apiVersion": "v1", "kind": "Config", "current-context": CLUSTER,
        "contexts": [{"name": CLUSTER, "context": {"cluster": "member", "user": "agent"}}],
        "clusters": [{"name": "member", "cluster": {"server": server.rstrip("/")}}],
        "users": [{"name": "agent", "user": {"token": MEMBER_TOKEN}}],
    }  # fmt: skip
    path.write_text(json.dumps(doc), encoding="utf-8")
    return path


def broker_config(
    db: Path, mqtt_port: int, prefix: str, command_key: str | None, tenants: str = ""
) -> str:
    """The broker's config: the cluster ``edge`` fed (and, with ``command_key``, launched
    into) by its agent over the private mosquitto; ``tenants``: more tenant lines. Adjust
    here when the source's schema changes."""
    key = f", commandKey: {{value: {json.dumps(command_key)}}}" if command_key else ""
    client = f"fbtest-broker-{secrets.token_hex(4)}"
    return f"""
store: {{url: "sqlite:///{db}"}}
events:
  mqtt: {{host: 127.0.0.1, port: {mqtt_port}, clientId: {client}, topicPrefix: "{prefix}"}}
clusters:
- name: {CLUSTER}
  labels: {{site: lab}}
  source: {{mqtt: {{staleAfterSeconds: {STALE_AFTER}{key}}}}}
queues:
- {{name: training, policy: gang}}
tenants:
- {{name: {TENANT}, defaultQueue: training, token: {{value: {TOKEN}}}}}
{tenants}"""


def launch_config_text(kube: str = "launchMode: pin", tenants: str = "{name: team-a}") -> str:
    """The agent's ``--launch-config``: how it launches into its member (``kube``: what a
    ``kube`` member's source says on the broker, as in ``workload_matrix.KUBE``; a fast pod
    poll) and its own policy for the tenants (``tenants``: flow mappings). Adjust here to
    the agent's schema."""
    pattern = "fedbroker-{tenant}"
    return f"{{{kube}, podPollSeconds: 0.02, namespacePattern: {pattern!r}, tenants: [{tenants}]}}"


class AgentProcess:
    """``fedbroker agent`` for the member, as a subprocess: started, killed (-9) or stopped
    (SIGTERM) at will, every wait bounded; its stderr (every start's) goes to ``log_path``."""

    STOP_SECONDS = 15.0

    def __init__(
        self,
        kubeconfig: Path,
        mqtt_port: int,
        prefix: str,
        directory: Path,
        *,
        key: str | None = None,
        launch_config: Path | None = None,
        cluster: str = CLUSTER,
    ) -> None:
        self.argv = [
            "-m", "broker.cli", "agent", "--cluster", cluster, "--kubeconfig", str(kubeconfig),
            "--mqtt-host", "127.0.0.1", "--mqtt-port", str(mqtt_port),
            "--topic-prefix", prefix, "--interval", str(INTERVAL),
        ]  # fmt: skip
        if launch_config is not None:
            self.argv += ["--launch-config", str(launch_config)]
        self.key = key
        self.log_path = directory / "agent.log"
        self.proc: asyncio.subprocess.Process | None = None
        self.starts = 0

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in (AGENT_KEY_ENV, PASSWORD_ENV)}
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
        if self.key is not None:
            env[AGENT_KEY_ENV] = self.key
        return env

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.returncode is None

    async def start(self) -> None:
        assert not self.running, "the agent runs already"
        self.starts += 1
        with self.log_path.open("ab") as out:
            out.write(f"--- start {self.starts}\n".encode())
            out.flush()
            self.proc = await asyncio.create_subprocess_exec(
                sys.executable, *self.argv, cwd=ROOT, env=self.env(),
                stdin=asyncio.subprocess.DEVNULL, stdout=out, stderr=out,
            )  # fmt: skip

    async def _signal(self, sig: signal.Signals) -> int:
        proc = self.proc
        assert proc is not None, "the agent was never started"
        if proc.returncode is None:
            proc.send_signal(sig)
        async with asyncio.timeout(self.STOP_SECONDS):
            return await proc.wait()

    async def kill9(self) -> None:
        """SIGKILL: no goodbye (the kernel closes its connections; mosquitto sends its will)."""
        await self._signal(signal.SIGKILL)

    async def stop(self) -> int:
        """SIGTERM, and its exit code (0: it published ``offline`` and exited cleanly)."""
        return await self._signal(signal.SIGTERM)

    async def close(self) -> None:
        """Teardown: stopped whatever state it is in (killed when SIGTERM is not enough)."""
        if not self.running:
            return
        try:
            await self.stop()
        except TimeoutError:
            await self.kill9()

    def log(self) -> str:
        return (
            self.log_path.read_text(encoding="utf-8", errors="replace")
            if self.log_path.exists()
            else ""
        )


@dataclass
class PullMode:
    """One test's member, mosquitto, agent and broker (see the module's docstring)."""

    k8s: PullMember
    member: Member
    mosquitto: PrivateMosquitto
    agent: AgentProcess
    service: Service
    clock: Clock
    prefix: str

    @property
    def members(self) -> MqttMembers:
        assert self.service.mqtt is not None
        return self.service.mqtt.members

    @property
    def schedulers(self) -> PausableSchedulers:
        assert isinstance(self.member.schedulers, PausableSchedulers)
        return self.member.schedulers

    def stale(self) -> bool:
        return self.service.ledger.snapshot().clusters[CLUSTER].stale

    def online(self) -> bool:
        return self.members.clusters[CLUSTER].online

    def gpus(self) -> tuple[int, float]:
        """Total and taken GPUs of ``edge`` in the broker's ledger."""
        view = self.service.ledger.snapshot().clusters[CLUSTER]
        return view.gpus_total(), view.gpus_total() - view.free_milli() / 1000

    def broker_connected(self) -> bool:
        assert self.service.mqtt is not None
        return self.service.mqtt.publisher.connected

    def trouble(self) -> str:
        """Why a wait may be failing: the agent's exit and log, the member's failure."""
        code = None if self.agent.proc is None else self.agent.proc.returncode
        return (
            f"agent exit code {code}; member failure {self.member.failure!r}; "
            f"agent log:\n{self.agent.log()[-4000:]}"
        )

    async def until(
        self, predicate: Callable[[], bool | Awaitable[bool]], what: str,
        timeout: float = BOUND, *, agent_up: bool = True,
    ) -> None:  # fmt: skip
        """Await ``predicate`` (polling, the loop serving meanwhile); fail after ``timeout``
        or at once when the agent died while it should run (``agent_up``), saying why."""

        async def holds() -> bool:
            given = predicate()
            return await given if inspect.isawaitable(given) else bool(given)

        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while not await holds():
            if agent_up and self.agent.proc is not None and not self.agent.running:
                raise AssertionError(f"the agent died waiting for {what}: {self.trouble()}")
            if self.member.failure is not None:
                raise AssertionError(f"the member failed waiting for {what}: {self.trouble()}")
            if loop.time() > deadline:
                raise AssertionError(f"not {what} in {timeout}s: {self.trouble()}")
            await asyncio.sleep(0.01)  # polling pace, bounded by the deadline

    async def reported(self, total: int, taken: float = 0.0) -> None:
        """Until the agent's reports put ``edge`` back in the ledger: fresh (not stale)
        with ``total`` GPUs of which ``taken`` are in use."""
        await self.until(
            lambda: not self.stale() and self.gpus() == (total, taken),
            f"edge fresh with {total} GPUs ({taken} taken)",
        )

    def go_stale_by_clock(self) -> bool:
        """Move the broker's clock past staleAfterSeconds and check at once (no heartbeat
        can arrive in between): True when the cluster is stale then."""
        self.clock.now += STALE_AFTER + 1
        self.members.check_stale()
        return self.stale()

    def our_pods(self) -> dict[str, Obj]:
        return self.member.c.stored(PODS, NS)

    def pod_writes(self, method: str) -> list[str]:
        """The names of our pods in each ``method`` request the member was sent (``post``:
        creations, bindings left out; ``delete``: deletions), in order."""
        return [
            str(r.name or ((r.data or {}).get("metadata") or {}).get("name"))
            for r in self.k8s[method][PODS]
            if r.namespace == NS and r.subresource is None
        ]

    async def heard(self, heartbeats: int) -> None:
        """Until the broker has heard ``heartbeats`` more of the agent's heartbeats (what
        the agent published before them has arrived too: one connection, in order)."""
        cluster = self.members.clusters[CLUSTER]
        target = cluster.heartbeats + heartbeats
        await self.until(lambda: cluster.heartbeats >= target, f"{heartbeats} heartbeats")

    async def state(self, name: str) -> str:
        return (await self.service.get(TENANT, name)).state

    async def until_state(
        self, name: str, state: str, timeout: float = BOUND, *, agent_up: bool = True
    ) -> None:
        async def reached() -> bool:
            return await self.state(name) == state

        await self.until(reached, f"job {name} {state}", timeout, agent_up=agent_up)

    async def placed(self, name: str) -> None:
        """Scheduling cycles (the broker's loop, driven by the test) until ``name`` is
        placed: the agent's capabilities and a fresh heartbeat may still be on their way."""

        async def cycle() -> bool:
            await self.service.schedule_once()
            return await self.state(name) != "Queued"

        await self.until(cycle, f"job {name} placed")


@contextlib.asynccontextmanager
async def pull_mode(
    k8s: PullMember,
    tmp_path: Path,
    *,
    launch: bool = False,
    nodes: int = 3,
    command_key: str | None = None,
    mode: Mode = "pin",
    launch_config: str | None = None,
    tenants: str = "",
) -> AsyncIterator[PullMode]:
    """The member (its players running), a private mosquitto, the agent (started and
    subscribed) and the broker (started, on a clock at the real time; a test waits for
    ``reported``). ``launch``: the agent gets ``--launch-config`` (``launch_config``, else
    ``launch_config_text()``) and the command key, and the broker's cluster its
    ``commandKey`` (``command_key`` alone: the broker's side only). ``mode``: the member's
    scheduler; ``tenants``: more tenants of the broker (``broker_config``). Torn down in
    reverse: broker, agent, member, mosquitto."""
    prefix = f"fbtest/{secrets.token_hex(6)}"
    key = COMMAND_KEY if launch else command_key
    async with contextlib.AsyncExitStack() as stack:
        mosquitto = PrivateMosquitto(tmp_path / "mosquitto")
        await mosquitto.start()
        stack.callback(mosquitto.kill, signal.SIGTERM)
        member = member_of(k8s, nodes, mode)
        await stack.enter_async_context(member.running())
        kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", str(k8s.url))
        # The broker's clock starts at the real time: a command carries its ``at``, which
        # the agent (on the real clock) refuses beyond MAX_SKEW_SECONDS; tests move it
        # by a minute or two at most.
        clock = Clock(float(int(time.time())))
        launch_path = None
        if launch:
            launch_path = tmp_path / "launch.yaml"
            launch_path.write_text(launch_config or launch_config_text(), encoding="utf-8")
        agent = AgentProcess(
            kubeconfig, mosquitto.port, prefix, tmp_path,
            key=COMMAND_KEY if launch else None, launch_config=launch_path,
        )  # fmt: skip
        # The agent first, its commands subscribed before the broker starts: a starting
        # broker reads its jobs back through every launching agent, and would wait for an
        # absent one until its timeout.
        await agent_ready(agent, mosquitto.port, prefix, launch)
        stack.push_async_callback(agent.close)
        text = broker_config(tmp_path / "jobs.db", mosquitto.port, prefix, key, tenants)
        service = Service(parse_config(text, "test config"), clock=clock)
        await service.start()
        stack.push_async_callback(service.close)
        yield PullMode(k8s, member, mosquitto, agent, service, clock, prefix)


async def agent_ready(agent: AgentProcess, port: int, prefix: str, launch: bool) -> None:
    """Start ``agent`` and wait until it has published its inventory (and, when it
    launches, its capabilities): retained, sent after it subscribed to its commands."""
    topics = {f"{prefix}/agents/{CLUSTER}/inventory"}
    if launch:
        topics.add(f"{prefix}/{capabilities_topic(CLUSTER)}")
    try:
        await agent.start()
        async with subscriber(f"{prefix}/agents/{CLUSTER}/#", port=port) as inbox:
            async with asyncio.timeout(BOUND):
                while not topics <= {topic for topic, _, _ in inbox.messages}:
                    assert agent.running, f"the agent exited: {agent.log()[-4000:]}"
                    await asyncio.sleep(0.01)  # polling pace, bounded by the timeout
    except BaseException:
        await agent.close()
        raise


__all__ = [
    "BOUND", "CLUSTER", "COMMAND_KEY", "MEMBER_TOKEN", "NS", "STALE_AFTER", "TENANT", "TOKEN",
    "AgentProcess", "PausableSchedulers", "PullMember", "PullMode", "agent_ready",
    "broker_config", "launch_config_text", "log_line", "member_of", "pull_mode",
    "write_kubeconfig",
]  # fmt: skip
