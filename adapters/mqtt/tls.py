"""TLS to the MQTT broker: the server verified against a CA file (else the system's trust
store), and optionally a client certificate, which mosquitto can take as the username
(``use_identity_as_username``), so each agent is known by its certificate alone.

``MqttTls.context()`` builds the ``ssl.SSLContext`` handed to aiomqtt (``tls_context``):
TLS 1.2 or newer, the server's certificate and host name always checked. It loads every
file when called, so a wrong file is refused before anything connects, with one line that
names the setting (``labels``: the config's keys or the agent's flags) and never the key's
content.

A client keeps its context for life (paho takes it once), so renewed files are loaded into
that same context (``refresh``) while it is not connected: checked on a fresh context
first, because OpenSSL drops the old key before it checks a new pair, and a bad pair would
leave none. A CA added to the file is trusted from then on; one removed stays trusted until
a restart.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass

from broker.process import Stamp, file_stamp, tls_reason

# What a file looked like: (mtime ns, size, inode), or None when missing.


class MqttTlsError(Exception):
    """A CA, certificate or key file of MQTT's TLS does not load (one line)."""


@dataclass(frozen=True, slots=True)
class MqttTls:
    ca_file: str | None = None  # None: the system's trust store
    cert_file: str | None = None  # with key_file: the client certificate (chain), PEM
    key_file: str | None = None  # its unencrypted PEM key: the path only, never its content
    # What errors call the CA file and the certificate/key pair.
    labels: tuple[str, str] = ("caFile", "certFile/keyFile")

    def context(self) -> ssl.SSLContext:
        """A client context; raises ``MqttTlsError`` naming the setting that does not load."""
        ca_label, pair_label = self.labels
        if (self.cert_file is None) != (self.key_file is None):
            raise MqttTlsError(f"{pair_label}: give both or neither")
        if self.ca_file is None:
            context = ssl.create_default_context()
        else:  # only that CA: not the system's as well
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
            try:
                context.load_verify_locations(cafile=self.ca_file)
            except (OSError, ssl.SSLError, ValueError) as exc:
                raise MqttTlsError(f"{ca_label}: cannot load the CA certificates: "
                                   f"{tls_reason(exc)}") from None  # fmt: skip
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        if self.cert_file is not None and self.key_file is not None:
            try:
                context.load_cert_chain(self.cert_file, self.key_file)
            except (OSError, ssl.SSLError, ValueError) as exc:  # no key material in these
                raise MqttTlsError(f"{pair_label}: cannot load the certificate and key: "
                                   f"{tls_reason(exc)}") from None  # fmt: skip
        return context

    def stamp(self) -> tuple[Stamp, ...]:
        """What the files look like now: compare to tell whether they changed."""
        return tuple(file_stamp(p) for p in (self.ca_file, self.cert_file, self.key_file))

    def refresh(self, context: ssl.SSLContext) -> None:
        """Load the files again into ``context`` (one no connection is using); raises
        ``MqttTlsError``, leaving ``context`` as it was, when they do not load."""
        self.context()
        try:
            if self.ca_file is not None:
                context.load_verify_locations(cafile=self.ca_file)
            if self.cert_file is not None and self.key_file is not None:
                context.load_cert_chain(self.cert_file, self.key_file)
        except (OSError, ssl.SSLError, ValueError) as exc:  # changed again meanwhile
            raise MqttTlsError(f"{self.labels[1]}: cannot load again: {tls_reason(exc)}") from None


__all__ = ["MqttTls", "MqttTlsError"]
