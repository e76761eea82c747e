"""Every command's exit status on each of its failures is what docs/cli.md says.

The table under "Exit codes" in docs/cli.md is the expectation: each row (command, failure,
exit) is run here, for every command it names, as ``fedbroker ...`` in process against a
real broker (the harness of tests/cli/test_cli_messages.py), a port nothing listens on, or
Kubernetes members served by kmock. A row without a way to run it here, or a way without a
row, fails the test: the page and the commands cannot drift apart.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import kmock
import pytest
from test_api import TOKENS, Harness, manifest
from test_cli_messages import clean_env, cli, free_port, served, write
from test_kube_watch import NODES, PLAN_GANG, PODS, node_obj, pod_obj, write_kubeconfig

from broker.cli.main import build_parser
from broker.cli.plan import EXIT_NO_FIT

__all__ = ["clean_env", "served"]  # fixtures, used by name

DOCS = Path(__file__).parents[2] / "docs" / "cli.md"
CLIENT_COMMANDS = ("submit", "get", "list", "cancel", "explain", "clusters", "pools", "pods",
                   "logs", "top")  # fmt: skip
TOKEN = ("--token", TOKENS["team-a"])


@dataclass
class Where:
    """What a failure is run against: files in ``tmp``, a live broker's URL and Kubernetes
    members (kmock), the last two only for the rows that need them (``LIVE``, ``KUBE``)."""

    tmp: Path
    live: str = ""
    kmock: kmock.KubernetesEmulator | None = None

    def file(self, name: str, text: str) -> str:
        (self.tmp / name).write_text(text)
        return str(self.tmp / name)

    def job(self) -> str:
        return write(self.tmp, manifest("train"))

    def dead_kubeconfig(self) -> str:
        return str(write_kubeconfig(self.tmp / "kc", {"a": f"http://127.0.0.1:{free_port()}"}))


def base(command: str, where: Where) -> list[str]:
    """The command with what it needs to run (a job's name, a file), and nothing else."""
    if command == "submit":
        return ["submit", "-f", where.job()]
    if command in ("get", "cancel", "explain", "pods", "logs"):
        return [command, "nosuch"]
    return ["top", "--once"] if command == "top" else [command]


Run = Callable[[str, Where], list[str]]


def _unknown_flag(command: str, where: Where) -> list[str]:
    return [command, "--no-such-flag"]


def _bad_ca(command: str, where: Where) -> list[str]:
    junk = where.file("junk.pem", "not a certificate")
    return [*base(command, where), "--server", "https://127.0.0.1:1", "--ca-file", junk]


def _plan_fits_nowhere(command: str, where: Where) -> list[str]:
    assert where.kmock is not None
    where.kmock.objects[NODES, None, "n1"] = node_obj("n1", gpus=4)
    where.kmock.objects[PODS, "ml", "p1"] = pod_obj("p1", "n1", gpus=1)
    kc = write_kubeconfig(where.tmp / "kc", {"live": str(where.kmock.url)})
    job = where.file("job.yaml", PLAN_GANG.format(name="big", pods=1, gpus=8))
    return ["plan", "-f", job, "--kubeconfig", str(kc), "--timeout", "2"]


def _kube(command: str, where: Where, kubeconfig: str) -> list[str]:
    if command == "plan":
        job = where.file("job.yaml", PLAN_GANG.format(name="j", pods=1, gpus=1))
        return ["plan", "-f", job, "--kubeconfig", kubeconfig, "--timeout", "2"]
    return ["inspect", "--kubeconfig", kubeconfig, "--timeout", "2"]


FAILURES: dict[str, Run] = {
    "an unknown flag": _unknown_flag,
    "`--server` is not an http(s) URL": lambda c, w: [*base(c, w), "--server", "ftp://broker"],
    "`--ca-file` does not load": _bad_ca,
    "the broker cannot be reached":
        lambda c, w: [*base(c, w), "--server", f"127.0.0.1:{free_port()}"],
    "no token given": lambda c, w: [*base(c, w), "--server", w.live],
    "`-f` names a missing file": lambda c, w: ["submit", "-f", str(w.tmp / "nosuch.yaml")],
    "the file gives a key twice":
        lambda c, w: ["submit", "-f", w.file("twice.yaml", "kind: Job\nkind: Job\n")],
    "`--queue` with a FederatedJob": lambda c, w: [*base(c, w), "--queue", "training"],
    "the broker refuses the manifest": lambda c, w: [
        "submit", "-f", write(w.tmp, manifest("bad", pods=0)), "--server", w.live, *TOKEN],
    "no such job": lambda c, w: [*base(c, w), "--server", w.live, *TOKEN],
    "`--limit 0`": lambda c, w: ["list", "--limit", "0"],
    "the broker refuses the selector":
        lambda c, w: ["list", "-l", "a in (b)", "--server", w.live, *TOKEN],
    "`--tail 0`": lambda c, w: ["logs", "nosuch", "--tail", "0", "--server", w.live, *TOKEN],
    "the config file is missing": lambda c, w: ["serve", "--config", str(w.tmp / "nosuch")],
    "`--port` out of range": lambda c, w: ["demo", "--port", "70000", "--plain"],
    "the kubeconfig is missing": lambda c, w: _kube(c, w, str(w.tmp / "nosuch")),
    "no context could be read": lambda c, w: _kube(c, w, w.dead_kubeconfig()),
    "the manifest names no job": lambda c, w: [
        "plan", "-f", w.file("j.yaml", "kind: FederatedJob\nmetadata: {}\n"),
        "--kubeconfig", w.dead_kubeconfig()],
    "the job fits nowhere now": _plan_fits_nowhere,
    "`--mqtt-cert-file` without `--mqtt-key-file`": lambda c, w: [
        "agent", "--cluster", "c", "--mqtt-host", "h", "--mqtt-cert-file", w.job()],
    "`--nodes` names a missing file":
        lambda c, w: ["simulate", "--nodes", str(w.tmp / "nosuch.csv")],
    "a shell other than bash or zsh": lambda c, w: ["completion", "fish"],
}  # fmt: skip


def commands_of(parser: argparse.ArgumentParser) -> list[str]:
    (sub,) = (a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return list(sub.choices)


def documented() -> list[tuple[str, str, int]]:
    """(command, failure, exit) for every command each row of the table names."""
    text = DOCS.read_text()
    section = text[text.index("## Exit codes") : text.index("## Shell completion")]
    every = sorted(commands_of(build_parser()))
    rows = []
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 3 or not cells[2].isdigit():
            continue
        names, failure, code = cells
        commands = {"every command": every, "client commands": list(CLIENT_COMMANDS)}.get(
            names, re.findall(r"`([a-z]+)`", names)
        )
        rows += [(command, failure, int(code)) for command in commands]
    return rows


ROWS = documented()


def test_every_documented_failure_is_run_here_and_every_one_run_is_documented() -> None:
    assert len(ROWS) > 40
    assert {failure for _, failure, _ in ROWS} == set(FAILURES)


# The failures run against a live broker, and against Kubernetes members; the rest need
# neither (most rows: a test each costs no broker).
LIVE = frozenset({"no token given", "the broker refuses the manifest", "no such job",
                  "the broker refuses the selector", "`--tail 0`"})  # fmt: skip
KUBE = frozenset({"the job fits nowhere now"})


def rows(*, of: frozenset[str] | None = None) -> list[object]:
    chosen = [r for r in ROWS if (r[1] not in LIVE | KUBE if of is None else r[1] in of)]
    return [pytest.param(*r, id=f"{r[0]}: {r[1]}") for r in chosen]


async def exits_as_documented(
    capsys: pytest.CaptureFixture[str], failure: str, command: str, code: int, where: Where
) -> None:
    argv = FAILURES[failure](command, where)
    got, out, err = await cli(capsys, *argv)
    assert got == code, err
    if code == EXIT_NO_FIT:  # an answer, on stdout: nothing went wrong
        assert err == "" and out
    else:
        assert err.startswith("fedbroker: error: ") and err.count("\n") == 1, err


@pytest.mark.parametrize(("command", "failure", "code"), rows())
async def test_the_exit_status_is_the_documented_one(
    command: str, failure: str, code: int, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    await exits_as_documented(capsys, failure, command, code, Where(tmp_path))


@pytest.mark.parametrize(("command", "failure", "code"), rows(of=LIVE))
async def test_the_exit_status_against_a_broker_is_the_documented_one(
    command: str, failure: str, code: int, tmp_path: Path, capsys: pytest.CaptureFixture[str],
    served: tuple[Harness, str],
) -> None:  # fmt: skip
    await exits_as_documented(capsys, failure, command, code, Where(tmp_path, live=served[1]))


@pytest.mark.parametrize(("command", "failure", "code"), rows(of=KUBE))
async def test_the_exit_status_against_kubernetes_is_the_documented_one(
    command: str, failure: str, code: int, tmp_path: Path, capsys: pytest.CaptureFixture[str],
    kmock: kmock.KubernetesEmulator,
) -> None:  # fmt: skip
    await exits_as_documented(capsys, failure, command, code, Where(tmp_path, kmock=kmock))
