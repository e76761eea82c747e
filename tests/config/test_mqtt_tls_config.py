"""``events.mqtt.tls``: files that exist at load, the certificate and its key together, one
line naming the field; what the config says reaches the MQTT client's settings; ``serve``
refuses a file that does not load in one line, before anything starts."""

from __future__ import annotations

from pathlib import Path

import pytest
from pki import Authority

from broker.cli.main import main
from broker.config import ConfigError, parse_config
from broker.service.mqtt import settings_of

CONFIG = """
store: {{url: "sqlite:///{db}"}}
events:
  mqtt: {{host: 127.0.0.1, port: 8883, tls: {tls}}}
queues: [{{name: training}}]
tenants:
- {{name: team-a, defaultQueue: training, token: {{value: tok-a-0123456789abcdef0123456789}}}}
"""


def config_text(tmp_path: Path, tls: str) -> str:
    return CONFIG.format(db=tmp_path / "jobs.db", tls=tls)


def test_the_files_reach_the_mqtt_settings(tmp_path: Path) -> None:
    ca = Authority(tmp_path)
    cert, key = ca.issue("fedbroker.broker", 2)
    tls = f"{{caFile: {ca.ca_file}, certFile: {cert}, keyFile: {key}}}"
    settings = settings_of(parse_config(config_text(tmp_path, tls), "broker.yaml", {}))
    assert settings.tls is not None
    assert (settings.tls.ca_file, settings.tls.cert_file, settings.tls.key_file) == (
        str(ca.ca_file), str(cert), str(key),
    )  # fmt: skip
    assert settings.tls_context() is not None
    # An empty section: TLS, the server verified by the system's trust store.
    empty = settings_of(parse_config(config_text(tmp_path, "{}"), "broker.yaml", {}))
    assert empty.tls is not None and empty.tls.ca_file is None
    # No section: plain TCP.
    plain = config_text(tmp_path, "null")
    assert settings_of(parse_config(plain, "broker.yaml", {})).tls is None


@pytest.mark.parametrize(
    ("tls", "error"),
    [
        ("{caFile: MISSING}", "events.mqtt.tls.caFile: no such file: MISSING"),
        ("{certFile: FILE}", "events.mqtt.tls.keyFile: required with certFile"),
        ("{keyFile: FILE}", "events.mqtt.tls.certFile: required with keyFile"),
        ("{certFile: FILE, keyFile: MISSING}", "events.mqtt.tls.keyFile: no such file: MISSING"),
        ("{caFile: FILE, crtFile: FILE}", "events.mqtt.tls.crtFile: "),
    ],
)
def test_a_wrong_section_is_one_line_naming_the_field(tmp_path: Path, tls: str, error: str) -> None:
    file, missing = tmp_path / "file.pem", tmp_path / "missing.pem"
    file.write_text("x")
    tls = tls.replace("MISSING", str(missing)).replace("FILE", str(file))
    with pytest.raises(ConfigError) as raised:
        parse_config(config_text(tmp_path, tls), "broker.yaml", {})
    message = str(raised.value)
    assert message.startswith("broker.yaml: " + error.replace("MISSING", str(missing)))
    assert "\n" not in message


def test_serve_refuses_a_file_that_does_not_load_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    junk = tmp_path / "junk.pem"
    junk.write_text("not a certificate")
    path = tmp_path / "broker.yaml"
    path.write_text(config_text(tmp_path, f"{{certFile: {junk}, keyFile: {junk}}}"))
    assert main(["serve", "--config", str(path), "--port", "0"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith(
        f"fedbroker: error: {path}: events.mqtt.tls.certFile/keyFile: cannot load the "
    ), err
