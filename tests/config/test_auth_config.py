"""Authentication config: static tokens (inline, env, sha256; named, with roles; 32
characters at least outside the demo), the OIDC issuer and its claim mapping. Every
mistake is one line naming the key, and no token shows in it."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from broker.config import MIN_TOKEN_LENGTH, ConfigError, demo_config, parse_config

QUEUES = "queues: [{name: a}, {name: b}, {name: c}]\n"
LONG = "l" * 32  # exactly the minimum
SECRET = "never-shown-" + "s" * 24
OIDC = (
    "auth:\n  oidc:\n    issuer: https://idp.example.com\n    audiences: [fedbroker]\n"
    "    tenants: {{ml: t}}\n{extra}"
)


def tenant(token: str, extra: str = "") -> str:
    return QUEUES + f"tenants:\n- {{name: t, defaultQueue: a, queues: [b]{extra}, {token}}}\n"


ERRORS: list[tuple[str, str, str]] = [
    (tenant("token: {value: " + "x" * 31 + "}"), "tenants[0].token.value",
     "token shorter than 32 characters (or give sha256)"),
    (tenant("token: {env: SHORT}"), "tenants[0].token.env", "shorter than 32"),
    (tenant("token: {value: 'has a space and is long enough xx'}"), "tenants[0].token.value",
     "printable ASCII without spaces"),
    (tenant("token: {sha256: abc}"), "tenants[0].token.sha256", "pattern"),
    (tenant("token: {sha256: " + "g" * 64 + "}"), "tenants[0].token.sha256", "pattern"),
    (tenant(f"token: {{value: {SECRET}, sha256: {'a' * 64}}}"), "tenants[0].token",
     "exactly one of: env, value, sha256"),
    (tenant(f"tokens: [{{name: ci, value: {SECRET}}}]"), "tenants[0].tokens[0].roles",
     "required"),
    (tenant(f"tokens: [{{name: ci, value: {SECRET}, roles: []}}]"),
     "tenants[0].tokens[0].roles", "at least 1"),
    (tenant(f"tokens: [{{name: ci, value: {SECRET}, roles: [write]}}]"),
     "tenants[0].tokens[0].roles[0]", "pattern"),
    (tenant(f"tokens: [{{name: ci, value: {SECRET}, roles: ['submit:']}}]"),
     "tenants[0].tokens[0].roles[0]", "pattern"),
    (tenant(f"tokens: [{{name: ci, value: {SECRET}, roles: ['read:a']}}]"),
     "tenants[0].tokens[0].roles[0]", "pattern"),
    (tenant(f"tokens: [{{name: ci, value: {SECRET}, roles: [read, 'submit:c']}}]"),
     "tenants[0].tokens[0].roles[1]", "tenant may not use queue 'c'"),
    (tenant(f"tokens: [{{name: ci, value: {SECRET}, roles: [read]}}, "
            f"{{name: ci, value: {LONG}, roles: [read]}}]"),
     "tenants[0].tokens[1].name", "duplicate token name 'ci'"),
    (tenant(f"tokens: [{{name: ci, value: {SECRET}, roles: [read]}}, "
            f"{{name: cd, value: {SECRET}, roles: [read]}}]"),
     "tenants[0].tokens[1]", "same token as token 'ci'"),
    (tenant(f"tokens: [{{name: ci, value: {SECRET}, roles: [read]}}, "
            f"{{name: cd, sha256: {hashlib.sha256(SECRET.encode()).hexdigest()}, roles: [read]}}]"),
     "tenants[0].tokens[1]", "same token as token 'ci'"),
    (tenant(f"tokens: [{{name: CI, value: {SECRET}, roles: [read]}}]"),
     "tenants[0].tokens[0].name", "DNS-1123"),
    (tenant("") + OIDC.format(extra="").replace("https://idp", "http://idp"),
     "auth.oidc.issuer", "must be https://"),
    (tenant("") + OIDC.format(extra="").replace("https://idp.example.com", "idp"),
     "auth.oidc.issuer", "must be an https:// URL"),
    (tenant("") + OIDC.format(extra="    jwksUri: http://keys.example.com/jwks\n"),
     "auth.oidc.jwksUri", "must be https://"),
    (tenant("") + OIDC.format(extra="").replace("{ml: t}", "{ml: nobody}"),
     "auth.oidc.tenants.ml", "no tenant named 'nobody'"),
    (tenant("") + OIDC.format(extra="").replace("{ml: t}", "{}"),
     "auth.oidc.tenants", "at least 1"),
    (tenant("") + OIDC.format(extra="    clockSkewSeconds: 301\n"),
     "auth.oidc.clockSkewSeconds", "<= 300"),
    (tenant("") + OIDC.format(extra="    roles: {ops: [read, 'cancel:zz']}\n"),
     "auth.oidc.roles.ops[1]", "no queue named 'zz'"),
    (tenant("") + OIDC.format(extra="    roles: {ops: [root]}\n"),
     "auth.oidc.roles.ops[0]", "pattern"),
    (tenant("") + OIDC.format(extra="").replace("[fedbroker]", "[]"),
     "auth.oidc.audiences", "at least 1"),
]  # fmt: skip


@pytest.mark.parametrize(("text", "path", "fragment"), ERRORS, ids=[e[1] for e in ERRORS])
def test_auth_mistakes_name_the_key(text: str, path: str, fragment: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config(text, "broker.yaml", {"SHORT": "s" * 31})
    message = str(caught.value)
    assert message.startswith(f"broker.yaml: {path}: "), message
    assert fragment in message
    assert "\n" not in message
    assert SECRET not in message and "s" * 31 not in message


def test_tokens_by_value_env_and_hash_with_their_roles() -> None:
    hashed = "h" * 40
    text = tenant(
        "token: {env: TEAM_TOKEN}, tokens: ["
        f"{{name: ci, sha256: {hashlib.sha256(hashed.encode()).hexdigest().upper()}, "
        "roles: [read, 'submit:b']}, "
        f"{{name: viewer-bot, value: {LONG}, roles: [viewer]}}]"
    )
    config = parse_config(text, "broker.yaml", {"TEAM_TOKEN": SECRET})
    table = config.tokens
    assert len(table) == 3
    legacy, ci, bot = table.lookup(SECRET), table.lookup(hashed), table.lookup(LONG)
    assert legacy is not None and (legacy.name, legacy.tenant) == ("t", "t")
    assert legacy.roles == {"submit", "cancel", "read"}
    assert ci is not None and (ci.name, ci.roles) == ("ci", frozenset({"read", "submit:b"}))
    assert bot is not None and bot.roles == {"viewer"}
    for wrong in ("", hashed[:-1], hashed + "h", SECRET.upper(), "\udcff" * 40, "h" * 39 + "\x00"):
        assert table.lookup(wrong) is None, repr(wrong)
    assert config.authenticate(hashed) is config.tenant("t")
    for shown in (repr(config), config.model_dump_json(), repr(table)):
        assert SECRET not in shown and LONG not in shown


def test_an_admin_tenants_token_is_admin_and_a_tenant_may_have_no_token() -> None:
    text = QUEUES + (
        f"tenants:\n- {{name: ops, defaultQueue: a, admin: true, token: {{value: {LONG}}}}}\n"
        "- {name: oidc-only, defaultQueue: b}\n"
    )
    grant = parse_config(text, "broker.yaml", {}).tokens.lookup(LONG)
    assert grant is not None and grant.roles == {"admin"}


def test_the_demo_may_use_short_tokens(tmp_path: Path) -> None:
    short = {"team-a": "a" * 8, "team-b": "b" * 8, "admin": "c" * 8}
    assert len(short["team-a"]) < MIN_TOKEN_LENGTH
    config = demo_config(tmp_path, short)
    found = config.tokens.lookup("a" * 8)
    assert found is not None and found.tenant == "team-a"


def test_oidc_defaults() -> None:
    config = parse_config(tenant("") + OIDC.format(extra=""), "broker.yaml", {})
    oidc = config.auth.oidc
    assert oidc is not None
    assert (oidc.subject_claim, oidc.tenant_claim, oidc.role_claim) == ("sub", "groups", "groups")
    assert oidc.clock_skew_seconds == 60.0 and oidc.jwks_uri is None
    assert oidc.tenants == {"ml": "t"} and oidc.roles == {}
    loopback = OIDC.format(extra="").replace("https://idp.example.com", "http://127.0.0.1:9")
    assert parse_config(tenant("") + loopback, "broker.yaml", {}).auth.oidc is not None


TABLE = parse_config(tenant(f"token: {{value: {SECRET}}}"), "broker.yaml", {}).tokens


@given(st.text(max_size=80))
def test_only_the_token_itself_finds_its_grant(guess: str) -> None:
    found = TABLE.lookup(guess)  # never raises, whatever the text (surrogates included)
    assert (found is not None) == (guess == SECRET)
