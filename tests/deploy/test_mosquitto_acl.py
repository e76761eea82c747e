"""The example mosquitto setup of pull mode (deploy/mosquitto) really isolates the agents.

A private mosquitto (services.PrivateMosquitto) runs the shipped ``acl`` as it is and the
shipped ``mosquitto.conf``'s settings (its listeners moved to free loopback ports, its files
to the test's), with a password file made by ``mosquitto_passwd`` for the broker, and
certificates of a test CA (pki.Authority) for mosquitto's TLS listener, the broker
(CN ``fedbroker.broker``) and the agents of clusters ``a`` and ``b`` (CN ``a``, ``b``): on
the agents' listener a certificate's CN is the username the ACL knows.

Each check that something does NOT arrive is ordered, not timed: the same sender then
sends something that may arrive, and the receiver's first message must be that one
(mosquitto handles one client's packets in order, and drops a denied publish, or a
message a subscriber may not read, where it would have queued it).
"""

from __future__ import annotations

import asyncio
import shutil
import signal
import socket
import ssl
import subprocess
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import aiomqtt
import pytest
from pki import Authority
from services import PrivateMosquitto, unavailable

from adapters.mqtt.tls import MqttTls

ROOT = Path(__file__).resolve().parents[2]
ACL = ROOT / "deploy" / "mosquitto" / "acl"
CONF = ROOT / "deploy" / "mosquitto" / "mosquitto.conf"
BROKER_USER = "fedbroker.broker"
PREFIX = "fedbroker/agents"
SECONDS = 10.0  # bound on every wait


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _settings(passwd: Path, pki: Path) -> tuple[list[str], dict[int, int], bool]:
    """The shipped mosquitto.conf for a test: (its lines with files and listeners moved,
    shipped listener port -> test port, whether it lets anonymous clients in). ``pki``
    holds the TLS files under the shipped names (``ca.crt``, ``server.crt``, ...)."""
    lines: list[str] = []
    ports: dict[int, int] = {}
    anonymous = True  # mosquitto's default
    for raw in CONF.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        key, _, value = line.partition(" ")
        if key == "listener":
            ports[int(value.split()[0])] = port = _free_port()
            lines.append(f"listener {port} 127.0.0.1")
        elif key == "allow_anonymous":
            anonymous = value == "true"
        elif key == "password_file":
            lines.append(f"password_file {passwd}")
        elif key == "acl_file":
            lines.append(f"acl_file {ACL}")
        elif key in ("cafile", "certfile", "keyfile"):
            lines.append(f"{key} {pki / Path(value).name}")
        elif not key.startswith("persistence"):  # the private one's own
            lines.append(line)
    return lines, ports, anonymous


@dataclass
class Setup:
    broker_port: int  # the shipped 1883: the broker's replicas, with passwords
    agents_port: int  # the shipped 8883: TLS, a client certificate per agent
    passwords: dict[str, str]
    pki: Path  # ca.crt, and <cn>.crt / <cn>.key for each client

    def tls(self, cn: str | None) -> MqttTls:
        """The client side of the agents' listener, with ``cn``'s certificate (if any)."""
        ca = str(self.pki / "ca.crt")
        if cn is None:
            return MqttTls(ca)
        return MqttTls(ca, str(self.pki / f"{cn}.crt"), str(self.pki / f"{cn}.key"))


def make_pki(directory: Path, clients: tuple[str, ...]) -> Path:
    """A test CA as ``ca.crt``, mosquitto's pair (``server.crt``/``.key``, for 127.0.0.1)
    and one pair per client, its CN the client's name."""
    directory.mkdir(parents=True, exist_ok=True)
    authority = Authority(directory)
    authority.ca_file.rename(directory / "ca.crt")
    for serial, cn in enumerate(("server", *clients), start=1):
        authority.issue(cn, serial)
    return directory


async def shipped_mosquitto(
    directory: Path, passwd: Path, pki: Path
) -> tuple[PrivateMosquitto, dict[int, int]]:
    """The shipped configuration running (started), and its listeners' test ports."""
    lines, ports, anonymous = _settings(passwd, pki)
    mosquitto = PrivateMosquitto(directory, anonymous=anonymous, extra=lines)
    await mosquitto.start()
    # start() waits for the first listener; a client of the TLS one must not meet it closed
    # (its first refusal would cost it a reconnect backoff).
    async with asyncio.timeout(PrivateMosquitto.START_SECONDS):
        for port in ports.values():
            while True:
                try:
                    _, writer = await asyncio.open_connection("127.0.0.1", port)
                except OSError:
                    await asyncio.sleep(0.02)  # polling pace, bounded by the timeout
                    continue
                writer.close()
                break
    return mosquitto, ports


@pytest.fixture
async def setup(tmp_path: Path) -> AsyncIterator[Setup]:
    tool = shutil.which("mosquitto_passwd") or "/usr/bin/mosquitto_passwd"
    if not Path(tool).is_file():
        unavailable("mosquitto_passwd not found (Debian package mosquitto)")
    passwd = tmp_path / "passwd"
    passwords = {user: f"pw-{user}-0123456789" for user in (BROKER_USER, "a", "b")}
    for i, (user, password) in enumerate(passwords.items()):
        create = ["-c"] if i == 0 else []
        subprocess.run([tool, *create, "-b", str(passwd), user, password], check=True)
    pki = make_pki(tmp_path / "pki", (BROKER_USER, "a", "b"))
    mosquitto, ports = await shipped_mosquitto(tmp_path / "mosquitto", passwd, pki)
    try:
        yield Setup(ports[1883], ports[8883], passwords, pki)
    finally:
        mosquitto.kill(signal.SIGTERM)


@asynccontextmanager
async def connected(
    setup: Setup,
    user: str | None,
    *,
    port: int,
    identifier: str | None = None,
    tls: MqttTls | None = None,
) -> AsyncIterator[aiomqtt.Client]:
    """A client with ``user``'s password (None: no user), over ``tls`` if given."""
    password = None if user is None else setup.passwords[user]
    client = aiomqtt.Client(
        "127.0.0.1", port, username=user, password=password, identifier=identifier,
        timeout=SECONDS, tls_context=None if tls is None else tls.context(),
    )  # fmt: skip
    async with client:
        yield client


def broker(setup: Setup) -> AbstractAsyncContextManager[aiomqtt.Client]:
    return connected(setup, BROKER_USER, port=setup.broker_port)


def agent(
    setup: Setup, cluster: str, identifier: str | None = None
) -> AbstractAsyncContextManager[aiomqtt.Client]:
    """The agent of ``cluster``: its certificate, no user nor password."""
    return connected(
        setup, None, port=setup.agents_port, identifier=identifier, tls=setup.tls(cluster)
    )


async def first(client: aiomqtt.Client) -> tuple[str, bytes]:
    async with asyncio.timeout(SECONDS):
        message = await anext(client.messages)
    assert isinstance(message.payload, bytes)
    return str(message.topic), message.payload


async def test_an_agent_hears_only_its_own_clusters_commands(setup: Setup) -> None:
    async with broker(setup) as b_broker, agent(setup, "a") as a, agent(setup, "b") as b:
        await a.subscribe(f"{PREFIX}/#", qos=1)  # the widest it may ask for
        await b.subscribe(f"{PREFIX}/b/commands", qos=1)
        await b_broker.publish(f"{PREFIX}/b/commands", b"for b", qos=1)
        await b_broker.publish(f"{PREFIX}/a/commands", b"for a", qos=1)
        assert await first(a) == (f"{PREFIX}/a/commands", b"for a")  # b's never came
        assert await first(b) == (f"{PREFIX}/b/commands", b"for b")  # the broker may


async def test_an_agent_writes_only_its_own_reports_and_replies(setup: Setup) -> None:
    async with broker(setup) as listener, agent(setup, "a") as a, agent(setup, "b") as b:
        await listener.subscribe(f"{PREFIX}/#", qos=1)
        for forged in ("b/replies", "b/nodes/n1", "b/status", "a/commands", "b/commands"):
            await a.publish(f"{PREFIX}/{forged}", b"forged by a", qos=1)
        await a.publish(f"{PREFIX}/a/replies", b"a's reply", qos=1)
        assert await first(listener) == (f"{PREFIX}/a/replies", b"a's reply")
        await b.publish(f"{PREFIX}/b/replies", b"b's reply", qos=1)
        assert await first(listener) == (f"{PREFIX}/b/replies", b"b's reply")


async def test_an_agent_cannot_take_another_clients_id(setup: Setup) -> None:
    own_id = "fedbroker-agent-b"  # what b's agent asks for (its default)
    async with broker(setup) as sender, agent(setup, "b", identifier=own_id) as b:
        await b.subscribe(f"{PREFIX}/b/commands", qos=1)
        # On the agents' listener a client's id is its username, whatever it asks for: b's
        # connection is not taken over (it would be dropped, and hear nothing more).
        async with agent(setup, "a", identifier=own_id):
            await sender.publish(f"{PREFIX}/b/commands", b"still b's", qos=1)
            assert await first(b) == (f"{PREFIX}/b/commands", b"still b's")


async def test_the_broker_listener_wants_a_user_and_its_password(setup: Setup) -> None:
    setup.passwords[BROKER_USER] = "not-its-password"
    for user in (None, BROKER_USER):
        with pytest.raises(aiomqtt.MqttError):
            async with connected(setup, user, port=setup.broker_port):
                pass


async def test_the_agents_listener_wants_a_certificate_of_the_ca(
    setup: Setup, tmp_path: Path
) -> None:
    """No certificate (even with a user's password), or one another CA signed: refused in
    the handshake. (The clients stop at TLS 1.2, where mosquitto's refusal ends the
    handshake itself; under 1.3 it comes after, and aiomqtt waits out its timeout.)"""
    other = make_pki(tmp_path / "other-ca", ("a",))
    stranger = MqttTls(str(setup.pki / "ca.crt"), str(other / "a.crt"), str(other / "a.key"))
    for user, tls in ((None, setup.tls(None)), (BROKER_USER, setup.tls(None)), (None, stranger)):
        context = tls.context()
        context.maximum_version = ssl.TLSVersion.TLSv1_2
        client = aiomqtt.Client(
            "127.0.0.1", setup.agents_port, username=user,
            password=None if user is None else setup.passwords[user],
            timeout=SECONDS, tls_context=context,
        )  # fmt: skip
        with pytest.raises(aiomqtt.MqttError, match="SSL"):
            async with client:
                pass
    async with agent(setup, "a"):  # the same listener lets a certificate of the CA in
        pass


async def test_the_broker_with_its_certificate_is_the_brokers_user(setup: Setup) -> None:
    """On the agents' listener the broker's certificate (CN fedbroker.broker) gets the
    broker's rights: it sends commands and hears the agents."""
    tls = setup.tls(BROKER_USER)
    async with connected(setup, None, port=setup.agents_port, tls=tls) as b, agent(setup, "a") as a:
        await a.subscribe(f"{PREFIX}/a/commands", qos=1)
        await b.subscribe(f"{PREFIX}/a/replies", qos=1)
        await b.publish(f"{PREFIX}/a/commands", b"for a", qos=1)
        assert await first(a) == (f"{PREFIX}/a/commands", b"for a")
        await a.publish(f"{PREFIX}/a/replies", b"done", qos=1)
        assert await first(b) == (f"{PREFIX}/a/replies", b"done")
