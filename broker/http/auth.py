"""Who is calling: a bearer token resolved to its tenant (401 without one, 429 over the
tenant's rate limit), whose jobs it sees and whose job a path names. Tokens are never logged."""

from __future__ import annotations

from aiohttp import web

from broker.config import TenantConfig
from broker.http.principal import PRINCIPAL, Principal
from broker.http.state import CONFIG, LIMITER


def tenant_of(request: web.Request) -> TenantConfig:
    """The caller's tenant, after its rate limit; raises 401 or 429 (as HTTP errors)."""
    header = request.headers.get("Authorization", "")
    scheme, _, token = header.partition(" ")
    tenant = None
    if scheme.lower() == "bearer" and token.strip():
        tenant = request.app[CONFIG].authenticate(token.strip())
    if tenant is None:
        raise web.HTTPUnauthorized(
            reason="Authorization: missing or invalid bearer token",
            headers={"WWW-Authenticate": "Bearer"},
        )
    roles = frozenset({"admin"} if tenant.admin else {"submit", "cancel", "read"})
    request[PRINCIPAL] = Principal(f"token:{tenant.name}", tenant.name, roles)
    wait = request.app[LIMITER].retry_after(tenant.name)
    if wait is not None:
        limit = request.app[CONFIG].api.rate_limit_per_tenant
        raise web.HTTPTooManyRequests(
            reason=f"rate limit: tenant {tenant.name!r} is over {limit.requests_per_second:g} "
            f"requests/s (burst {limit.burst}); retry after {wait} s",
            headers={"Retry-After": str(wait)},
        )
    return tenant


def seen_by(tenant: TenantConfig) -> str | None:
    """Whose jobs the caller sees: its own tenant's, or everyone's (None) for an admin."""
    return None if tenant.admin else tenant.name


def owner_of(request: web.Request, tenant: TenantConfig) -> str:
    """Whose job a path names: the caller's, or for an admin the ``tenant`` query's."""
    other = request.query.get("tenant")
    return other if tenant.admin and other else tenant.name


__all__ = ["owner_of", "seen_by", "tenant_of"]
