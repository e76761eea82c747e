"""MQTT events against a real mosquitto: retained capacity, job events, the last will, a
restart of the MQTT broker mid-stream, and an API that never waits on MQTT.

The shared mosquitto (FEDBROKER_TEST_MQTT_HOST/PORT, default 127.0.0.1:1883) is used with a
unique topic prefix per test; the restart test starts its own mosquitto on a free port.
Without them the tests skip, except under FEDBROKER_REQUIRE_SERVICES=1 where they fail.
"""

from __future__ import annotations

import asyncio
import contextlib
import getpass
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, NoReturn

import aiomqtt
import pytest
from aiohttp.test_utils import TestClient, TestServer
from builders import Clock, until
from prometheus_client.parser import text_string_to_metric_families
from test_api import manifest

from adapters.mqtt.publisher import Backoff, MqttSettings, Publisher
from adapters.mqtt.reports import Usage, node_report, parse_node_report
from broker.config import ConfigError, parse_config
from broker.http.app import make_app
from broker.model import GpuType, Node, PodBound, PodDeleted, Resources
from broker.ports import ReportError
from broker.service.facade import Service
from broker.service.mqtt import MqttMembers

MQTT_HOST = os.environ.get("FEDBROKER_TEST_MQTT_HOST", "127.0.0.1")
MQTT_PORT = int(os.environ.get("FEDBROKER_TEST_MQTT_PORT", "1883"))
MOSQUITTO = shutil.which("mosquitto") or "/usr/sbin/mosquitto"
ROOT = Path(__file__).resolve().parents[2]
TOKEN = {"Authorization": "Bearer tok-a-00000000000000000000000000"}
FAST = Backoff(base=0.05, cap=0.5)


# --- helpers (test_agent.py uses them too) -----------------------------------------------


def unavailable(reason: str) -> NoReturn:
    if os.environ.get("FEDBROKER_REQUIRE_SERVICES") == "1":
        pytest.fail(f"{reason} (FEDBROKER_REQUIRE_SERVICES=1)")
    pytest.skip(reason)


async def require_mqtt(host: str = MQTT_HOST, port: int = MQTT_PORT) -> None:
    try:
        async with asyncio.timeout(3):
            _, writer = await asyncio.open_connection(host, port)
    except (OSError, TimeoutError) as exc:
        unavailable(f"mosquitto at {host}:{port} is unreachable: {exc}")
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()


def unique_prefix() -> str:
    return f"fbtest/{secrets.token_hex(6)}"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Inbox:
    """Messages a subscriber received, and a way to wait for one that matters."""

    def __init__(self) -> None:
        self.messages: list[tuple[str, bytes, bool]] = []
        self.changed = asyncio.Event()
        self.subscribed = asyncio.Event()

    def add(self, message: aiomqtt.Message) -> None:
        payload = message.payload if isinstance(message.payload, bytes) else b""
        self.messages.append((str(message.topic), payload, bool(message.retain)))
        self.changed.set()

    async def wait(self, predicate: Callable[[], bool], timeout: float = 10.0) -> None:
        async with asyncio.timeout(timeout):
            while not predicate():
                self.changed.clear()
                await self.changed.wait()

    def payloads(self, topic: str) -> list[bytes]:
        return [p for t, p, _ in self.messages if t == topic]

    def json(self, topic: str) -> list[Any]:
        return [json.loads(p) for p in self.payloads(topic) if p]


@asynccontextmanager
async def subscriber(
    topic_filter: str,
    *,
    port: int = MQTT_PORT,
    client_id: str | None = None,
    persistent: bool = False,
) -> AsyncIterator[Inbox]:
    """A QoS 1 subscriber that reconnects (its persistent session, when asked, keeps what
    arrives while it is away)."""
    inbox = Inbox()

    async def run() -> None:
        # One client throughout: what it received (and acknowledged) but was not read yet
        # when the connection dropped stays in its queue for the next connection.
        client = aiomqtt.Client(
            MQTT_HOST, port, identifier=client_id, clean_session=not persistent, timeout=5
        )
        while True:
            try:
                async with client:
                    # A persistent session subscribes once: the MQTT broker keeps the
                    # subscription (and what it matches meanwhile) across reconnects.
                    if not (persistent and inbox.subscribed.is_set()):
                        await client.subscribe(topic_filter, qos=1)
                    inbox.subscribed.set()
                    async for message in client.messages:
                        inbox.add(message)
            except aiomqtt.MqttError:
                await asyncio.sleep(0.05)  # retry pace, not synchronisation

    task = asyncio.create_task(run())
    try:
        async with asyncio.timeout(10):
            await inbox.subscribed.wait()
        yield inbox
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


class Mosquitto:
    """Our own mosquitto on a free port, with persistence (QoS 1 sessions survive)."""

    def __init__(self, tmp: Path) -> None:
        if not Path(MOSQUITTO).is_file():
            unavailable(f"mosquitto binary not found at {MOSQUITTO}")
        self.port = free_port()
        self.dir = tmp
        self.conf = tmp / "mosquitto.conf"
        self.conf.write_text(
            f"listener {self.port} 127.0.0.1\nallow_anonymous true\npersistence true\n"
            f"persistence_location {tmp}/\nlog_dest file {tmp}/mosquitto.log\n"
            "max_queued_messages 100000\n"
            # Started as root, mosquitto would switch to user mosquitto, who may not write
            # the persistence database into our temporary directory.
            f"user {getpass.getuser()}\n"
        )
        self.proc: subprocess.Popen[bytes] | None = None

    async def start(self) -> None:
        self.proc = subprocess.Popen(
            [MOSQUITTO, "-c", str(self.conf)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
        )
        async with asyncio.timeout(10):
            while True:
                if self.proc.poll() is not None:
                    err = self.proc.stderr.read().decode() if self.proc.stderr else ""
                    unavailable(f"mosquitto did not start: {err.strip()[:200]}")
                try:
                    _, writer = await asyncio.open_connection("127.0.0.1", self.port)
                except OSError:
                    await asyncio.sleep(0.02)
                    continue
                writer.close()
                return

    async def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)  # saves the persistence database
            await asyncio.to_thread(self.proc.wait, 10)
        self.proc = None


def events_config(db: Path, prefix: str, *, port: int = MQTT_PORT, extra: str = "") -> str:
    client_id = f"fbtest-{secrets.token_hex(4)}"
    return f"""
store: {{url: "sqlite:///{db}"}}
events:
  mqtt: {{host: "{MQTT_HOST}", port: {port}, clientId: {client_id}, topicPrefix: "{prefix}"{extra}}}
clusters:
- name: small-a
  source:
    simulated: {{shapes: [{{gpuType: A100, gpus: 8, cpu: "96", memory: 1024Gi, count: 2}}]}}
queues:
- {{name: training, policy: gang}}
tenants:
- {{name: team-a, defaultQueue: training, token: {{value: tok-a-00000000000000000000000000}}}}
"""


@asynccontextmanager
async def api(
    text: str, clock: Clock | None = None
) -> AsyncIterator[tuple[TestClient[Any, Any], Service]]:
    config = parse_config(text, "test config")
    service = Service(config, clock=clock or Clock())
    await service.start()
    client = TestClient(TestServer(make_app(service, config)))
    await client.start_server()
    try:
        yield client, service
    finally:
        await client.close()
        await service.close()


# --- (a) retained capacity, job events -----------------------------------------------------


async def test_capacity_is_retained_for_late_subscribers_and_job_events_flow(
    tmp_path: Path,
) -> None:
    await require_mqtt()
    prefix = unique_prefix()
    capacity = f"{prefix}/clusters/small-a/capacity"
    async with (
        subscriber(f"{prefix}/jobs/#") as jobs,
        api(events_config(tmp_path / "db", prefix)) as (client, service),
    ):
        assert service.mqtt is not None
        publisher = service.mqtt.publisher
        bridge = service.mqtt

        def sent_free() -> float | None:
            row = bridge.capacity_sent("small-a")
            return None if row is None else float(row["gpuTypes"][0]["free"])

        await publisher.wait_connected()
        await until(lambda: sent_free() is not None)
        await publisher.flush()
        async with subscriber(capacity) as late:  # connects after the publication
            await late.wait(lambda: bool(late.messages))
        topic, payload, retained = late.messages[0]
        assert (topic, retained) == (capacity, True)
        row = json.loads(payload)
        assert row["cluster"] == "small-a" and row["stale"] is False
        [a100] = row["gpuTypes"]
        assert (a100["total"], a100["free"], a100["reserved"], a100["largestGang"]) == (
            16, 16.0, 0.0, 2,
        )  # fmt: skip

        resp = await client.post("/v1/jobs", json=manifest("train"), headers=TOKEN)
        assert resp.status == 201
        await service.schedule_once()
        await service.launches_done(timeout=10)
        job_topic = f"{prefix}/jobs/team-a/train"
        await jobs.wait(lambda: [m["state"] for m in jobs.json(job_topic)][-1:] == ["Running"])
        events = jobs.json(job_topic)
        assert [e["state"] for e in events] == ["Queued", "Placed", "Running"]
        assert len({e["eventId"] for e in events}) == 3
        assert all(e["job"] == "train" and e["tenant"] == "team-a" for e in events)
        assert events[1]["cluster"] == "small-a"
        assert all(retained is False for _, _, retained in jobs.messages)

        # The new capacity (8 GPUs taken) replaces the retained message within a second.
        def free_now() -> float:
            return float(service.clusters()[0]["gpuTypes"][0]["free"])

        assert free_now() == 8.0
        await until(lambda: sent_free() == 8.0)
        await publisher.flush()
        async with subscriber(capacity) as late:
            await late.wait(lambda: bool(late.messages))
        assert json.loads(late.messages[0][1])["gpuTypes"][0]["free"] == 8.0
        assert publisher.dropped == 0


# --- (b) the last will --------------------------------------------------------------------

CHILD = """
import asyncio, sys
from adapters.mqtt.publisher import MqttSettings, Publisher

async def main() -> None:
    host, port, prefix, client_id = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
    publisher = Publisher(MqttSettings(host, port, client_id=client_id, prefix=prefix))
    publisher.start()
    await publisher.wait_connected()
    print("connected", flush=True)
    await asyncio.Event().wait()

asyncio.run(main())
"""


async def test_last_will_says_offline_when_the_process_is_killed() -> None:
    await require_mqtt()
    prefix = unique_prefix()
    status = f"{prefix}/status"
    async with subscriber(status) as inbox:
        child = await asyncio.create_subprocess_exec(
            sys.executable, "-c", CHILD, MQTT_HOST, str(MQTT_PORT), prefix,
            f"fbtest-will-{secrets.token_hex(4)}",
            cwd=ROOT, stdout=asyncio.subprocess.PIPE,
        )  # fmt: skip
        try:
            assert child.stdout is not None
            async with asyncio.timeout(20):
                assert await child.stdout.readline() == b"connected\n"
            await inbox.wait(lambda: inbox.payloads(status)[-1:] == [b"online"])
        finally:
            child.send_signal(signal.SIGKILL)  # no clean disconnect: only the will speaks
            await child.wait()
        await inbox.wait(lambda: inbox.payloads(status)[-1:] == [b"offline"])
    # Retained: a late subscriber learns it too.
    async with subscriber(status) as late:
        await late.wait(lambda: bool(late.messages))
    assert late.messages[0][1:] == (b"offline", True)


# --- (c) the MQTT broker restarted mid-stream ------------------------------------------------


async def test_no_event_lost_across_a_mosquitto_restart(tmp_path: Path) -> None:
    mosquitto = Mosquitto(tmp_path)
    await mosquitto.start()
    prefix = unique_prefix()
    total, first = 3000, 2500
    ids = [f"evt-{i}-{secrets.token_hex(4)}" for i in range(total)]
    publisher = Publisher(
        MqttSettings("127.0.0.1", mosquitto.port, client_id="fbtest-pub", prefix=prefix,
                     keepalive=5, timeout=3.0),
        backoff=FAST,
    )  # fmt: skip
    try:
        async with subscriber(
            f"{prefix}/jobs/#", port=mosquitto.port, client_id="fbtest-sub", persistent=True
        ) as inbox:
            publisher.start()
            await publisher.wait_connected()

            def send(lo: int, hi: int) -> None:
                for i in range(lo, hi):
                    body = json.dumps({"eventId": ids[i], "seq": i})
                    assert publisher.publish_nowait(f"jobs/t/j{i % 7}", body, qos=1)

            send(0, first)
            await until(lambda: publisher.published >= 50)
            await mosquitto.stop()
            assert (mosquitto.dir / "mosquitto.db").is_file()  # the sessions were saved
            assert publisher.published < first  # mid-stream: the rest waits or is in flight
            await until(lambda: not publisher.connected)
            send(first, total)  # while the MQTT broker is away: into the outbox
            await mosquitto.start()
            await publisher.wait_connected()

            ids_seen: set[str] = set()
            read = 0

            def seen() -> set[str]:  # incremental: parsing everything per message is O(n^2)
                nonlocal read
                for _, payload, _ in inbox.messages[read:]:
                    ids_seen.add(json.loads(payload)["eventId"])
                read = len(inbox.messages)
                return ids_seen

            await inbox.wait(lambda: seen() >= set(ids), timeout=30)
            assert seen() == set(ids)
            assert publisher.connected and publisher.connects >= 2
            assert publisher.dropped == 0
            await publisher.flush()
    finally:
        await publisher.close()
        await mosquitto.stop()


# --- (e) the API never waits on MQTT ----------------------------------------------------------


async def test_api_answers_while_mqtt_is_unreachable(tmp_path: Path) -> None:
    port = free_port()  # nothing listens there
    text = events_config(tmp_path / "db", unique_prefix(), port=port, extra=", outboxSize: 2")
    async with api(text) as (client, service):
        assert service.mqtt is not None
        async with asyncio.timeout(5):  # nothing here may wait for MQTT
            for i in range(4):
                resp = await client.post("/v1/jobs", json=manifest(f"j{i}", gpus=1), headers=TOKEN)
                assert resp.status == 201
            assert (await client.get("/v1/clusters", headers=TOKEN)).status == 200
        publisher = service.mqtt.publisher
        assert not publisher.connected
        assert publisher.dropped >= 2  # 4 job events (and capacity) into an outbox of 2
        text_metrics = await (await client.get("/metrics")).text()
        samples = {
            s.name: s.value
            for family in text_string_to_metric_families(text_metrics)
            for s in family.samples
        }
        assert samples["fedbroker_mqtt_connected"] == 0.0
        assert samples["fedbroker_mqtt_dropped_events_total"] == publisher.dropped


# --- units: reports, members, config ---------------------------------------------------------


def test_node_report_round_trip_and_errors() -> None:
    node = Node("n1", GpuType("A100"), Resources(gpus=8, cpu_milli=96_000, memory_mib=1024))
    usage = Usage(3, (250, 500), 24_000, 512, 4)
    payload = json.dumps(node_report(node, usage, 1.0)).encode()
    assert parse_node_report(payload, "n1") == (node, usage)
    with pytest.raises(ReportError, match="topic"):
        parse_node_report(payload, "n2")
    broken = json.loads(payload)
    broken["used"]["sharedGpuMilli"] = [1000]
    with pytest.raises(ReportError, match="sharedGpuMilli"):
        parse_node_report(json.dumps(broken).encode(), "n1")
    with pytest.raises(ReportError, match="JSON"):
        parse_node_report(b"{", "n1")


def test_members_follow_inventory_heartbeats_and_status() -> None:
    text = events_config(Path("/nonexistent/db"), "p").replace(
        "clusters:\n", "clusters:\n- {name: edge, source: {mqtt: {staleAfterSeconds: 30}}}\n"
    )
    config = parse_config(text, "test config")
    emitted: list[Any] = []
    stale: dict[str, bool] = {}
    clock = Clock()
    members = MqttMembers(config.clusters, 60.0, "p", emitted.extend, stale.__setitem__, clock)
    assert stale == {"edge": True}
    node = Node("n1", GpuType("A100"), Resources(gpus=4, cpu_milli=1000, memory_mib=1000))
    report = json.dumps(node_report(node, Usage(gpus=2, pods=1), 0.0)).encode()
    members.on_message("p/agents/edge/inventory", b'{"nodes": ["n1"]}', True)
    members.on_message("p/agents/edge/nodes/n1", report, True)
    members.on_message("p/agents/edge/nodes/old", report.replace(b'"n1"', b'"old"'), True)
    assert [type(e).__name__ for e in emitted] == ["NodeUpdated", "PodBound"]  # old: unlisted
    assert emitted[1] == PodBound("edge", "agent:n1", "n1", Resources(gpus=2))
    assert stale["edge"] is True  # no heartbeat yet
    members.on_message("p/agents/edge/status", b"online", True)
    members.on_message("p/agents/edge/heartbeat", b"{}", False)
    assert stale["edge"] is False
    assert members.connected("edge") is True
    clock.now += 31
    members.check_stale()
    assert stale["edge"] is True
    members.on_message("p/agents/edge/heartbeat", b"{}", False)
    assert stale["edge"] is False
    members.on_message("p/agents/edge/status", b"offline", True)  # the will
    assert stale["edge"] is True
    emitted.clear()
    members.on_message("p/agents/edge/nodes/n1", b"", True)  # cleared: deleted
    assert [type(e).__name__ for e in emitted] == ["PodDeleted", "NodeDeleted"]
    assert emitted[0] == PodDeleted("edge", "agent:n1")
    members.on_message("p/agents/edge/nodes/n1", b"not json", True)
    assert members.clusters["edge"].rejected == 1


@pytest.mark.parametrize(
    ("fragment", "message"),
    [
        ("port: 0", "events.mqtt.port: must be >= 1"),
        ('topicPrefix: "a/#"', "events.mqtt.topicPrefix"),
        ("outboxSize: 0", "events.mqtt.outboxSize"),
        ("password: {env: FEDBROKER_TEST_NO_SUCH_VAR}", "events.mqtt.password.env"),
        ("nope: 1", "events.mqtt.nope"),
    ],
)
def test_mqtt_config_errors_name_the_key(fragment: str, message: str) -> None:
    text = f"events:\n  mqtt: {{host: h, {fragment}}}\n"
    with pytest.raises(ConfigError) as info:
        parse_config(text, "cfg.yaml", {})
    assert str(info.value).startswith(f"cfg.yaml: {message}")
    assert "\n" not in str(info.value)


def test_mqtt_cluster_needs_events_mqtt_and_password_stays_secret() -> None:
    with pytest.raises(ConfigError, match=r"clusters\[0\]\.source\.mqtt: needs events\.mqtt"):
        parse_config("clusters:\n- {name: e, source: {mqtt: {}}}\n", "cfg.yaml", {})
    config = parse_config(
        "events: {mqtt: {host: h, username: u, password: {value: hunter2-canary}}}\n",
        "cfg.yaml",
        {},
    )
    assert config.mqtt_password is not None
    assert config.mqtt_password.get_secret_value() == "hunter2-canary"
    assert "hunter2-canary" not in repr(config) + str(config.model_dump())
    settings = MqttSettings("h", password="hunter2-canary")
    assert "hunter2-canary" not in repr(settings)
