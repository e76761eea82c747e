"""TLS on the API (``api.tls``, broker/http/tls.py), in process: the real API over HTTPS with
a CA and certificates made in the test; a rotated certificate served without a restart
(the served serial read over a raw TLS connection before and after ``reload()``), a bad
new pair keeping the old one, mutual TLS, a follower forwarding a write over HTTPS, and
the config's one-line errors. ``fedbroker serve`` over TLS with the CLI: tests/cli."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from pki import Authority, serial_of

from broker.config import Config, ConfigError, TlsConfig, parse_config
from broker.http.app import make_app
from broker.http.audit import AUDIT_LOGGER
from broker.http.forwarding import FORWARDED_BY
from broker.http.tls import ApiCertificates, TlsError
from broker.service.facade import Service

TOKEN = "tls-team-a-token-0123456789abcdef0123"
CONFIG = """
store: {{url: "sqlite:///{db}"}}
api: {{tls: {tls}}}
clusters:
- name: small
  source:
    simulated: {{shapes: [{{gpuType: A100, gpus: 8, cpu: "96", memory: 1024Gi, count: 1}}]}}
queues: [{{name: training}}]
tenants:
- {{name: team-a, defaultQueue: training, token: {{value: {token}}}}}
"""


def tls_config(tmp_path: Path, **files: Path) -> Config:
    tls = "{" + ", ".join(f"{k}: {v}" for k, v in files.items()) + "}"
    text = CONFIG.format(db=tmp_path / "jobs.db", tls=tls, token=TOKEN)
    return parse_config(text, "test config")


@dataclass
class Served:
    """The API on 127.0.0.1 over TLS, its certificates and the CA that signed them."""

    port: int
    certificates: ApiCertificates
    ca: Authority
    cert_file: Path
    key_file: Path
    service: Service

    def client_context(self, pair: tuple[Path, Path] | None = None) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=str(self.ca.ca_file))
        if pair is not None:
            context.load_cert_chain(*pair)
        return context

    async def serial(self) -> int:
        """The serial of the certificate a new handshake gets."""
        _, writer = await asyncio.open_connection("127.0.0.1", self.port, ssl=self.client_context())
        try:
            return serial_of(writer.get_extra_info("ssl_object").getpeercert(True))
        finally:
            writer.close()

    def rotate(self, stem: str, serial: int, ca: Authority | None = None) -> None:
        """A new pair put in place as operators do: written aside, renamed over the old."""
        cert, key = (ca or self.ca).issue(stem, serial)
        os.replace(cert, self.cert_file)
        os.replace(key, self.key_file)


async def serve_tls(tmp_path: Path, client_ca: bool = False) -> AsyncIterator[Served]:
    ca = Authority(tmp_path)
    cert_file, key_file = ca.issue("server", 1001)
    files = {"certFile": cert_file, "keyFile": key_file}
    if client_ca:
        files["clientCAFile"] = ca.ca_file
    config = tls_config(tmp_path, **files)
    assert config.api.tls is not None
    certificates = ApiCertificates(config.api.tls)
    service = Service(config)
    await service.start()
    runner = web.AppRunner(make_app(service, config, certificates=certificates))
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=certificates.server)
    await site.start()
    port = int(runner.addresses[0][1])
    try:
        yield Served(port, certificates, ca, cert_file, key_file, service)
    finally:
        await runner.cleanup()
        await service.close()


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[Served]:
    async for s in serve_tls(tmp_path):
        yield s


@pytest.fixture
async def mutual(tmp_path: Path) -> AsyncIterator[Served]:
    async for s in serve_tls(tmp_path, client_ca=True):
        yield s


async def test_a_rotated_certificate_is_served_without_a_restart(served: Served) -> None:
    assert await served.serial() == 1001
    assert served.certificates.reload() is False  # nothing changed: nothing done
    served.rotate("next", 1002)
    assert await served.serial() == 1001  # not before the reload
    assert served.certificates.reload() is True
    assert await served.serial() == 1002
    async with aiohttp.ClientSession() as session:
        url = f"https://127.0.0.1:{served.port}/healthz"
        async with session.get(url, ssl=served.client_context()) as answer:
            assert answer.status == 200


async def test_a_bad_new_pair_keeps_the_old_certificate_and_logs_one_line(
    served: Served, caplog: pytest.LogCaptureFixture
) -> None:
    other, _ = served.ca.issue("other", 3003)
    _, wrong_key = served.ca.issue("wrong", 4004)
    os.replace(other, served.cert_file)
    os.replace(wrong_key, served.key_file)  # a certificate with another pair's key
    with caplog.at_level(logging.INFO, logger="broker.http.tls"):
        assert served.certificates.reload() is False
        assert served.certificates.reload() is False  # the same bad files: no second line
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1
    assert "api.tls.certFile/keyFile" in errors[0].getMessage()
    assert "previous certificate" in errors[0].getMessage()
    assert await served.serial() == 1001
    served.rotate("fixed", 1005)
    assert served.certificates.reload() is True
    assert await served.serial() == 1005


async def test_the_reload_task_checks_the_files_on_its_interval(served: Served) -> None:
    asked: list[float] = []
    second = asyncio.Event()

    async def sleep(seconds: float) -> None:
        asked.append(seconds)
        if len(asked) > 1:
            second.set()
            await asyncio.Event().wait()

    served.rotate("next", 1002)
    task = asyncio.create_task(served.certificates.watch(7.5, sleep=sleep), name="tls-reload")
    try:
        await asyncio.wait_for(second.wait(), timeout=10)
    finally:
        task.cancel()
    assert asked == [7.5, 7.5]
    assert served.certificates.reloads == 1
    assert await served.serial() == 1002


async def get_status(port: int, context: ssl.SSLContext) -> int:
    async with aiohttp.ClientSession() as session:
        url = f"https://127.0.0.1:{port}/healthz"
        async with session.get(url, ssl=context) as answer:
            await answer.read()
            return answer.status


async def test_mutual_tls_refuses_a_client_without_a_certificate(mutual: Served) -> None:
    with pytest.raises(aiohttp.ClientError):
        await get_status(mutual.port, mutual.client_context())
    stranger = Authority(mutual.cert_file.parent, name="stranger-ca")
    with pytest.raises(aiohttp.ClientError):
        await get_status(mutual.port, mutual.client_context(stranger.issue("intruder", 9)))
    assert await get_status(mutual.port, mutual.client_context(mutual.ca.issue("cli", 7))) == 200


async def test_plain_http_to_the_tls_port_fails(served: Served) -> None:
    with pytest.raises(aiohttp.ClientError):
        async with (
            aiohttp.ClientSession() as session,
            session.get(f"http://127.0.0.1:{served.port}/healthz") as answer,
        ):
            await answer.read()


def test_the_client_context_trusts_the_ca_file_then_the_client_ca(tmp_path: Path) -> None:
    ca = Authority(tmp_path)
    other = Authority(tmp_path, name="replicas-ca")
    cert, key = ca.issue("server", 1)
    only_client_ca = TlsConfig.model_validate(
        {"certFile": str(cert), "keyFile": str(key), "clientCAFile": str(ca.ca_file)}
    )
    both = TlsConfig.model_validate(
        {"certFile": str(cert), "keyFile": str(key), "clientCAFile": str(ca.ca_file),
         "caFile": str(other.ca_file)}
    )  # fmt: skip

    def subjects(tls: TlsConfig) -> set[str]:
        found: set[str] = set()
        for c in ApiCertificates(tls).client.get_ca_certs():
            for rdn in c["subject"]:
                found.update(str(pair[1]) for pair in rdn if pair[0] == "commonName")
        return found

    assert subjects(only_client_ca) == {"test-ca"}
    assert subjects(both) == {"replicas-ca"}


@pytest.mark.parametrize(
    ("files", "key"),
    [({"certFile": "missing.crt", "keyFile": "ok"}, "api.tls.certFile"),
     ({"certFile": "ok", "keyFile": "missing.key"}, "api.tls.keyFile"),
     ({"certFile": "ok", "keyFile": "ok", "clientCAFile": "missing.pem"}, "api.tls.clientCAFile"),
     ({"certFile": "ok", "keyFile": "ok", "caFile": "missing.pem"}, "api.tls.caFile"),
     ({"keyFile": "ok"}, "api.tls.certFile")],
)  # fmt: skip
def test_missing_tls_files_are_one_line_config_errors(
    tmp_path: Path, files: dict[str, str], key: str
) -> None:
    (tmp_path / "ok").write_text("x")
    paths = {k: tmp_path / v for k, v in files.items()}
    with pytest.raises(ConfigError) as caught:
        tls_config(tmp_path, **paths)
    message = str(caught.value)
    assert message.startswith(f"test config: {key}: ")
    assert "\n" not in message


def test_files_that_are_not_a_pair_are_refused_at_start_naming_the_key(tmp_path: Path) -> None:
    (tmp_path / "junk.pem").write_text("not a certificate")
    config = tls_config(tmp_path, certFile=tmp_path / "junk.pem", keyFile=tmp_path / "junk.pem")
    assert config.api.tls is not None
    with pytest.raises(TlsError, match=r"^api\.tls\.certFile/keyFile: cannot load"):
        ApiCertificates(config.api.tls)


class TlsReplica:
    """A Service behind the real API over mutual TLS on 127.0.0.1; identity = its address."""

    def __init__(self, config: Config, certificates: ApiCertificates) -> None:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = int(sock.getsockname()[1])
        self.identity = f"127.0.0.1:{self.port}"
        self.service = Service(config, identity=self.identity)
        self.certificates = certificates
        self.runner = web.AppRunner(make_app(self.service, config, certificates=certificates))

    async def start(self) -> None:
        await self.service.start()
        await self.runner.setup()
        site = web.TCPSite(
            self.runner, "127.0.0.1", self.port, ssl_context=self.certificates.server
        )
        await site.start()

    async def close(self) -> None:
        await self.service.launches_done(timeout=10)
        await self.runner.cleanup()
        await self.service.close()


async def test_a_follower_forwards_a_write_to_the_leader_over_mutual_tls(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    ca = Authority(tmp_path)
    cert, key = ca.issue("replica", 55)
    config = tls_config(tmp_path, certFile=cert, keyFile=key, clientCAFile=ca.ca_file)
    assert config.api.tls is not None
    leader = TlsReplica(config, ApiCertificates(config.api.tls))
    follower = TlsReplica(config, ApiCertificates(config.api.tls))
    await leader.start()
    await follower.start()
    try:
        assert leader.service.leading and not follower.service.leading
        context = ssl.create_default_context(cafile=str(ca.ca_file))
        context.load_cert_chain(*ca.issue("cli", 56))
        headers = {"Authorization": f"Bearer {TOKEN}", "X-Request-Id": "fwd-1"}
        body = {"apiVersion": "fedbroker.io/v1alpha1", "kind": "FederatedJob",
                "metadata": {"name": "over-tls"},
                "spec": {"podSets": [{"name": "w", "count": 1, "resources": {
                    "nvidia.com/gpu": 1, "cpu": "1", "memory": "1Gi"}}]}}  # fmt: skip
        with caplog.at_level(logging.INFO):
            async with (
                aiohttp.ClientSession() as session,
                session.post(f"https://{follower.identity}/v1/jobs", json=body, headers=headers,
                             ssl=context) as answer,
            ):  # fmt: skip
                assert answer.status == 201, await answer.text()
                assert answer.headers[FORWARDED_BY] == follower.identity
        assert [j.name for j in await leader.service.store.list_jobs()] == ["over-tls"]
        audits = [json.loads(r.getMessage()) for r in caplog.records if r.name == AUDIT_LOGGER]
        assert [a["requestId"] for a in audits] == ["fwd-1", "fwd-1"]  # leader, then follower
        assert [a["result"] for a in audits] == [201, 201]
    finally:
        await follower.close()
        await leader.close()
