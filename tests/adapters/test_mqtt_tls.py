"""``MqttSettings.tls_context``: the TLS the MQTT client connects with (adapters.mqtt.tls),
built from files of a test CA (pki.Authority): the server always verified (only against the
given CA), TLS 1.2 or newer, the client pair loaded; a file that does not load is one line
naming the setting, never the key's content; renewed files are taken at the next
connection. (More handshakes with mosquitto: tests/deploy/test_mosquitto_acl.py and
tests/agent/test_agent_tls.py.)"""

from __future__ import annotations

import re
import socket
import ssl
from pathlib import Path

import pytest
from builders import until
from pki import Authority
from services import PrivateMosquitto

from adapters.mqtt.publisher import Backoff, MqttSettings, Publisher
from adapters.mqtt.tls import MqttTls, MqttTlsError

LABELS = ("events.mqtt.tls.caFile", "events.mqtt.tls.certFile/keyFile")


@pytest.fixture
def ca(tmp_path: Path) -> Authority:
    return Authority(tmp_path)


def test_without_tls_there_is_no_context() -> None:
    assert MqttSettings("h").tls_context() is None


def test_the_ca_alone_verifies_the_server_against_it_only(ca: Authority) -> None:
    context = MqttSettings("h", tls=MqttTls(str(ca.ca_file))).tls_context()
    assert context is not None
    assert context.verify_mode == ssl.CERT_REQUIRED and context.check_hostname
    assert context.minimum_version == ssl.TLSVersion.TLSv1_2
    subjects = [c["subject"] for c in context.get_ca_certs()]
    assert subjects == [((("commonName", "test-ca"),),)]  # not the system's CAs as well


def test_without_a_ca_the_system_trust_store_verifies(ca: Authority) -> None:
    context = MqttTls().context()
    assert context.verify_mode == ssl.CERT_REQUIRED and context.check_hostname
    assert context.minimum_version >= ssl.TLSVersion.TLSv1_2


def test_the_client_pair_is_loaded_and_the_key_stays_out_of_the_settings(
    ca: Authority,
) -> None:
    cert, key = ca.issue("edge", 2)
    settings = MqttSettings("h", password="pw", tls=MqttTls(str(ca.ca_file), str(cert), str(key)))
    assert settings.tls_context() is not None
    assert "pw" not in repr(settings) and key.read_text() not in repr(settings)
    # The publisher builds it at once: a wrong file fails before any connection.
    broken = MqttTls(str(ca.ca_file), str(cert), str(ca.ca_file), LABELS)
    with pytest.raises(MqttTlsError):
        Publisher(MqttSettings("h", tls=broken))


def _rows(ca: Authority) -> list[tuple[MqttTls, str]]:
    cert, key = ca.issue("edge", 2)
    _, other_key = ca.issue("other", 3)
    missing = str(ca.directory / "missing.pem")
    return [
        (MqttTls(missing, labels=LABELS), "events.mqtt.tls.caFile: cannot load the CA "),
        (MqttTls(str(key), labels=LABELS), "events.mqtt.tls.caFile: cannot load the CA "),
        (MqttTls(cert_file=str(cert), labels=LABELS),
         "events.mqtt.tls.certFile/keyFile: give both or neither"),
        (MqttTls(str(ca.ca_file), str(cert), str(other_key), LABELS),
         "events.mqtt.tls.certFile/keyFile: cannot load the certificate and key: "),
        (MqttTls(str(ca.ca_file), str(cert), missing, LABELS),
         "events.mqtt.tls.certFile/keyFile: cannot load the certificate and key: "),
    ]  # fmt: skip


def test_a_file_that_does_not_load_is_one_line_naming_the_setting(ca: Authority) -> None:
    for tls, start in _rows(ca):
        with pytest.raises(MqttTlsError) as raised:
            tls.context()
        message = str(raised.value)
        assert message.startswith(start), message
        assert "\n" not in message and "PRIVATE KEY" not in message
        for key in ca.directory.glob("*.key"):
            body = key.read_text().splitlines()[1]
            assert body not in message


async def test_a_renewed_certificate_is_used_from_the_next_connection(
    ca: Authority, tmp_path: Path
) -> None:
    """A private mosquitto whose TLS listener takes the certificate's CN as the username:
    the publisher connects as ``old``; its files are replaced by ``new``'s, and after
    mosquitto's restart it connects as ``new``; a pair that does not load keeps ``new``."""
    ca.issue("server", 1)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = int(sock.getsockname()[1])
    d = ca.directory
    mosquitto = PrivateMosquitto(tmp_path / "mosquitto", extra=[
        f"listener {port} 127.0.0.1", f"cafile {ca.ca_file}", f"certfile {d / 'server.crt'}",
        f"keyfile {d / 'server.key'}", "require_certificate true",
        "use_identity_as_username true",
    ])  # fmt: skip
    cert, key = d / "client.crt", d / "client.key"

    def install(cn: str, serial: int, key_of: str | None = None) -> None:
        new_cert, new_key = ca.issue(cn, serial)
        cert.write_bytes(new_cert.read_bytes())
        key.write_bytes((d / f"{key_of}.key" if key_of else new_key).read_bytes())

    def logins() -> list[str]:
        return re.findall(r"New client connected .* u'([^']+)'", mosquitto.log.read_text())

    install("old", 2)
    settings = MqttSettings("127.0.0.1", port, tls=MqttTls(str(ca.ca_file), str(cert), str(key)))
    publisher = Publisher(settings, backoff=Backoff(base=0.05, cap=0.1))
    await mosquitto.start()
    publisher.start()
    try:
        await until(lambda: publisher.connects == 1)
        install("new", 3)
        mosquitto.kill()
        await mosquitto.start()
        await until(lambda: publisher.connects == 2)
        install("newer", 4, key_of="old")  # a certificate with another's key
        mosquitto.kill()
        await mosquitto.start()
        await until(lambda: publisher.connects == 3)
        assert logins() == ["old", "new", "new"]
    finally:
        await publisher.close()
        mosquitto.kill()
