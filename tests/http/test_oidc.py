"""OIDC bearer tokens against a local issuer started by the test (aiohttp on 127.0.0.1:0,
keys made here with cryptography): a valid RS256 or ES256 JWT submits; expired, not yet
valid, wrong iss or aud, unknown kid (after exactly one refetch), alg none and HS256 signed
with the public key are 401 each; a rotated key is picked up; groups map to tenants and
roles, and roles are enforced."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import jwt
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from builders import Clock
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from jwt.algorithms import ECAlgorithm, RSAAlgorithm
from test_api import manifest

from broker.config import parse_config
from broker.http.app import make_app
from broker.http.oidc import REFETCH_SECONDS
from broker.service.facade import Service

AUDIENCE = "fedbroker"
CONFIG = """
store: {{url: "sqlite:///{db}"}}
# Every request here comes from one address, many of them refused on purpose.
api: {{rateLimitUnauthenticated: {{requestsPerSecond: 1000.0, burst: 1000}}}}
clusters:
- name: small-a
  source:
    simulated: {{shapes: [{{gpuType: A100, gpus: 8, cpu: "96", memory: 1024Gi, count: 2}}]}}
queues:
- {{name: training, policy: gang}}
- {{name: inference, policy: binpack}}
tenants:
- {{name: team-a, defaultQueue: training, queues: [inference]}}
- {{name: team-b, defaultQueue: inference}}
auth:
  oidc:
    issuer: {issuer}
    audiences: [other-app, {audience}]
    tenants: {{ml: team-a, ml-readers: team-a, ml-trainers: team-a, infer: team-b}}
    roles:
      ml: [submit, cancel, read]
      infer: [submit, cancel, read]
      ml-readers: [read]
      ml-trainers: ["submit:training", read]
      platform: [viewer]
"""


class Issuer:
    """A local OIDC issuer: discovery document, JWKS (counted), keys made in the test."""

    def __init__(self) -> None:
        self.rsa = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        self.ec = ec.generate_private_key(ec.SECP256R1())
        self.jwks: list[dict[str, Any]] = [jwk(self.rsa, "rsa-1"), jwk(self.ec, "ec-1")]
        self.fetches = 0
        self.fail = False
        self.document: Any = None  # served instead of the key set, when set
        self.url = ""

    async def discovery(self, request: web.Request) -> web.Response:
        return web.json_response({"issuer": self.url, "jwks_uri": f"{self.url}/keys"})

    async def keys(self, request: web.Request) -> web.Response:
        self.fetches += 1
        if self.fail:
            return web.json_response({"error": "down"}, status=500)
        if self.document is not None:
            return web.json_response(self.document)
        return web.json_response({"keys": self.jwks})

    def token(self, key: Any = None, kid: str = "rsa-1", alg: str = "RS256", **claims: Any) -> str:
        now = int(time.time())
        body = {"iss": self.url, "aud": AUDIENCE, "sub": "alice", "iat": now,
                "exp": now + 300, "groups": ["ml"], **claims}  # fmt: skip
        body = {k: v for k, v in body.items() if v is not None}
        return jwt.encode(body, key or self.rsa, algorithm=alg, headers={"kid": kid})


def jwk(key: rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey, kid: str) -> dict[str, Any]:
    if isinstance(key, rsa.RSAPrivateKey):
        doc = RSAAlgorithm.to_jwk(key.public_key(), as_dict=True)
    else:
        doc = ECAlgorithm.to_jwk(key.public_key(), as_dict=True)
    return {**doc, "kid": kid, "use": "sig"}


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def hand_made(header: dict[str, Any], claims: dict[str, Any], secret: bytes | None) -> str:
    """A JWT signed by hand: PyJWT itself refuses to HMAC with a PEM key or sign 'none'."""
    signing = f"{b64(json.dumps(header).encode())}.{b64(json.dumps(claims).encode())}"
    if secret is None:
        return f"{signing}."
    return f"{signing}.{b64(hmac.new(secret, signing.encode(), hashlib.sha256).digest())}"


class Stack:
    def __init__(self, issuer: Issuer, client: TestClient[Any, Any], mono: Clock) -> None:
        self.issuer, self.client, self.mono = issuer, client, mono

    async def call(self, method: str, path: str, token: str, **kw: Any) -> tuple[int, Any]:
        resp = await self.client.request(
            method, path, headers={"Authorization": f"Bearer {token}"}, **kw
        )
        return resp.status, await resp.json()


@pytest.fixture
async def stack(tmp_path: Path) -> AsyncIterator[Stack]:
    issuer = Issuer()
    app = web.Application()
    app.router.add_get("/.well-known/openid-configuration", issuer.discovery)
    app.router.add_get("/keys", issuer.keys)
    idp = TestServer(app, host="127.0.0.1", port=0)
    await idp.start_server()
    issuer.url = str(idp.make_url("")).rstrip("/")
    text = CONFIG.format(db=tmp_path / "jobs.db", issuer=issuer.url, audience=AUDIENCE)
    config = parse_config(text, "test config", {})
    service = Service(config, clock=Clock())
    await service.start()
    mono = Clock(100.0)  # the API's monotonic clock: rate limits and the JWKS refetch bound
    client = TestClient(TestServer(make_app(service, config, clock=mono)))
    await client.start_server()
    try:
        yield Stack(issuer, client, mono)
    finally:
        await client.close()
        await service.close()
        await idp.close()


async def test_valid_rs256_and_es256_tokens_submit(stack: Stack) -> None:
    issuer = stack.issuer
    status, doc = await stack.call("POST", "/v1/jobs", issuer.token(), json=manifest("rs"))
    assert status == 201, doc
    assert doc["metadata"]["namespace"] == "team-a"
    es = issuer.token(issuer.ec, kid="ec-1", alg="ES256")
    status, doc = await stack.call("POST", "/v1/jobs", es, json=manifest("es"))
    assert status == 201, doc
    assert issuer.fetches == 1  # the discovery document named the JWKS; fetched once, cached
    # Within the clock skew bound (60 s) an expired token still passes; past it, not.
    now = int(time.time())
    late = issuer.token(exp=now - 30, iat=now - 600)
    assert (await stack.call("GET", "/v1/jobs", late))[0] == 200


def _refused(issuer: Issuer) -> list[tuple[str, str, str]]:
    """(case, token, what the 401 says): every one of them is refused."""
    now = int(time.time())
    pem = issuer.rsa.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    claims = {"iss": issuer.url, "aud": AUDIENCE, "sub": "mallory", "iat": now,
              "exp": now + 300, "groups": ["ml"]}  # fmt: skip
    stranger = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    return [
        ("expired", issuer.token(exp=now - 61 - 60, iat=now - 600), "expired"),
        ("not yet valid", issuer.token(nbf=now + 600), "not yet valid"),
        ("issued in the future", issuer.token(iat=now + 600), "not yet valid"),
        ("wrong iss", issuer.token(iss="https://evil.example.com"), "wrong issuer"),
        ("wrong aud", issuer.token(aud="someone-else"), "wrong audience"),
        ("no exp", issuer.token(exp=None), "required claim"),
        ("alg none", hand_made({"alg": "none", "kid": "rsa-1", "typ": "JWT"}, claims, None),
         "algorithm not accepted"),
        ("HS256 with the public key", hand_made({"alg": "HS256", "kid": "rsa-1"}, claims, pem),
         "algorithm not accepted"),
        ("RS384", issuer.token(alg="RS384"), "algorithm not accepted"),
        ("another key, known kid", issuer.token(stranger), "bad signature"),
        ("ES256 named on the RSA key", issuer.token(issuer.ec, kid="rsa-1", alg="ES256"),
         "does not fit"),
        ("no kid", jwt.encode(claims, issuer.rsa, algorithm="RS256"), "no key id"),
        ("garbage in three segments", "eyJhbGciOi.eyJzdWIiOi.c2ln", "not a well-formed JWT"),
    ]  # fmt: skip


async def test_every_bad_token_is_401_and_stores_nothing(stack: Stack) -> None:
    for case, token, why in _refused(stack.issuer):
        status, doc = await stack.call("POST", "/v1/jobs", token, json=manifest("bad"))
        assert status == 401, (case, doc)
        assert doc["error"] == f"bearer token: {why}" or why in doc["error"], (case, doc)
        assert token not in doc["error"]
    status, doc = await stack.call("GET", "/v1/jobs", stack.issuer.token())
    assert status == 200 and doc["items"] == []


async def test_unknown_kid_refetches_exactly_once_then_a_rotated_key_is_accepted(
    stack: Stack,
) -> None:
    issuer = stack.issuer
    assert (await stack.call("GET", "/v1/jobs", issuer.token()))[0] == 200
    assert issuer.fetches == 1
    stack.mono.now += REFETCH_SECONDS
    unknown = issuer.token(kid="rsa-2")
    status, doc = await stack.call("GET", "/v1/jobs", unknown)
    assert (status, doc["error"]) == (401, "bearer token: unknown signing key (kid)")
    assert issuer.fetches == 2  # exactly one refetch for the unknown kid
    # A flood of made-up kids right after: refused from the cache, the issuer is left alone.
    flood = [stack.call("GET", "/v1/jobs", issuer.token(kid=f"x{i}")) for i in range(20)]
    assert {status for status, _ in await asyncio.gather(*flood)} == {401}
    assert issuer.fetches == 2
    # The issuer rotates to a new key; once the bound has passed, its kid is fetched.
    new = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    issuer.jwks = [jwk(new, "rsa-2")]
    stack.mono.now += REFETCH_SECONDS
    status, doc = await stack.call("POST", "/v1/jobs", issuer.token(new, kid="rsa-2"),
                                   json=manifest("rotated"))  # fmt: skip
    assert status == 201, doc
    assert issuer.fetches == 3
    # The old key left the set: its tokens are refused now, without another fetch.
    status, _ = await stack.call("GET", "/v1/jobs", issuer.token())
    assert status == 401 and issuer.fetches == 3


async def test_concurrent_unknown_kids_share_one_fetch(stack: Stack) -> None:
    issuer = stack.issuer
    calls = [stack.call("GET", "/v1/jobs", issuer.token(kid=f"k{i}")) for i in range(10)]
    assert {status for status, _ in await asyncio.gather(*calls)} == {401}
    assert issuer.fetches == 1


async def test_an_unreachable_issuer_is_503_not_401(stack: Stack) -> None:
    stack.issuer.fail = True
    resp = await stack.client.get(
        "/v1/jobs", headers={"Authorization": f"Bearer {stack.issuer.token()}"}
    )
    assert resp.status == 503
    assert resp.headers["Retry-After"] == "5"
    assert "issuer's keys cannot be fetched" in (await resp.json())["error"]


@pytest.mark.parametrize(
    "document",
    [{"keys": "abc"}, {"keys": [{"kty": "RSA"}]}, {"keys": [1, None]}, {"nokeys": 1}, [1, 2],
     {"keys": [{"kty": "oct", "k": "c2VjcmV0", "kid": "rsa-1"}]}],
)  # fmt: skip
async def test_a_garbage_key_set_is_503_never_500(stack: Stack, document: Any) -> None:
    stack.issuer.document = document
    status, doc = await stack.call("GET", "/v1/jobs", stack.issuer.token())
    assert status in (401, 503), doc
    assert stack.issuer.fetches == 1


async def test_groups_map_to_tenants_and_roles(stack: Stack) -> None:
    issuer = stack.issuer
    team_b = issuer.token(sub="bob", groups=["infer"])
    status, doc = await stack.call("POST", "/v1/jobs", team_b, json=manifest("b1", gpus=1))
    assert status == 201 and doc["metadata"]["namespace"] == "team-b"
    # team-a's caller does not see team-b's job; a viewer (platform group) sees both.
    await stack.call("POST", "/v1/jobs", issuer.token(), json=manifest("a1"))
    _, own = await stack.call("GET", "/v1/jobs", issuer.token())
    assert [j["metadata"]["name"] for j in own["items"]] == ["a1"]
    viewer = issuer.token(sub="vera", groups=["ml", "platform"])
    _, seen = await stack.call("GET", "/v1/jobs", viewer)
    assert sorted(j["metadata"]["name"] for j in seen["items"]) == ["a1", "b1"]
    # Two tenants, or none: a valid token that maps nowhere usable is 403, naming why.
    both = issuer.token(sub="eve", groups=["ml", "infer"])
    status, doc = await stack.call("GET", "/v1/jobs", both)
    assert (status, doc["error"]) == (
        403, "forbidden: oidc:eve maps to several tenants (team-a, team-b) (claim 'groups')"
    )  # fmt: skip
    status, doc = await stack.call("GET", "/v1/jobs", issuer.token(groups="platform"))
    assert (status, doc["error"]) == (
        403,
        "forbidden: oidc:alice maps to no tenant (claim 'groups')",
    )


async def test_roles_are_enforced_per_route(stack: Stack) -> None:
    issuer = stack.issuer
    assert (await stack.call("POST", "/v1/jobs", issuer.token(), json=manifest("j")))[0] == 201
    reader = issuer.token(sub="rita", groups=["ml-readers"])
    status, doc = await stack.call("GET", "/v1/jobs/j", reader)
    assert status == 200 and doc["metadata"]["namespace"] == "team-a"
    status, doc = await stack.call("POST", "/v1/jobs", reader, json=manifest("r"))
    assert (status, doc["error"]) == (403, 'forbidden: oidc:rita lacks "submit" on tenant team-a')
    status, doc = await stack.call("DELETE", "/v1/jobs/j", reader)
    assert (status, doc["error"]) == (403, 'forbidden: oidc:rita lacks "cancel" on tenant team-a')
    # A trainer submits to the training queue only.
    trainer = issuer.token(sub="tom", groups=["ml-trainers"])
    status, _ = await stack.call("POST", "/v1/jobs", trainer, json=manifest("t1"))
    assert status == 201
    wrong = manifest("t2", gpus=1, queue="inference")
    status, doc = await stack.call("POST", "/v1/jobs", trainer, json=wrong)
    assert (status, doc["error"]) == (
        403, 'forbidden: oidc:tom lacks "submit" on queue inference of tenant team-a'
    )  # fmt: skip
    _, listed = await stack.call("GET", "/v1/jobs", issuer.token())
    assert sorted(j["metadata"]["name"] for j in listed["items"]) == ["j", "t1"]
