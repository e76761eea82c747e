"""``fedbroker pods`` and ``fedbroker logs`` against a running API (a real Service over
simulated clusters, on a test server): the pods table, a log to stdout, every pod's log
(``--all-pods``), ``--timestamps``, ``--previous``, and one-line errors (another tenant's
job, a bad parameter)."""

from __future__ import annotations

import io
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestServer
from test_api import TOKENS
from test_job_logs import Stack, running_job

from adapters.simulated import simulated_log_line
from broker.cli.client import ClientError
from broker.cli.gang_logs import parse_selector, prefixed
from broker.cli.main import build_parser
from broker.cli.podlogs import POD_HEADER, call, run_pods
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
    with pytest.raises(ClientError, match=r"^job 'train' not found$"):
        await run(server, "logs", "train", tenant="team-b")
    with pytest.raises(ClientError, match=r"^tailLines: "):
        await run(server, "logs", "train", "--tail", "0")


async def test_logs_of_every_pod_each_line_prefixed(served: tuple[Any, Stack, str]) -> None:
    client, s, server = served
    await running_job(client, s)
    pods = ("train-worker-0", "train-worker-1")
    lines = [f"[pod/{p}] ".encode() + simulated_log_line(p, i) for p in pods for i in range(5)]
    assert await run(server, "logs", "train", "--all-pods") == b"".join(lines)
    tail = await run(server, "logs", "train", "--all-pods", "--tail", "1", "-c", "main")
    assert tail.decode().splitlines() == [
        "[pod/train-worker-0/main] train-worker-0: step 4 loss 0.8000",
        "[pod/train-worker-1/main] train-worker-1: step 4 loss 0.8000",
    ]
    # Followed at once, each pod's log holds one of the tenant's maxLogFollows (1 here).
    with pytest.raises(ClientError, match=r"^limit: .*maxLogFollows"):
        await run(server, "logs", "train", "--all-pods", "-f")
    args = build_parser().parse_args(["logs", "train", "--all-pods", "-p", "train-worker-0"])
    assert run_pods(args) == 2


def test_prefixed_keeps_a_partial_line_for_the_next_chunk() -> None:
    out, rest = prefixed(b"[pod/p] ", b"", b"one\ntw")
    assert (out, rest) == (b"[pod/p] one\n", b"tw")
    assert prefixed(b"[pod/p] ", rest, b"o\n\nthree") == (b"[pod/p] two\n[pod/p] \n", b"three")


async def test_timestamps_and_previous(served: tuple[Any, Stack, str]) -> None:
    client, s, server = served
    await running_job(client, s)
    dated = await run(server, "logs", "train", "--timestamps", "--tail", "2")
    stamp = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{9}Z"
    assert re.fullmatch(
        rf"{stamp} train-worker-0: step 3 [^\n]*\n{stamp} train-worker-0: step 4 [^\n]*\n",
        dated.decode(),
    )
    # A simulated container never restarts: no previous instance, as the kubelet says.
    with pytest.raises(ClientError, match=r"^no previous instance of container 'main' in pod"):
        await run(server, "logs", "train", "--previous")


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


async def test_logs_of_the_pods_a_selector_picks(served: tuple[Any, Stack, str]) -> None:
    client, s, server = served
    await running_job(client, s)
    pods = ("train-worker-0", "train-worker-1")
    every = [f"[pod/{p}] ".encode() + simulated_log_line(p, i) for p in pods for i in range(5)]
    assert await run(server, "logs", "train", "-l", "pod-set=worker") == b"".join(every)
    with pytest.raises(ClientError, match=r"^job 'train' has no pods matching pod-set=master$"):
        await run(server, "logs", "train", "-l", "pod-set=master")
    for bad in ("pod-set", "color=red"):
        with pytest.raises(SystemExit) as usage:  # argparse's one line, exit 2
            build_parser().parse_args(["logs", "train", "-l", bad])
        assert usage.value.code == 2
    assert parse_selector("pod-set=worker,phase=Running") == {
        "podSet": "worker",
        "phase": "Running",
    }
