"""The running broker: ``fedbroker demo`` as a real process, the supervisor, jobs that end.

The demo runs as a subprocess on a free port; readiness is polled on /readyz with a
deadline, and the CLI client runs as subprocesses against it, as a newcomer would (issue 3,
acceptance 7). Jobs finishing is tested in-process with a fake clock and a fake sleep.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from adapters.simulated import SimulatedLauncher
from broker.cli.demo import parse_tokens
from broker.cli.runtime import supervise
from broker.config import demo_config
from broker.manifest import parse_manifest
from broker.service.facade import Service

ROOT = Path(__file__).resolve().parents[2]
TOKENS = {"team-a": "tok-a", "team-b": "tok-b", "admin": "tok-admin"}
TOKENS_ENV = "team-a=tok-a,team-b=tok-b,admin=tok-admin"
DEADLINE_SECONDS = 30.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def http_get(url: str, token: str | None = None) -> tuple[int, Any]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=5) as r:
            return r.status, json.loads(r.read() or b"{}")
    except urllib.error.HTTPError as exc:
        return exc.code, None


class Demo:
    """``fedbroker demo`` in a subprocess; ``ready()`` polls /readyz until a deadline."""

    def __init__(self, data_dir: Path, *extra: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = {**os.environ, "FEDBROKER_DEMO_TOKENS": TOKENS_ENV}
        args = ["demo", "--port", str(self.port), "--data-dir", str(data_dir), "--log-stderr",
                *extra]  # fmt: skip
        self.out = self.err = ""
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "broker.cli", *args], cwd=ROOT, env=env,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip

    def ready(self) -> None:
        deadline = time.monotonic() + DEADLINE_SECONDS
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"demo exited early: {self.proc.communicate()}")
            try:
                if http_get(self.url + "/readyz")[0] == 200:
                    return
            except OSError:
                pass
            time.sleep(0.1)
        raise AssertionError("demo not ready in time")

    def stop(self) -> int:
        """SIGTERM; the exit code once it has stopped (its output kept in out/err)."""
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.out, self.err = self.proc.communicate(timeout=DEADLINE_SECONDS)
        finally:
            self.kill()
        return self.proc.returncode

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        for stream in (self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()


@pytest.fixture
def demos() -> Iterator[list[Demo]]:
    started: list[Demo] = []
    yield started
    for demo in started:
        demo.kill()


def cli(*args: str, token: str = "tok-a") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "broker.cli", *args, "--token", token],
        cwd=ROOT, capture_output=True, text=True, timeout=DEADLINE_SECONDS, check=False,
    )  # fmt: skip


def test_demo_serves_the_cli_and_keeps_jobs_across_restart(
    tmp_path: Path, demos: list[Demo]
) -> None:
    demo = Demo(tmp_path, "--no-workload")
    demos.append(demo)
    demo.ready()

    submitted = cli("submit", "-f", "deploy/examples/job.yaml", "--server", demo.url)
    assert submitted.returncode == 0, submitted.stderr
    assert "llama-pretrain" in submitted.stdout
    clusters = cli("clusters", "--server", demo.url)
    assert clusters.returncode == 0, clusters.stderr
    for name in ("onprem-a", "onprem-b", "cloud-burst"):
        assert name in clusters.stdout
    pools = cli("pools", "--server", demo.url)
    assert pools.returncode == 0, pools.stderr
    [header, row] = pools.stdout.splitlines()[:2]
    assert header.split()[:3] == ["POOL", "CLUSTER", "GPU"]
    assert row.split()[:4] == ["cloud-a100", "cloud-burst", "A100", "0"]
    got = cli("get", "llama-pretrain", "--server", demo.url, "-o", "json")
    assert got.returncode == 0, got.stderr
    assert json.loads(got.stdout)["status"]["state"] in ("Queued", "Placed", "Running")

    assert demo.stop() == 0

    again = Demo(tmp_path, "--no-workload")
    demos.append(again)
    again.ready()
    got = cli("get", "llama-pretrain", "--server", again.url, "-o", "json")
    assert got.returncode == 0, got.stderr
    assert json.loads(got.stdout)["metadata"]["name"] == "llama-pretrain"
    assert again.stop() == 0


def test_demo_logs_never_show_tokens(tmp_path: Path, demos: list[Demo]) -> None:
    demo = Demo(tmp_path, "--no-workload")
    demos.append(demo)
    demo.ready()
    assert cli("clusters", "--server", demo.url).returncode == 0
    assert demo.stop() == 0
    out, err = demo.out, demo.err
    assert "tok-a" not in out + err
    assert "listening on" in err  # structured logs (JSON: stderr is a pipe)
    assert all(json.loads(line) for line in err.splitlines())


def test_workload_generator_submits_for_both_tenants(tmp_path: Path, demos: list[Demo]) -> None:
    demo = Demo(tmp_path, "--seed", "3")
    demos.append(demo)
    demo.ready()
    tenants: set[str] = set()
    deadline = time.monotonic() + DEADLINE_SECONDS
    while time.monotonic() < deadline and tenants != {"team-a", "team-b"}:
        status, doc = http_get(demo.url + "/v1/jobs?limit=1000", token="tok-admin")
        assert status == 200
        tenants = {job["metadata"]["namespace"] for job in doc["items"]}
        time.sleep(0.2)
    assert tenants == {"team-a", "team-b"}
    assert demo.stop() == 0


def test_bad_demo_tokens_are_one_line_and_exit_2(tmp_path: Path) -> None:
    env = {**os.environ, "FEDBROKER_DEMO_TOKENS": "team-a=x,team-b"}
    done = subprocess.run(
        [sys.executable, "-m", "broker.cli", "demo", "--port", "0", "--data-dir", str(tmp_path)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=DEADLINE_SECONDS,
        check=False,
    )  # fmt: skip
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1
    assert "FEDBROKER_DEMO_TOKENS" in done.stderr


@pytest.mark.parametrize(
    "text",
    ["", "team-a=x", "team-a=x,team-b=y,admin=", "team-a=x,team-b=y,admin=z,bob=w",
     "team-a=x,team-a=y,team-b=y,admin=z"],
)  # fmt: skip
def test_parse_tokens_refuses_malformed(text: str) -> None:
    with pytest.raises(ValueError, match="FEDBROKER_DEMO_TOKENS"):
        parse_tokens(text)


def test_parse_tokens() -> None:
    assert parse_tokens(TOKENS_ENV) == TOKENS


# --- in-process ------------------------------------------------------------------------


class FakeTime:
    """A clock and a sleep that moves it: run times pass without waiting."""

    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.now += seconds
        await asyncio.sleep(0)


JOB = b"""
apiVersion: fedbroker.io/v1alpha1
kind: FederatedJob
metadata: {name: short}
spec:
  queue: training
  podSets: [{name: worker, count: 2, resources: {nvidia.com/gpu: 8, cpu: "8", memory: 32Gi}}]
"""


def free_gpus(service: Service) -> float:
    return float(sum(t["free"] for c in service.clusters() for t in c["gpuTypes"]))


async def test_a_job_with_a_run_time_succeeds_and_frees_its_gpus(tmp_path: Path) -> None:
    clock = FakeTime()
    launcher = SimulatedLauncher(sleep=clock.sleep, run_seconds=lambda placement: 120.0)
    service = Service(demo_config(tmp_path, TOKENS), launcher=launcher, clock=clock)
    await service.start()
    try:
        before = free_gpus(service)
        record, created = await service.submit("team-a", parse_manifest(JOB, "application/yaml"))
        assert created
        await service.schedule_once(clock.now)
        await service.launches_done(timeout=10)
        await service.runs_done(timeout=10)
        record = await service.get("team-a", "short")
        assert record.state == "Succeeded"
        assert record.reason is not None and "completed after 120s" in record.reason
        assert free_gpus(service) == before
        states = [t.state for t in await service.store.history("team-a", "short")]
        assert states[-2:] == ["Running", "Succeeded"]
    finally:
        await service.close()


async def test_a_job_without_run_time_runs_until_cancelled(tmp_path: Path) -> None:
    clock = FakeTime()
    launcher = SimulatedLauncher(sleep=clock.sleep)
    service = Service(demo_config(tmp_path, TOKENS), launcher=launcher, clock=clock)
    await service.start()
    try:
        before = free_gpus(service)
        await service.submit("team-a", parse_manifest(JOB, "application/yaml"))
        await service.schedule_once(clock.now)
        await service.launches_done(timeout=10)
        await service.runs_done(timeout=0.05)
        assert (await service.get("team-a", "short")).state == "Running"
        assert free_gpus(service) == before - 16
        assert (await service.cancel("team-a", "short")).state == "Cancelled"
        assert free_gpus(service) == before
    finally:
        await service.close()


async def test_supervisor_stops_everything_when_one_task_fails() -> None:
    cancelled: list[str] = []

    async def forever(name: str) -> None:
        try:
            await asyncio.Event().wait()
        finally:
            cancelled.append(name)

    async def broken() -> None:
        raise RuntimeError("boom")

    code = await supervise({"a": forever("a"), "b": broken()}, asyncio.Event(), timeout=5)
    assert code == 1
    assert cancelled == ["a"]


async def test_supervisor_returns_0_on_stop() -> None:
    stop = asyncio.Event()
    stop.set()

    async def forever() -> None:
        await asyncio.Event().wait()

    assert await supervise({"a": forever()}, stop) == 0
