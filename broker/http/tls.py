"""The API's TLS (``api.tls``): the listening context (TLS 1.2+, mutual TLS with a client
CA), the client context a follower forwards writes to the leader with, and both rebuilt
when the certificate, key or CA files change, without a restart.

A certificate is never loaded into the context that is serving: OpenSSL drops the old key
before it checks a new pair, so a bad pair would leave it with none. Each reload builds
fresh contexts from the files, and only a pair that loads is taken; the listening
context's SNI callback (called on every handshake, with or without a server name) hands
each new handshake the newest context, so new connections get the new certificate and
open ones keep theirs. A bad pair keeps the previous one and logs one line, once per
change of the files. A CA change is picked up the same way.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Awaitable, Callable
from typing import Any

from broker.config import TlsConfig
from broker.process import Stamp, file_stamp, tls_reason

log = logging.getLogger(__name__)

# What a file looked like when last loaded: (mtime ns, size, inode), or None when missing.


class TlsError(Exception):
    """The certificate, key or a CA of ``api.tls`` cannot be loaded (one line)."""


def _server_context(tls: TlsConfig) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    _load(context, tls.cert_file, tls.key_file, "api.tls.certFile/keyFile")
    if tls.client_ca_file is not None:
        _trust(context, tls.client_ca_file, "api.tls.clientCAFile")
        context.verify_mode = ssl.CERT_REQUIRED
    return context


def _client_context(tls: TlsConfig) -> ssl.SSLContext:
    """How a follower reaches the leader: its certificate verified with ``caFile`` (else
    ``clientCAFile``, else the system's trust store); under mutual TLS it presents its own
    certificate, which the leader checks against the same client CA."""
    ca = tls.ca_file or tls.client_ca_file
    if ca is None:
        context = ssl.create_default_context()
    else:  # only that CA: not the system's as well
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        _trust(context, ca, "api.tls.caFile" if tls.ca_file else "api.tls.clientCAFile")
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    if tls.client_ca_file is not None:
        _load(context, tls.cert_file, tls.key_file, "api.tls.certFile/keyFile")
    return context


def _load(context: ssl.SSLContext, cert: str, key: str, keys: str) -> None:
    try:
        context.load_cert_chain(cert, key)
    except (OSError, ssl.SSLError, ValueError) as exc:  # the message holds no key material
        raise TlsError(f"{keys}: cannot load the certificate and key: {tls_reason(exc)}") from None


def _trust(context: ssl.SSLContext, ca: str, key: str) -> None:
    try:
        context.load_verify_locations(cafile=ca)
    except (OSError, ssl.SSLError, ValueError) as exc:
        raise TlsError(f"{key}: cannot load the CA certificates: {tls_reason(exc)}") from None


class ApiCertificates:
    """The API's TLS contexts from ``api.tls``; ``reload()`` takes changed files in.

    ``server`` is the context to listen with (it never changes; its SNI callback hands each
    handshake the current one); ``client`` is the current context for forwarding.
    Raises TlsError when the files cannot be loaded at start."""

    def __init__(self, tls: TlsConfig) -> None:
        self.tls = tls
        self._stamps = self._read_stamps()
        self._current = _server_context(tls)
        self.client = _client_context(tls)
        self.server = _server_context(tls)
        self.server.sni_callback = self._hand_over
        self.reloads = 0  # pairs taken in since start

    def _read_stamps(self) -> tuple[Stamp, ...]:
        t = self.tls
        return tuple(file_stamp(p) for p in (t.cert_file, t.key_file, t.client_ca_file, t.ca_file))

    def _hand_over(self, connection: Any, server_name: str | None, _: ssl.SSLContext) -> None:
        connection.context = self._current

    def reload(self) -> bool:
        """Take the files in if they changed since the last attempt: True when a new pair
        (and CA) now serves new handshakes; a pair that does not load keeps the old one
        (one line logged)."""
        stamps = self._read_stamps()
        if stamps == self._stamps:
            return False
        self._stamps = stamps
        try:
            server, client = _server_context(self.tls), _client_context(self.tls)
        except TlsError as exc:
            log.error("%s; still serving the previous certificate", exc)
            return False
        self._current, self.client = server, client
        self.reloads += 1
        log.info("api.tls: new certificate loaded from %s", self.tls.cert_file)
        return True

    async def watch(
        self, interval: float, sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep
    ) -> None:
        """Check the files every ``interval`` seconds, forever (a supervised task)."""
        while True:
            await sleep(interval)
            self.reload()


__all__ = ["ApiCertificates", "TlsError"]
