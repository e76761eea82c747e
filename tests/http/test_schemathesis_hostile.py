"""schemathesis against the live API with hostile requests added (issue 13, acceptance 6):
every generated case is sent again with a hostile header (control characters, invalid
UTF-8, oversized, in the token or elsewhere) and, for the operations with a body, a body
nested up to hundreds of levels deep or raw bytes no parser can read. Checked: never a
response >= 500, every error one-line JSON, and the token never echoed."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.core.result import Ok
from test_api import manifest
from test_openapi import TOKEN, LiveServer

from broker.http.openapi import openapi_document

CANARY = TOKEN["Authorization"].removeprefix("Bearer ")
_CONTROL = st.sampled_from([chr(c) for c in [*range(0, 9), *range(11, 13), *range(14, 32), 127]])
HOSTILE_HEADERS = st.one_of(
    st.builds(lambda c: ("Authorization", f"Bearer {CANARY}{c}"), _CONTROL),
    st.builds(lambda c: ("Authorization", f"Bearer {c}{CANARY}"), _CONTROL),
    st.just(("X-Token", b"Bearer \xff\xfe" + CANARY.encode())),
    st.just(("Authorization", "Bearer " + CANARY + "x" * 10_000)),
    st.builds(lambda n: ("X-Padding", "p" * n), st.integers(8_000, 70_000)),
    st.builds(lambda c: ("Content-Type", f"application/json{c}"), _CONTROL),
    st.just(("Accept", b"\xc3\x28 text/html")),
    st.builds(lambda c: (f"X-Odd{c}Name", "v"), _CONTROL.filter(lambda c: c not in "\x00\t")),
)


def _deep(levels: int, kind: str) -> Any:
    inner: Any = {}
    for _ in range(levels):
        inner = {"a": inner} if kind == "object" else [inner]
    return inner


DEEP_BODIES = st.one_of(
    st.builds(
        lambda n, k: json.dumps(
            {**manifest("deep"), "spec": {"podSets": [{"name": "w", "count": 1,
             "resources": {}, "template": _deep(n, k)}]}}
        ).encode(),
        st.integers(60, 900), st.sampled_from(["object", "list"]),
    ),
    st.builds(lambda n: b"[" * n, st.integers(1_000, 200_000)),
    st.builds(lambda n: b"a:\n" + b"  " * n + b"b: 1\n", st.integers(100, 2_000)),
    st.builds(lambda n: ("- " * n).encode() + b"x\n", st.integers(100, 5_000)),
    st.just(b'{"apiVersion": ' + b"9" * 5000 + b"}"),
    st.just(json.dumps(manifest("s\ud800")).encode()),
)  # fmt: skip


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with LiveServer(tmp_path_factory.mktemp("hostile")) as url:
        yield url


def _check(response: requests.Response) -> None:
    assert response.status_code < 500, (response.status_code, response.text[:300])
    assert CANARY not in response.text
    if response.status_code >= 400:
        assert response.headers["Content-Type"].startswith("application/json")
        error = response.json()["error"]
        assert isinstance(error, str) and "\n" not in error


def _send(session: requests.Session, case: Any, live: str, header: tuple[str, Any]) -> None:
    headers = {**dict(case.headers or {}), **TOKEN}
    headers[header[0]] = header[1]
    kwargs = case.as_transport_kwargs(base_url=live, headers=headers)
    kwargs.pop("headers", None)
    try:
        response = session.request(**kwargs, headers=headers, timeout=30)
    except requests.exceptions.ConnectionError:
        return  # the server closed a connection it could not parse: refused, not broken
    _check(response)


def test_a_token_of_invalid_utf8_is_401_not_500(live: str) -> None:
    headers = {"Authorization": b"Bearer \xff\xfe" + CANARY.encode()}
    response = requests.get(live + "/v1/clusters", headers=headers, timeout=30)
    _check(response)
    assert response.status_code == 401


def test_hostile_headers_and_deep_bodies_never_get_5xx(live: str) -> None:
    schema = schemathesis.openapi.from_dict(openapi_document())
    operations = [
        op
        for op in (result.ok() for result in schema.get_all_operations() if isinstance(result, Ok))
        if op.path != "/v1/events"
    ]
    cases = st.one_of([
        op.as_strategy(generation_mode=mode, headers=dict(TOKEN))
        for op in operations
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE)
    ])  # fmt: skip
    session = requests.Session()

    @settings(
        max_examples=300,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
        derandomize=True,
    )
    @given(case=cases, header=HOSTILE_HEADERS, body=DEEP_BODIES, kind=st.sampled_from(
        ["json", "yaml", None]))  # fmt: skip
    def run(case: Any, header: tuple[str, Any], body: bytes, kind: str | None) -> None:
        _send(session, case, live, header)
        content_type = {"json": "application/json", "yaml": "application/yaml"}.get(kind or "")
        headers = {**TOKEN, **({"Content-Type": content_type} if content_type else {})}
        for path in ("/v1/jobs", "/v1/plan"):
            _check(session.post(live + path, data=body, headers=headers, timeout=30))

    run()
