"""What a kubectl user reaches for: ``--watch`` that prints changes, ``submit -f -`` and
multi-document files and directories, ``cancel`` of several names or ``-l``.

Run end to end as tests/cli/test_cli_messages.py does: ``fedbroker ...`` (``main`` in a
thread) against a real Service behind a real HTTP server, scheduler cycles by hand.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import os
import shutil
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from builders import until
from test_api import TOKENS, Harness, manifest, running, settle
from test_cli_messages import as_user, cli

from broker.cli.args import UsageError
from broker.cli.client import watch_list
from broker.cli.completion import bash_script
from broker.cli.main import build_parser

A = {"Authorization": f"Bearer {TOKENS['team-a']}"}


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[tuple[Harness, str]]:
    async with running(tmp_path) as h:
        yield h, f"http://{h[0].host}:{h[0].port}"


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("FEDBROKER_SERVER", "FEDBROKER_TOKEN", "FEDBROKER_CA_FILE", "FEDBROKER_USER"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("FEDBROKER_RETRY_SECONDS", "0")


# -- --watch: changes only ------------------------------------------------------------------


class Printed:
    """What a watch printed so far (capsys read incrementally)."""

    def __init__(self, capsys: pytest.CaptureFixture[str]) -> None:
        self.capsys, self.text = capsys, ""

    def lines(self) -> list[str]:
        self.text += self.capsys.readouterr().out
        return self.text.splitlines()

    def has(self, predicate: Any) -> Any:
        return lambda: any(predicate(line) for line in self.lines())


@contextlib.asynccontextmanager
async def watching(server: str, *argv: str) -> AsyncIterator[None]:
    task = asyncio.ensure_future(watch_list(build_parser().parse_args(as_user(server, *argv))))
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def test_a_piped_list_watch_prints_one_line_per_change(
    served: tuple[Harness, str], capsys: pytest.CaptureFixture[str]
) -> None:
    (client, service, clock), server = served
    assert (await client.post("/v1/jobs", json=manifest("early"), headers=A)).status == 201
    await service.schedule_once(clock.now)
    await settle(service)
    capsys.readouterr()
    printed = Printed(capsys)
    async with watching(server, "list", "--watch"):
        await until(printed.has(lambda line: line.startswith("early")))
        header, first = printed.lines()
        assert header.split()[:3] == ["NAME", "QUEUE", "STATE"] and "Running" in first
        assert (await client.post("/v1/jobs", json=manifest("late"), headers=A)).status == 201
        await until(printed.has(lambda line: line.startswith("late") and "Queued" in line))
        await service.schedule_once(clock.now)
        await settle(service)
        await until(printed.has(lambda line: line.startswith("late") and "Running" in line))
        changes = printed.lines()[2:]
    # Neither the header nor the unchanged job again; each row under the first table's columns.
    assert changes and all(line.startswith("late ") for line in changes)
    assert all(line.index(line.split()[2]) == header.index("STATE") for line in changes)


async def test_a_list_watch_keeps_sort_by_s_order(
    served: tuple[Harness, str], capsys: pytest.CaptureFixture[str]
) -> None:
    (client, _, _), server = served
    for name in ("zeta", "alpha", "mid"):  # the list's own order is submission order
        assert (await client.post("/v1/jobs", json=manifest(name), headers=A)).status == 201
    capsys.readouterr()
    printed = Printed(capsys)
    async with watching(server, "list", "--watch", "--sort-by", "name"):
        await until(lambda: len(printed.lines()) >= 4)
    names = [line.split()[0] for line in printed.lines()[1:4]]
    assert names == ["alpha", "mid", "zeta"]
    with pytest.raises(UsageError, match="--sort-by nope: no such column"):
        argv = as_user(server, "list", "-w", "--sort-by", "nope")
        await asyncio.wait_for(watch_list(build_parser().parse_args(argv)), 10)  # refused at once


async def test_get_watch_prints_the_job_s_changes_only(
    served: tuple[Harness, str], capsys: pytest.CaptureFixture[str]
) -> None:
    (client, service, clock), server = served
    assert (await client.post("/v1/jobs", json=manifest("mine"), headers=A)).status == 201
    capsys.readouterr()
    printed = Printed(capsys)
    async with watching(server, "get", "mine", "-w"):
        await until(printed.has(lambda line: line.startswith("mine") and "Queued" in line))
        assert (await client.post("/v1/jobs", json=manifest("other"), headers=A)).status == 201
        await service.schedule_once(clock.now)
        await settle(service)
        await until(printed.has(lambda line: line.startswith("mine") and "Running" in line))
    lines = printed.lines()
    assert lines[0].startswith("NAME") and all(line.startswith("mine") for line in lines[1:])


def test_json_and_terminal_watches() -> None:
    """Piped JSON: one object per changed job per line; a terminal: the table redrawn."""
    from broker.cli.watching import Changes

    def job(name: str, state: str) -> dict[str, Any]:
        return {"metadata": {"name": name}, "status": {"state": state, "updatedAt": 1.0}}

    piped = Changes("json", terminal=False)
    assert piped.text({"items": [job("a", "Queued"), job("b", "Queued")]}) is not None
    again = {"items": [job("a", "Queued"), {**job("b", "Running")}]}
    assert piped.text(again) == json.dumps(job("b", "Running"))
    assert piped.text(again) is None
    screen = Changes("table", terminal=True)
    screen.text({"items": [job("a", "Queued")]})
    redrawn = screen.text({"items": [job("a", "Running")]})
    assert redrawn is not None and redrawn.startswith("\x1b[H\x1b[2JNAME")


# -- submit: stdin, several documents, a directory ------------------------------------------


def stream(*docs: dict[str, Any]) -> str:
    return yaml.safe_dump_all(docs)


async def names(capsys: pytest.CaptureFixture[str], server: str) -> dict[str, str]:
    code, out, _ = await cli(capsys, *as_user(server, "list", "-o", "json"))
    assert code == 0
    return {j["metadata"]["name"]: j["status"]["state"] for j in json.loads(out)["items"]}


async def test_submit_reads_stdin_and_every_document(
    served: tuple[Harness, str], capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    _, server = served
    piped = io.TextIOWrapper(io.BytesIO(stream(manifest("one"), manifest("two")).encode()))
    monkeypatch.setattr("sys.stdin", piped)
    code, out, err = await cli(capsys, *as_user(server, "submit", "-f", "-"))
    assert (code, err) == (0, "")
    assert out.splitlines() == [
        "<stdin> (document 1): job 'one' submitted (Queued)",
        "<stdin> (document 2): job 'two' submitted (Queued)",
    ]
    assert await names(capsys, server) == {"one": "Queued", "two": "Queued"}


async def test_a_bad_document_is_named_and_the_rest_submitted(
    served: tuple[Harness, str], capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    _, server = served
    bad = manifest("bad")
    bad["spec"]["podSets"][0]["count"] = 0
    path = tmp_path / "jobs.yaml"
    empty = "---\n# nothing here\n---\n"
    path.write_text(stream(manifest("a"), bad) + empty + stream(manifest("c")))
    code, out, err = await cli(capsys, *as_user(server, "submit", "-f", str(path)))
    assert code == 1
    assert [line.split(":")[0] for line in out.splitlines()] == [
        f"{path} (document 1)", f"{path} (document 3)",
    ]  # fmt: skip
    assert err.startswith(f"fedbroker: error: {path} (document 2): spec.podSets[0].count: ")
    assert len(err.splitlines()) == 1 and "count" in err
    assert await names(capsys, server) == {"a": "Queued", "c": "Queued"}


async def test_submit_of_a_directory_takes_its_manifests_in_order(
    served: tuple[Harness, str], capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    _, server = served
    (tmp_path / "b.yml").write_text(yaml.safe_dump(manifest("from-b")))
    (tmp_path / "a.json").write_text(json.dumps(manifest("from-a")))
    (tmp_path / "notes.txt").write_text("not a manifest")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "c.yaml").write_text(yaml.safe_dump(manifest("from-c")))
    code, out, _ = await cli(capsys, *as_user(server, "submit", "-f", str(tmp_path)))
    assert code == 0
    assert out.splitlines() == [
        f"{tmp_path / 'a.json'}: job 'from-a' submitted (Queued)",
        f"{tmp_path / 'b.yml'}: job 'from-b' submitted (Queued)",
    ]
    code, _, err = await cli(capsys, *as_user(server, "submit", "-f", str(tmp_path / "sub" / "x")))
    assert code != 0 and err.count("\n") == 1


# -- cancel: several names, or -l -----------------------------------------------------------


async def test_cancel_of_several_names_and_of_a_selector(
    served: tuple[Harness, str], capsys: pytest.CaptureFixture[str]
) -> None:
    (client, _, _), server = served
    for name, team in (("v1", "vision"), ("v2", "vision"), ("n1", "nlp"), ("n2", "nlp")):
        doc = manifest(name)
        doc["metadata"]["labels"] = {"team": team}
        assert (await client.post("/v1/jobs", json=doc, headers=A)).status == 201
    code, out, err = await cli(capsys, *as_user(server, "cancel", "-l", "team=vision"))
    assert (code, err) == (0, "")
    assert [line.split()[:2] for line in out.splitlines()] == [["job", "'v1'"], ["job", "'v2'"]]
    code, out, err = await cli(capsys, *as_user(server, "cancel", "n1", "nosuch", "n2"))
    assert code == 1
    assert [line.split()[1] for line in out.splitlines()] == ["'n1'", "'n2'"]
    assert err == "fedbroker: error: job 'nosuch': job 'nosuch' not found\n"
    assert set((await names(capsys, server)).values()) == {"Cancelled"}
    code, _, err = await cli(capsys, *as_user(server, "cancel", "n1", "-l", "team=nlp"))
    assert code == 2 and "one of them" in err


# -- completion of job names ----------------------------------------------------------------


async def test_complete_jobs_lists_the_callers_names_and_fails_silently(
    served: tuple[Harness, str], capsys: pytest.CaptureFixture[str]
) -> None:
    (client, _, _), server = served
    for name in ("train-a", "train-b", "eval"):
        assert (await client.post("/v1/jobs", json=manifest(name), headers=A)).status == 201
    complete = ("__complete", "jobs", "--server", server)
    assert await cli(capsys, *complete, "--token", TOKENS["team-a"], "tr") == (
        0, "train-a\ntrain-b\n", "",
    )  # fmt: skip
    code, out, _ = await cli(capsys, *complete, "--token", TOKENS["team-a"])
    assert (code, sorted(out.split())) == (0, ["eval", "train-a", "train-b"])
    assert await cli(capsys, *complete, "--token", TOKENS["team-b"], "tr") == (0, "", "")
    assert await cli(capsys, *complete, "--token", "wrong", "tr") == (1, "", "")


async def test_bash_completes_a_job_name_from_the_broker(served: tuple[Harness, str]) -> None:
    """The script of ``fedbroker completion bash`` run by bash, calling ``fedbroker`` (this
    tree's, in a process of its own) with the line's --server and --token."""
    if shutil.which("bash") is None:
        pytest.skip("no bash")
    (client, _, _), server = served
    for name in ("train-a", "train-b", "eval"):
        assert (await client.post("/v1/jobs", json=manifest(name), headers=A)).status == 201
    words = ["fedbroker", "logs", "--server", server, "--token", TOKENS["team-a"], "tr"]
    program = (
        bash_script(build_parser())
        + f'fedbroker() {{ "{sys.executable}" -m broker.cli "$@"; }}\n'
        + f"COMP_WORDS=({' '.join(words)}); COMP_CWORD={len(words) - 1}; _fedbroker\n"
        + 'printf "%s\\n" "${COMPREPLY[@]}"\n'
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    proc = await asyncio.create_subprocess_exec(
        "bash", "--norc", "--noprofile", stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE, env=env,
    )  # fmt: skip
    out, _ = await asyncio.wait_for(proc.communicate(program.encode()), 30)
    assert out.decode().split() == ["train-a", "train-b"]


def test_a_yaml_stream_is_split_as_yaml_reads_it() -> None:
    """``---`` lines only (content after the marker kept; ``----`` is no marker), empty
    documents (comments, an end marker) skipped, one that does not parse kept for the
    broker to name; a JSON file is one document."""
    from broker.cli.submitting import split

    stream = (
        b"--- {a: 1}\n---\nb: 2\n---\n# only a comment\n...\n---\nc: |\n  x\n----y: 1\n---\n[bad\n"
    )
    docs = split(stream, "f.yaml", is_json=False)
    assert [d.source for d in docs] == [f"f.yaml (document {i})" for i in (1, 2, 3, 4)]
    assert [yaml.safe_load(d.body) for d in docs[:3]] == [
        {"a": 1},
        {"b": 2},
        {"c": "x\n", "----y": 1},
    ]
    assert docs[3].body == b"\n[bad\n"
    assert split(b"---\nname: one\n", "g.yaml", is_json=False)[0].source == "g.yaml"
    assert split(b'{"a": 1}\n---\n', "h.json", is_json=True)[0].body == b'{"a": 1}\n---\n'


async def test_an_admin_cancels_by_selector_across_tenants(
    served: tuple[Harness, str], capsys: pytest.CaptureFixture[str]
) -> None:
    (client, _, _), server = served
    B = {"Authorization": f"Bearer {TOKENS['team-b']}"}
    for name, headers in (("a-job", A), ("b-job", B)):
        doc = manifest(name)
        doc["metadata"]["labels"] = {"sweep": "7"}
        assert (await client.post("/v1/jobs", json=doc, headers=headers)).status == 201
    argv = as_user(server, "cancel", "-l", "sweep=7", "-A", tenant="admin")
    code, out, err = await cli(capsys, *argv)
    assert (code, err) == (0, "")
    assert sorted(line.split()[1] for line in out.splitlines()) == ["'a-job'", "'b-job'"]
    for headers, name in ((A, "a-job"), (B, "b-job")):
        got = await (await client.get(f"/v1/jobs/{name}", headers=headers)).json()
        assert got["status"]["state"] == "Cancelled"
