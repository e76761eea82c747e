"""Fault: the MQTT broker is down for a minute; the API keeps answering, events resume.

A real ``fedbroker serve`` (simulated clusters, SQLite) publishes its events to a private
mosquitto on a free port (``services.PrivateMosquitto``: the shared one on 1883 is never
touched); a test subscriber reads ``<prefix>/jobs/#``.

1. Jobs submitted while mosquitto is up reach the subscriber (Queued, Placed, Running).
2. mosquitto is killed (SIGKILL) and stays down for ``OUTAGE_SECONDS`` of wall time. Once
   the broker says so (``fedbroker_mqtt_connected`` 0), a job is submitted and read back
   every ``PACE_SECONDS``, with ``/readyz`` and ``/metrics`` on the way: every call answers
   within ``LATENCY_BOUND`` (the API never waits on MQTT; a correctness bound, not a speed
   target), ``/readyz`` stays 200 (MQTT is an optional sink, not part of readiness), and
   the outbox never holds more than ``outboxSize`` messages (plus one in flight).
3. mosquitto comes back on the same port; the broker reconnects by itself within
   ``RECONNECT_BOUND`` (its backoff is capped), and the events of jobs submitted
   afterwards reach the subscriber.

The broker reaches mosquitto through ``tcp_proxy.TcpProxy``, which refuses connections
from the kill until the test subscriber has subscribed again on the restarted mosquitto:
without it the broker could flush its outbox before the subscriber is back, and a message
missed that way could not be told from a dropped one. The reconnect time is measured
from the moment the proxy listens again.

What happens to the events of the outage (``adapters.mqtt.publisher``): they wait in the
bounded outbox (``events.mqtt.outboxSize``, here ``OUTBOX``), oldest first, and are sent
after the reconnect; once it is full the newer ones are dropped and counted in
``fedbroker_mqtt_dropped_events_total``. Capacity (retained state) is not queued while
disconnected: the current rows are published again on reconnect, so a long outage cannot
fill the outbox with stale capacity. The test checks each part: the first outage job's
events arrive, the last one's were dropped, the counter equals what was refused, and the
outbox gauge never passed its bound (memory stays bounded however long the outage).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import signal
import time
from pathlib import Path
from typing import Any

import aiohttp
import yaml
from prometheus_client.parser import text_string_to_metric_families
from services import private_mosquitto
from tcp_proxy import TcpProxy
from test_crash_safety import TENANT, TENANT_TOKEN, Broker, manifest, write_config
from test_mqtt import Inbox, subscriber, unique_prefix

from adapters.mqtt.publisher import Backoff
from broker.store import sqlite_url

OUTAGE_SECONDS = 60.0  # the minute, in wall time
PACE_SECONDS = 0.5  # one submission (and its reads) every half second: 2 jobs/s
LATENCY_BOUND = 2.0  # seconds per API call during the outage
RECONNECT_BOUND = 15.0  # MQTT reachable again -> fedbroker_mqtt_connected 1
NOTICE_BOUND = 20.0  # mosquitto killed -> fedbroker_mqtt_connected 0 (keepalive 15 s)
EVENT_BOUND = 20.0  # an event on its way to the subscriber
OUTBOX = 100  # events.mqtt.outboxSize: small, so that a minute of events overflows it
STATES = ["Queued", "Placed", "Running"]
TENANT_HEADERS = {"Authorization": f"Bearer {TENANT_TOKEN}"}
REQUEST_TIMEOUT = aiohttp.ClientTimeout(total=10)  # a hung call fails, LATENCY_BOUND judges


def test_reconnect_backoff_is_capped_well_below_a_minute() -> None:
    """However long the outage, the next attempt is at most 10 s (+20 % jitter) away, so a
    returning MQTT broker is noticed within RECONNECT_BOUND (with time to connect)."""
    backoff = Backoff(rng=random.Random(7))
    delays = [backoff.delay(attempt) for attempt in range(200)]
    assert max(delays) <= 12.0 < RECONNECT_BOUND
    assert delays[0] <= 0.6  # a blip is retried at once
    assert sum(delays[:8]) < OUTAGE_SECONDS  # and it keeps trying throughout the minute


def write_mqtt_config(path: Path, db: Path, port: int, prefix: str) -> None:
    """The crash-safety config (simulated clusters, SQLite) with events to MQTT on ``port``."""
    write_config(path, sqlite_url(str(db)))
    config = yaml.safe_load(path.read_text(encoding="utf-8"))
    config["events"] = {
        "mqtt": {"host": "127.0.0.1", "port": port, "clientId": "fbtest-outage",
                 "topicPrefix": prefix, "outboxSize": OUTBOX}
    }  # fmt: skip
    path.write_text(yaml.safe_dump(config), encoding="utf-8")


class Api:
    """The broker's HTTP API, every call timed."""

    def __init__(self, session: aiohttp.ClientSession, url: str) -> None:
        self.session, self.url = session, url
        self.latencies: list[tuple[float, str]] = []

    async def call(self, method: str, path: str, **kwargs: Any) -> tuple[int, str]:
        started = time.monotonic()
        async with self.session.request(method, self.url + path, **kwargs) as response:
            body = await response.text()
        self.latencies.append((time.monotonic() - started, f"{method} {path}"))
        return response.status, body

    async def submit(self, name: str) -> None:
        status, body = await self.call(
            "POST", "/v1/jobs", json=manifest(name), headers=TENANT_HEADERS
        )
        assert status == 201, (name, status, body)

    async def state(self, name: str) -> str:
        status, body = await self.call("GET", f"/v1/jobs/{name}", headers=TENANT_HEADERS)
        assert status == 200, (name, status, body)
        return str(json.loads(body)["status"]["state"])

    async def ready(self) -> None:
        status, body = await self.call("GET", "/readyz")
        assert status == 200, body

    async def metrics(self) -> dict[str, float]:
        status, text = await self.call("GET", "/metrics")
        assert status == 200, text
        return {
            sample.name: sample.value
            for family in text_string_to_metric_families(text)
            for sample in family.samples
            if sample.name.startswith("fedbroker_mqtt_")
        }

    async def until_running(self, name: str, timeout: float) -> None:
        started = time.monotonic()
        while await self.state(name) != "Running":
            assert time.monotonic() - started < timeout, f"{name} not Running in {timeout}s"
            await asyncio.sleep(0.05)  # polling pace, bounded by the deadline

    async def until_metric(self, name: str, value: float, timeout: float) -> float:
        """Poll /metrics until ``name`` == ``value``; seconds it took (fails at the deadline)."""
        started = time.monotonic()
        while (await self.metrics()).get(name) != value:
            assert time.monotonic() - started < timeout, f"{name} not {value} in {timeout}s"
            await asyncio.sleep(0.05)  # polling pace, bounded by the deadline
        return time.monotonic() - started


def job_json(inbox: Inbox, prefix: str, name: str) -> list[Any]:
    return inbox.json(f"{prefix}/jobs/{TENANT}/{name}")


def job_events(inbox: Inbox, prefix: str, name: str) -> list[str]:
    return [e["state"] for e in job_json(inbox, prefix, name)]


async def all_running(inbox: Inbox, prefix: str, names: list[str]) -> None:
    """Wait (bounded) until the subscriber saw every job of ``names`` reach Running."""
    await inbox.wait(
        lambda: all(job_events(inbox, prefix, n)[-1:] == ["Running"] for n in names),
        timeout=EVENT_BOUND,
    )


async def test_mqtt_down_for_a_minute_api_answers_and_events_resume(tmp_path: Path) -> None:
    prefix = unique_prefix()
    async with contextlib.AsyncExitStack() as stack:  # unwound last in, first out
        mosquitto = await stack.enter_async_context(private_mosquitto(tmp_path / "mosquitto"))
        inbox = await stack.enter_async_context(subscriber(f"{prefix}/#", port=mosquitto.port))
        session = await stack.enter_async_context(aiohttp.ClientSession(timeout=REQUEST_TIMEOUT))
        config = tmp_path / "fedbroker.yaml"
        proxy = TcpProxy(mosquitto.port)
        await proxy.start()
        stack.push_async_callback(proxy.close)
        write_mqtt_config(config, tmp_path / "fedbroker.db", proxy.port, prefix)
        broker = Broker(config, tmp_path)
        broker.start()
        stack.callback(broker.stop)
        await broker.ready(session)
        api = Api(session, broker.url)

        # 1. Events flow.
        await api.until_metric("fedbroker_mqtt_connected", 1.0, NOTICE_BOUND)
        before = [f"before-{i}" for i in range(3)]
        for name in before:
            await api.submit(name)
        await all_running(inbox, prefix, before)
        assert all(job_events(inbox, prefix, n) == STATES for n in before)

        # 2. mosquitto down for a minute: the API answers, readiness holds.
        mosquitto.kill(signal.SIGKILL)
        await proxy.refuse()  # the broker's attempts are refused, as by a dead mosquitto
        killed = time.monotonic()
        inbox.subscribed.clear()  # set again once the subscriber is back
        noticed = await api.until_metric("fedbroker_mqtt_connected", 0.0, NOTICE_BOUND)
        assert (await api.metrics())["fedbroker_mqtt_dropped_events_total"] == 0.0
        api.latencies.clear()
        outage: list[str] = []
        outbox_max = 0.0
        while time.monotonic() - killed < OUTAGE_SECONDS:
            tick = killed + noticed + len(outage) * PACE_SECONDS
            await asyncio.sleep(max(0.0, tick - time.monotonic()))  # the load's pace
            name = f"outage-{len(outage):03d}"
            await api.submit(name)
            outage.append(name)
            assert await api.state(name) in STATES
            await api.ready()
            sample = await api.metrics()
            assert sample["fedbroker_mqtt_connected"] == 0.0
            outbox_max = max(outbox_max, sample["fedbroker_mqtt_outbox_messages"])
        during = list(api.latencies)
        slowest, call = max(during)
        assert slowest < LATENCY_BOUND, f"{call} took {slowest:.2f}s while MQTT was down"
        assert outbox_max <= OUTBOX + 1  # the queue, and one message in flight at the kill
        # Every outage job runs (the scheduler does not wait on MQTT either), all three of
        # its events made before the reconnect.
        await api.until_running(outage[-1], EVENT_BOUND)
        assert [await api.state(n) for n in outage] == ["Running"] * len(outage)
        down = await api.metrics()
        assert down["fedbroker_mqtt_dropped_events_total"] > 0  # the outbox overflowed

        # 3. mosquitto back on its port: the broker reconnects by itself, events resume.
        await mosquitto.start()
        async with asyncio.timeout(EVENT_BOUND):
            await inbox.subscribed.wait()  # it will see every message the outbox flushes
        assert (await api.metrics())["fedbroker_mqtt_connected"] == 0.0
        await proxy.start()  # same port: from here the broker can reach mosquitto again
        reconnect = await api.until_metric("fedbroker_mqtt_connected", 1.0, RECONNECT_BOUND)
        after = [f"after-{i}" for i in range(3)]
        for name in after:
            await api.submit(name)
        await all_running(inbox, prefix, after)
        assert all(job_events(inbox, prefix, n) == STATES for n in after)

        # The outage's events: the oldest OUTBOX arrived (in order), the newer were dropped.
        await api.until_metric("fedbroker_mqtt_outbox_messages", 0.0, EVENT_BOUND)  # drained
        up = await api.metrics()
        assert (
            up["fedbroker_mqtt_dropped_events_total"] == down["fedbroker_mqtt_dropped_events_total"]
        )
        delivered = len({e["eventId"] for n in outage for e in job_json(inbox, prefix, n)})
        # Each outage job event was either delivered or dropped and counted, never both
        # (capacity, which is not queued while disconnected, is never counted here).
        assert delivered + up["fedbroker_mqtt_dropped_events_total"] == 3 * len(outage)
        assert OUTBOX - 2 <= delivered <= OUTBOX  # a capacity row may hold a slot or two
        assert job_events(inbox, prefix, outage[0]) == STATES
        assert job_events(inbox, prefix, outage[-1]) == []
        # The gap was announced in-band, before the first event that found room again.
        gaps = inbox.json(f"{prefix}/gaps/jobs")
        assert sum(g["dropped"] for g in gaps) == up["fedbroker_mqtt_dropped_events_total"]
        topics = [t for t, _, _ in inbox.messages]
        first_after = topics.index(f"{prefix}/jobs/{TENANT}/{after[0]}")
        assert f"{prefix}/gaps/jobs" in topics[:first_after]
        assert all(g["firstDroppedAt"] <= g["lastDroppedAt"] <= g["at"] for g in gaps)

        log = (tmp_path / f"broker-{broker.starts}.log").read_text(encoding="utf-8")
        assert "Traceback" not in log, log[-4000:]
        assert "reconnecting in" in log  # the outage was noticed, without a traceback
        print(json.dumps({
            "outage_s": OUTAGE_SECONDS, "jobs_during_outage": len(outage),
            "api_calls_during_outage": len(during),
            "max_api_latency_s": round(slowest, 3), "slowest_call": call,
            "disconnect_noticed_s": round(noticed, 2), "reconnect_s": round(reconnect, 2),
            "buffered_and_delivered": delivered,
            "dropped": up["fedbroker_mqtt_dropped_events_total"],
        }))  # fmt: skip
