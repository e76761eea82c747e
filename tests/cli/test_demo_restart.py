"""``fedbroker demo`` restarted on the same data dir: the tokens it generated at its first
start are kept there and still work (a token exported before the restart is not refused),
and the banner says which jobs the start restored. Two demos in a row without the
workload generator, read down a pipe (``--plain``), every wait bounded by a deadline."""

from __future__ import annotations

import json
import os
import re
import select
import signal
import stat
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from terminal import ROOT
from test_runtime import free_port, http_get

DEADLINE_SECONDS = 60.0
TOKEN_LINE = re.compile(r"^ {4}(team-a|team-b|admin) +(\S+)$", re.M)


def gang(name: str, pods: int) -> bytes:
    """A gang of ``pods`` x 8 G2 GPUs, on-prem only (no burst)."""
    return json.dumps({
        "apiVersion": "fedbroker.io/v1alpha1", "kind": "FederatedJob",
        "metadata": {"name": name},
        "spec": {"queue": "training", "gang": {"minMember": pods},
                 "placement": {"gpuTypes": ["G2"]},
                 "podSets": [{"name": "w", "count": pods,
                              "resources": {"nvidia.com/gpu": 8, "cpu": "8", "memory": "32Gi"}}]},
    }).encode()  # fmt: skip


def post(url: str, token: str, body: bytes) -> int:
    request = urllib.request.Request(
        url + "/v1/jobs", data=body, method="POST",
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )  # fmt: skip
    with urllib.request.urlopen(request, timeout=10) as answer:
        return int(answer.status)


class PlainDemo:
    """The demo down a pipe, its tokens left to it (no FEDBROKER_DEMO_TOKENS)."""

    def __init__(self, data_dir: Path) -> None:
        env = {k: v for k, v in os.environ.items() if k != "FEDBROKER_DEMO_TOKENS"}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "broker.cli", "demo", "--port", str(free_port()),
             "--data-dir", str(data_dir), "--no-workload", "--plain", "--interval", "5"],
            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        self.banner = self._read_until("stop with Ctrl-C")
        found = re.search(r"API (http://127\.0\.0\.1:\d+)", self.banner)
        assert found is not None, self.banner
        self.url = found[1]
        self.tokens = dict(TOKEN_LINE.findall(self.banner))

    def _read_until(self, want: str) -> str:
        assert self.proc.stdout is not None
        out, deadline = b"", time.monotonic() + DEADLINE_SECONDS
        while want.encode() not in out and time.monotonic() < deadline:
            if select.select([self.proc.stdout], [], [], 0.2)[0]:
                chunk = os.read(self.proc.stdout.fileno(), 65536)
                if not chunk:
                    break
                out += chunk
        return out.decode()

    def state(self, name: str) -> str:
        status, doc = http_get(f"{self.url}/v1/jobs/{name}", self.tokens["team-a"])
        assert status == 200, status
        return str(doc["status"]["state"])

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=DEADLINE_SECONDS)
        finally:
            self.kill()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()


def test_a_restarted_demo_keeps_its_tokens_and_says_what_it_restored(tmp_path: Path) -> None:
    kept = tmp_path / "tokens"
    first = PlainDemo(tmp_path)
    try:
        assert set(first.tokens) == {"team-a", "team-b", "admin"}, first.banner
        assert f"tokens (new; kept in {kept} for the next start;" in first.banner
        assert "restored" not in first.banner  # nothing to restore
        assert stat.S_IMODE(kept.stat().st_mode) == 0o600
        token = first.tokens["team-a"]
        # Two gangs that run (onprem-a has 27 G2 nodes) and one that waits behind them.
        for name, pods in (("big", 20), ("small", 4), ("waits", 20)):
            assert post(first.url, token, gang(name, pods)) == 201
        deadline = time.monotonic() + DEADLINE_SECONDS
        while time.monotonic() < deadline and {first.state(n) for n in ("big", "small")} != {
            "Running"
        }:
            time.sleep(0.1)  # polling the API with a deadline: nothing to wait on instead
        assert [first.state(n) for n in ("big", "small", "waits")] == [
            "Running", "Running", "Queued"
        ]  # fmt: skip
        assert first.stop() == 0
    finally:
        first.kill()

    again = PlainDemo(tmp_path)
    try:
        assert again.tokens == first.tokens, again.banner
        assert f"tokens (kept in {kept} from an earlier start;" in again.banner
        assert "restored 3 jobs: 1 queued, 2 that were running, queued again" in again.banner
        status, _ = http_get(f"{again.url}/v1/jobs/big", token)  # the token exported before
        assert status == 200
        assert again.stop() == 0
    finally:
        again.kill()


def test_a_tokens_file_it_cannot_read_is_one_line_naming_it_and_exit_2(tmp_path: Path) -> None:
    kept = tmp_path / "tokens"
    kept.write_text("team-a=x,team-b=y\n", encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if k != "FEDBROKER_DEMO_TOKENS"}
    done = subprocess.run(
        [sys.executable, "-m", "broker.cli", "demo", "--port", "0", "--data-dir", str(tmp_path)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=DEADLINE_SECONDS,
        check=False,
    )  # fmt: skip
    assert done.returncode == 2
    assert done.stderr == f"fedbroker: error: {kept}: missing tenant(s) admin\n"
