"""The CLI client's retries (broker/client.py) against real HTTP servers.

A 503 with Retry-After (a follower, no leader yet, state being rebuilt) is retried after
the hinted wait within ``--retry-for``; anything else fails at once with one line. The
brokers here are real: two Services on one SQLite file (a leader holding the file lock and
a follower), each behind aiohttp's TestServer. The wait between retries is injected: it
records what was asked for and returns at once (the client counts the asked-for waits
against its budget too), and where a test needs the world to change between two attempts
it changes it inside that wait: no sleeping for synchronization.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path

import pytest
import yaml
from aiohttp import ClientSession, web
from aiohttp.test_utils import TestServer
from test_leader import CONFIG, manifest

from broker.cli.client import ClientError, call, retry_after_seconds
from broker.cli.main import build_parser
from broker.config import Config, parse_config
from broker.http.app import make_app
from broker.service.facade import Service

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "tok-a-00000000000000000000000000"


class Waits:
    """The injected sleep: records each wait, runs an optional hook, returns at once."""

    def __init__(self, hook: Callable[[int], Awaitable[None]] | None = None) -> None:
        self.asked: list[float] = []
        self.hook = hook

    async def __call__(self, seconds: float) -> None:
        self.asked.append(seconds)
        if self.hook is not None:
            await self.hook(len(self.asked))


class Replica:
    def __init__(self, config: Config, identity: str) -> None:
        self.service = Service(config, identity=identity)
        self.server = TestServer(make_app(self.service, config))

    async def start(self) -> None:
        await self.service.start()
        await self.server.start_server()

    async def close(self) -> None:
        await self.server.close()
        await self.service.close()

    @property
    def url(self) -> str:
        return str(self.server.make_url("")).rstrip("/")


@pytest.fixture
async def replicas(tmp_path: Path) -> AsyncIterator[tuple[Replica, Replica]]:
    """(leader, follower) on one SQLite file: the first to start holds the file lock."""
    config = parse_config(CONFIG.format(url=f"sqlite://{tmp_path / 'jobs.db'}"), "test config")
    leader, follower = Replica(config, "host-a:8080"), Replica(config, "host-b:8080")
    await leader.start()
    await follower.start()
    assert leader.service.leading and not follower.service.leading
    yield leader, follower
    await follower.service.launches_done(timeout=10)
    await leader.service.launches_done(timeout=10)
    await follower.close()
    await leader.close()


def job_file(tmp_path: Path, name: str) -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(manifest(name)))
    return path


def args(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(list(argv))


async def stored_names(replica: Replica) -> list[str]:
    return [r.name for r in await replica.service.store.list_jobs(tenant="team-a")]


# --- against real brokers ----------------------------------------------------------------


async def test_a_submit_to_a_follower_lands_once_the_follower_takes_over(
    replicas: tuple[Replica, Replica], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    leader, follower = replicas

    async def hand_over(attempt: int) -> None:
        if attempt == 2:  # during the second wait the leader goes and the follower takes over
            await leader.service.leadership.elector.release()
            await leader.service.leadership.step()
            await follower.service.leadership.step()
            assert follower.service.leading

    waits = Waits(hand_over)
    cmd = args("submit", "-f", str(job_file(tmp_path, "j1")), "--server", follower.url,
               "--token", TOKEN, "--retry-for", "30")  # fmt: skip
    doc = await call(cmd, sleep=waits)
    assert doc["metadata"]["name"] == "j1" and doc["status"]["state"] == "Queued"
    # Retry-After from the follower is the renewal period (2 s): waited exactly that, twice.
    assert waits.asked == [2.0, 2.0]
    assert await stored_names(follower) == ["j1"]
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 2
    for line in err:
        assert line.startswith("fedbroker: leader: this replica (host-b:8080)")
        assert "host-a:8080" in line and line.endswith("retrying in 2 s")


async def test_retries_stop_when_the_budget_is_spent_with_one_line_naming_the_leader(
    replicas: tuple[Replica, Replica], tmp_path: Path
) -> None:
    leader, follower = replicas
    waits = Waits()
    cmd = args("cancel", "nope", "--server", follower.url, "--token", TOKEN, "--retry-for", "5")
    with pytest.raises(ClientError) as caught:
        await call(cmd, sleep=waits)
    assert waits.asked == [2.0, 2.0, 1.0]  # the last wait is cut to what is left of 5 s
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith("leader: this replica (host-b:8080) is a follower")
    assert "the leader is host-a:8080" in message
    assert message.endswith("(still unavailable after 4 attempts in 5 s; --retry-for)")
    assert await stored_names(leader) == []


async def test_retry_for_zero_does_not_retry(
    replicas: tuple[Replica, Replica], tmp_path: Path
) -> None:
    _, follower = replicas
    waits = Waits()
    cmd = args("submit", "-f", str(job_file(tmp_path, "j1")), "--server", follower.url,
               "--token", TOKEN, "--retry-for", "0")  # fmt: skip
    with pytest.raises(ClientError, match=r"^leader: .*\(not retried: --retry-for 0\)$"):
        await call(cmd, sleep=waits)
    assert waits.asked == []


async def test_other_errors_fail_at_once(replicas: tuple[Replica, Replica]) -> None:
    leader, follower = replicas
    waits = Waits()
    for replica in (leader, follower):  # reads are served by both; a 404 is final
        cmd = args("get", "missing", "--server", replica.url, "--token", TOKEN)
        with pytest.raises(ClientError, match=r"^job 'missing' not found$"):
            await call(cmd, sleep=waits)
    cmd = args("get", "missing", "--server", follower.url, "--token", "wrong")
    with pytest.raises(ClientError, match=r"^Authorization: missing or invalid bearer token "):
        await call(cmd, sleep=waits)
    assert waits.asked == []


async def test_a_write_whose_answer_was_lost_is_retried_without_a_duplicate(
    replicas: tuple[Replica, Replica], tmp_path: Path
) -> None:
    """Why retrying a write is safe: the first POST reaches the leader and commits, but its
    answer is lost on the way back (a proxy answers 503 instead, as a follower whose forward
    failed would). The retry gets the stored job back (200), and there is one job."""
    leader, _ = replicas
    seen: list[int] = []

    async def lossy(request: web.Request) -> web.Response:
        body = await request.read()
        async with (
            ClientSession() as session,
            session.request(request.method, leader.url + request.path_qs, data=body,
                            headers={k: v for k, v in request.headers.items()
                                     if k in ("Authorization", "Content-Type")}) as resp,
        ):  # fmt: skip
            seen.append(resp.status)
            text = await resp.text()
            if len(seen) == 1:
                return web.json_response(
                    {"error": "leader: the answer was lost"}, status=503,
                    headers={"Retry-After": "1"},
                )  # fmt: skip
            return web.Response(text=text, status=resp.status, content_type="application/json")

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", lossy)
    proxy = TestServer(app)
    await proxy.start_server()
    try:
        waits = Waits()
        cmd = args("submit", "-f", str(job_file(tmp_path, "j1")),
                   "--server", str(proxy.make_url("")), "--token", TOKEN)  # fmt: skip
        doc = await call(cmd, sleep=waits)
    finally:
        await proxy.close()
    assert seen == [201, 200]  # created, then the resubmission answered with the stored job
    assert waits.asked == [1.0]
    assert doc["metadata"]["name"] == "j1"
    assert await stored_names(leader) == ["j1"]


async def test_the_cli_prints_one_line_and_no_traceback(
    replicas: tuple[Replica, Replica], tmp_path: Path
) -> None:
    """The real ``fedbroker`` entry point in a subprocess, against the follower."""
    _, follower = replicas
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", "import sys; from broker.cli.main import main; sys.exit(main())",
        "submit", "-f", str(job_file(tmp_path, "j1")), "--server", follower.url,
        "--token", TOKEN, "--retry-for", "0",
        cwd=ROOT, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    stdout, stderr = await asyncio.wait_for(proc.communicate(), timeout=60)
    assert proc.returncode == 1
    assert stdout == b""
    lines = stderr.decode().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("fedbroker: error: leader: this replica (host-b:8080)")
    assert TOKEN not in lines[0]


# --- against a scripted server -----------------------------------------------------------


async def test_only_a_503_or_429_with_retry_after_is_retried() -> None:
    answers: list[tuple[int, dict[str, str]]] = [
        (503, {"Retry-After": "3"}),
        (503, {}),  # no hint: the server did not ask to come back
    ]

    async def scripted(request: web.Request) -> web.Response:
        status, headers = answers.pop(0)
        return web.json_response({"error": f"scripted {status}"}, status=status, headers=headers)

    app = web.Application()
    app.router.add_get("/v1/clusters", scripted)
    server = TestServer(app)
    await server.start_server()
    try:
        waits = Waits()
        cmd = args("clusters", "--server", str(server.make_url("")))
        with pytest.raises(ClientError, match=r"^scripted 503$"):
            await call(cmd, sleep=waits)
        assert waits.asked == [3.0] and answers == []
        # Rate limited: asked to come back after 1 s, then answered.
        answers += [(429, {"Retry-After": "1"}), (200, {})]
        assert await call(cmd, sleep=waits) == {"error": "scripted 200"}
        assert waits.asked == [3.0, 1.0] and answers == []
        answers.append((429, {}))  # no hint: not retried
        with pytest.raises(ClientError, match=r"^scripted 429$"):
            await call(cmd, sleep=waits)
        assert waits.asked == [3.0, 1.0]
    finally:
        await server.close()


def test_retry_after_forms() -> None:
    now = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)
    assert retry_after_seconds("2", now) == 2.0
    assert retry_after_seconds(" 7 ", now) == 7.0
    assert retry_after_seconds("Thu, 01 Jan 2026 12:00:10 GMT", now) == 10.0
    assert retry_after_seconds("Thu, 01 Jan 2026 11:00:00 GMT", now) == 0.0  # in the past
    assert retry_after_seconds(None, now) is None
    assert retry_after_seconds("soon", now) is None
    assert retry_after_seconds("-1", now) is None
    assert retry_after_seconds("²", now) is None


def test_retry_for_comes_from_the_flag_or_the_environment(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("FEDBROKER_RETRY_SECONDS", raising=False)
    assert args("list").retry_for == 30.0
    assert args("list", "--retry-for", "2.5").retry_for == 2.5
    monkeypatch.setenv("FEDBROKER_RETRY_SECONDS", "0")
    assert args("list").retry_for == 0.0
    for bad in ("-1", "nan", "soon", "3601"):
        with pytest.raises(SystemExit):
            args("list", "--retry-for", bad)
        assert "--retry-for" in capsys.readouterr().err
