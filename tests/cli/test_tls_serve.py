"""``fedbroker serve`` over TLS, end to end: a CA and a certificate for 127.0.0.1 made in
the test, the broker as a real process, the CLI as subprocesses against it (as
tests/cli/test_runtime.py does): ``--ca-file`` and ``$FEDBROKER_CA_FILE`` work, no CA or
plain HTTP fail with one line; the process's stderr holds the audit line of the submit and
the access log, never the token. Readiness is polled on /readyz with a deadline."""

from __future__ import annotations

import http.client
import json
import os
import signal
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from pki import Authority
from test_runtime import DEADLINE_SECONDS, ROOT, free_port

TOKEN = "tls-serve-team-a-token-0123456789abcd"
CONFIG = """
store: {{url: "sqlite:///{db}"}}
api: {{tls: {{certFile: {cert}, keyFile: {key}}}}}
clusters:
- name: onprem
  labels: {{region: eu}}
  source:
    simulated: {{shapes: [{{gpuType: G2, gpus: 8, cpu: "96", memory: 1024Gi, count: 4}}]}}
queues: [{{name: training}}]
tenants:
- {{name: team-a, defaultQueue: training, token: {{env: TEAM_A_TOKEN}}}}
"""


class Broker:
    """``fedbroker serve`` over TLS in a subprocess."""

    def __init__(self, tmp_path: Path) -> None:
        self.ca = Authority(tmp_path)
        cert, key = self.ca.issue("server", 77)
        config = tmp_path / "broker.yaml"
        config.write_text(CONFIG.format(db=tmp_path / "jobs.db", cert=cert, key=key))
        self.port = free_port()
        self.url = f"https://127.0.0.1:{self.port}"
        env = {**os.environ, "TEAM_A_TOKEN": TOKEN}
        env.pop("FEDBROKER_CA_FILE", None)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "broker.cli", "serve", "--config", str(config),
             "--port", str(self.port)],
            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        self.out = self.err = ""

    def ready(self) -> None:
        context = ssl.create_default_context(cafile=str(self.ca.ca_file))
        deadline = time.monotonic() + DEADLINE_SECONDS
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"serve exited early: {self.proc.communicate()}")
            try:
                with urllib.request.urlopen(self.url + "/readyz", context=context, timeout=5):
                    return
            except (OSError, urllib.error.HTTPError):
                time.sleep(0.1)
        raise AssertionError("serve not ready in time")

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        self.out, self.err = self.proc.communicate(timeout=DEADLINE_SECONDS)
        return self.proc.returncode

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.communicate()


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Broker]:
    started = Broker(tmp_path)
    try:
        started.ready()
        yield started
    finally:
        started.kill()


def cli(*args: str, ca_env: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "FEDBROKER_TOKEN": TOKEN, "FEDBROKER_RETRY_SECONDS": "0"}
    env.pop("FEDBROKER_CA_FILE", None)
    if ca_env is not None:
        env["FEDBROKER_CA_FILE"] = str(ca_env)
    return subprocess.run(
        [sys.executable, "-m", "broker.cli", *args], cwd=ROOT, env=env, capture_output=True,
        text=True, timeout=DEADLINE_SECONDS, check=False,
    )  # fmt: skip


def test_the_cli_talks_to_a_tls_broker_with_its_ca(broker: Broker) -> None:
    submitted = cli("submit", "-f", "deploy/examples/job.yaml", "--server", broker.url,
                    "--ca-file", str(broker.ca.ca_file), "-o", "json")  # fmt: skip
    assert submitted.returncode == 0, submitted.stderr
    assert json.loads(submitted.stdout)["metadata"]["name"] == "llama-pretrain"
    listed = cli("list", "--server", broker.url, ca_env=broker.ca.ca_file)
    assert listed.returncode == 0, listed.stderr
    assert "llama-pretrain" in listed.stdout

    untrusted = cli("clusters", "--server", broker.url)  # the system's trust: not our CA
    assert untrusted.returncode == 1
    assert untrusted.stderr.count("\n") == 1 and "--ca-file" in untrusted.stderr
    plain = cli("clusters", "--server", f"http://127.0.0.1:{broker.port}",
                "--ca-file", str(broker.ca.ca_file))  # fmt: skip
    assert plain.returncode == 1 and plain.stderr.count("\n") == 1
    with pytest.raises((OSError, http.client.HTTPException)):
        urllib.request.urlopen(f"http://127.0.0.1:{broker.port}/healthz", timeout=5)

    assert broker.stop() == 0
    assert TOKEN not in broker.out + broker.err
    lines = [json.loads(line) for line in broker.err.splitlines()]  # every line is JSON
    audits = [x for x in lines if "actor" in x]
    assert len(audits) == 1
    [audit] = audits
    assert (audit["action"], audit["result"], audit["actor"]["subject"]) == (
        "submit", 201, "token:team-a",
    )  # fmt: skip
    access = [x["msg"] for x in lines if x.get("logger") == "aiohttp.access"]
    assert any('"POST /v1/jobs HTTP/1.1" 201' in m and audit["requestId"] in m for m in access)
    assert any(x.get("msg", "").startswith("listening on https://") for x in lines)


def test_a_bad_ca_file_is_one_line(tmp_path: Path) -> None:
    junk = tmp_path / "junk.pem"
    junk.write_text("not a certificate")
    done = cli("clusters", "--server", "https://127.0.0.1:1", "--ca-file", str(junk))
    assert done.returncode == 2  # a usage mistake: nothing was sent
    assert done.stderr.startswith("fedbroker: error: --ca-file ") and done.stderr.count("\n") == 1


def test_serve_refuses_a_pair_that_does_not_load_in_one_line(tmp_path: Path) -> None:
    junk = tmp_path / "junk.pem"
    junk.write_text("not a certificate")
    config = tmp_path / "broker.yaml"
    config.write_text(CONFIG.format(db=tmp_path / "jobs.db", cert=junk, key=junk))
    done = subprocess.run(
        [sys.executable, "-m", "broker.cli", "serve", "--config", str(config), "--port", "0"],
        cwd=ROOT, env={**os.environ, "TEAM_A_TOKEN": TOKEN}, capture_output=True, text=True,
        timeout=DEADLINE_SECONDS, check=False,
    )  # fmt: skip
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1
    assert done.stderr.startswith(
        f"fedbroker: error: {config}: api.tls.certFile/keyFile: cannot load the certificate"
    )
