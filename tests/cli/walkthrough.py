"""The README's walkthrough as a user types it in a second terminal, against a running demo.

``readme_commands`` reads the README's block that starts with the ``export`` of
``FEDBROKER_SERVER`` and ``FEDBROKER_TOKEN`` (the words of each line as
``test_doc_commands`` splits them); ``WalkThrough`` runs its lines with that environment
(the server and token of the demo under test in place of the README's placeholders), the
program as this interpreter's ``-m broker.cli`` in place of ``.venv/bin/fedbroker``, while
the demo's terminal keeps being read (a demo whose terminal is not read stalls on its
output).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from terminal import ROOT, Terminal
from test_doc_commands import cli_args, sh_blocks, words
from test_runtime import http_get

README = ROOT / "README.md"
COMMAND_SECONDS = 30.0  # the most one CLI command may take


def readme_commands(readme: Path = README) -> tuple[dict[str, str], list[list[str]]]:
    """The walkthrough's exported variables (placeholders as ``PLACEHOLDER``) and the
    arguments of each CLI command after them, in order."""
    for block in sh_blocks(readme):
        commands = words(block)
        if commands and commands[0][0] == "export" and "FEDBROKER_SERVER" in block:
            exported = dict(w.split("=", 1) for w in commands[0][1:])
            args = [a for c in commands[1:] if (a := cli_args(c)) is not None]
            return exported, args
    raise AssertionError(f"{readme}: no sh block starting with `export FEDBROKER_SERVER=...`")


class WalkThrough:
    def __init__(self, terminal: Terminal, url: str, team_a_token: str) -> None:
        self.terminal = terminal
        exported, self.commands = readme_commands()
        assert set(exported) == {"FEDBROKER_SERVER", "FEDBROKER_TOKEN"}, exported
        assert exported["FEDBROKER_TOKEN"] == "PLACEHOLDER"  # "<team-a token from the banner>"
        # The demo's own address by default; the demo under test listens on a free port.
        assert exported["FEDBROKER_SERVER"] == "http://127.0.0.1:8080", exported
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("FEDBROKER_")}
        self.env |= {"FEDBROKER_SERVER": url, "FEDBROKER_TOKEN": team_a_token}

    def command(self, verb: str) -> list[str]:
        """The README's first command of ``verb`` (``submit``, ``get``, ...)."""
        return next(c for c in self.commands if c[0] == verb)

    def run(self, args: list[str], deadline: float) -> subprocess.CompletedProcess[str]:
        proc = subprocess.Popen(
            [sys.executable, "-m", "broker.cli", *args], cwd=ROOT, env=self.env,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        try:
            self.terminal.read_until(lambda _: proc.poll() is not None, deadline)
            out, err = proc.communicate(timeout=max(0.1, deadline - time.monotonic()))
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def pool_nodes(url: str, admin_token: str) -> tuple[int, int]:
    """The burst pools' nodes up or coming, and their maximum, as ``fedbroker pools``
    reads them."""
    status, doc = http_get(url + "/v1/pools", admin_token)
    assert status == 200, status
    pools = doc["pools"]
    return sum(p["ready"] + p["coming"] for p in pools), sum(p["maxNodes"] for p in pools)


def state_of(table: str) -> str:
    """The STATE column of the job's row in ``get``'s table."""
    header, row = (line.split() for line in table.splitlines()[:2])
    return dict(zip(header, row, strict=False))["STATE"]


def walk_the_readme(terminal: Terminal, url: str, tokens: dict[str, str], within: float) -> str:
    """Once the generator has filled the on-prem clusters and asked the pool for nodes
    (it leaves the 4 nodes the README's job needs), submit the README's job as the README
    says and follow it with the README's ``get`` until it is Running, at most ``within``
    seconds: the last ``get``'s output."""
    walk = WalkThrough(terminal, url, tokens["team-a"])
    deadline = time.monotonic() + within
    claimed = terminal.read_until(lambda _: pool_nodes(url, tokens["admin"])[0] >= 8, deadline)
    assert claimed, "the generator never asked the burst pool for 8 nodes"
    held, most = pool_nodes(url, tokens["admin"])
    assert most - held >= 4, f"the generator took the burst pool's last nodes: {held} of {most}"
    submitted = walk.run(walk.command("submit"), time.monotonic() + COMMAND_SECONDS)
    assert submitted.returncode == 0, submitted.stderr
    assert "llama-pretrain" in submitted.stdout
    deadline = time.monotonic() + within
    got = None
    while got is None or time.monotonic() < deadline:
        # Each command is given its own time: the deadline is the job's, not theirs.
        got = walk.run(walk.command("get"), time.monotonic() + COMMAND_SECONDS)
        assert got.returncode == 0, got.stderr
        if state_of(got.stdout) == "Running":
            return got.stdout
        terminal.read_until(lambda _: False, min(deadline, time.monotonic() + 1.0))  # pace
    raise AssertionError(f"the README's job is not Running after {within:.0f}s:\n{got.stdout}")
