"""Who a request acts as, once authenticated: the subject, its tenant and its roles.

Authentication (``broker.http.auth``) stores one ``Principal`` on the request under
``PRINCIPAL``; the audit trail and the access log read it from there (absent: the request
was not authenticated)."""

from __future__ import annotations

from dataclasses import dataclass

from aiohttp import web


@dataclass(frozen=True, slots=True)
class Principal:
    subject: str  # who: a static token's name or an OIDC subject; never a secret
    tenant: str  # whose jobs it acts on
    roles: frozenset[str]  # e.g. submit, cancel, read, viewer, admin


# The request key authentication stores the principal under (aiohttp request mapping).
PRINCIPAL = web.RequestKey("fedbroker.principal", Principal)


def principal_of(request: web.Request) -> Principal | None:
    """The request's principal, if authentication has run and succeeded."""
    return request.get(PRINCIPAL)


__all__ = ["PRINCIPAL", "Principal", "principal_of"]
