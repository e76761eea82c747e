"""SIGTERM to a busy broker stops it cleanly (issue 16, acceptance 4).

``fedbroker serve`` runs in a subprocess on simulated clusters with a short scheduling cycle;
160 one-GPU jobs are submitted through HTTP and run (simulated jobs under ``serve`` run
until cancelled). At SIGTERM, submissions are still arriving (each wakes the scheduler: the
moment Python 3.11's ``wait_for`` used to swallow the cancellation) and an event stream is
open, as a dashboard keeps one. The broker must exit 0 without the supervisor's
``did not stop within`` warning. The target is 2 s; what is asserted is the absence of the
warning (a 10 s bound) and exit 0, so a slow machine does not fail the test; the seconds it
took, by the wall clock and by the broker's own log, are printed (``pytest -s``) and
attached to the test's report as properties.
"""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "stop-under-load-token-0123456789abcdef"
JOBS = 160
DEADLINE_SECONDS = 120.0  # to get there (start, submit, run) on a slow, shared machine
STOP_BOUND_SECONDS = 30.0  # for the exit itself; the warning's absence is the real check
CONFIG = """
store: {{url: "sqlite:///{db}"}}
scheduler: {{cycleSeconds: 0.1}}
clusters:
- name: east
  source:
    simulated: {{shapes: [{{gpuType: A100, gpus: 8, cpu: "96", memory: 1024Gi, count: 12}}]}}
- name: west
  source:
    simulated: {{shapes: [{{gpuType: A100, gpus: 8, cpu: "96", memory: 1024Gi, count: 12}}]}}
queues: [{{name: inference}}]
tenants:
- {{name: team-a, defaultQueue: inference, token: {{value: {token}}}}}
"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def manifest(name: str) -> bytes:
    pod_set = {"name": "worker", "count": 1,
               "resources": {"nvidia.com/gpu": 1, "cpu": "1", "memory": "4Gi"}}  # fmt: skip
    return json.dumps({
        "apiVersion": "fedbroker.io/v1alpha1", "kind": "FederatedJob",
        "metadata": {"name": name},
        "spec": {"queue": "inference", "policy": "binpack", "podSets": [pod_set]},
    }).encode()  # fmt: skip


class Broker:
    """``fedbroker serve`` in a subprocess, its log (JSON lines) in a file: a pipe nobody
    reads while it runs would fill up and stall it."""

    def __init__(self, tmp_path: Path) -> None:
        config = tmp_path / "broker.yaml"
        config.write_text(CONFIG.format(db=tmp_path / "jobs.db", token=TOKEN))
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = tmp_path / "broker.log"
        with self.log.open("w") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "broker.cli", "serve", "--config", str(config),
                 "--host", "127.0.0.1", "--port", str(self.port)],
                cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
            )  # fmt: skip

    def request(self, path: str, body: bytes | None = None) -> Any:
        request = urllib.request.Request(
            self.url + path, data=body, method="GET" if body is None else "POST",
            headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"},
        )  # fmt: skip
        with urllib.request.urlopen(request, timeout=10) as response:
            return json.loads(response.read() or b"null")

    def until(self, what: str, check: Any) -> None:
        deadline = time.monotonic() + DEADLINE_SECONDS
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"serve exited early: {self.log.read_text()[-2000:]}")
            try:
                if check():
                    return
            except (OSError, urllib.error.HTTPError):
                pass
            time.sleep(0.2)
        raise AssertionError(f"serve: {what} not reached in {DEADLINE_SECONDS}s")

    def running(self) -> int:
        return len(self.request("/v1/jobs?state=Running&limit=1000")["items"])

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def records(self) -> list[dict[str, Any]]:
        out = []
        for line in self.log.read_text().splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                out.append({"msg": line})
        return out


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Broker]:
    started = Broker(tmp_path)
    try:
        yield started
    finally:
        started.kill()


class Submitter(threading.Thread):
    """Submissions until ``stop`` or the broker goes away (each wakes its scheduler);
    ``sent`` counts those answered."""

    def __init__(self, broker: Broker) -> None:
        super().__init__(daemon=True)
        self.broker, self.stop, self.sent = broker, threading.Event(), 0

    def run(self) -> None:
        seq = 0
        while not self.stop.is_set():
            try:
                self.broker.request("/v1/jobs", manifest(f"late-{seq:05d}"))
                self.sent += 1
            except (OSError, urllib.error.HTTPError):
                if self.broker.proc.poll() is not None:
                    return
            seq += 1


def read_events(broker: Broker) -> None:
    """An open event stream (as a dashboard keeps), read until the broker ends it."""
    request = urllib.request.Request(
        broker.url + "/v1/events", headers={"Authorization": f"Bearer {TOKEN}"}
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as stream:
            while stream.readline():
                pass
    except (OSError, urllib.error.HTTPError):
        pass


def stop_seconds_logged(records: list[dict[str, Any]]) -> float | None:
    """From the broker's own log: "shutdown requested" to "broker stopped"."""
    times = {r.get("msg"): r.get("ts") for r in records if isinstance(r.get("ts"), float)}
    asked, stopped = times.get("shutdown requested"), times.get("broker stopped")
    return None if asked is None or stopped is None else stopped - asked


def test_sigterm_under_load_stops_cleanly_and_exits_0(broker: Broker, record_property: Any) -> None:
    broker.until("readiness", lambda: broker.request("/readyz") is not None)
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda i: broker.request("/v1/jobs", manifest(f"job-{i:04d}")), range(JOBS)))
    broker.until(f"{JOBS} jobs running", lambda: broker.running() >= JOBS)

    events = threading.Thread(target=read_events, args=(broker,), daemon=True)
    events.start()
    submitter = Submitter(broker)
    submitter.start()
    broker.until("submissions arriving", lambda: submitter.sent >= 20)
    began = time.monotonic()
    broker.proc.send_signal(signal.SIGTERM)
    try:
        code = broker.proc.wait(timeout=STOP_BOUND_SECONDS)
    finally:
        submitter.stop.set()
    wall = time.monotonic() - began
    submitter.join(timeout=10)
    events.join(timeout=10)

    records = broker.records()
    logged = stop_seconds_logged(records)
    record_property("stop_seconds_wall", round(wall, 3))
    record_property("stop_seconds_logged", logged)
    print(f"\nSIGTERM with {JOBS}+ jobs running: exit after {wall:.2f}s (wall), broker's own "
          f"log {logged if logged is None else round(logged, 3)}s")  # fmt: skip
    late = [r["msg"] for r in records if "did not stop within" in str(r.get("msg"))]
    assert not late, late
    assert code == 0, broker.log.read_text()[-2000:]
    assert logged is not None, "no 'shutdown requested' .. 'broker stopped' in the log"
    assert not events.is_alive(), "the event stream was left open"
