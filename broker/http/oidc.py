"""OIDC bearer tokens: a JWT signed by the configured issuer (RS256 or ES256 only), checked
with PyJWT against the issuer's keys, and its claims mapped to a ``Principal``.

The keys (JWKS) are fetched with aiohttp, never with PyJWT's blocking ``PyJWKClient``: from
``auth.oidc.jwksUri``, or from the ``jwks_uri`` of the issuer's discovery document. They are
cached and fetched again when a token names an unknown ``kid`` (so a rotated key is picked
up) or when they are an hour old, but at most once per ``REFETCH_SECONDS``: a flood of
made-up kids cannot hammer the issuer. ``alg: none``, every HMAC algorithm (HS256 signed
with the public key as its secret included) and a key whose type does not fit the
algorithm are refused before any signature is checked. No token ever reaches a message.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
from collections.abc import Callable, Mapping
from typing import Any

import aiohttp
import jwt

from broker.config import OidcConfig
from broker.http.principal import Principal

log = logging.getLogger(__name__)

ALGORITHMS = ("RS256", "ES256")
REFETCH_SECONDS = 10.0  # at most one JWKS fetch this often, whatever tokens arrive
MAX_KEY_AGE_SECONDS = 3600.0  # keys older than this are fetched again on the next token
FETCH_TIMEOUT_SECONDS = 5.0
MAX_DOCUMENT_BYTES = 256 * 1024
MAX_JWT_BYTES = 16 * 1024
_JWT_SHAPE = re.compile(r"[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]*")
_FAILURES: tuple[tuple[type[jwt.PyJWTError], str], ...] = (
    (jwt.ExpiredSignatureError, "expired"),
    (jwt.ImmatureSignatureError, "not yet valid (nbf or iat in the future)"),
    (jwt.InvalidIssuerError, "wrong issuer (iss)"),
    (jwt.InvalidAudienceError, "wrong audience (aud)"),
    (jwt.InvalidSignatureError, "bad signature"),
    (jwt.MissingRequiredClaimError, "a required claim (exp, iat, iss, aud) is missing"),
)


# A fetch that failed, or a document that is no key set (PyJWT's parsers may raise any of
# these on a malformed one).
_FETCH_ERRORS = (
    aiohttp.ClientError, TimeoutError, ValueError, TypeError, KeyError, AttributeError,
    jwt.PyJWTError,
)  # fmt: skip


class Unauthenticated(Exception):
    """The token proves nothing (401); the message says why, without the token."""


class Denied(Exception):
    """The token is valid but its claims map to no usable tenant (403)."""


class KeysUnavailable(Exception):
    """The issuer's keys cannot be fetched right now (503: the caller may retry)."""


def looks_like_jwt(token: str) -> bool:
    """Three base64url segments: a JWT (anything else is tried as a static token)."""
    return len(token) <= MAX_JWT_BYTES and _JWT_SHAPE.fullmatch(token) is not None


class JwksCache:
    """The issuer's signing keys by ``kid``, fetched lazily and rate-limited."""

    def __init__(
        self, issuer: str, jwks_uri: str | None, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.issuer = issuer
        self.jwks_uri = jwks_uri  # None: read from the discovery document
        self.clock = clock
        self.fetches = 0  # JWKS documents fetched (tests and logs)
        self._keys: dict[str, jwt.PyJWK] = {}
        self._fetched_at: float | None = None
        self._tried_at: float | None = None
        self._discovered: str | None = None
        self._lock = asyncio.Lock()
        self._session: aiohttp.ClientSession | None = None

    async def key(self, kid: str) -> jwt.PyJWK | None:
        """The key ``kid``; refetches the set (rate-limited) when it is unknown or old.
        Raises KeysUnavailable when a needed fetch failed."""
        if self._fresh() and kid in self._keys:
            return self._keys[kid]
        async with self._lock:  # one fetch at a time; the others reuse its answer
            if self._fresh() and kid in self._keys:
                return self._keys[kid]
            now = self.clock()
            if self._tried_at is None or now - self._tried_at >= REFETCH_SECONDS:
                self._tried_at = now
                if not await self._refresh() and kid not in self._keys:
                    raise KeysUnavailable("authentication: the issuer's keys cannot be fetched")
            return self._keys.get(kid)

    def _fresh(self) -> bool:
        at = self._fetched_at
        return at is not None and self.clock() - at < MAX_KEY_AGE_SECONDS

    async def _refresh(self) -> bool:
        """Fetch the key set; on failure keep the old keys and say so (False)."""
        try:
            uri = self.jwks_uri or self._discovered or await self._discover()
            self.fetches += 1
            found = jwt.PyJWKSet.from_dict(await self._get_json(uri))
        except _FETCH_ERRORS as exc:  # whatever the issuer sent or did: keep the old keys
            self._discovered = None  # discover again next time: the issuer may have moved
            log.warning("OIDC keys of %s not fetched: %s", self.issuer, type(exc).__name__)
            return False
        self._keys = {
            k.key_id: k for k in found.keys
            if k.key_id and k.algorithm_name in ALGORITHMS and k.public_key_use != "enc"
        }  # fmt: skip
        self._fetched_at = self.clock()
        log.info("OIDC keys of %s fetched: %d usable", self.issuer, len(self._keys))
        return True

    async def _discover(self) -> str:
        url = f"{self.issuer.rstrip('/')}/.well-known/openid-configuration"
        doc = await self._get_json(url)
        uri = doc.get("jwks_uri")
        if doc.get("issuer") != self.issuer or not isinstance(uri, str):
            raise ValueError("discovery document: issuer differs or jwks_uri missing")
        if not uri.startswith("https://") and not uri.startswith(_origin(self.issuer)):
            raise ValueError("discovery document: jwks_uri must be https")
        self._discovered = uri
        return uri

    async def _get_json(self, url: str) -> dict[str, Any]:
        if self._session is None:
            timeout = aiohttp.ClientTimeout(total=FETCH_TIMEOUT_SECONDS)
            self._session = aiohttp.ClientSession(timeout=timeout)
        async with self._session.get(url, allow_redirects=False) as resp:
            if resp.status != 200:
                raise ValueError(f"HTTP {resp.status}")
            body = bytearray()
            async for chunk in resp.content.iter_chunked(64 * 1024):
                body += chunk
                if len(body) > MAX_DOCUMENT_BYTES:
                    raise ValueError("document too large")
        return _json_object(bytes(body))

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


def _origin(url: str) -> str:
    scheme, _, rest = url.partition("://")
    return f"{scheme}://{rest.split('/', 1)[0]}/"


def _json_object(body: bytes) -> dict[str, Any]:
    doc = json.loads(body)
    if not isinstance(doc, dict):
        raise ValueError("not a JSON object")
    return doc


def _strings(value: object) -> list[str]:
    """A claim as a list of strings (a string, or the strings of a list)."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, list):
        return [v for v in value if isinstance(v, str)]
    return []


def _subject(config: OidcConfig, claims: Mapping[str, Any]) -> str:
    sub = claims.get(config.subject_claim)
    if not isinstance(sub, str) or not 0 < len(sub) <= 256 or not sub.isprintable():
        raise Unauthenticated(f"bearer token: claim {config.subject_claim!r} missing or invalid")
    return f"oidc:{sub}"


def principal_of_claims(config: OidcConfig, claims: Mapping[str, Any]) -> Principal:
    """Who verified ``claims`` are: ``oidc:<subject>``, the one tenant the tenant claim
    maps to, and the roles of every role-claim value. No tenant, or two: Denied."""
    subject = _subject(config, claims)
    values = _strings(claims.get(config.tenant_claim))
    tenants = sorted({config.tenants[v] for v in values if v in config.tenants})
    if len(tenants) != 1:
        which = f"several tenants ({', '.join(tenants)})" if tenants else "no tenant"
        raise Denied(f"forbidden: {subject} maps to {which} (claim {config.tenant_claim!r})")
    roles = {
        role for v in _strings(claims.get(config.role_claim)) for role in config.roles.get(v, ())
    }
    return Principal(subject, tenants[0], frozenset(roles))


class OidcVerifier:
    """Checks a JWT against the configured issuer and maps it to a Principal."""

    def __init__(self, config: OidcConfig, clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config
        self.keys = JwksCache(config.issuer, config.jwks_uri, clock)

    async def principal(self, token: str) -> Principal:
        """Raises Unauthenticated (401), Denied (403) or KeysUnavailable (503)."""
        return principal_of_claims(self.config, await self.claims(token))

    async def claims(self, token: str) -> dict[str, Any]:
        try:
            header = jwt.get_unverified_header(token)
        except jwt.PyJWTError:
            raise Unauthenticated("bearer token: not a well-formed JWT") from None
        alg, kid = header.get("alg"), header.get("kid")
        if alg not in ALGORITHMS:
            raise Unauthenticated("bearer token: algorithm not accepted (RS256 or ES256 only)")
        if not isinstance(kid, str) or not 0 < len(kid) <= 256:
            raise Unauthenticated("bearer token: no key id (kid)")
        key = await self.keys.key(kid)
        if key is None:
            raise Unauthenticated("bearer token: unknown signing key (kid)")
        if key.algorithm_name != alg:
            raise Unauthenticated("bearer token: the key does not fit the algorithm")
        try:
            claims: dict[str, Any] = jwt.decode(
                token, key.key, algorithms=[alg], audience=list(self.config.audiences),
                issuer=self.config.issuer, leeway=self.config.clock_skew_seconds,
                options={"require": ["exp", "iat", "iss", "aud"]},
            )  # fmt: skip
        except jwt.PyJWTError as exc:
            why = next((text for kind, text in _FAILURES if isinstance(exc, kind)), "invalid")
            raise Unauthenticated(f"bearer token: {why}") from None
        return claims

    async def close(self) -> None:
        await self.keys.close()


__all__ = [
    "ALGORITHMS", "REFETCH_SECONDS", "Denied", "JwksCache", "KeysUnavailable", "OidcVerifier",
    "Unauthenticated", "looks_like_jwt", "principal_of_claims",
]  # fmt: skip
