"""One MQTT connection (aiomqtt) with a bounded outbox, a status topic and reconnects.

``Publisher`` implements ``broker.ports.EventSink`` (the broker's events out, the agents'
reports in) and is what the cluster agent publishes through.

``Publisher`` connects with a last will ``<prefix>/<status>`` = ``offline`` (retained, QoS 1)
and publishes ``online`` (retained) after every connect; a clean ``close()`` publishes
``offline`` itself (a will is only sent when the connection dies). It reconnects forever with
exponential backoff and jitter (about 0.5 s doubling to 10 s; reset after a connect): the
cap bounds how long an MQTT broker that is back goes unnoticed, however long it was down
(a refused connect costs nothing, so a short cap is cheap). The session is persistent
(``clean_session=False``, a fixed client id): the MQTT broker keeps our subscriptions and
the QoS 1 messages it owes us while we are away.

Outgoing messages go through a bounded outbox (an ``asyncio.Queue``). ``publish_nowait``
never blocks the caller (the API never waits on MQTT): when the outbox is full the message
is dropped and counted (``dropped``). ``publish`` (for the agent, whose state must not be
lost) waits for room instead. A message leaves the outbox only once ``client.publish`` has
returned, i.e. a QoS 1 message was acknowledged (PUBACK): one in flight when the connection
drops is sent again after the reconnect (at least once; consumers dedupe).

While the MQTT broker is unreachable, messages wait in the outbox, oldest first, and are
sent after the reconnect; once it holds ``outbox_size`` messages the newer ones are dropped
(and counted) until it drains. An outage of any length therefore holds at most
``outbox_size`` messages (plus the one in flight) in memory.

Subscriptions (``subscribe``) are made on every connect; their messages go to a synchronous
handler. Iterating the client's messages is also how a dropped connection is noticed while
nothing is being published.

TLS (``settings.tls``, ``adapters.mqtt.tls``): the context is built when the publisher is
(a file that does not load raises ``MqttTlsError`` then, before any connection). Before each
reconnect, files that changed are loaded into it again (a renewed client certificate is
used from the next connection on, without a restart; one that does not load is logged and
the previous one kept).

Secrets: the password is never logged, nor put in an error; log lines name the host, the
port and the error only. Of the TLS key only its path is held here (``ssl``
loads it into the context).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import ssl
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import aiomqtt

from adapters.mqtt.tls import MqttTls, MqttTlsError
from broker.ports import EventSink, MessageHandler

log = logging.getLogger(__name__)

Sleep = Callable[[float], Awaitable[None]]
ONLINE = b"online"
OFFLINE = b"offline"
DEFAULT_OUTBOX = 10_000


@dataclass(frozen=True, slots=True)
class MqttSettings:
    host: str
    port: int = 1883
    client_id: str = "fedbroker"
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    prefix: str = "fedbroker"
    status: str = "status"  # the will / status topic, below the prefix
    outbox_size: int = DEFAULT_OUTBOX
    keepalive: int = 15
    timeout: float = 10.0  # per MQTT operation (connect, PUBACK, SUBACK)
    tls: MqttTls | None = None  # None: plain TCP

    def tls_context(self) -> ssl.SSLContext | None:
        """The client's TLS context (None without TLS); raises ``MqttTlsError``."""
        return None if self.tls is None else self.tls.context()


@dataclass(frozen=True, slots=True)
class Outgoing:
    topic: str  # the full topic
    payload: bytes
    qos: int = 1
    retain: bool = False


@dataclass(slots=True)
class Backoff:
    """About 0.5 s, 1 s, 2 s, ... capped at 10 s, each +-20 % of jitter.

    (tenacity's ``wait_exponential_jitter`` would compute the same, but its retry state
    would not reset after a connection that lived for hours: the attempt counter is ours.)
    """

    base: float = 0.5
    cap: float = 10.0
    jitter: float = 0.2
    rng: random.Random = field(default_factory=random.Random)

    def delay(self, attempt: int) -> float:
        raw = min(self.cap, self.base * 2.0 ** min(attempt, 32))
        return min(self.cap, raw * (1.0 + self.jitter * (2.0 * self.rng.random() - 1.0)))


class Publisher(EventSink):
    def __init__(
        self,
        settings: MqttSettings,
        *,
        sleep: Sleep = asyncio.sleep,
        backoff: Backoff | None = None,
        on_connect: Callable[[], None] | None = None,
    ) -> None:
        self.settings = settings
        self._tls = settings.tls_context()
        self._tls_stamp = settings.tls.stamp() if settings.tls is not None else ()
        self._sleep = sleep
        self._backoff = backoff or Backoff()
        self._on_connect = on_connect
        self._outbox: asyncio.Queue[Outgoing] = asyncio.Queue(maxsize=settings.outbox_size)
        self._inflight: Outgoing | None = None
        self._handlers: list[tuple[str, MessageHandler]] = []
        self._client: aiomqtt.Client | None = None
        self._task: asyncio.Task[None] | None = None
        self._idle = asyncio.Event()
        self._idle.set()
        self._up = asyncio.Event()
        self.connected = False
        self.connects = 0
        self.dropped = 0
        self.published = 0

    # -- topics and messages --------------------------------------------------------------

    def topic(self, suffix: str) -> str:
        return f"{self.settings.prefix}/{suffix}"

    @property
    def status_topic(self) -> str:
        return self.topic(self.settings.status)

    def publish_nowait(
        self, suffix: str, payload: bytes | str, *, qos: int = 1, retain: bool = False
    ) -> bool:
        """Queue a message without ever waiting; False (and counted) when the outbox is full."""
        item = Outgoing(self.topic(suffix), _bytes(payload), qos, retain)
        try:
            self._outbox.put_nowait(item)
        except asyncio.QueueFull:
            self.dropped += 1
            return False
        self._idle.clear()
        return True

    async def publish(
        self, suffix: str, payload: bytes | str, *, qos: int = 1, retain: bool = False
    ) -> None:
        """Queue a message, waiting for room in the outbox (never dropped)."""
        self._idle.clear()
        await self._outbox.put(Outgoing(self.topic(suffix), _bytes(payload), qos, retain))

    @property
    def full(self) -> bool:
        """True while ``publish_nowait`` would drop."""
        return self._outbox.full()

    @property
    def backlog(self) -> int:
        return self._outbox.qsize() + (self._inflight is not None)

    async def flush(self) -> None:
        """Wait until every queued message was handed over (acknowledged for QoS 1)."""
        while self.backlog:
            self._idle.clear()
            await self._idle.wait()

    async def wait_connected(self) -> None:
        await self._up.wait()

    def subscribe(self, topic_filter: str, handler: MessageHandler) -> None:
        """Subscribe (QoS 1) on every connect; call before ``start``."""
        self._handlers.append((topic_filter, handler))

    # -- the connection -------------------------------------------------------------------

    def start(self) -> asyncio.Task[None]:
        if self._task is None:
            self._task = asyncio.create_task(self.run(), name="mqtt")
        return self._task

    async def close(self, timeout: float = 2.0) -> None:
        """Say ``offline`` (retained) if connected, then disconnect cleanly."""
        client = self._client
        if self.connected and client is not None:
            with contextlib.suppress(aiomqtt.MqttError, TimeoutError):
                await asyncio.wait_for(
                    client.publish(self.status_topic, OFFLINE, qos=1, retain=True), timeout
                )
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    def _new_client(self) -> aiomqtt.Client:
        s = self.settings
        return aiomqtt.Client(
            s.host,
            s.port,
            username=s.username,
            password=s.password,
            identifier=s.client_id,
            clean_session=False,
            keepalive=s.keepalive,
            timeout=s.timeout,
            tls_context=self._tls,
            will=aiomqtt.Will(self.status_topic, OFFLINE, qos=1, retain=True),
        )

    async def run(self) -> None:
        """Connect, publish, listen; reconnect with backoff. Runs until cancelled."""
        s = self.settings
        # One client for every connection (the aiomqtt reconnect pattern): paho keeps the
        # session's in-flight messages, and messages received (and acknowledged) but not
        # yet handled stay in the client's queue for the next session's listener.
        client = self._client = self._new_client()
        attempt = 0
        while True:
            self._refresh_tls()
            try:
                async with client:
                    await client.publish(self.status_topic, ONLINE, qos=1, retain=True)
                    for topic_filter, _ in self._handlers:
                        await client.subscribe(topic_filter, qos=1)
                    self._set_connected(True)
                    attempt = 0
                    if self._on_connect is not None:
                        self._on_connect()
                    await self._session(client)
            except aiomqtt.MqttError as exc:
                self._set_connected(False)
                delay = self._backoff.delay(attempt)
                attempt += 1
                log.warning(
                    "mqtt %s:%s: %s; reconnecting in %.1fs", s.host, s.port, _describe(exc), delay
                )
                await self._sleep(delay)
            finally:
                self._set_connected(False)

    def _refresh_tls(self) -> None:
        """Load the TLS files again if they changed (no connection is open now)."""
        tls, s = self.settings.tls, self.settings
        if tls is None or self._tls is None or tls.stamp() == self._tls_stamp:
            return
        self._tls_stamp = tls.stamp()
        try:
            tls.refresh(self._tls)
        except MqttTlsError as exc:
            log.error("mqtt %s:%s: %s; connecting with the previous one", s.host, s.port, exc)
            return
        log.info("mqtt %s:%s: TLS files loaded again", s.host, s.port)

    def _set_connected(self, up: bool) -> None:
        if up and not self.connected:
            self.connects += 1
            log.info("mqtt %s:%s: connected", self.settings.host, self.settings.port)
        self.connected = up
        if up:
            self._up.set()
        else:
            self._up.clear()

    async def _session(self, client: aiomqtt.Client) -> None:
        """Drain the outbox one message at a time (the message stays ``_inflight`` until
        acknowledged) while a listener reads incoming messages; the listener's MqttError
        (the connection dropped) ends the session."""
        listener = asyncio.create_task(self._listen(client))
        try:
            while True:
                if self._inflight is None:
                    if self._outbox.empty():
                        self._idle.set()
                    getter = asyncio.ensure_future(self._outbox.get())
                    await asyncio.wait({getter, listener}, return_when=asyncio.FIRST_COMPLETED)
                    if getter.done() and not getter.cancelled():
                        self._inflight = getter.result()
                    else:
                        getter.cancel()
                    if self._inflight is None:
                        listener.result()  # raises the listener's MqttError
                        raise aiomqtt.MqttError("message listener ended")
                item = self._inflight
                sending = asyncio.ensure_future(
                    client.publish(item.topic, item.payload, qos=item.qos, retain=item.retain)
                )
                await asyncio.wait({sending, listener}, return_when=asyncio.FIRST_COMPLETED)
                if not sending.done():
                    sending.cancel()
                    await asyncio.gather(sending, return_exceptions=True)
                    listener.result()
                    raise aiomqtt.MqttError("message listener ended")
                sending.result()  # an MqttError keeps the message in flight
                self._inflight = None
                self.published += 1
        finally:
            listener.cancel()
            await asyncio.gather(listener, return_exceptions=True)

    async def _listen(self, client: aiomqtt.Client) -> None:
        async for message in client.messages:
            topic = str(message.topic)
            payload = message.payload if isinstance(message.payload, bytes) else b""
            for topic_filter, handler in self._handlers:
                if message.topic.matches(topic_filter):
                    try:
                        handler(topic, payload, bool(message.retain))
                    except Exception:
                        log.exception("mqtt handler for %s failed", topic)


def _bytes(payload: bytes | str) -> bytes:
    return payload.encode() if isinstance(payload, str) else payload


def _describe(exc: BaseException) -> str:
    """The error's own words (aiomqtt's messages carry codes, never credentials)."""
    text = str(exc).splitlines()[0] if str(exc) else ""
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


__all__ = ["OFFLINE", "ONLINE", "Backoff", "MqttSettings", "Outgoing", "Publisher"]
