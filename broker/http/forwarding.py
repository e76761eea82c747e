"""A follower's forward of a write to the leader (``leaderElection.forwardWrites``): which
writes go, to which address (over HTTPS when the API serves TLS, the leader's certificate
verified as ``broker.http.tls`` says), and the leader's answer relayed back as it came."""

from __future__ import annotations

import logging
import re
from collections.abc import AsyncIterator

import aiohttp
from aiohttp import web
from yarl import URL

from broker.http.state import CONFIG, FORWARDER, SERVICE, TLS, route_template
from broker.service.admission import NotLeader

log = logging.getLogger(__name__)

FORWARDED_BY = "X-Fedbroker-Forwarded-By"  # set on the hop, and on the answer relayed back
FORWARD_TIMEOUT = aiohttp.ClientTimeout(total=10, sock_connect=2)
WRITE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
_REQUEST_HEADERS = ("Authorization", "Content-Type", "Accept", "X-Request-Id")
_RESPONSE_HEADERS = (
    "Content-Type", "Retry-After", "X-Fedbroker-Leader", "WWW-Authenticate", "Allow",
)  # fmt: skip
# host:port (a DNS name or IPv4 address) or [IPv6]:port: an identity that is an address.
_ADDRESS = re.compile(
    r"(?:[A-Za-z0-9](?:[A-Za-z0-9.-]{0,251}[A-Za-z0-9])?|\[[0-9A-Fa-f:.]{2,45}\]):[0-9]{1,5}"
)


def leader_address(holder: str | None, me: str) -> str | None:
    """The leader's identity when it is an address (host:port) and not this replica's."""
    if not holder or holder == me or not _ADDRESS.fullmatch(holder):
        return None
    return holder if 1 <= int(holder.rpartition(":")[2]) <= 65_535 else None


def _forwardable(request: web.Request) -> bool:
    """Forwarding on, a write under /v1/, and not forwarded once already (no loops)."""
    return (
        request.app.get(FORWARDER) is not None
        and request.app[CONFIG].leader_election.forward_writes
        and request.method in WRITE_METHODS
        and request.path.startswith("/v1/")
        and FORWARDED_BY not in request.headers
    )


async def forward(request: web.Request, refused: NotLeader) -> web.Response | None:
    """The leader's answer to this write, relayed (with ``X-Fedbroker-Forwarded-By``), or
    None when it is not forwarded: forwarding off, not a write under /v1/, already
    forwarded once (no loops), the leader unknown or no address, or the leader not
    answering within FORWARD_TIMEOUT. Whatever the leader answers is relayed, a 503 too
    (it stopped leading meanwhile: its answer names the newer leader).

    The Authorization header goes to the leader as it came; it is never logged."""
    me = request.app[SERVICE].leadership.identity
    if not _forwardable(request):
        return None
    address = leader_address(refused.holder, me)
    if address is None:
        return None
    body = await request.read()  # already read (and size-checked) by the handler: cached
    headers = {k: request.headers[k] for k in _REQUEST_HEADERS if k in request.headers}
    headers[FORWARDED_BY] = me
    certificates = request.app.get(TLS)
    scheme = "http" if certificates is None else "https"
    url = URL(f"{scheme}://{address}{request.raw_path}", encoded=True)  # path, query as sent
    tls = True if certificates is None else certificates.client
    try:
        async with request.app[FORWARDER].request(
            request.method, url, data=body, headers=headers, allow_redirects=False, ssl=tls
        ) as answer:
            payload = await answer.read()
            relayed = {k: answer.headers[k] for k in _RESPONSE_HEADERS if k in answer.headers}
            status = answer.status
    except (aiohttp.ClientError, TimeoutError) as exc:
        # The route template and the error only: no path (job names), no headers (token).
        log.warning(
            "%s %s not forwarded to the leader %s (%s: %s); answering 503",
            request.method, route_template(request), address, type(exc).__name__, exc,
        )  # fmt: skip
        return None
    log.info("%s %s forwarded to the leader %s: %d", request.method, route_template(request),
             address, status)  # fmt: skip
    relayed[FORWARDED_BY] = me
    return web.Response(body=payload, status=status, headers=relayed)


async def forwarder(app: web.Application) -> AsyncIterator[None]:
    """The HTTP client a follower forwards writes with (one pool, closed on shutdown)."""
    async with aiohttp.ClientSession(timeout=FORWARD_TIMEOUT) as session:
        app[FORWARDER] = session
        yield


__all__ = ["FORWARDED_BY", "FORWARD_TIMEOUT", "WRITE_METHODS", "forward", "forwarder",
           "leader_address"]  # fmt: skip
