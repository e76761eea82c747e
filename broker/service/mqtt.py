"""MQTT events of the live broker, and member clusters fed by agents over MQTT.

``MqttEvents`` is built by ``broker.service.compose`` when the config has
``events.mqtt``. It owns one ``adapters.mqtt.publisher.Publisher`` (one connection, client
id ``events.mqtt.clientId``, persistent session) and publishes, below the topic prefix
(default ``fedbroker``):

``<prefix>/status``  retained, QoS 1: ``online``; ``offline`` on a clean stop and as the
    connection's last will.
``<prefix>/clusters/<cluster>/capacity``  retained, QoS 1, on change and at most once per
    second per cluster: the cluster's row of ``GET /v1/clusters`` (``ReadModel.clusters()``:
    ``cluster``, ``kind``, ``stale``, ``connected``, ``labels``, ``gpuTypes`` with per GPU
    type ``total``, ``free``, ``reserved``, ``allocated``, ``largestGang``; ``topology``:
    per declared level its domains and largest gang per GPU type) plus ``at``.
``<prefix>/jobs/<tenant>/<job>``  QoS 1, not retained, on every committed job change:
    ``{"eventId": <uuid4>, "job", "tenant", "queue", "state", "reason", "cluster",
    "attempts", "at"}``. Delivery is at least once (a message in flight when the
    connection drops is sent again): consumers dedupe by ``eventId``.

Job changes come from the same place as ``/v1/events``: the service's store is wrapped in a
``PublishingStore`` whose bus also hands every job event to MQTT (synchronously, into the
bounded outbox: nothing waits on MQTT, a full outbox drops and counts).

While the MQTT broker is unreachable (``tests/service/test_mqtt_outage.py``): the API, the
scheduler and readiness go on as before (MQTT is an optional sink); job events wait in the
outbox, oldest first, and are sent after the reconnect, and once ``outboxSize`` of them
wait the newer ones are dropped and counted (``fedbroker_mqtt_dropped_events_total``).
Capacity is state, not an event: it is not queued while disconnected (nor while the outbox
is full), and every cluster's current row is published again after a reconnect, so stale
rows never take the job events' room and a refused capacity row is not counted as dropped.

Member clusters with ``source: {mqtt: {...}}`` are fed by ``fedbroker agent`` (topics and
schema in ``adapters.mqtt.reports``): the broker subscribes to each agent's topics below
``<prefix>/agents/<cluster>/`` (not its own ``commands``), turns node reports into ledger
capacity events (through ``Binding.on_capacity``, as the Kubernetes watchers do), and keeps
the cluster stale until the agent's first heartbeat, and again when the last heartbeat
(timed by the broker's clock) is older than ``staleAfterSeconds`` (default
``scheduler.staleAfterSeconds``) or the agent's status says ``offline`` (its will). Jobs are
launched there by the agent, through ``broker.service.agents`` (``attach``): its replies
and capabilities are handed there, and so is the staleness of a cluster whose agent
launches (a member's, with its garbage collection on return).

Metrics (``Service.metric_sources``): ``fedbroker_mqtt_connected``,
``fedbroker_mqtt_dropped_events_total``, ``fedbroker_mqtt_outbox_messages``,
``fedbroker_agent_refusals_total{cluster}``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric

from adapters.mqtt.publisher import MqttSettings, Publisher
from adapters.mqtt.reports import (
    Usage,
    parse_inventory,
    parse_node_report,
    report_events,
)
from adapters.mqtt.tls import MqttTls
from broker.config import ClusterConfig, Config
from broker.core.ledger import Ledger
from broker.model import CapacityEvent, Node, NodeDeleted, PodDeleted
from broker.ports import ReportError
from broker.service.agents import AgentLaunchers
from broker.service.events import EventBus, EventKind
from broker.service.readmodel import ClusterRow
from broker.service.tasks import Supervisor

if TYPE_CHECKING:
    from broker.service.events import Event

log = logging.getLogger(__name__)

CAPACITY_MIN_SECONDS = 1.0  # per cluster, between two capacity messages
CAPACITY_TICK_SECONDS = 0.25
GAP_TOPIC = "gaps/jobs"  # job events dropped (outbox full): how many, when
Emit = Callable[[list[CapacityEvent]], None]


@dataclass(eq=False)
class TeeBus(EventBus):
    """An EventBus that also hands every job event to ``tee`` (synchronously)."""

    tee: Callable[[Mapping[str, Any]], None] | None = None
    capacity_changed: Callable[[], None] | None = None

    def publish(self, kind: EventKind, tenant: str | None, data: Mapping[str, Any]) -> Event:
        event = super().publish(kind, tenant, data)
        if kind == "job" and self.tee is not None:
            self.tee(data)
        elif kind == "capacity" and self.capacity_changed is not None:
            self.capacity_changed()
        return event


def job_message(data: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "eventId": str(uuid.uuid4()),
        "job": data.get("name"),
        "tenant": data.get("tenant"),
        "queue": data.get("queue"),
        "state": data.get("state"),
        "reason": data.get("reason"),
        "cluster": data.get("cluster"),
        "attempts": data.get("attempts"),
        "at": data.get("at"),
    }


# -- agent-fed member clusters -------------------------------------------------------------


@dataclass(slots=True)
class AgentCluster:
    name: str
    stale_after: float
    last_heartbeat: float | None = None  # by the broker's clock
    online: bool = False
    inventory: frozenset[str] | None = None
    reports: dict[str, tuple[Node, Usage]] = field(default_factory=dict)
    pods: dict[str, list[str]] = field(default_factory=dict)  # node in the ledger -> its pods
    heartbeats: int = 0
    rejected: int = 0

    def listed(self, node: str) -> bool:
        return self.inventory is None or node in self.inventory


class MqttMembers:
    """Clusters whose capacity agents report over MQTT: reports into the ledger (``emit``),
    staleness into ``set_stale``."""

    def __init__(
        self,
        clusters: list[ClusterConfig],
        default_stale_after: float,
        prefix: str,
        emit: Emit,
        set_stale: Callable[[str, bool], None],
        clock: Callable[[], float],
    ) -> None:
        self.prefix = prefix
        self._emit = emit
        self._set_stale = set_stale
        self._clock = clock
        self.clusters: dict[str, AgentCluster] = {}
        self.agents: AgentLaunchers | None = None  # replies, capabilities, returns
        self._stale: dict[str, bool] = {}
        for cc in clusters:
            source = cc.source.mqtt
            if source is None:
                continue
            after = source.stale_after_seconds or default_stale_after
            self.clusters[cc.name] = AgentCluster(cc.name, after)
            self._stale[cc.name] = True
            set_stale(cc.name, True)  # until the agent's first heartbeat

    def __bool__(self) -> bool:
        return bool(self.clusters)

    def topic_filters(self) -> list[str]:
        """What each agent publishes (never its ``commands``: ours, not to be heard back)."""
        topics = ("heartbeat", "status", "inventory", "nodes/+", "capabilities", "replies")
        return [f"{self.prefix}/agents/{name}/{t}" for name in self.clusters for t in topics]

    def on_message(self, topic: str, payload: bytes, retained: bool) -> None:
        head = f"{self.prefix}/agents/"
        if not topic.startswith(head):
            return
        name, _, rest = topic[len(head) :].partition("/")
        agent = self.clusters.get(name)
        if agent is None:
            return
        try:
            if rest == "heartbeat":
                agent.last_heartbeat = self._clock()
                agent.online = True
                agent.heartbeats += 1
            elif rest == "replies":  # one answering a command of ours: a heartbeat too
                if self.agents is None or not self.agents.on_reply(name, payload):
                    return
                agent.last_heartbeat, agent.online = self._clock(), True
            elif rest == "capabilities":
                if self.agents is not None:
                    self.agents.on_capabilities(name, payload, fresh=not retained)
            elif rest == "status":
                was, agent.online = agent.online, payload == b"online"
                if not agent.online:
                    log.warning("cluster %s: agent offline", name)
                elif not was and not retained and self.agents is not None:
                    # (a retained one comes with our own reconnect, which resends anyway)
                    self.agents.agent_back(name)
            elif rest == "inventory":
                if payload:
                    self._on_inventory(agent, parse_inventory(payload))
            elif rest.startswith("nodes/"):
                self._on_node(agent, rest[len("nodes/") :], payload)
        except ReportError as exc:
            agent.rejected += 1
            log.warning("cluster %s: bad agent message on %s: %s", name, topic, exc)
        self.check_stale()

    def _on_inventory(self, agent: AgentCluster, nodes: frozenset[str]) -> None:
        agent.inventory = nodes
        events: list[CapacityEvent] = []
        for gone in [n for n in agent.pods if n not in nodes]:
            events.extend(self._forget(agent, gone))
        for name in sorted(nodes):
            if name not in agent.pods and name in agent.reports:
                events.extend(self._apply(agent, name))
        if events:
            self._emit(events)

    def _on_node(self, agent: AgentCluster, node: str, payload: bytes) -> None:
        if not payload:  # the retained report was cleared: the node is gone
            agent.reports.pop(node, None)
            if node in agent.pods:
                self._emit(self._forget(agent, node))
            return
        agent.reports[node] = parse_node_report(payload, node)
        if agent.listed(node):
            self._emit(self._apply(agent, node))

    def _apply(self, agent: AgentCluster, name: str) -> list[CapacityEvent]:
        node, usage = agent.reports[name]
        events, pods = report_events(agent.name, node, usage, agent.pods.get(name, ()))
        agent.pods[name] = pods
        return events

    def _forget(self, agent: AgentCluster, name: str) -> list[CapacityEvent]:
        events: list[CapacityEvent] = [PodDeleted(agent.name, p) for p in agent.pods.pop(name)]
        events.append(NodeDeleted(agent.name, name))
        return events

    def stale(self, name: str) -> bool:
        agent = self.clusters[name]
        if not agent.online or agent.last_heartbeat is None:
            return True
        return self._clock() - agent.last_heartbeat > agent.stale_after

    def check_stale(self) -> None:
        for name in self.clusters:
            stale = self.stale(name)
            if stale != self._stale[name]:
                log.warning("cluster %s is %s", name, "stale" if stale else "back")
                self._stale[name] = stale
                self._set_stale(name, stale)

    def connected(self, name: str) -> bool | None:
        """Whether an agent-fed cluster's agent was heard from lately; None for other
        clusters."""
        if name not in self.clusters:
            return None
        return not self.stale(name)


# -- the service's MQTT side -----------------------------------------------------------------


def settings_of(config: Config) -> MqttSettings:
    mqtt = config.events.mqtt
    assert mqtt is not None
    password, tls = config.mqtt_password, mqtt.tls
    labels = ("events.mqtt.tls.caFile", "events.mqtt.tls.certFile/keyFile")
    return MqttSettings(
        host=mqtt.host,
        port=mqtt.port,
        client_id=mqtt.client_id,
        username=mqtt.username,
        password=password.get_secret_value() if password is not None else None,
        prefix=mqtt.topic_prefix,
        outbox_size=mqtt.outbox_size,
        tls=None if tls is None else MqttTls(tls.ca_file, tls.cert_file, tls.key_file, labels),
    )


class MqttEvents:
    """Job and capacity events out, agents' reports in, for one service: ``emit`` takes the
    agents' capacity events (``Binding.on_capacity``), ``clusters`` gives the rows to
    publish. Job events arrive through ``on_job`` (``compose`` tees the store's bus here)."""

    def __init__(
        self,
        config: Config,
        clock: Callable[[], float],
        ledger: Ledger,
        emit: Emit,
        clusters: Callable[[], list[ClusterRow]],
    ) -> None:
        self._config = config
        self._ledger = ledger
        self._emit = emit
        self._clusters = clusters
        self._capacity_wake = asyncio.Event()
        self.agents: AgentLaunchers | None = None
        self.publisher = Publisher(settings_of(config), on_connect=self._on_connect)
        prefix = self.publisher.settings.prefix
        self.members = MqttMembers(
            config.clusters, config.scheduler.stale_after_seconds, prefix, emit,
            self._set_stale, clock,
        )  # fmt: skip
        for topic_filter in self.members.topic_filters():
            self.publisher.subscribe(topic_filter, self.members.on_message)
        self._sent: dict[str, dict[str, Any]] = {}
        self._sent_at: dict[str, float] = {}
        self._version = -1
        self._computed_at = 0.0
        self._tasks: list[asyncio.Task[None]] = []
        # Job events dropped since the last gap notice: how many, first and last at (Unix s).
        self._gap: tuple[int, float, float] | None = None

    def on_job(self, data: Mapping[str, Any]) -> None:
        """Queue a job event. Events dropped on a full outbox are announced in-band: the
        next event that finds room is preceded by ``<prefix>/gaps/jobs`` = ``{dropped,
        firstDroppedAt, lastDroppedAt, at}``, so a consumer knows to re-read
        ``/v1/jobs`` rather than trust the stream it has."""
        now = time.time()
        if self._gap is not None and not self.publisher.full:  # a notice is never dropped
            dropped, first, last = self._gap
            notice = {"dropped": dropped, "firstDroppedAt": first, "lastDroppedAt": last, "at": now}
            if self.publisher.publish_nowait(GAP_TOPIC, json.dumps(notice), qos=1):
                self._gap = None
        topic = f"jobs/{data.get('tenant')}/{data.get('name')}"
        if not self.publisher.publish_nowait(topic, json.dumps(job_message(data)), qos=1):
            dropped, first, _ = self._gap or (0, now, now)
            self._gap = (dropped + 1, first, now)

    def capacity_changed(self) -> None:
        self._capacity_wake.set()

    def attach(self, agents: AgentLaunchers) -> None:
        """Agents that launch: their replies, capabilities and staleness go there."""
        self.agents = self.members.agents = agents

    def _set_stale(self, name: str, stale: bool) -> None:
        if self.agents is None or not self.agents.set_stale(name, stale):
            self._ledger.set_stale(name, stale)
        self._emit([])  # wakes the scheduler
        self._capacity_wake.set()

    def _on_connect(self) -> None:
        self._sent.clear()  # retained state may have been lost: publish it all again
        self._capacity_wake.set()
        if self.agents is not None:  # commands unanswered may have been lost with it
            self.agents.resend_all()

    def publish_capacity(self, now: float | None = None, *, force: bool = False) -> int:
        """Publish the rows that changed (each at most once per CAPACITY_MIN_SECONDS);
        returns how many were queued."""
        now = time.monotonic() if now is None else now
        if not self.publisher.connected:
            self._version = -1  # look again once connected (a reconnect resends every row)
            return 0
        version = self._ledger.snapshot().version
        if not force and version == self._version and now - self._computed_at < 1.0:
            return 0
        self._version, self._computed_at = version, now
        queued = 0
        for cluster in self._clusters():
            name, row = cluster.cluster, cluster.as_json()
            if self._sent.get(name) == row:
                continue
            if now - self._sent_at.get(name, -1e18) < CAPACITY_MIN_SECONDS:
                self._version = -1  # look again next tick
                continue
            if self.publisher.full:  # look again next tick: a row waits, it is not dropped
                self._version = -1
                break
            body = json.dumps({**row, "at": time.time()})
            self.publisher.publish_nowait(f"clusters/{name}/capacity", body, retain=True)
            self._sent[name], self._sent_at[name] = row, now
            queued += 1
        return queued

    def capacity_sent(self, cluster: str) -> dict[str, Any] | None:
        """The row last queued for ``cluster`` since the last (re)connect (None: none)."""
        return self._sent.get(cluster)

    async def _capacity_loop(self) -> None:
        while True:
            try:
                self.publish_capacity()
            except Exception:
                log.exception("capacity publication failed; retrying")
            with contextlib.suppress(TimeoutError):  # not wait_for: see Cycles.run
                async with asyncio.timeout(CAPACITY_TICK_SECONDS):
                    await self._capacity_wake.wait()
            if self._capacity_wake.is_set():
                self._capacity_wake.clear()
                self._version = -1

    async def _stale_loop(self) -> None:
        while True:
            await asyncio.sleep(self._config.scheduler.cycle_seconds)
            self.members.check_stale()

    def start(self, tasks: Supervisor) -> None:
        self._tasks = [
            self.publisher.start(),
            tasks.keep("mqtt-capacity", self._capacity_loop),
        ]
        if self.members:
            self._tasks.append(tasks.keep("mqtt-stale", self._stale_loop))

    async def close(self) -> None:
        for task in self._tasks[1:]:
            task.cancel()
        await asyncio.gather(*self._tasks[1:], return_exceptions=True)
        await self.publisher.close()
        self._tasks = []

    def metrics(self) -> Iterator[Metric]:
        connected = GaugeMetricFamily(
            "fedbroker_mqtt_connected", "1 while the broker is connected to its MQTT broker"
        )
        connected.add_metric([], 1.0 if self.publisher.connected else 0.0)
        yield connected
        dropped = CounterMetricFamily(
            "fedbroker_mqtt_dropped_events",
            "MQTT events dropped because the outbox was full (the MQTT broker unreachable)",
        )
        dropped.add_metric([], float(self.publisher.dropped))
        yield dropped
        outbox = GaugeMetricFamily(
            "fedbroker_mqtt_outbox_messages", "MQTT messages waiting to be sent"
        )
        outbox.add_metric([], float(self.publisher.backlog))
        yield outbox
        if self.agents is not None:
            yield from self.agents.metrics()


__all__ = ["MqttEvents", "MqttMembers", "TeeBus", "job_message", "settings_of"]
