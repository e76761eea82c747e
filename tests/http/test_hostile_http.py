"""Issue 13's HTTP holes: aiohttp's own errors (a malformed request line, a bad method,
headers too large or with control characters, unknown routes, wrong methods) answered as
one-line JSON without echoing the input; ``Server`` without versions; ``nosniff`` and
``Cache-Control: no-store`` on API JSON; deep and odd bodies refused with 4xx."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from test_api import TOKENS, A, Harness, manifest, running

CANARY = TOKENS["admin"]


@pytest.fixture
async def harness(tmp_path: Path) -> AsyncIterator[Harness]:
    async with running(tmp_path) as h:
        yield h


async def _raw(h: Harness, request: bytes) -> tuple[int, dict[str, str], bytes]:
    """Send ``request`` as raw bytes; the status, headers and body of the answer."""
    client = h[0]
    server: Any = client.server
    reader, writer = await asyncio.open_connection(server.host, server.port)
    try:
        writer.write(request)
        await writer.drain()
        head = await reader.readuntil(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ")[1])
        headers = {}
        for line in lines[1:]:
            if ":" in line:
                key, _, value = line.partition(":")
                headers[key.strip().lower()] = value.strip()
        body = await reader.readexactly(int(headers.get("content-length", "0")))
        return status, headers, body
    finally:
        writer.close()


RAW: list[tuple[str, bytes, int, str]] = [
    ("not HTTP at all", b"NOT HTTP AT ALL\r\n\r\n", 400, "method"),
    ("no version", b"GET / HTTP/9\r\n\r\n", 400, "request"),
    ("bad method", b"G(T / HTTP/1.1\r\nHost: x\r\n\r\n", 400, "method"),
    ("control character in a header",
     b"GET /v1/jobs HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + CANARY.encode()
     + b"\x01\r\n\r\n", 400, "malformed"),
    ("header too long",
     b"GET /v1/jobs HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 20_000 + b"\r\n\r\n", 400,
     "too long"),
    ("request line too long", b"GET /" + b"a" * 20_000 + b" HTTP/1.1\r\nHost: x\r\n\r\n", 400,
     "too long"),
]  # fmt: skip


@pytest.mark.parametrize(("request_bytes", "status", "fragment"), [r[1:] for r in RAW],
                         ids=[r[0] for r in RAW])  # fmt: skip
async def test_parser_errors_are_one_line_json(
    harness: Harness, request_bytes: bytes, status: int, fragment: str
) -> None:
    got, headers, body = await _raw(harness, request_bytes)
    assert got == status
    assert headers["content-type"].startswith("application/json")
    assert headers["server"] == "fedbroker"
    error = json.loads(body)["error"]
    assert fragment in error and "\n" not in error
    assert CANARY not in body.decode()


# Malformed raw requests as aiohttp's parser refuses them: the log line each one gets.
LOGGED: list[tuple[str, bytes, str]] = [
    ("Content-Length and Transfer-Encoding together",
     b"POST /v1/jobs HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\nTransfer-Encoding: chunked"
     b"\r\n\r\n0\r\n\r\n", "request: malformed HTTP request"),
    ("1,000 headers",
     b"GET /v1/jobs HTTP/1.1\r\nHost: x\r\n"
     + b"".join(b"X-H%d: v\r\n" % i for i in range(1000)) + b"\r\n",
     "request: malformed HTTP request"),
    ("an over-long line", b"GET /" + b"a" * 20_000 + b" HTTP/1.1\r\nHost: x\r\n\r\n",
     "headers: a request line or header is too long"),
    ("bad header bytes",
     b"GET /v1/jobs HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + CANARY.encode()
     + b"\x01\r\n\r\n", "request: malformed HTTP request"),
    ("a bad chunk", b"POST /v1/jobs HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
     b"zz\r\nabc\r\n0\r\n\r\n", "request: malformed HTTP request"),
]  # fmt: skip


@pytest.mark.parametrize(("request_bytes", "message"), [r[1:] for r in LOGGED],
                         ids=[r[0] for r in LOGGED])  # fmt: skip
async def test_a_malformed_request_is_one_warning_line_without_traceback(
    harness: Harness, caplog: pytest.LogCaptureFixture, request_bytes: bytes, message: str
) -> None:
    with caplog.at_level(logging.DEBUG, logger="aiohttp.server"):
        status, _, body = await _raw(harness, request_bytes)
    assert status == 400 and json.loads(body) == {"error": message}
    [line] = [r for r in caplog.records if r.name == "aiohttp.server"]
    assert line.levelno == logging.WARNING
    assert line.getMessage() == f"malformed request from 127.0.0.1: {message} (400)"
    assert line.exc_info is None and line.exc_text is None and line.stack_info is None


@pytest.mark.parametrize(
    ("method", "path", "status", "fragment"),
    [("GET", "/v2/nothing", 404, "path: no such resource"),
     ("PUT", "/v1/jobs", 405, "method: PUT not allowed"),
     ("PATCH", "/v1/jobs/x", 405, "method: PATCH")],
)  # fmt: skip
async def test_unknown_routes_and_methods_are_json(
    harness: Harness, method: str, path: str, status: int, fragment: str
) -> None:
    client = harness[0]
    resp = await client.request(method, path, headers=A)
    assert resp.status == status
    assert fragment in (await resp.json())["error"]
    assert resp.headers["Server"] == "fedbroker"


@pytest.mark.parametrize("path", ["/v1/jobs", "/v1/queues", "/healthz", "/openapi.json"])
async def test_json_answers_are_not_sniffed_nor_cached(harness: Harness, path: str) -> None:
    resp = await harness[0].get(path, headers=A)
    assert resp.status == 200
    assert resp.headers["X-Content-Type-Options"] == "nosniff"
    assert resp.headers["Cache-Control"] == "no-store"
    assert resp.headers["Server"] == "fedbroker"  # no Python, no aiohttp version


async def test_errors_are_not_cached_either(harness: Harness) -> None:
    resp = await harness[0].get("/v1/jobs")
    assert resp.status == 401
    assert resp.headers["Cache-Control"] == "no-store"
    assert resp.headers["X-Content-Type-Options"] == "nosniff"


def _deep(levels: int) -> dict[str, Any]:
    doc: dict[str, Any] = {}
    for _ in range(levels):
        doc = {"a": doc}
    return doc


BODIES: list[tuple[str, bytes, str]] = [
    ("template 300 deep",
     json.dumps({**manifest("deep"), "spec": {**manifest("deep")["spec"], "podSets": [
         {**manifest("deep")["spec"]["podSets"][0], "template": _deep(300)}]}}).encode(),
     "spec.podSets[0].template"),
    ("lone surrogate", json.dumps(manifest("s\ud800")).encode(), "metadata.name"),
    ("huge number", b'{"apiVersion": 1e999999}', "apiVersion"),
    ("duplicate keys", b'{"kind": "a", "kind": "b"}', "duplicate key"),
    ("a list", b"[1, 2, 3]", "must be a mapping"),
    ("a string", b'"FederatedJob"', "must be a mapping"),
]  # fmt: skip


@pytest.mark.parametrize(("body", "fragment"), [b[1:] for b in BODIES], ids=[b[0] for b in BODIES])
async def test_hostile_bodies_are_400_and_store_nothing(
    harness: Harness, body: bytes, fragment: str
) -> None:
    client, service, _ = harness
    headers = {**A, "Content-Type": "application/json"}
    resp = await client.post("/v1/jobs", data=body, headers=headers)
    assert resp.status == 400, await resp.text()
    assert fragment in (await resp.json())["error"]
    assert await service.store.list_jobs() == []


async def test_a_yaml_key_given_twice_is_400_naming_it_and_stores_nothing(
    harness: Harness,
) -> None:
    client, service, _ = harness
    text = (
        "apiVersion: fedbroker.io/v1alpha1\nkind: FederatedJob\nmetadata: {name: twice}\n"
        "spec:\n  podSets:\n  - name: w\n    count: 1\n    count: 64\n"
    )
    resp = await client.post(
        "/v1/jobs", data=text, headers={**A, "Content-Type": "application/yaml"}
    )
    assert resp.status == 400
    assert (await resp.json())["error"] == (
        'spec.podSets[0]: duplicate key "count" in a YAML mapping (lines 7 and 8)'
    )
    assert await service.store.list_jobs() == []
