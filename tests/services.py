"""Real services for the tests: a fresh PostgreSQL database per use, a private mosquitto,
a private PostgreSQL server a test may stop and start at will.

Tests that need a service use it when it is reachable and skip with a reason when it is not,
except under FEDBROKER_REQUIRE_SERVICES=1 (as .ci/run sets), where they fail instead.
"""

from __future__ import annotations

import asyncio
import getpass
import os
import pwd
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import NoReturn
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import pytest

from broker.store import redact_url

PG_URL = os.environ.get("FEDBROKER_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test")
MOSQUITTO = shutil.which("mosquitto") or "/usr/sbin/mosquitto"
PG_BIN_DIRS = sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True)  # newest first
PG_CTL_SECONDS = 60  # pg_ctl's own wait for start and stop (-t)


def unavailable(reason: str) -> NoReturn:
    """Skip with ``reason``; fail instead under FEDBROKER_REQUIRE_SERVICES=1."""
    if os.environ.get("FEDBROKER_REQUIRE_SERVICES") == "1":
        pytest.fail(f"{reason} (FEDBROKER_REQUIRE_SERVICES=1)")
    pytest.skip(reason)


@asynccontextmanager
async def postgres_database(prefix: str = "fedbroker_test") -> AsyncIterator[str]:
    """A fresh database on the test server, dropped on exit; yields its URL."""
    try:
        admin = await asyncpg.connect(PG_URL, timeout=5)
    except (OSError, TimeoutError, asyncpg.PostgresError) as exc:
        unavailable(f"PostgreSQL at {redact_url(PG_URL)} is unreachable: {exc}")
    name = f"{prefix}_{secrets.token_hex(6)}"
    await admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield urlunsplit(urlsplit(PG_URL)._replace(path=f"/{name}"))
    finally:
        # FORCE: a killed process (a broker, a child writer) may leave a backend behind.
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.close()


class PrivateMosquitto:
    """A mosquitto of the test's own on a free 127.0.0.1 port (never the shared one, which
    other tests use): started, killed and started again on the same port at will. Without
    persistence a restart forgets every session and retained message, like a fresh broker.
    """

    START_SECONDS = 10.0

    def __init__(
        self,
        directory: Path,
        *,
        persistence: bool = False,
        anonymous: bool = True,
        extra: Sequence[str] = (),
    ) -> None:
        """``anonymous``: whether clients may connect without a user; ``extra``: lines added
        to the configuration (a password file, an ACL file, more listeners)."""
        if not Path(MOSQUITTO).is_file():
            unavailable(f"mosquitto binary not found at {MOSQUITTO}")
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = int(sock.getsockname()[1])
        directory.mkdir(parents=True, exist_ok=True)
        self.dir = directory
        self.log = directory / "mosquitto.log"
        self.conf = directory / "mosquitto.conf"
        lines = [
            f"listener {self.port} 127.0.0.1",
            f"allow_anonymous {'true' if anonymous else 'false'}",
            f"persistence {'true' if persistence else 'false'}",
            f"persistence_location {directory}/",
            f"log_dest file {self.log}",
            # Started as root, mosquitto would switch to user mosquitto, who may not write
            # into our temporary directory.
            f"user {getpass.getuser()}",
            *extra,
        ]
        self.conf.write_text("\n".join(lines) + "\n", encoding="utf-8")
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    async def start(self) -> None:
        """Start it and wait (bounded) until it accepts connections."""
        self.starts += 1
        proc = self.proc = subprocess.Popen(
            [MOSQUITTO, "-c", str(self.conf)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
        )
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.START_SECONDS
        while True:
            if proc.poll() is not None:
                err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
                unavailable(f"mosquitto did not start: {err.strip()[:300]}")
            try:
                _, writer = await asyncio.open_connection("127.0.0.1", self.port)
            except OSError:
                if loop.time() > deadline:
                    self.kill()
                    unavailable(f"mosquitto not listening on {self.port} in {self.START_SECONDS}s")
                await asyncio.sleep(0.02)  # polling pace, bounded by the deadline
                continue
            writer.close()
            return

    def kill(self, sig: signal.Signals = signal.SIGKILL) -> None:
        """Stop it with ``sig`` (SIGKILL: no goodbye to its clients) and reap it."""
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(sig)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stderr is not None:
            proc.stderr.close()


@asynccontextmanager
async def private_mosquitto(directory: Path) -> AsyncIterator[PrivateMosquitto]:
    """A running ``PrivateMosquitto`` (without persistence), killed on exit."""
    mosquitto = PrivateMosquitto(directory)
    await mosquitto.start()
    try:
        yield mosquitto
    finally:
        mosquitto.kill(signal.SIGTERM)


def _pg_binary(name: str) -> str | None:
    """``name`` (initdb, pg_ctl) from PATH, else from Debian's /usr/lib/postgresql/*/bin."""
    found = shutil.which(name)
    if found is None:
        found = next((str(d / name) for d in PG_BIN_DIRS if (d / name).is_file()), None)
    return found


class PrivatePostgres:
    """A PostgreSQL server of the test's own, in a temporary directory, on a free loopback
    port, trust authentication, fsync off; ``stop`` and ``start`` are real (pg_ctl), so a
    test can take the database away from a broker without touching the shared server.

    PostgreSQL refuses to run as root: as root every command runs as the ``postgres`` user
    (``runuser``), which owns the directory."""

    def __init__(self, initdb: str, pg_ctl: str, as_user: list[str]) -> None:
        self._initdb, self._pg_ctl, self._as_user = initdb, pg_ctl, as_user
        self.dir = Path(tempfile.mkdtemp(prefix="fedbroker-pg-"))
        self.data = self.dir / "data"
        self.log = self.dir / "postgres.log"
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = int(sock.getsockname()[1])
        self.url = f"postgresql://postgres@127.0.0.1:{self.port}/postgres"
        self.running = False

    async def _run(self, *argv: str) -> None:
        output = self.dir / "pg_ctl.out"
        with output.open("ab") as out:
            proc = await asyncio.create_subprocess_exec(
                *self._as_user, *argv, cwd=self.dir,
                stdin=asyncio.subprocess.DEVNULL, stdout=out, stderr=out,
            )  # fmt: skip
            code = await asyncio.wait_for(proc.wait(), PG_CTL_SECONDS + 10)
        if code != 0:
            raise RuntimeError(f"{' '.join(argv)} exited {code}:\n{self.log_tail()}")

    def log_tail(self) -> str:
        text = ""
        for path in (self.dir / "pg_ctl.out", self.log):
            if path.exists():
                text += path.read_text(encoding="utf-8", errors="replace")[-3000:]
        return text

    async def init(self) -> None:
        if self._as_user:
            shutil.chown(self.dir, "postgres", "postgres")
        await self._run(
            self._initdb, "-D", str(self.data), "-U", "postgres", "-A", "trust",
            "-E", "UTF8", "--no-sync", "--no-instructions",
        )  # fmt: skip
        settings = {
            "listen_addresses": "'127.0.0.1'", "port": str(self.port),
            "unix_socket_directories": f"'{self.dir}'", "fsync": "off",
            "full_page_writes": "off", "max_connections": "50", "logging_collector": "off",
        }  # fmt: skip
        with (self.data / "postgresql.conf").open("a", encoding="utf-8") as conf:
            conf.writelines(f"{key} = {value}\n" for key, value in settings.items())

    async def start(self) -> None:
        """Start and wait until it accepts connections."""
        pg_ctl = [self._pg_ctl, "-D", str(self.data), "-t", str(PG_CTL_SECONDS)]
        await self._run(*pg_ctl, "-l", str(self.log), "-w", "start")
        self.running = True

    async def stop(self, mode: str = "fast") -> None:
        """Stop (``fast``: roll back open transactions, close every connection) and wait
        until it is down."""
        self.running = False
        await self._run(self._pg_ctl, "-D", str(self.data), "-t", str(PG_CTL_SECONDS),
                        "-m", mode, "-w", "stop")  # fmt: skip


@asynccontextmanager
async def private_postgres() -> AsyncIterator[PrivatePostgres]:
    """A running private PostgreSQL server (see PrivatePostgres), removed on exit."""
    initdb, pg_ctl = _pg_binary("initdb"), _pg_binary("pg_ctl")
    if initdb is None or pg_ctl is None:
        unavailable("PostgreSQL server binaries (initdb, pg_ctl) are not installed")
    as_user: list[str] = []
    if os.geteuid() == 0:
        runuser = shutil.which("runuser")
        if runuser is None:
            unavailable("running as root, and runuser (to run PostgreSQL as postgres) is missing")
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            unavailable("running as root, and there is no postgres user to run PostgreSQL as")
        as_user = [runuser, "-u", "postgres", "--"]
    server = PrivatePostgres(initdb, pg_ctl, as_user)
    try:
        await server.init()
        await server.start()
        yield server
    finally:
        if server.running or (server.data / "postmaster.pid").exists():
            try:
                await server.stop("immediate")
            except (RuntimeError, TimeoutError) as exc:
                print(f"private PostgreSQL did not stop: {exc}")
        shutil.rmtree(server.dir, ignore_errors=True)


async def open_loop(
    names: Sequence[str],
    rate: float,
    concurrency: int,
    submit: Callable[[str], Awaitable[None]],
    sent: Callable[[], None] = lambda: None,
) -> None:
    """A load generator's open loop: ``submit(name)`` for each name, started ``rate`` times a
    second (the offered load, whatever the answers), at most ``concurrency`` in flight;
    ``sent`` is called as each one starts. Returns once every submission has ended."""
    slots = asyncio.Semaphore(concurrency)
    tasks: list[asyncio.Task[None]] = []

    async def one(name: str) -> None:
        try:
            await submit(name)
        finally:
            slots.release()

    started = time.monotonic()
    for i, name in enumerate(names):
        delay = started + i / rate - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)  # pacing: this is the offered load
        await slots.acquire()
        tasks.append(asyncio.create_task(one(name)))
        sent()
    await asyncio.gather(*tasks)
