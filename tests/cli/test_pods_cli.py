"""``fedbroker pods`` and ``fedbroker logs`` against a running API (a real Service over
simulated clusters, on a test server): the pods table, a log to stdout, and one-line errors
(another tenant's job, a bad parameter)."""

from __future__ import annotations

import io
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestServer
from test_api import TOKENS
from test_job_logs import Stack, running_job

from adapters.simulated import simulated_log_line
from broker.cli.client import ClientError
from broker.cli.main import build_parser
from broker.cli.podlogs import POD_HEADER, call
from broker.http.app import make_app


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[tuple[Any, Stack, str]]:
    from aiohttp.test_utils import TestClient

    s = Stack(tmp_path)
    await s.service.start()
    client: TestClient[Any, Any] = TestClient(TestServer(s.app))
    await client.start_server()
    yield client, s, str(client.make_url("/"))
    await client.close()
    await s.service.close()


async def run(server: str, *argv: str, tenant: str = "team-a") -> bytes:
    args = build_parser().parse_args([*argv, "--server", server, "--token", TOKENS[tenant]])
    out = io.BytesIO()
    await call(args, out)
    return out.getvalue()


async def test_pods_table_and_logs(served: tuple[Any, Stack, str]) -> None:
    client, s, server = served
    await running_job(client, s)
    lines = (await run(server, "pods", "train")).decode().splitlines()
    assert lines[0].split() == list(POD_HEADER)
    assert [line.split()[0] for line in lines[1:]] == ["train-worker-0", "train-worker-1"]
    assert all(line.split()[4:] == ["Running", "0", f"worker-{i}"]
               for i, line in enumerate(lines[1:]))  # fmt: skip
    log = await run(server, "logs", "train", "-p", "train-worker-1", "--tail", "1")
    assert log == simulated_log_line("train-worker-1", 4)


async def test_errors_are_one_line(served: tuple[Any, Stack, str]) -> None:
    client, s, server = served
    await running_job(client, s)
    with pytest.raises(ClientError, match=r"^404 name: "):
        await run(server, "logs", "train", tenant="team-b")
    with pytest.raises(ClientError, match=r"^400 tailLines: "):
        await run(server, "logs", "train", "--tail", "0")


async def test_pods_and_logs_of_a_finished_job(tmp_path: Path) -> None:
    """A Succeeded job's pods and logs while kept; a clear 404 once deleted."""
    from aiohttp.test_utils import TestClient
    from test_finished_pods import Stack as FinishedStack

    s = FinishedStack(tmp_path, None)
    await s.service.start()
    client: TestClient[Any, Any] = TestClient(TestServer(make_app(s.service, s.config)))
    await client.start_server()
    try:
        server = str(client.make_url("/"))
        await s.finished_job(client)
        lines = (await run(server, "pods", "train")).decode().splitlines()
        assert [line.split()[4] for line in lines[1:]] == ["Succeeded", "Succeeded"]
        log = await run(server, "logs", "train", "--tail", "1")
        assert log == simulated_log_line("train-worker-0", 4)
        s.clock.now += 600
        await s.sweep()
        with pytest.raises(ClientError, match=r"its pods were deleted 10m after it finished"):
            await run(server, "logs", "train")
    finally:
        await client.close()
        await s.service.close()
