"""Who is calling and what it may do: the bearer token resolved to a ``Principal`` (a
static token by its hash, or an OIDC JWT; 401 without a valid one, 429 over the tenant's
rate limit), and the one check every ``/v1`` route makes, ``require(request, verb)``
(403 naming the missing permission). Also whose jobs a caller sees, whose job a path
names, and the swap of the static tokens on reload (SIGHUP). Tokens are never logged.

Permissions: ``submit``, ``cancel``, ``read`` on the principal's own tenant, each possibly
narrowed to a queue (``submit:training``); ``viewer`` reads every tenant; ``admin`` does
everything on every tenant. A JWT (three base64url segments) that is no static token goes
to the OIDC issuer when one is configured.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

from aiohttp import web

from broker.config import Config, ConfigError, TokenTable, load_config
from broker.http.oidc import (
    Denied,
    KeysUnavailable,
    OidcVerifier,
    Unauthenticated,
    looks_like_jwt,
)
from broker.http.principal import PRINCIPAL, Principal, principal_of
from broker.http.state import CONFIG, LIMITER

log = logging.getLogger(__name__)

Verb = str  # "submit" | "cancel" | "read"
_UNAUTHORIZED = "Authorization: missing or invalid bearer token"


class Authenticator:
    """The static token table (swapped whole on reload) and the OIDC verifier, if any."""

    def __init__(self, config: Config, clock: Callable[[], float] = time.monotonic) -> None:
        self.tenants = frozenset(t.name for t in config.tenants)
        self.tokens: TokenTable = config.tokens
        oidc = config.auth.oidc
        self.oidc = None if oidc is None else OidcVerifier(oidc, clock)

    async def principal(self, token: str) -> Principal:
        """Raises Unauthenticated (401), Denied (403) or KeysUnavailable (503)."""
        grant = self.tokens.lookup(token)
        if grant is not None:
            return Principal(f"token:{grant.name}", grant.tenant, grant.roles)
        if self.oidc is not None and looks_like_jwt(token):
            return await self.oidc.principal(token)
        raise Unauthenticated(_UNAUTHORIZED)

    def reload(self, config: Config) -> int:
        """Use ``config``'s static tokens from now on; their number. Tenants cannot be
        added or removed this way (the rest of the broker still runs the old config)."""
        unknown = sorted({t.name for t in config.tenants} ^ self.tenants)
        if unknown:
            raise ConfigError(f"tenants: {', '.join(unknown)} added or removed (needs a restart)")
        self.tokens = config.tokens  # one assignment: a request sees the old or the new table
        return len(config.tokens)


AUTH: web.AppKey[Authenticator] = web.AppKey("auth", Authenticator)


def reload_tokens(
    app: web.Application, path: str | Path, on_loaded: Callable[[Config], object] | None = None
) -> int | None:
    """What SIGHUP does: re-read the config file and swap its static tokens in; logs and
    returns their number. ``on_loaded`` sees the new config first (the log redactor learns
    its secrets before any can be used). A bad file keeps the old tokens and logs its
    one-line error (ConfigError never repeats a secret); None then."""
    try:
        config = load_config(path)
        if on_loaded is not None:
            on_loaded(config)
        count = app[AUTH].reload(config)
    except ConfigError as exc:
        log.error("tokens not reloaded, the old ones stay: %s", exc)
        return None
    log.info("reloaded %d tokens", count)
    return count


async def auth_context(app: web.Application) -> AsyncIterator[None]:
    """``cleanup_ctx``: the OIDC verifier's HTTP session is closed with the app."""
    yield
    oidc = app[AUTH].oidc
    if oidc is not None:
        await oidc.close()


def _bearer(request: web.Request) -> str | None:
    # aiohttp hands headers over as str (undecodable bytes as surrogates): a token holds
    # visible ASCII only, so anything else is simply no token (never an encoding error).
    scheme, _, token = request.headers.get("Authorization", "").partition(" ")
    token = token.strip(" \t")
    if scheme.lower() != "bearer" or not token or not all("!" <= c <= "~" for c in token):
        return None
    return token


async def authenticate(request: web.Request) -> Principal:
    """The caller, stored on the request under PRINCIPAL, after its tenant's rate limit;
    raises 401, 403 (valid token, no tenant), 429 or 503 (issuer keys unreachable)."""
    known = principal_of(request)
    if known is not None:
        return known
    token = _bearer(request)
    try:
        if token is None:
            raise Unauthenticated(_UNAUTHORIZED)
        principal = await request.app[AUTH].principal(token)
    except Unauthenticated as exc:
        raise web.HTTPUnauthorized(
            reason=str(exc), headers={"WWW-Authenticate": "Bearer"}
        ) from None
    except Denied as exc:
        raise web.HTTPForbidden(reason=str(exc)) from None
    except KeysUnavailable as exc:
        raise web.HTTPServiceUnavailable(
            reason=f"{exc}; retry", headers={"Retry-After": "5"}
        ) from None
    request[PRINCIPAL] = principal
    wait = request.app[LIMITER].retry_after(principal.tenant)
    if wait is not None:
        limit = request.app[CONFIG].api.rate_limit_per_tenant
        raise web.HTTPTooManyRequests(
            reason=f"rate limit: tenant {principal.tenant!r} is over "
            f"{limit.requests_per_second:g} requests/s (burst {limit.burst}); "
            f"retry after {wait} s",
            headers={"Retry-After": str(wait)},
        )
    return principal


def allows(principal: Principal, verb: Verb, tenant: str, queue: str | None = None) -> bool:
    """Whether ``principal`` may ``verb`` on ``tenant`` (on ``queue``, when the action has
    one: a queue-narrowed role counts only there)."""
    roles = principal.roles
    if "admin" in roles or (verb == "read" and "viewer" in roles):
        return True
    if tenant != principal.tenant:
        return False
    return verb in roles or (queue is not None and f"{verb}:{queue}" in roles)


def denial(principal: Principal, verb: Verb, tenant: str, queue: str | None = None) -> str:
    """The one-line 403: ``forbidden: token:ci lacks "cancel" on tenant team-a``."""
    where = f"queue {queue} of tenant {tenant}" if queue is not None else f"tenant {tenant}"
    return f'forbidden: {principal.subject} lacks "{verb}" on {where}'


async def require(
    request: web.Request, verb: Verb, *, tenant: str | None = None, queue: str | None = None
) -> Principal:
    """Authenticate, then check ``verb`` on ``tenant`` (default: the caller's own) and
    ``queue``; raises 401/429 as ``authenticate`` does, 403 naming what is missing."""
    principal = await authenticate(request)
    owner = principal.tenant if tenant is None else tenant
    if not allows(principal, verb, owner, queue):
        raise web.HTTPForbidden(reason=denial(principal, verb, owner, queue))
    return principal


async def require_on_queue(
    request: web.Request, verb: Verb, tenant: str, queue: Callable[[], Awaitable[str]]
) -> Principal:
    """``require`` for an action on one queue, whose name costs something to learn (the
    manifest's, a stored job's): asked for only when a queue-narrowed role could allow it,
    so a caller without ``verb`` anywhere on ``tenant`` gets its 403 first."""
    principal = await authenticate(request)
    if allows(principal, verb, tenant) or not any(
        r.startswith(f"{verb}:") for r in principal.roles
    ):
        return await require(request, verb, tenant=tenant)
    return await require(request, verb, tenant=tenant, queue=await queue())


def sees_all(principal: Principal) -> bool:
    return bool(principal.roles & {"admin", "viewer"})


def seen_by(principal: Principal) -> str | None:
    """Whose jobs the caller sees: its own tenant's, or everyone's (None) for an admin or
    a viewer."""
    return None if sees_all(principal) else principal.tenant


def owner_of(request: web.Request, principal: Principal) -> str:
    """Whose job a path names: the caller's tenant, or for an admin or a viewer the
    ``tenant`` query's (the verb is checked on that tenant after)."""
    other = request.query.get("tenant")
    return other if other and sees_all(principal) else principal.tenant


__all__ = [
    "AUTH", "Authenticator", "allows", "auth_context", "authenticate", "denial", "owner_of",
    "reload_tokens", "require", "require_on_queue", "seen_by", "sees_all",
]  # fmt: skip
