"""Static tokens and what they may do: every ``/v1`` route checks its verb (submit, cancel,
read; per queue; viewer; admin) and a 403 names the missing permission; tokens by SHA-256;
header bytes that are no token are 401 over a real socket; SIGHUP swaps the token table."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import hashlib
import logging
import os
import signal
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from builders import Clock
from test_api import manifest

from broker.cli.runtime import serve
from broker.config import load_config, parse_config
from broker.http.app import make_app
from broker.http.auth import allows, reload_tokens
from broker.http.principal import Principal
from broker.service.facade import Service

T = {name: f"{name}-".ljust(40, "x") for name in
     ("team-a", "ci", "ro", "submitter", "canceller", "team-b", "viewer-bot", "admin")}  # fmt: skip
HASHED = "hashed-".ljust(40, "h")
CONFIG = """
store: {{url: "sqlite:///{db}"}}
clusters:
- name: small-a
  source:
    simulated: {{shapes: [{{gpuType: A100, gpus: 8, cpu: "96", memory: 1024Gi, count: 4}}]}}
queues:
- {{name: training, policy: gang}}
- {{name: inference, policy: binpack}}
tenants:
- name: team-a
  defaultQueue: training
  queues: [inference]
  token: {{value: {team-a}}}
  tokens:
  - {{name: ci, value: {ci}, roles: [read, "submit:training"]}}
  - {{name: ro, value: {ro}, roles: [read]}}
  - {{name: submitter, value: {submitter}, roles: [submit]}}
  - {{name: canceller, value: {canceller}, roles: [read, "cancel:inference"]}}
  - {{name: hashed, sha256: {hashed}, roles: [submit, read]}}
- {{name: team-b, defaultQueue: inference, token: {{value: {team-b}}}}}
- name: ops
  defaultQueue: training
  tokens: [{{name: viewer-bot, value: {viewer-bot}, roles: [viewer]}}]
- {{name: admin, defaultQueue: training, admin: true, token: {{value: {admin}}}}}
"""


def config_text(db: Path, **tokens: str) -> str:
    sha = hashlib.sha256(HASHED.encode()).hexdigest()
    return CONFIG.format(db=db, hashed=sha, **{**T, **tokens})


Client = TestClient[Any, Any]


@pytest.fixture
async def client(tmp_path: Path) -> AsyncIterator[Client]:
    config = parse_config(config_text(tmp_path / "jobs.db"), "test config", {})
    service = Service(config, clock=Clock())
    await service.start()
    async with TestClient(TestServer(make_app(service, config))) as test_client:
        yield test_client
    await service.close()


async def call(client: Client, method: str, path: str, who: str, **kw: Any) -> tuple[int, Any]:
    token = T.get(who, who)
    resp = await client.request(method, path, headers={"Authorization": f"Bearer {token}"}, **kw)
    body = await resp.json() if resp.content_type == "application/json" else await resp.text()
    return resp.status, body


ALLOWS: list[tuple[set[str], str, str, str | None, bool]] = [
    # roles of a principal of tenant "a"; verb; on tenant; queue; allowed
    ({"submit", "cancel", "read"}, "cancel", "a", None, True),
    ({"submit", "cancel", "read"}, "read", "b", None, False),  # another tenant
    ({"read"}, "submit", "a", "q", False),
    ({"read"}, "cancel", "a", None, False),
    ({"submit:q"}, "submit", "a", "q", True),
    ({"submit:q"}, "submit", "a", "r", False),
    ({"submit:q"}, "submit", "a", None, False),  # a narrowed role needs the queue
    ({"submit:q"}, "cancel", "a", "q", False),  # narrowed to one verb only
    ({"submit:q"}, "submit", "b", "q", False),  # on its own tenant only
    ({"cancel:q"}, "cancel", "a", "q", True),
    ({"viewer"}, "read", "b", None, True),
    ({"viewer"}, "cancel", "b", None, False),
    ({"viewer"}, "submit", "a", None, False),
    ({"admin"}, "cancel", "b", None, True),
    ({"admin"}, "read", "b", "q", True),
    (set(), "read", "a", None, False),
]  # fmt: skip


@pytest.mark.parametrize(("roles", "verb", "tenant", "queue", "expected"), ALLOWS)
def test_allows(roles: set[str], verb: str, tenant: str, queue: str | None, expected: bool) -> None:
    assert allows(Principal("token:x", "a", frozenset(roles)), verb, tenant, queue) is expected


READ_ROUTES = [
    ("GET", "/v1/jobs"), ("GET", "/v1/jobs/j"), ("GET", "/v1/jobs/j/explain"),
    ("POST", "/v1/plan"), ("GET", "/v1/clusters"), ("GET", "/v1/queues"),
    ("GET", "/v1/pools"), ("GET", "/v1/nodes"), ("GET", "/v1/events"),
]  # fmt: skip


async def test_every_read_route_checks_read(client: Client) -> None:
    status, _ = await call(client, "POST", "/v1/jobs", "submitter", json=manifest("j"))
    assert status == 201
    denied = 'forbidden: token:submitter lacks "read" on tenant team-a'
    for method, path in READ_ROUTES:
        status, body = await call(client, method, path, "submitter", json=manifest("p"))
        assert (status, body) == (403, {"error": denied}), path
        if path != "/v1/events":  # the stream never ends: a reader's is checked below
            status, _ = await call(client, method, path, "ro", json=manifest("p"))
            assert status == 200, path
    # The public routes keep needing no token.
    for path in ("/healthz", "/readyz", "/metrics", "/openapi.json", "/"):
        assert (await client.get(path)).status == 200, path


async def test_a_read_only_token_cannot_submit_or_cancel(client: Client) -> None:
    assert (await call(client, "POST", "/v1/jobs", "team-a", json=manifest("j")))[0] == 201
    status, body = await call(client, "POST", "/v1/jobs", "ro", json=manifest("r"))
    assert (status, body["error"]) == (403, 'forbidden: token:ro lacks "submit" on tenant team-a')
    status, body = await call(client, "DELETE", "/v1/jobs/j", "ro")
    assert (status, body["error"]) == (403, 'forbidden: token:ro lacks "cancel" on tenant team-a')
    status, body = await call(client, "GET", "/v1/jobs", "ro")
    assert status == 200 and [j["metadata"]["name"] for j in body["items"]] == ["j"]
    assert body["items"][0]["status"]["state"] != "Cancelled"
    # Refused before the body is read: garbage from a read-only token is 403, not 400.
    resp = await client.post("/v1/jobs", data=b"{", headers={"Authorization": f"Bearer {T['ro']}"})
    assert resp.status == 403
    async with client.get("/v1/events", headers={"Authorization": f"Bearer {T['ro']}"}) as resp:
        assert resp.status == 200  # a reader may stream


async def test_per_queue_submit_and_cancel(client: Client) -> None:
    assert (await call(client, "POST", "/v1/jobs", "ci", json=manifest("t")))[0] == 201
    elsewhere = manifest("i", gpus=1, queue="inference")
    status, body = await call(client, "POST", "/v1/jobs", "ci", json=elsewhere)
    assert (status, body["error"]) == (
        403, 'forbidden: token:ci lacks "submit" on queue inference of tenant team-a'
    )  # fmt: skip
    assert (await call(client, "POST", "/v1/jobs", "team-a", json=elsewhere))[0] == 201
    status, body = await call(client, "DELETE", "/v1/jobs/t", "canceller")
    assert (status, body["error"]) == (
        403, 'forbidden: token:canceller lacks "cancel" on queue training of tenant team-a'
    )  # fmt: skip
    status, body = await call(client, "DELETE", "/v1/jobs/i", "canceller")
    assert status == 200 and body["status"]["state"] == "Cancelled"
    status, body = await call(client, "DELETE", "/v1/jobs/nope", "canceller")
    assert status == 404


async def test_viewer_reads_every_tenant_and_changes_nothing(client: Client) -> None:
    assert (await call(client, "POST", "/v1/jobs", "team-a", json=manifest("a1")))[0] == 201
    b1 = manifest("b1", gpus=1)
    assert (await call(client, "POST", "/v1/jobs", "team-b", json=b1))[0] == 201
    status, body = await call(client, "GET", "/v1/jobs", "viewer-bot")
    assert status == 200
    assert sorted(j["metadata"]["namespace"] for j in body["items"]) == ["team-a", "team-b"]
    status, body = await call(client, "GET", "/v1/jobs?tenant=team-b", "viewer-bot")
    assert [j["metadata"]["name"] for j in body["items"]] == ["b1"]
    assert (await call(client, "GET", "/v1/jobs/b1?tenant=team-b", "viewer-bot"))[0] == 200
    status, body = await call(client, "DELETE", "/v1/jobs/b1?tenant=team-b", "viewer-bot")
    assert (status, body["error"]) == (
        403, 'forbidden: token:viewer-bot lacks "cancel" on tenant team-b'
    )  # fmt: skip
    status, body = await call(client, "POST", "/v1/jobs", "viewer-bot", json=manifest("v"))
    assert (status, body["error"]) == (
        403, 'forbidden: token:viewer-bot lacks "submit" on tenant ops'
    )  # fmt: skip
    # A tenant's own token still cannot look into another tenant (404, as before).
    assert (await call(client, "GET", "/v1/jobs/b1?tenant=team-b", "team-a"))[0] == 404
    status, body = await call(client, "DELETE", "/v1/jobs/b1?tenant=team-b", "admin")
    assert status == 200 and body["status"]["state"] == "Cancelled"


async def test_a_token_given_as_its_sha256(client: Client) -> None:
    status, body = await call(client, "POST", "/v1/jobs", HASHED, json=manifest("h"))
    assert status == 201 and body["metadata"]["namespace"] == "team-a"
    assert (await call(client, "GET", "/v1/jobs", HASHED[:-1] + "H"))[0] == 401


async def raw_get(port: int, authorization: bytes) -> tuple[int, bytes]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(b"GET /v1/jobs HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                     b"Authorization: " + authorization + b"\r\n\r\n")  # fmt: skip
        await writer.drain()
        answer = await reader.read()
    finally:
        writer.close()
    head, _, body = answer.partition(b"\r\n\r\n")
    return int(head.split(b" ")[1]), body


async def test_header_bytes_that_are_no_token_are_401_over_a_real_socket(client: Client) -> None:
    port = client.server.port
    assert port is not None
    token = T["team-a"].encode()
    # What reaches the handler (aiohttp decodes bytes as UTF-8, the rest as surrogates).
    for raw in (b"Bearer \xff\xfe", b"Bearer " + token + b"\xff", b"Bearer \xe2\x82\xac",
                b"Bearer a\tb", b"Bearer " + token + b" x", b"Bearer", b"bearer  ",
                b"Basic " + token, b"\xff\xfe " + token):  # fmt: skip
        status, body = await raw_get(port, raw)
        assert (status, body) == (
            401, b'{"error": "Authorization: missing or invalid bearer token"}'
        ), raw  # fmt: skip
    # Control characters never reach a handler (aiohttp's parser refuses them): no 5xx.
    for raw in (b"Bearer " + token + b"\x01", b"Bearer \x00", b"Bearer \x1b[31m"):
        status, _ = await raw_get(port, raw)
        assert 400 <= status < 500, raw
    assert (await raw_get(port, b"Bearer " + token))[0] == 200


async def test_reload_swaps_the_tokens_and_a_bad_file_keeps_them(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path, db = tmp_path / "broker.yaml", tmp_path / "jobs.db"
    path.write_text(config_text(db))
    config = load_config(path, {})
    service = Service(config, clock=Clock())
    await service.start()
    app = make_app(service, config)
    new = "rotated-".ljust(40, "r")
    async with TestClient(TestServer(app)) as client:
        assert (await call(client, "GET", "/v1/jobs", "ci"))[0] == 200
        path.write_text(config_text(db, ci=new))
        caplog.set_level(logging.INFO, "broker.http.auth")
        assert reload_tokens(app, path) == 9
        assert (await call(client, "GET", "/v1/jobs", "ci"))[0] == 401
        assert (await call(client, "GET", "/v1/jobs", new))[0] == 200
        assert "reloaded 9 tokens" in caplog.messages
        # A short token in the file: refused with one line naming the key, old table kept.
        path.write_text(config_text(db, ci="short-token"))
        assert reload_tokens(app, path) is None
        [error] = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
        assert error == (
            f"tokens not reloaded, the old ones stay: {path}: tenants[0].tokens[0].value: "
            "token shorter than 32 characters (or give sha256)"
        )
        assert (await call(client, "GET", "/v1/jobs", new))[0] == 200
        # Adding a tenant needs a restart; the old tokens stay.
        path.write_text(config_text(db).replace("- name: ops", "- name: ops2"))
        assert reload_tokens(app, path) is None
        assert (await call(client, "GET", "/v1/jobs", new))[0] == 200
        for text in caplog.messages:
            assert all(token not in text for token in (*T.values(), new, "short-token"))
    await service.close()


class _Seen(logging.Handler):
    """Sets an event when a log message starting with ``prefix`` is emitted."""

    def __init__(self, prefix: str) -> None:
        super().__init__()
        self.prefix, self.event = prefix, asyncio.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if record.getMessage().startswith(self.prefix):
            self.event.set()


async def _status(session: aiohttp.ClientSession, url: str, token: str) -> int:
    async with session.get(f"{url}/v1/jobs", headers={"Authorization": f"Bearer {token}"}) as r:
        return r.status


async def test_a_real_sighup_reloads_the_running_broker(tmp_path: Path) -> None:
    path, db = tmp_path / "broker.yaml", tmp_path / "jobs.db"
    path.write_text(config_text(db))
    listening: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    running = asyncio.create_task(
        serve(load_config(path, {}), host="127.0.0.1", port=0, config_path=path,
              on_listening=listening.set_result)
    )  # fmt: skip
    seen = _Seen("reloaded ")
    logger = logging.getLogger("broker.http.auth")
    level = logger.level
    logger.addHandler(seen)
    logger.setLevel(logging.INFO)
    new = "after-sighup-".ljust(40, "s")
    try:
        url = await asyncio.wait_for(listening, 30)
        async with aiohttp.ClientSession() as session:
            assert await _status(session, url, T["ci"]) == 200
            path.write_text(config_text(db, ci=new))
            # serve handles SIGHUP (else the default action would end the test run).
            assert signal.getsignal(signal.SIGHUP) not in (signal.SIG_DFL, signal.SIG_IGN)
            os.kill(os.getpid(), signal.SIGHUP)
            await asyncio.wait_for(seen.event.wait(), 10)
            assert await _status(session, url, T["ci"]) == 401
            assert await _status(session, url, new) == 200
        os.kill(os.getpid(), signal.SIGTERM)
        assert await asyncio.wait_for(running, 30) == 0
    finally:
        logger.removeHandler(seen)
        logger.setLevel(level)
        if not running.done():
            running.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await running
        gc.unfreeze()  # serve froze the heap for its own sake


def test_the_app_exposes_no_token_table_in_its_repr(tmp_path: Path) -> None:
    config = parse_config(config_text(tmp_path / "jobs.db"), "test config", {})
    shown = repr(config.tokens) + repr(config) + repr(web.Application())
    assert all(token not in shown for token in T.values())
