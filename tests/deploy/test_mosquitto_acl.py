"""The example mosquitto setup of pull mode (deploy/mosquitto) really isolates the agents.

A private mosquitto (services.PrivateMosquitto) runs the shipped ``acl`` as it is and the
shipped ``mosquitto.conf``'s settings (its listeners moved to free loopback ports, its files
to the test's), with a password file made by ``mosquitto_passwd`` for the broker and the
agents of clusters ``a`` and ``b``. Each check that something does NOT arrive is ordered, not
timed: the same sender then sends something that may arrive, and the receiver's first
message must be that one (mosquitto handles one client's packets in order, and drops a
denied publish, or a message a subscriber may not read, where it would have queued it).
"""

from __future__ import annotations

import asyncio
import shutil
import signal
import socket
import subprocess
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import aiomqtt
import pytest
from services import PrivateMosquitto, unavailable

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


def _settings(passwd: Path) -> tuple[list[str], dict[int, int], bool]:
    """The shipped mosquitto.conf for a test: (its lines with files and listeners moved,
    shipped listener port -> test port, whether it lets anonymous clients in)."""
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
        elif not key.startswith("persistence"):  # the private one's own
            lines.append(line)
    return lines, ports, anonymous


@dataclass
class Setup:
    broker_port: int  # the shipped 1883: the broker's replicas
    agents_port: int  # the shipped 1884: the agents
    passwords: dict[str, str]


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
    lines, ports, anonymous = _settings(passwd)
    mosquitto = PrivateMosquitto(tmp_path / "mosquitto", anonymous=anonymous, extra=lines)
    await mosquitto.start()
    try:
        yield Setup(ports[1883], ports[1884], passwords)
    finally:
        mosquitto.kill(signal.SIGTERM)


@asynccontextmanager
async def connected(
    setup: Setup, user: str | None, *, port: int, identifier: str | None = None
) -> AsyncIterator[aiomqtt.Client]:
    password = None if user is None else setup.passwords[user]
    client = aiomqtt.Client(
        "127.0.0.1", port, username=user, password=password, identifier=identifier,
        timeout=SECONDS,
    )  # fmt: skip
    async with client:
        yield client


def broker(setup: Setup) -> AbstractAsyncContextManager[aiomqtt.Client]:
    return connected(setup, BROKER_USER, port=setup.broker_port)


def agent(
    setup: Setup, cluster: str, identifier: str | None = None
) -> AbstractAsyncContextManager[aiomqtt.Client]:
    return connected(setup, cluster, port=setup.agents_port, identifier=identifier)


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


@pytest.mark.parametrize("user", [None, "a"])
async def test_no_one_gets_in_without_a_user_and_its_password(
    setup: Setup, user: str | None
) -> None:
    if user is not None:
        setup.passwords[user] = "not-its-password"
    with pytest.raises(aiomqtt.MqttError):
        async with connected(setup, user, port=setup.agents_port):
            pass
