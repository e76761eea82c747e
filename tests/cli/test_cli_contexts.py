"""Contexts of the client's config file, end to end: ``fedbroker ...`` (``main``, in a
thread) against a real Service behind a real HTTP server (tests/http/test_api.py's
``running`` harness), with the file written by the test.

Checked: the current context chooses the server and the token; flags, ``--context`` and the
variables win in their order; a tokenCommand's output is the token and a failing one is one
line without it; a bad file is one line naming the file and the field, exit 2; a readable
file holding a token draws a warning; ``config get-contexts|current-context|use-context``.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from test_api import TOKENS, running
from test_cli_messages import cli, free_port

from broker.cli.contexts import ClientConfig, Context

WRONG = "tok-wrong-000000000000000000000000"


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[str]:
    async with running(tmp_path) as h:
        client = h[0]
        yield f"http://{client.host}:{client.port}"


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("FEDBROKER_SERVER", "FEDBROKER_TOKEN", "FEDBROKER_CA_FILE", "XDG_CONFIG_HOME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("FEDBROKER_RETRY_SECONDS", "0")


def config_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, doc: Any, mode: int = 0o600
) -> Path:
    path = tmp_path / "fedbroker.yaml"
    path.write_text(doc if isinstance(doc, str) else yaml.safe_dump(doc))
    path.chmod(mode)
    monkeypatch.setenv("FEDBROKER_CONFIG", str(path))
    return path


def two_contexts(server: str, current: str = "a") -> dict[str, Any]:
    return {
        "current-context": current,
        "contexts": [
            {"name": "a", "server": server, "token": TOKENS["team-a"]},
            {"name": "admin", "server": server, "token": TOKENS["admin"]},
            {"name": "dead", "server": f"127.0.0.1:{free_port()}", "token": WRONG},
        ],
    }


def names(out: str) -> list[str]:
    return [line.split()[0] for line in out.splitlines()[1:]]


async def test_the_current_context_gives_server_and_token(
    served: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    config_file(tmp_path, monkeypatch, two_contexts(served))
    code, out, err = await cli(capsys, "list")
    assert (code, err) == (0, "")
    assert out.split() == ["NAME", "QUEUE", "STATE", "CLUSTER", "AGE", "REASON"]
    # --context (a flag) beats the variable; the variable beats the current context.
    monkeypatch.setenv("FEDBROKER_TOKEN", WRONG)
    code, _, err = await cli(capsys, "list")
    assert code == 1 and err.startswith("fedbroker: error: 401 ")
    assert (await cli(capsys, "list", "--context", "a"))[0] == 0
    assert (await cli(capsys, "list", "--context", "a", "--token", WRONG))[0] == 1
    monkeypatch.delenv("FEDBROKER_TOKEN")
    # A server given by the variable: the file's current context is not used at all, so its
    # token is not sent there.
    monkeypatch.setenv("FEDBROKER_SERVER", served)
    code, _, err = await cli(capsys, "list")
    assert code == 1 and "no token given" in err
    code, _, err = await cli(capsys, "list", "--context", "dead")
    assert code == 1 and "cannot reach the broker at http://127.0.0.1:" in err
    code, _, err = await cli(capsys, "list", "--context", "nosuch")
    assert code == 2 and err.count("\n") == 1
    assert "--context nosuch: no such context in " in err and "(known: a, admin, dead)" in err


async def test_a_token_command_gives_the_token_and_fails_in_one_line(
    served: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    secret = TOKENS["team-a"]
    good = [sys.executable, "-c", f"print({secret!r})"]
    bad = [sys.executable, "-c", f"import sys; print({secret!r}); sys.exit(3)"]
    config_file(tmp_path, monkeypatch, {
        "current-context": "cmd",
        "contexts": [{"name": "cmd", "server": served, "tokenCommand": good},
                     {"name": "bad", "server": served, "tokenCommand": bad}],
    }, mode=0o644)  # fmt: skip
    code, out, err = await cli(capsys, "list")
    assert (code, err) == (0, "")  # no warning: the file holds no token, only a command
    code, out, err = await cli(capsys, "list", "--context", "bad")
    assert code == 1 and out == ""
    assert err == f"fedbroker: error: context 'bad': tokenCommand {sys.executable!r} exited 3\n"
    code, out, _ = await cli(capsys, "config", "get-contexts", "-o", "json")
    assert secret not in out
    assert json.loads(out)["contexts"][0]["auth"] == "tokenCommand"


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("contexts: [name: a", "not YAML (line 1)"),
        ("contexts: {name: a}", "contexts: Input should be a valid list"),
        ("contexts: [{name: a, tokenCommand: vault read x}]",
         "contexts.0.tokenCommand: Input should be a valid list"),
        ("contexts: [{name: a, sever: x}]", "contexts.0.sever: unknown field"),
        ("contexts: [{name: a, token: t, tokenCommand: [x]}]",
         "contexts.0: give token or tokenCommand, not both"),
        ("contexts: [{name: a}, {name: a}]", "context 'a' is named twice"),
        ("{current-context: b, contexts: [{name: a}]}",
         "current-context: no context named 'b'"),
    ],
)  # fmt: skip
async def test_a_bad_file_is_one_line_naming_file_and_field_exit_2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
    text: str, named: str,
) -> None:  # fmt: skip
    path = config_file(tmp_path, monkeypatch, text)
    for argv in (["list"], ["config", "get-contexts"]):
        code, out, err = await cli(capsys, *argv)
        assert (code, out) == (2, "")
        assert err == f"fedbroker: error: {path}: {named}\n"


async def test_a_readable_file_holding_a_token_is_warned_about(
    served: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    path = config_file(tmp_path, monkeypatch, two_contexts(served), mode=0o640)
    code, _, err = await cli(capsys, "list")
    assert code == 0
    assert err == (
        f"fedbroker: warning: {path} holds a token and others can read it (mode 640); "
        f"chmod 600 {path}\n"
    )
    path.chmod(0o600)
    assert (await cli(capsys, "list"))[2] == ""


async def test_get_use_and_current_context(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    path = config_file(tmp_path, monkeypatch, two_contexts("http://broker.example:8080"))
    code, out, err = await cli(capsys, "config", "get-contexts")
    assert (code, err) == (0, "")
    lines = out.splitlines()
    assert lines[0].split() == ["CURRENT", "NAME", "SERVER", "AUTH", "CA-FILE"]
    assert lines[1].split() == ["*", "a", "http://broker.example:8080", "token", "-"]
    assert lines[2].split()[:2] == ["admin", "http://broker.example:8080"]
    assert all(t not in out for t in (*TOKENS.values(), WRONG))
    for output in ("json", "yaml"):
        code, out, _ = await cli(capsys, "config", "get-contexts", "-o", output)
        assert all(t not in out for t in (*TOKENS.values(), WRONG))
        doc = json.loads(out) if output == "json" else yaml.safe_load(out)
        assert doc["current-context"] == "a"
        assert [c["name"] for c in doc["contexts"]] == ["a", "admin", "dead"]
    assert await cli(capsys, "config", "current-context") == (0, "a\n", "")
    code, out, _ = await cli(capsys, "config", "use-context", "admin")
    assert (code, out) == (0, "switched to context 'admin'\n")
    assert await cli(capsys, "config", "current-context") == (0, "admin\n", "")
    assert ClientConfig.model_validate(yaml.safe_load(path.read_text())).contexts[1] == Context(
        name="admin", server="http://broker.example:8080", token=TOKENS["admin"]
    )
    assert os.stat(path).st_mode & 0o777 == 0o600
    code, _, err = await cli(capsys, "config", "use-context", "nosuch")
    assert code == 2 and err.startswith(f"fedbroker: error: {path}: no context named 'nosuch'")
    config_file(tmp_path, monkeypatch, {"contexts": [{"name": "a"}]})
    code, out, err = await cli(capsys, "config", "current-context")
    assert (code, out) == (1, "") and err.endswith(": no current-context is set\n")


async def test_the_default_file_is_under_the_config_directory(
    served: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    monkeypatch.delenv("FEDBROKER_CONFIG")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    (tmp_path / "xdg" / "fedbroker").mkdir(parents=True)
    path = tmp_path / "xdg" / "fedbroker" / "config.yaml"
    path.write_text(yaml.safe_dump(two_contexts(served)))
    path.chmod(0o600)
    assert await cli(capsys, "config", "current-context") == (0, "a\n", "")
    assert (await cli(capsys, "list"))[0] == 0
