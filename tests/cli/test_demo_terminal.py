"""``fedbroker demo`` on a terminal, ``--plain`` elsewhere, and ``fedbroker top`` (issue 16,
item 1).

The acceptance test runs the demo under a pseudo-terminal and reads the screen back with a
terminal emulator: after about 20 s of workload the banner is on screen (its tokens work),
the view shows every demo cluster and queue, and no log line ever reached the terminal
(the log file has them). Then the README's walkthrough, as printed (``walkthrough``):
once the generator, at two and a half times its pace, has filled the on-prem clusters and
claimed the burst pool, the pool still has the README's job's 4 nodes, and that job,
submitted as the README says, is Running within a minute. Every wait is bounded by a
deadline. The screen it captured is drawn as an SVG: into the test's directory always,
into docs/terminal.svg with FEDBROKER_UPDATE_SCREENSHOT=1 (or ``python
tests/cli/terminal.py``).
"""

from __future__ import annotations

import json
import os
import re
import select
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from terminal import ROOT, SCREENSHOT, Terminal, screen_svg
from test_runtime import TOKENS, TOKENS_ENV, Demo, free_port, http_get
from walkthrough import walk_the_readme

CLUSTERS = ("onprem-a", "onprem-b", "cloud-burst")
QUEUES = ("training", "inference", "research")
WORKLOAD_SECONDS = 20.0
# The generator at two and a half times its default pace: the federation is as full, and
# the burst pool as claimed, after 20 s as after a minute and more of `make run`.
RATE = "5"
README_JOB_SECONDS = 60.0  # the README: "Running within a minute of your submit"
DEADLINE_SECONDS = 90.0
LOG_MARKS = ('"level"', "listening on", " INFO ", "WARNING", "Traceback", "broker.")


def shows_the_view(t: Terminal) -> bool:
    text = t.text
    return all(name in text for name in (*CLUSTERS, *QUEUES, "Last job events"))


def run_demo_on_a_terminal(data_dir: Path) -> tuple[Terminal, float]:
    """The demo under a pty with generated tokens, read until it has drawn its view under
    load for WORKLOAD_SECONDS (and shows a job running); the terminal (the demo still
    running) and when the view first showed."""
    env = {k: v for k, v in os.environ.items() if k != "FEDBROKER_DEMO_TOKENS"}
    argv = [sys.executable, "-m", "broker.cli", "demo", "--port", str(free_port()),
            "--data-dir", str(data_dir), "--interval", "0.5", "--rate", RATE]  # fmt: skip
    terminal = Terminal(argv, env=env)
    try:
        deadline = time.monotonic() + DEADLINE_SECONDS
        assert terminal.read_until(shows_the_view, deadline), terminal.text
        shown = time.monotonic()
        loaded = terminal.read_until(
            lambda t: time.monotonic() - shown >= WORKLOAD_SECONDS and "Running" in t.text
            and shows_the_view(t),
            deadline,
        )  # fmt: skip
        assert loaded, terminal.text
    except BaseException:
        terminal.close()
        raise
    return terminal, shown


@pytest.fixture
def demo_terminal() -> Iterator[tuple[Terminal, Path]]:
    # A short data dir: its path is on the screen, and in the screenshot.
    with tempfile.TemporaryDirectory(prefix="fbdemo-") as data_dir:
        terminal, _ = run_demo_on_a_terminal(Path(data_dir))
        try:
            yield terminal, Path(data_dir)
        finally:
            terminal.close()


def test_demo_on_a_terminal_draws_the_view_and_no_log_line(
    demo_terminal: tuple[Terminal, Path], tmp_path: Path
) -> None:
    terminal, data_dir = demo_terminal
    text = terminal.text

    # The banner stays on top: URL, dashboard link with the admin token, the three tokens,
    # how to stop, the log file.
    url = re.search(r"API\s+(http://127\.0\.0\.1:\d+)", text)
    assert url is not None, text
    tokens = dict(re.findall(r"(team-a|team-b|admin) (\S+)", text))
    assert set(tokens) == {"team-a", "team-b", "admin"}, text
    assert f"{url[1]}/#token={tokens['admin']}" in text
    assert "Ctrl-C" in text
    log_file = data_dir / "demo.log"
    assert str(log_file) in text
    assert text.index("fedbroker demo") < text.index("Clusters")
    for tenant, token in tokens.items():  # the tokens shown are the broker's
        assert http_get(url[1] + "/v1/clusters", token)[0] == 200, tenant

    # Every demo cluster and queue, bars, the pool, job events.
    for name in (*CLUSTERS, *QUEUES, "cloud-a100", "█"):
        assert name in text, name

    # Nothing but the view: no log line on the screen or ever written to the terminal.
    written = terminal.raw.decode("utf-8", errors="replace")
    for mark in LOG_MARKS:
        assert mark not in written, mark

    svg = screen_svg(terminal.screen, "fedbroker demo")
    (tmp_path / "terminal.svg").write_text(svg, encoding="utf-8")
    assert svg.startswith("<svg") and "onprem-a" in svg.replace("&#160;", " ")
    if os.environ.get("FEDBROKER_UPDATE_SCREENSHOT") == "1":
        SCREENSHOT.write_text(svg, encoding="utf-8")

    # The README's walkthrough as printed, on this busy federation: its job runs.
    walk_the_readme(terminal, url[1], tokens, README_JOB_SECONDS)

    assert terminal.stop(time.monotonic() + 30.0) == 0
    assert "fedbroker demo stopped (exit 0)" in terminal.text
    logged = log_file.read_text(encoding="utf-8")
    assert "listening on" in logged and "broker stopped" in logged
    assert all(json.loads(line) for line in logged.splitlines() if line.startswith("{"))
    for token in tokens.values():
        assert token not in logged


def test_the_committed_screenshot_is_an_svg_of_the_view() -> None:
    svg = SCREENSHOT.read_text(encoding="utf-8").replace("&#160;", " ")
    assert svg.startswith("<svg")
    for name in (*CLUSTERS, *QUEUES, "fedbroker demo"):
        assert name in svg, name


def _read_pipe(proc: subprocess.Popen[bytes], want: str, deadline: float) -> str:
    """Read the demo's stdout (a pipe) until ``want`` shows or the deadline passes."""
    assert proc.stdout is not None
    out = b""
    while want.encode() not in out and time.monotonic() < deadline:
        ready, _, _ = select.select([proc.stdout], [], [], 0.2)
        if ready:
            chunk = os.read(proc.stdout.fileno(), 65536)
            if not chunk:
                break
            out += chunk
    return out.decode()


def test_demo_on_a_pipe_prints_the_banner_and_status_lines(tmp_path: Path) -> None:
    env = {**os.environ, "FEDBROKER_DEMO_TOKENS": TOKENS_ENV}
    argv = [sys.executable, "-m", "broker.cli", "demo", "--port", str(free_port()),
            "--data-dir", str(tmp_path), "--interval", "0.3", "--no-workload"]  # fmt: skip
    proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)  # fmt: skip
    try:
        out = _read_pipe(proc, "\nstatus:", time.monotonic() + DEADLINE_SECONDS)
        out += _read_pipe(proc, "status:", time.monotonic() + DEADLINE_SECONDS)
        proc.send_signal(signal.SIGTERM)
        rest, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0
    out += rest.decode()
    assert out.startswith("fedbroker demo: API http://127.0.0.1:")
    assert f"logs {tmp_path / 'demo.log'}" in out
    assert "\x1b[" not in out  # no terminal codes down a pipe
    lines = [x for x in out.splitlines() if x.startswith("status:")]
    assert len(lines) >= 2
    assert lines[0].startswith(
        "status: GPUs 0/366 in use; pending 0 (training=0 inference=0 research=0), "
        "oldest wait -; burst nodes 0 up, 0 coming"
    )
    assert err == b""  # the logs went to the file
    assert "listening on" in (tmp_path / "demo.log").read_text(encoding="utf-8")


@pytest.fixture
def demo(tmp_path: Path) -> Iterator[Demo]:
    running = Demo(tmp_path, "--no-workload")
    try:
        running.ready()
        yield running
    finally:
        running.kill()


def top(*args: str, token: str = TOKENS["admin"]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "broker.cli", "top", *args, "--token", token],
        cwd=ROOT, capture_output=True, text=True, timeout=DEADLINE_SECONDS, check=False,
    )  # fmt: skip


def test_top_once_draws_the_view_from_the_api(demo: Demo) -> None:
    done = top("--once", "--server", demo.url)
    assert done.returncode == 0, done.stderr
    for name in (*CLUSTERS, *QUEUES, "cloud-a100", demo.url):
        assert name in done.stdout, name
    plain = top("--once", "--plain", "--server", demo.url)
    assert plain.returncode == 0, plain.stderr
    assert plain.stdout.startswith("status: GPUs 0/366 in use; pending 0")
    assert plain.stdout.count("\n") == 1


def test_top_refused_or_unreachable_is_one_line(demo: Demo) -> None:
    refused = top("--once", "--server", demo.url, token="not-a-token")
    assert refused.returncode == 1
    assert refused.stderr.startswith("fedbroker: error: /v1/")
    assert refused.stderr.count("\n") == 1
    gone = top("--once", "--server", f"http://127.0.0.1:{free_port()}")
    assert gone.returncode == 1
    assert "cannot reach the broker" in gone.stderr and gone.stderr.count("\n") == 1


def test_top_on_a_terminal_follows_job_events(demo: Demo) -> None:
    env = {**os.environ, "FEDBROKER_SERVER": demo.url, "FEDBROKER_TOKEN": TOKENS["admin"]}
    terminal = Terminal([sys.executable, "-m", "broker.cli", "top", "--interval", "0.3"],
                        env=env)  # fmt: skip
    try:
        deadline = time.monotonic() + DEADLINE_SECONDS
        assert terminal.read_until(shows_the_view, deadline), terminal.text
        assert terminal.read_until(lambda t: "none yet" in t.text, deadline), terminal.text
        body = json.dumps({
            "apiVersion": "fedbroker.io/v1alpha1", "kind": "FederatedJob",
            "metadata": {"name": "seen-by-top"},
            "spec": {"queue": "inference", "podSets": [
                {"name": "w", "count": 1, "resources": {"nvidia.com/gpu": 1}}]},
        })  # fmt: skip
        posted = subprocess.run(
            [sys.executable, "-m", "broker.cli", "submit", "-f", "/dev/stdin", "--server",
             demo.url, "--token", TOKENS["team-b"]],
            input=body, cwd=ROOT, capture_output=True, text=True, timeout=DEADLINE_SECONDS,
            check=False,
        )  # fmt: skip
        assert posted.returncode == 0, posted.stderr
        assert terminal.read_until(lambda t: "team-b/seen-by-top" in t.text, deadline), (
            terminal.text
        )
        assert terminal.stop(time.monotonic() + 30.0) is not None
    finally:
        terminal.close()
