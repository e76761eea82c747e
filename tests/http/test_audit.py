"""The audit trail (broker/http/audit.py) over the real API: exactly one line on the
``fedbroker.audit`` logger per submit, cancel, denied request (401, 403, 429) and admin
action, with its actor; none for a tenant's plain read; request ids taken when safe, made
otherwise, and echoed. The rate limiter's clock is frozen, so the 429 needs no waiting."""

from __future__ import annotations

import json
import logging
import re
from collections.abc import AsyncIterator, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer
from hypothesis import given
from hypothesis import strategies as st

from broker.config import parse_config
from broker.http.app import make_app
from broker.http.audit import AUDIT_LOGGER, action_of, audited, request_id, rfc3339
from broker.service.facade import Service

TOKEN_A = "audit-team-a-token-0123456789abcdef01"
TOKEN_ADMIN = "audit-admin-token-0123456789abcdef012"
TOKEN_VIEWER = "audit-viewer-token-0123456789abcdef01"
A = {"Authorization": f"Bearer {TOKEN_A}"}
ADMIN = {"Authorization": f"Bearer {TOKEN_ADMIN}"}
VIEWER = {"Authorization": f"Bearer {TOKEN_VIEWER}"}
CONFIG = f"""
store: {{url: "sqlite:///{{db}}"}}
api: {{rateLimitPerTenant: {{requestsPerSecond: 1, burst: 6}}}}
clusters:
- name: small
  source:
    simulated: {{shapes: [{{gpuType: A100, gpus: 8, cpu: "96", memory: 1024Gi, count: 2}}]}}
queues: [{{name: training}}, {{name: private}}]
tenants:
- {{name: team-a, defaultQueue: training, token: {{value: {TOKEN_A}}}}}
- {{name: ops, defaultQueue: training, admin: true, token: {{value: {TOKEN_ADMIN}}}}}
- {{name: watch, defaultQueue: training,
   tokens: [{{name: viewer, value: {TOKEN_VIEWER}, roles: [viewer]}}]}}
"""
FIELDS = {"ts", "actor", "tenant", "targetTenant", "roles", "action", "job", "queue", "result",
          "source", "requestId"}  # fmt: skip


def job(name: str, queue: str = "training") -> dict[str, Any]:
    return {
        "apiVersion": "fedbroker.io/v1alpha1",
        "kind": "FederatedJob",
        "metadata": {"name": name},
        "spec": {"queue": queue, "podSets": [
            {"name": "w", "count": 1, "resources": {"nvidia.com/gpu": 1, "cpu": "1",
                                                     "memory": "1Gi"}}]},
    }  # fmt: skip


class Lines(logging.Handler):
    """What the audit logger writes, as parsed JSON lines."""

    def __init__(self) -> None:
        super().__init__()
        self.lines: list[dict[str, Any]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(json.loads(record.getMessage()))

    def take(self) -> list[dict[str, Any]]:
        taken, self.lines = self.lines, []
        return taken


@pytest.fixture
def audit_lines() -> Iterator[Lines]:
    handler = Lines()
    logger = logging.getLogger(AUDIT_LOGGER)
    logger.addHandler(handler)
    level = logger.level
    logger.setLevel(logging.INFO)
    yield handler
    logger.removeHandler(handler)
    logger.setLevel(level)


Client = TestClient[Any, Any]


@pytest.fixture
async def client(tmp_path: Path) -> AsyncIterator[Client]:
    config = parse_config(CONFIG.replace("{db}", str(tmp_path / "jobs.db")), "test config")
    service = Service(config)
    await service.start()
    app = make_app(service, config, clock=lambda: 0.0)  # frozen: the bucket never refills
    async with TestClient(TestServer(app)) as test_client:
        yield test_client
    await service.launches_done(timeout=10)
    await service.close()


def only(lines: list[dict[str, Any]]) -> dict[str, Any]:
    assert len(lines) == 1, lines
    [line] = lines
    assert set(line) == FIELDS
    assert datetime.fromisoformat(line["ts"]).utcoffset() is not None
    assert line["ts"].endswith("Z")
    assert line["source"] == "127.0.0.1"
    return line


async def test_submit_and_cancel_write_one_line_each_with_the_actor(
    client: Client, audit_lines: Lines
) -> None:
    answer = await client.post("/v1/jobs", json=job("train"), headers={**A, "X-Request-Id": "r-1"})
    assert answer.status == 201
    assert answer.headers["X-Request-Id"] == "r-1"
    line = only(audit_lines.take())
    assert line["actor"] == {"subject": "token:team-a", "tenant": "team-a"}
    assert "submit" in line["roles"]
    assert (line["action"], line["job"], line["tenant"], line["targetTenant"]) == (
        "submit", "train", "team-a", None,
    )  # fmt: skip
    assert line["queue"] == "training"
    assert (line["result"], line["requestId"]) == (201, "r-1")

    assert (await client.post("/v1/jobs", json=job("train"), headers=A)).status == 200
    assert only(audit_lines.take())["result"] == 200  # a resubmission is a write too

    assert (await client.delete("/v1/jobs/train", headers=A)).status == 200
    line = only(audit_lines.take())
    assert (line["action"], line["job"], line["queue"], line["result"]) == (
        "cancel", "train", "training", 200,
    )  # fmt: skip

    assert (await client.get("/v1/jobs/train", headers=A)).status == 200
    assert (await client.get("/v1/clusters", headers=A)).status == 200
    assert audit_lines.take() == []  # a tenant's own reads are not audited


async def test_denied_requests_write_one_line_each(client: Client, audit_lines: Lines) -> None:
    answer = await client.get("/v1/jobs/secret", headers={"Authorization": "Bearer wrong"})
    assert answer.status == 401
    line = only(audit_lines.take())
    assert line["actor"] == {"subject": "anonymous", "tenant": None}
    assert (line["roles"], line["action"], line["job"], line["result"]) == (
        [],
        "get",
        "secret",
        401,
    )
    assert "wrong" not in json.dumps(line)

    assert (await client.post("/v1/jobs", json=job("x"))).status == 401
    assert only(audit_lines.take())["action"] == "submit"

    answer = await client.post("/v1/jobs", json=job("sneaky", queue="private"), headers=A)
    assert answer.status == 403
    line = only(audit_lines.take())
    assert (line["actor"]["tenant"], line["action"], line["result"]) == ("team-a", "submit", 403)

    statuses = [(await client.get("/v1/queues", headers=A)).status for _ in range(6)]
    assert statuses[-1] == 429
    lines = audit_lines.take()
    assert [x["result"] for x in lines] == [429] * statuses.count(429)
    assert lines[0]["actor"]["subject"] == "token:team-a"


async def test_admin_actions_are_audited(client: Client, audit_lines: Lines) -> None:
    assert (await client.post("/v1/jobs", json=job("theirs"), headers=A)).status == 201
    audit_lines.take()
    assert (await client.get("/v1/jobs", headers=ADMIN)).status == 200
    line = only(audit_lines.take())
    assert (line["actor"]["subject"], line["action"], line["roles"]) == (
        "token:ops", "list", ["admin"],
    )  # fmt: skip
    answer = await client.delete("/v1/jobs/theirs?tenant=team-a", headers=ADMIN)
    assert answer.status == 200
    line = only(audit_lines.take())
    assert (line["action"], line["job"], line["tenant"], line["targetTenant"]) == (
        "cancel", "theirs", "ops", "team-a",
    )  # fmt: skip
    assert line["actor"]["tenant"] == "ops"


async def test_every_answer_has_a_request_id(client: Client, audit_lines: Lines) -> None:
    made = await client.get("/healthz", headers={"X-Request-Id": "bad id\twith spaces"})
    rid = made.headers["X-Request-Id"]
    assert re.fullmatch(r"[0-9a-f]{32}", rid)
    other = await client.get("/healthz")
    assert other.headers["X-Request-Id"] != rid
    missing = await client.get("/no/such/path")
    assert missing.status == 404 and "X-Request-Id" in missing.headers
    assert audit_lines.take() == []


@pytest.mark.parametrize(
    ("given_id", "kept"),
    [("abc-123", True), ("a.b:c_d", True), ("x" * 128, True), ("x" * 129, False), ("", False),
     ("a b", False), ("a\nb", False), ("ünïcode", False), ("a;b", False), (None, False)],
)  # fmt: skip
def test_request_id_is_kept_only_when_short_and_safe(given_id: str | None, kept: bool) -> None:
    assert (request_id(given_id) == given_id) is kept


@given(st.text(max_size=300))
def test_a_request_id_is_always_short_and_safe(text: str) -> None:
    assert re.fullmatch(r"[A-Za-z0-9._:-]{1,128}", request_id(text))


@pytest.mark.parametrize(
    ("method", "route", "status", "roles", "expected"),
    [("POST", "/v1/jobs", 201, frozenset({"submit"}), True),
     ("DELETE", "/v1/jobs/{name}", 404, frozenset({"cancel"}), True),
     ("POST", "/v1/plan", 200, frozenset({"submit"}), False),
     ("POST", "/v1/plan", 403, frozenset({"read"}), True),
     ("GET", "/v1/jobs", 200, frozenset({"read"}), False),
     ("GET", "/v1/jobs", 200, frozenset({"admin"}), True),
     ("GET", "/healthz", 200, frozenset({"admin"}), False),
     ("GET", "/metrics", 401, frozenset(), True),
     ("GET", "/v1/events", 429, frozenset({"read"}), True),
     ("GET", "unmatched", 404, frozenset(), False)],
)  # fmt: skip
def test_what_is_audited(
    method: str, route: str, status: int, roles: frozenset[str], expected: bool
) -> None:
    assert audited(method, route, status, roles) is expected


def test_actions_and_timestamps() -> None:
    assert action_of("POST", "/v1/jobs") == "submit"
    assert action_of("DELETE", "/v1/jobs/{name}") == "cancel"
    assert action_of("PUT", "/v1/admin/thing") == "PUT /v1/admin/thing"
    assert rfc3339(0.0) == "1970-01-01T00:00:00.000Z"
    assert rfc3339(1_700_000_000.5) == "2023-11-14T22:13:20.500Z"


# (who, method, path, status): the caller's tenant and the other tenant it acted on.
TENANTS: list[tuple[str, dict[str, str], str, str, int, str | None, str | None]] = [
    ("a tenant's own submit", A, "POST", "/v1/jobs", 201, "team-a", None),
    ("a tenant's ?tenant= is ignored", A, "DELETE", "/v1/jobs/none?tenant=ops", 404,
     "team-a", None),
    ("an admin cancels another's job", ADMIN, "DELETE", "/v1/jobs/theirs?tenant=team-a", 200,
     "ops", "team-a"),
    ("an admin reads another's job", ADMIN, "GET", "/v1/jobs/theirs?tenant=team-a", 200,
     "ops", "team-a"),
    ("an admin explains another's job", ADMIN, "GET", "/v1/jobs/theirs/explain?tenant=team-a",
     200, "ops", "team-a"),
    ("an admin lists another's jobs", ADMIN, "GET", "/v1/jobs?tenant=team-a", 200,
     "ops", "team-a"),
    ("an admin lists every tenant's", ADMIN, "GET", "/v1/jobs", 200, "ops", None),
    ("an admin names its own", ADMIN, "GET", "/v1/jobs?tenant=ops", 200, "ops", None),
    ("a viewer's write, refused", VIEWER, "DELETE", "/v1/jobs/theirs?tenant=team-a", 403,
     "watch", "team-a"),
    ("anonymous", {}, "GET", "/v1/jobs/theirs?tenant=team-a", 401, None, None),
]  # fmt: skip


@pytest.mark.parametrize(
    ("headers", "method", "path", "status", "tenant", "target"),
    [t[1:] for t in TENANTS], ids=[t[0] for t in TENANTS],
)  # fmt: skip
async def test_the_line_names_the_callers_tenant_and_the_other_one_it_acted_on(
    client: Client,
    audit_lines: Lines,
    headers: dict[str, str],
    method: str,
    path: str,
    status: int,
    tenant: str | None,
    target: str | None,
) -> None:
    assert (await client.post("/v1/jobs", json=job("theirs"), headers=A)).status == 201
    audit_lines.take()
    body = job("mine") if method == "POST" else None
    answer = await client.request(method, path, json=body, headers=headers)
    assert answer.status == status
    line = only(audit_lines.take())
    assert (line["tenant"], line["actor"]["tenant"], line["targetTenant"]) == (
        tenant, tenant, target,
    )  # fmt: skip
