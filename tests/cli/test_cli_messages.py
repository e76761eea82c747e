"""What the CLI says when things are not as a newcomer expects (issue 16, acceptance 2).

Each message is checked end to end: ``fedbroker ...`` (``main``, in a thread of its own, as
the command runs) against a real Service behind a real HTTP server on a loopback port (the
``running`` harness of tests/http/test_api.py: SQLite store, simulated clusters, scheduler
cycles driven by hand on a fake clock). What is checked is what the user reads: the exit
status, stdout's table, and the one line on stderr, never a traceback.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import socket
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from aiohttp.test_utils import TestClient, TestServer
from builders import Clock, until
from test_api import TOKENS, Harness, manifest, running, settle
from test_authz import Client, T, config_text

from broker.cli import client as client_module
from broker.cli.client import SUBMITTED_BY, watch_list
from broker.cli.main import build_parser, main
from broker.config import parse_config
from broker.http.app import make_app
from broker.service.facade import Service

Result = tuple[int, str, str]


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[tuple[Harness, str]]:
    async with running(tmp_path) as h:
        client = h[0]
        yield h, f"{client.host}:{client.port}"  # no scheme: taken as http://


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("FEDBROKER_SERVER", "FEDBROKER_TOKEN", "FEDBROKER_CA_FILE", "FEDBROKER_USER"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("FEDBROKER_RETRY_SECONDS", "0")


async def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> Result:
    """``fedbroker argv``: exit status, stdout, stderr (run in a thread: it has its loop)."""
    capsys.readouterr()
    try:
        code = await asyncio.to_thread(main, list(argv))
    except SystemExit as exc:  # argparse's own exits (--help, usage errors)
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    return code, out, err


def as_user(server: str, *argv: str, tenant: str = "team-a", token: bool = True) -> tuple[str, ...]:
    auth = ("--token", TOKENS[tenant]) if token else ()
    return (*argv, "--server", server, *auth)


def write(tmp_path: Path, doc: dict[str, Any], name: str = "job.yaml") -> str:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(doc))
    return str(path)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# -- reaching the broker --------------------------------------------------------------


async def test_a_server_without_a_scheme_is_taken_as_http(
    served: tuple[Harness, str], capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    _, server = served
    code, out, err = await cli(capsys, *as_user(server, "list"))
    assert (code, err) == (0, "")
    assert out.split() == ["NAME", "QUEUE", "STATE", "CLUSTER", "AGE", "REASON"]
    monkeypatch.setenv("FEDBROKER_SERVER", server)  # the variable, as the README exports it
    monkeypatch.setenv("FEDBROKER_TOKEN", TOKENS["team-a"])
    code, out, err = await cli(capsys, "list")
    assert (code, err) == (0, "")


@pytest.mark.parametrize(
    ("flag", "value", "named"),
    [
        ("--server", "ftp://127.0.0.1:8080", "--server"),
        ("--server", "http://127.0.0.1:eighty", "--server"),
        ("FEDBROKER_SERVER", "ftp://broker", "$FEDBROKER_SERVER"),
        ("FEDBROKER_SERVER", "http://", "$FEDBROKER_SERVER"),
    ],
)
async def test_a_bad_server_is_one_line_naming_its_source(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
    flag: str, value: str, named: str,
) -> None:  # fmt: skip
    argv = ["list"]
    if flag.startswith("--"):
        argv += [flag, value]
    else:
        monkeypatch.setenv(flag, value)
    code, out, err = await cli(capsys, *argv)
    assert code == 2 and out == ""
    assert err.startswith(f"fedbroker: error: {named}: ") and err.count("\n") == 1


async def test_connection_refused_names_the_url_and_the_demo(
    capsys: pytest.CaptureFixture[str],
) -> None:
    port = free_port()
    code, out, err = await cli(capsys, "get", "train", "--server", f"127.0.0.1:{port}")
    assert code == 1 and out == "" and err.count("\n") == 1
    assert f"cannot reach the broker at http://127.0.0.1:{port}: connection refused" in err
    assert "fedbroker demo" in err and "make run" in err


async def test_a_401_says_what_sets_the_token(
    served: tuple[Harness, str], capsys: pytest.CaptureFixture[str]
) -> None:
    _, server = served
    code, _, err = await cli(capsys, *as_user(server, "list", token=False))
    assert code == 1 and err.count("\n") == 1
    assert err.startswith("fedbroker: error: Authorization: missing or invalid bearer token ")
    assert "set $FEDBROKER_TOKEN or pass --token" in err
    code, _, err = await cli(capsys, "list", "--server", server, "--token", "tok-wrong")
    assert code == 1 and "bearer token" in err and "--token or $FEDBROKER_TOKEN" in err


async def test_a_403_keeps_what_the_server_refused(
    served: tuple[Harness, str], capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    _, server = served
    path = write(tmp_path, manifest("train", queue="training"))
    code, _, err = await cli(capsys, *as_user(server, "submit", "-f", path, tenant="team-b"))
    assert code == 1
    assert err == (
        "fedbroker: error: spec.queue: tenant may not use queue 'training' (inference)\n"
    )


# -- list: the reason of each job, and its filters -------------------------------------


async def test_list_shows_why_a_queued_job_waits(
    served: tuple[Harness, str], capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    (_client, service, clock), server = served
    # small-a has 2 nodes of 8 A100 GPUs: 2 x 8 waits for room, 3 x 8 never fits
    for doc in (manifest("small", pods=1), manifest("huge", pods=2), manifest("never", pods=3)):
        code, _, _ = await cli(capsys, *as_user(server, "submit", "-f", write(tmp_path, doc)))
        assert code == 0
    await service.schedule_once(clock.now)
    await settle(service)
    code, out, _ = await cli(capsys, *as_user(server, "list"))
    rows = {line.split()[0]: line for line in out.splitlines()[1:]}
    assert "Running" in rows["small"]
    assert rows["huge"].split()[2] == "Queued"
    assert rows["huge"].endswith("no cluster has room for 2 pods of 8 GPUs")
    never = "never fits: no cluster could take 3 pods of 8 GPUs even empty; the largest, "
    never += "small-a, could take 2"
    assert rows["never"].endswith(never)
    code, out, _ = await cli(capsys, *as_user(server, "get", "huge", "-o", "json"))
    assert json.loads(out)["status"]["waiting"] == "no cluster has room for 2 pods of 8 GPUs"
    code, out, _ = await cli(capsys, *as_user(server, "explain", "never"))
    assert code == 0 and f"\n\n{never}\nQUEUE  " in out, out
    code, out, _ = await cli(capsys, *as_user(server, "explain", "huge", "-o", "json"))
    assert json.loads(out)["neverFits"] is None


async def test_list_filters_by_name_labels_and_submitter(
    served: tuple[Harness, str], capsys: pytest.CaptureFixture[str], tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    (client, _, _), server = served
    monkeypatch.setenv("FEDBROKER_USER", "ada")
    vision = manifest("train-vision", pods=1)
    vision["metadata"]["labels"] = {"team": "vision"}
    for doc in (vision, manifest("train-nlp", pods=1), manifest("eval", pods=1)):
        assert (await cli(capsys, *as_user(server, "submit", "-f", write(tmp_path, doc))))[0] == 0
    # Someone else's job under the same tenant (the demo's generator, say): not labelled.
    headers = {"Authorization": f"Bearer {TOKENS['team-a']}"}
    assert (await client.post("/v1/jobs", json=manifest("bot-1"), headers=headers)).status == 201

    async def names(*argv: str) -> list[str]:
        code, out, err = await cli(capsys, *as_user(server, "list", *argv))
        assert (code, err) == (0, "")
        return [line.split()[0] for line in out.splitlines()[1:]]

    assert await names() == ["train-vision", "train-nlp", "eval", "bot-1"]
    assert await names("--name", "train") == ["train-vision", "train-nlp"]
    assert await names("--name", "*-nlp") == ["train-nlp"]
    assert await names("-l", "team=vision") == ["train-vision"]
    assert await names("-l", "team!=vision", "--name", "train") == ["train-nlp"]
    assert await names("--mine") == ["train-vision", "train-nlp", "eval"]
    code, out, err = await cli(capsys, *as_user(server, "list", "--mine", "--limit", "2"))
    assert [line.split()[0] for line in out.splitlines()[1:]] == ["train-vision", "train-nlp"]
    assert err.startswith("fedbroker: 1 more job not shown: raise --limit (now 2, ")
    code, out, _ = await cli(capsys, *as_user(server, "get", "eval", "-o", "json"))
    assert json.loads(out)["metadata"]["labels"] == {SUBMITTED_BY: "ada"}
    code, _, err = await cli(capsys, *as_user(server, "list", "-l", "team in (a,b)"))
    assert code == 1 and err.startswith("fedbroker: error: selector: ")


async def test_a_filtered_list_pages_through_many_jobs(
    served: tuple[Harness, str], capsys: pytest.CaptureFixture[str]
) -> None:
    """The server reads a bounded number of jobs per filtered request; the CLI follows the
    cursor, so a match far down the store is still found."""
    (client, _, _), server = served
    headers = {"Authorization": f"Bearer {TOKENS['team-a']}"}
    for i in range(25):
        body = manifest(f"bulk-{i}", pods=1)
        assert (await client.post("/v1/jobs", json=body, headers=headers)).status == 201
    resp = await client.get("/v1/jobs?limit=1&name=bulk-24", headers=headers)
    page = await resp.json()
    assert page["items"] == [] and page["continue"] is not None  # 10 read, none kept
    _code, out, _ = await cli(capsys, *as_user(server, "list", "--name", "bulk-24", "--limit", "1"))
    assert [line.split()[0] for line in out.splitlines()[1:]] == ["bulk-24"]


# -- explain and resubmit of a finished job ---------------------------------------------


async def test_explain_of_a_finished_job_says_how_and_where_it_ran(
    served: tuple[Harness, str], capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    (_client, service, clock), server = served
    path = write(tmp_path, manifest("train", pods=2))
    assert (await cli(capsys, *as_user(server, "submit", "-f", path)))[0] == 0
    await service.schedule_once(clock.now)
    await settle(service)
    clock.now += 90
    assert (await cli(capsys, *as_user(server, "cancel", "train")))[0] == 0
    code, out, err = await cli(capsys, *as_user(server, "explain", "train"))
    assert (code, err) == (0, "")
    first, *rest = out.splitlines()
    assert first.startswith("train: Cancelled ") and "finished" in first
    assert "  how:   cancelled by request" in rest
    assert "  where: small-a, ran for 1m30s" in rest
    assert "  more:  fedbroker get train   (its history)" in rest
    assert "CLUSTER" not in out  # no empty table of clusters
    code, out, _ = await cli(capsys, *as_user(server, "explain", "train", "-o", "json"))
    assert json.loads(out)["state"] == "Cancelled"  # scripts get the API's answer as it is


async def test_explain_of_a_job_cancelled_while_waiting(
    served: tuple[Harness, str], capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    _, server = served
    path = write(tmp_path, manifest("huge", pods=9))
    assert (await cli(capsys, *as_user(server, "submit", "-f", path)))[0] == 0
    assert (await cli(capsys, *as_user(server, "cancel", "huge")))[0] == 0
    _, out, _ = await cli(capsys, *as_user(server, "explain", "huge"))
    assert "  where: never placed (it ended while it waited)" in out.splitlines()


async def test_resubmitting_a_name_says_what_happened(
    served: tuple[Harness, str], capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    _, server = served
    path = write(tmp_path, manifest("train", pods=1))
    code, _, err = await cli(capsys, *as_user(server, "submit", "-f", path))
    assert (code, err) == (0, "")
    # The same spec while the job is active: nothing new, and the way to run it again.
    code, out, err = await cli(capsys, *as_user(server, "submit", "-f", path))
    assert code == 0 and out.splitlines()[1].split()[:3] == ["train", "training", "Queued"]
    assert "already exists with this spec (Queued)" in err and "fedbroker cancel train" in err
    # Another spec while it is active: 409, and what to do.
    other = write(tmp_path, manifest("train", pods=2), "other.yaml")
    code, _, err = await cli(capsys, *as_user(server, "submit", "-f", other))
    assert code == 1 and err.startswith("fedbroker: error: metadata.name: ")
    assert "`fedbroker cancel train`" in err and err.count("\n") == 1
    # Once finished, the name is reused: the next run, and where the last one went.
    assert (await cli(capsys, *as_user(server, "cancel", "train")))[0] == 0
    code, out, err = await cli(capsys, *as_user(server, "submit", "-f", path))
    assert code == 0 and "Queued" in out
    assert err.startswith("fedbroker: job 'train' had finished, so its name was reused")
    assert "run 2" in err and "fedbroker get train" in err


# -- list --watch --------------------------------------------------------------------------


async def test_watch_redraws_on_job_events(
    served: tuple[Harness, str], capsys: pytest.CaptureFixture[str]
) -> None:
    (client, _, _), server = served
    args = build_parser().parse_args(as_user(server, "list", "--watch"))
    capsys.readouterr()
    watching = asyncio.ensure_future(watch_list(args))
    try:
        await until(lambda: "NAME" in capsys.readouterr().out)  # the first drawing
        headers = {"Authorization": f"Bearer {TOKENS['team-a']}"}
        assert (await client.post("/v1/jobs", json=manifest("late"), headers=headers)).status == 201
        seen = ""

        def drawn() -> bool:
            nonlocal seen
            seen += capsys.readouterr().out
            return "late" in seen

        await until(drawn)  # redrawn after the job's event, without being asked
        assert all(line.startswith("late ") for line in seen.splitlines())  # its row only
    finally:
        watching.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watching


def test_ctrl_c_ends_a_watch_with_status_0(monkeypatch: pytest.MonkeyPatch) -> None:
    async def interrupted(args: argparse.Namespace) -> int:
        raise KeyboardInterrupt

    monkeypatch.setattr(client_module, "watch_list", interrupted)
    assert main(["list", "--watch"]) == 0
    assert main(["get", "train", "--watch"]) == 0


@pytest.fixture
async def authz(tmp_path: Path) -> AsyncIterator[Client]:
    """The API with tokens of fewer roles (tests/http/test_authz.py's tenants)."""
    config = parse_config(config_text(tmp_path / "authz.db"), "test config", {})
    service = Service(config, clock=Clock())
    await service.start()
    async with TestClient(TestServer(make_app(service, config))) as test_client:
        yield test_client
    await service.close()


async def test_a_403_names_the_permission_missing(
    authz: Client, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    server = f"{authz.host}:{authz.port}"
    path = write(tmp_path, manifest("train"))
    code, _, err = await cli(capsys, "submit", "-f", path, "--server", server, "--token", T["ro"])
    assert code == 1
    assert err == 'fedbroker: error: forbidden: token:ro lacks "submit" on tenant team-a\n'


async def test_top_reaches_the_broker_as_the_other_commands_do(
    served: tuple[Harness, str], capsys: pytest.CaptureFixture[str]
) -> None:
    _, server = served
    code, out, err = await cli(capsys, *as_user(server, "top", "--once", "--plain"))
    assert (code, err) == (0, "") and out
    code, _, err = await cli(capsys, *as_user(server, "top", "--once", token=False))
    assert code == 1 and "set $FEDBROKER_TOKEN or pass --token" in err
    code, _, err = await cli(capsys, "top", "--once", "--server", f"127.0.0.1:{free_port()}")
    assert code == 1 and "connection refused" in err and "fedbroker demo" in err
