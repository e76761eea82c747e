"""Who may call the API, as the operator writes it: static bearer tokens (inline, from the
environment, or as a SHA-256 hash; named, each with its roles), the OIDC issuer whose JWTs
are accepted and how their claims map to tenants and roles, and the resolved token table.

Roles are ``submit``, ``cancel`` and ``read`` on the token's own tenant, the writes
optionally narrowed to one queue (``submit:training``, ``cancel:training``), plus
``viewer`` (reads every tenant) and ``admin`` (reads and cancels everything). The table
keeps SHA-256 digests only: a token is looked up by hashing what the caller sent and
comparing every digest in constant time, so neither the answer's timing nor a dump of the
table gives a token away.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated
from urllib.parse import urlsplit

from pydantic import Field, SecretStr, field_validator, model_validator

from broker.config.section import Section
from broker.manifest import DnsLabel, FieldError

if TYPE_CHECKING:
    from broker.config.tenancy import TenantConfig

# Non-hashed tokens shorter than this are refused outside the demo: guessable otherwise.
MIN_TOKEN_LENGTH = 32
VERBS = ("submit", "cancel", "read")
# A verb on the whole tenant, a write on one of its queues ("submit:training"); viewer; admin.
# Reads are not narrowed to queues: lists, the event stream and the views span them all.
_ROLE_PATTERN = r"^((submit|cancel)(:[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?)?|read|viewer|admin)$"
Role = Annotated[str, Field(pattern=_ROLE_PATTERN, max_length=80)]
# What a legacy ``token`` of a tenant may do: everything on its tenant (admin: the admin role).
LEGACY_ROLES = frozenset(VERBS)
ClaimName = Annotated[str, Field(min_length=1, max_length=128)]
ClaimValue = Annotated[str, Field(min_length=1, max_length=256)]


def _printable(token: str) -> bool:
    """Visible ASCII only: what RFC 6750 bearer tokens are made of, and all we compare."""
    return all("!" <= c <= "~" for c in token)


class BearerTokenRef(Section):
    """A bearer token: from the environment (``env``), inline (``value``), or only its
    SHA-256 hex digest (``sha256``), so the config file need not hold the token at all."""

    env: str | None = Field(default=None, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$", max_length=128)
    value: SecretStr | None = None
    sha256: str | None = Field(default=None, pattern=r"^[0-9a-fA-F]{64}$", repr=False)

    @model_validator(mode="after")
    def _exactly_one(self) -> BearerTokenRef:
        if sum(x is not None for x in (self.env, self.value, self.sha256)) != 1:
            raise FieldError([], "give exactly one of: env, value, sha256")
        return self

    def digest(self, environ: Mapping[str, str], min_length: int) -> bytes:
        """The token's SHA-256 digest; raises FieldError (path relative to this ref)."""
        if self.sha256 is not None:
            return bytes.fromhex(self.sha256)
        key = "value" if self.value is not None else "env"
        if self.value is not None:
            token = self.value.get_secret_value()
        elif self.env is not None and self.env in environ:
            token = environ[self.env]
        else:
            raise FieldError(["env"], f"environment variable {self.env} is not set")
        if not token:
            raise FieldError([key], "token is empty")
        if not _printable(token):
            raise FieldError([key], "token must be printable ASCII without spaces")
        if len(token) < min_length:
            raise FieldError([key], f"token shorter than {min_length} characters (or give sha256)")
        return hashlib.sha256(token.encode("ascii")).digest()


class StaticToken(BearerTokenRef):
    """One named token of a tenant; its audit subject is ``token:<name>``."""

    name: DnsLabel
    roles: list[Role] = Field(min_length=1, max_length=64)


def _loopback(host: str | None) -> bool:
    if host == "localhost":
        return True
    try:
        return host is not None and ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _issuer_url(url: str) -> str:
    parts = urlsplit(url)
    if not parts.hostname or parts.scheme not in ("https", "http"):
        raise ValueError("must be an https:// URL")
    if parts.scheme == "http" and not _loopback(parts.hostname):
        raise ValueError("must be https:// (plain http only on a loopback address)")
    return url


class OidcConfig(Section):
    """The one OIDC issuer whose JWTs (RS256/ES256) are accepted, and its claim mapping."""

    issuer: str = Field(min_length=1, max_length=2048)
    audiences: list[ClaimValue] = Field(min_length=1, max_length=16)
    # Where the signing keys are; default: the issuer's discovery document says.
    jwks_uri: str | None = Field(default=None, min_length=1, max_length=2048)
    subject_claim: ClaimName = "sub"
    tenant_claim: ClaimName = "groups"
    tenants: dict[ClaimValue, DnsLabel] = Field(min_length=1, max_length=10_000)
    role_claim: ClaimName = "groups"
    roles: dict[ClaimValue, list[Role]] = Field(default_factory=dict, max_length=10_000)
    clock_skew_seconds: float = Field(default=60.0, ge=0, le=300)

    @field_validator("issuer", "jwks_uri")
    @classmethod
    def _https(cls, url: str | None) -> str | None:
        return None if url is None else _issuer_url(url)


class AuthConfig(Section):
    oidc: OidcConfig | None = None


@dataclass(frozen=True, slots=True)
class StaticGrant:
    """What a static token is: its name (the audit subject is ``token:<name>``), its
    tenant and its roles."""

    name: str
    tenant: str
    roles: frozenset[str]


class TokenTable:
    """Static tokens by digest; swapped whole on reload (never edited in place)."""

    def __init__(self, entries: Sequence[tuple[bytes, StaticGrant]] = ()) -> None:
        self._entries = tuple(entries)

    def __len__(self) -> int:
        return len(self._entries)

    def lookup(self, token: str) -> StaticGrant | None:
        """The grant of ``token``, comparing every digest (constant time per entry)."""
        if not token or not _printable(token):
            return None
        given = hashlib.sha256(token.encode("ascii")).digest()
        found = None
        for digest, grant in self._entries:
            if hmac.compare_digest(digest, given):
                found = grant
        return found


def queue_of(role: str) -> str | None:
    """The queue a role is narrowed to (``submit:training`` -> ``training``), if any."""
    return role.partition(":")[2] or None


def _tokens_of(i: int, tenant: TenantConfig) -> Iterable[tuple[list[str | int], BearerTokenRef]]:
    if tenant.token is not None:
        yield ["tenants", i, "token"], tenant.token
    for j, token in enumerate(tenant.tokens):
        yield ["tenants", i, "tokens", j], token


def _check_queues(path: list[str | int], roles: Sequence[str], tenant: TenantConfig) -> None:
    for k, role in enumerate(roles):
        queue = queue_of(role)
        if queue is not None and queue not in tenant.allowed_queues:
            raise FieldError([*path, "roles", k], f"tenant may not use queue {queue!r}")


def build_token_table(
    tenants: Sequence[TenantConfig], environ: Mapping[str, str], min_length: int
) -> TokenTable:
    """Every tenant's tokens, resolved and hashed. Refuses (FieldError with the key path)
    an unusable or short token, a token two entries share, a name used twice, and a role
    narrowed to a queue the tenant may not use."""
    entries: list[tuple[bytes, StaticGrant]] = []
    owners: dict[bytes, str] = {}
    names: set[str] = set()
    for i, tenant in enumerate(tenants):
        for path, ref in _tokens_of(i, tenant):
            try:
                digest = ref.digest(environ, min_length)
            except FieldError as exc:
                raise FieldError([*path, *exc.path], exc.message) from None
            if isinstance(ref, StaticToken):
                name, roles = ref.name, frozenset(ref.roles)
                _check_queues(path, ref.roles, tenant)
            else:
                name, roles = tenant.name, frozenset({"admin"} if tenant.admin else LEGACY_ROLES)
            other = owners.setdefault(digest, name)
            if other != name:
                raise FieldError(path, f"same token as token {other!r}")
            if name in names:
                where = [*path, "name"] if isinstance(ref, StaticToken) else path
                raise FieldError(where, f"duplicate token name {name!r}")
            names.add(name)
            entries.append((digest, StaticGrant(name, tenant.name, roles)))
    return TokenTable(entries)


__all__ = [
    "LEGACY_ROLES", "MIN_TOKEN_LENGTH", "VERBS", "AuthConfig", "BearerTokenRef", "OidcConfig",
    "Role", "StaticGrant", "StaticToken", "TokenTable", "build_token_table", "queue_of",
]  # fmt: skip
