"""The process's logging (broker/cli/logs.py): secrets redacted from every field of every
record, the access log without header values, the audit trail's destination, and the
canary: a tenant token sent in malformed requests over raw sockets appears in no output.

The canary test runs the real API the way ``serve`` does (AppRunner with the access log
format, on 127.0.0.1) with the real handlers installed by ``configure_logging``; what they
write (capfd), every record (caplog, re-added after them, formatted again here) and every
raw HTTP answer are searched for the token."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import sys
import traceback
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from hypothesis import given
from hypothesis import strategies as st

from broker.cli.logs import (
    ACCESS_LOG_FORMAT,
    JsonFormatter,
    Redactor,
    configure_logging,
    remember_secrets,
    secrets_of,
)
from broker.config import parse_config
from broker.http.app import make_app
from broker.service.facade import Service

CANARY = "canary-7f3a9c2e1b8d4f6a0c5e9b2d7a1f3c8e"
OTHER = "other-tenant-token-0123456789abcdef0123"
CONFIG = f"""
store: {{url: "sqlite:///{{db}}"}}
clusters:
- name: small
  source:
    simulated: {{shapes: [{{gpuType: A100, gpus: 8, cpu: "96", memory: 1024Gi, count: 1}}]}}
queues: [{{name: training}}]
tenants:
- {{name: canary, defaultQueue: training, token: {{value: {CANARY}}}}}
- {{name: other, defaultQueue: training, token: {{env: OTHER_TOKEN}}}}
"""


def record(msg: str, *args: object, **extra: Any) -> logging.LogRecord:
    made = logging.LogRecord("aiohttp.server", logging.ERROR, __file__, 1, msg, args, None)
    made.__dict__.update(extra)
    return made


def everything(rec: logging.LogRecord) -> str:
    """All a handler could show of a record: formatted both ways, and every attribute."""
    text = logging.Formatter().format(rec) + JsonFormatter().format(rec)
    if rec.exc_info and rec.exc_info[1] is not None:
        text += "".join(traceback.format_exception(rec.exc_info[1]))
    return text + repr(rec.__dict__)


def raised(text: str) -> Any:
    try:
        raise ValueError(text)
    except ValueError:
        return sys.exc_info()


def raised_codec() -> Any:
    try:
        f"Bearer {CANARY}\udcff".encode()
    except UnicodeEncodeError:
        return sys.exc_info()
    raise AssertionError("encoded")


REDACT = Redactor([CANARY])
CASES = [
    ("message", lambda: record(f"got {CANARY}")),
    ("args", lambda: record("header %s", f"Authorization: Bearer {CANARY}\x01")),
    ("mapping args", lambda: record("%(header)s", {"header": CANARY, "unused": CANARY})),
    ("exception args", lambda: _with(record("x"), exc_info=raised_codec())),
    ("bearer of an unknown token", lambda: record("Authorization: Bearer eyJhbGciOi.xyz.abc")),
    ("exception", lambda: _with(record("bad request"), exc_info=raised(f"b'X: {CANARY}\\x01'"))),
    ("exc_text", lambda: _with(record("bad request"), exc_text=f"Traceback: {CANARY}")),
    ("stack", lambda: _with(record("here"), stack_info=f"Stack (most recent call last): {CANARY}")),
    ("extra str", lambda: record("access", first_request_line=f"GET /?token={CANARY} HTTP/1.1")),
    ("extra dict", lambda: record("access", request_header={"Authorization": f"Bearer {CANARY}"})),
    ("extra list", lambda: record("x", tokens=[("a", CANARY)])),
    ("extra object", lambda: record("x", thing=ValueError(CANARY))),
    ("token= in a query", lambda: record("GET /v1/jobs?access_token=s3cr3t-value HTTP/1.1")),
    ("json password", lambda: record('{"password": "hunter2hunter2"}')),
]


def _with(rec: logging.LogRecord, **fields: Any) -> logging.LogRecord:
    rec.__dict__.update(fields)
    return rec


@pytest.mark.parametrize("make", [c[1] for c in CASES], ids=[c[0] for c in CASES])
def test_every_field_is_redacted(make: Any) -> None:
    rec = make()
    before = everything(rec)
    assert REDACT.filter(rec) is True  # redacted, never dropped
    after = everything(rec)
    assert after != before
    for secret in (CANARY, "eyJhbGciOi", "s3cr3t-value", "hunter2hunter2"):
        assert secret not in after
    assert "***" in after


@given(
    st.lists(st.text(min_size=4, max_size=40), min_size=1, max_size=3),
    st.text(max_size=60),
    st.text(max_size=60),
)
def test_a_known_secret_never_survives(secrets: list[str], before: str, after: str) -> None:
    redactor = Redactor(secrets)
    text = before + "".join(s + before for s in secrets) + after
    cleaned = redactor.redact(text)
    assert all(s not in cleaned for s in secrets)
    assert redactor.redact(cleaned) == cleaned


def test_secrets_remembered_later_are_redacted_too() -> None:
    redactor = Redactor(["first-secret"])
    redactor.remember(["second-secret", "abc"])  # too short to search for: ignored
    assert redactor.redact("first-secret second-secret abc") == "*** *** abc"


def test_an_ordinary_record_is_left_alone() -> None:
    rec = record("job %s/%s created", "team-a", "train", task="scheduler")
    rec.exc_info = raised("store unavailable")
    REDACT.filter(rec)
    assert rec.getMessage() == "job team-a/train created"
    assert rec.exc_info is not None and rec.__dict__["task"] == "scheduler"
    subject = record("audit", actor={"subject": "token:team-a"})
    REDACT.filter(subject)
    assert subject.__dict__["actor"] == {"subject": "token:team-a"}  # not a token


def test_secrets_of_the_config_inline_and_from_the_environment(tmp_path: Path) -> None:
    text = CONFIG.replace("{db}", str(tmp_path / "x.db"))
    config = parse_config(text, "test config", environ={"OTHER_TOKEN": OTHER})
    found = secrets_of(config, {"OTHER_TOKEN": OTHER})
    assert CANARY in found and OTHER in found
    pg = parse_config(
        text.replace(f"sqlite:///{tmp_path / 'x.db'}", "postgresql://u:pg-pass-123@db/x"),
        "test config", environ={"OTHER_TOKEN": OTHER},
    )  # fmt: skip
    assert "pg-pass-123" in secrets_of(pg, {"OTHER_TOKEN": OTHER})


def test_the_audit_trail_goes_to_its_file(tmp_path: Path, real_logging: None) -> None:
    path = tmp_path / "audit.log"
    configure_logging(secrets=[CANARY], audit_file=str(path))
    logging.getLogger("fedbroker.audit").info(json.dumps({"action": "submit", "t": CANARY}))
    logging.getLogger("fedbroker.audit").handlers[0].flush()
    [line] = path.read_text().splitlines()
    assert json.loads(line) == {"action": "submit", "t": "***"}


def test_a_reloaded_files_secrets_are_redacted_from_then_on(
    tmp_path: Path, real_logging: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OTHER_TOKEN", OTHER)  # as the reloaded process's environment has it
    path = tmp_path / "audit.log"
    configure_logging(secrets=[], audit_file=str(path))
    text = CONFIG.replace("{db}", str(tmp_path / "x.db"))
    remember_secrets(parse_config(text, "test config", environ={"OTHER_TOKEN": OTHER}))
    audit = logging.getLogger("fedbroker.audit")
    audit.info(json.dumps({"t": CANARY, "u": OTHER}))  # no "Bearer " before them
    audit.handlers[0].flush()
    [line] = path.read_text().splitlines()
    assert json.loads(line) == {"t": "***", "u": "***"}


async def _raw(port: int, request: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(request)
        await writer.drain()
        return await asyncio.wait_for(reader.read(), timeout=10)
    except ConnectionError:
        return b""
    finally:
        writer.close()


HEAD = b"GET /v1/jobs HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
TOKEN = CANARY.encode()
MALFORMED = [
    HEAD + b"Authorization: Bearer " + TOKEN + b"\x01\r\n\r\n",  # control character
    HEAD + b"Authorization: Bearer " + TOKEN + b"\x7f\r\n\r\n",
    HEAD + b"Authorization: " + TOKEN + b"\x00\r\n\r\n",  # no scheme, NUL
    HEAD + b"X-Forwarded-Token: " + TOKEN + b"\x1b[31m\r\n\r\n",  # any header
    HEAD + b"Authorization: Bearer " + TOKEN + b"\xff\xfe\r\n\r\n",  # invalid UTF-8
    HEAD + b"Authorization: Bearer \xc3\x28" + TOKEN + b"\r\n\r\n",
    HEAD + b"Authorization: Bearer " + TOKEN + b"a" * 9000 + b"\r\n\r\n",  # > 8 KiB
    HEAD + b"X-Big: " + TOKEN + b"b" * 9000 + b"\r\n\r\n",
    b"GET /v1/jobs?token=" + TOKEN + b"\x01 HTTP/1.1\r\nHost: x\r\n\r\n",  # request line
    b"GET /v1/jobs?token=" + TOKEN + b" HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    b"GET /" + TOKEN + b"c" * 9000 + b" HTTP/1.1\r\nHost: x\r\n\r\n",
    HEAD + b"Authorization: Bearer " + TOKEN + b"\r\n\r\n",  # well-formed: accepted
    b"POST /v1/jobs HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: 2\r\n"
    b"Content-Type: application/json\r\nAuthorization: Bearer " + TOKEN + b"\r\n\r\n{}",
]


async def test_the_canary_token_appears_in_no_output(
    tmp_path: Path,
    real_logging: None,
    caplog: pytest.LogCaptureFixture,
    capfd: pytest.CaptureFixture[str],
) -> None:
    config = parse_config(
        CONFIG.replace("{db}", str(tmp_path / "jobs.db")), "test config",
        environ={"OTHER_TOKEN": OTHER},
    )  # fmt: skip
    configure_logging(logging.DEBUG, secrets=secrets_of(config, {"OTHER_TOKEN": OTHER}))
    for name in ("", "fedbroker.audit"):  # caplog sees records after the real handlers
        logging.getLogger(name).addHandler(caplog.handler)
    service = Service(config)
    await service.start()
    runner = web.AppRunner(make_app(service, config), access_log_format=ACCESS_LOG_FORMAT)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        port = int(runner.addresses[0][1])
        answers = [await _raw(port, raw) for raw in MALFORMED]
    finally:
        await runner.cleanup()
        await service.close()
    out, err = capfd.readouterr()
    for answer in answers:
        assert TOKEN not in answer
    assert CANARY not in out + err
    for rec in caplog.records:
        assert CANARY not in everything(rec), rec.name
    # The paths that could leak were taken: aiohttp's server refused the malformed
    # requests (one line each, without the exception that holds the raw header), the
    # access log saw the requests, the submit was audited.
    server_lines = [r for r in caplog.records if r.name == "aiohttp.server"]
    # One each for the eight the parser refuses (not the well-formed three, nor the two
    # whose header bytes are no UTF-8: the parser passes them on undecoded, and the
    # broker finds no token in them).
    assert len(server_lines) == 8
    assert all(r.exc_info is None and r.exc_text is None for r in server_lines)
    assert all(r.getMessage().startswith("malformed request from ") for r in server_lines)
    assert sum(r.name == "aiohttp.access" for r in caplog.records) >= len(MALFORMED) - 2
    assert any(r.name == "fedbroker.audit" for r in caplog.records)
    assert b"200 OK" in answers[-2]


def test_the_access_log_format_has_no_request_headers() -> None:
    assert "i}" not in ACCESS_LOG_FORMAT  # %{Header}i: a request header's value
    assert "%{X-Request-Id}o" in ACCESS_LOG_FORMAT


def test_json_lines_carry_the_redacted_exception() -> None:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter())
    handler.addFilter(Redactor([CANARY]))
    logger = logging.getLogger("test.logs.json")
    logger.addHandler(handler)
    logger.propagate = False
    try:
        try:
            raise RuntimeError(f"Authorization: Bearer {CANARY}")
        except RuntimeError:
            logger.exception("failed")
    finally:
        logger.removeHandler(handler)
    doc = json.loads(stream.getvalue())
    assert doc["msg"] == "failed" and "Bearer ***" in doc["exc"]
    assert CANARY not in stream.getvalue()
