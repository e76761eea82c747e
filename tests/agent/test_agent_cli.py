"""``fedbroker agent --launch-config``: a wrong file or key is one line and exit 2, before
anything connects; the command key is given to the log redactor like the MQTT password."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from pki import Authority

from broker.cli.main import main

KEY = "agent-key-7f3c9e1d5b0a24683579acebd0f1e2a3"


def agent(tmp_path: Path, config: str) -> list[str]:
    path = tmp_path / "launch.yaml"
    path.write_text(config)
    kubeconfig = tmp_path / "kc"
    kubeconfig.write_text("{}")
    return ["agent", "--cluster", "edge", "--kubeconfig", str(kubeconfig), "--mqtt-host", "h",
            "--launch-config", str(path)]  # fmt: skip


@pytest.mark.usefixtures("real_logging")
def test_a_wrong_launch_config_is_one_line_and_the_key_is_redacted(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FEDBROKER_AGENT_KEY", KEY)
    assert main(agent(tmp_path, "tenants: [{name: a, podSecurity: root}]")) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "--launch-config " in err and "launch.yaml: tenants[0].podSecurity: " in err
    logging.getLogger("broker.agent").warning("leaked %s", KEY)
    out = capsys.readouterr()
    assert "leaked" in out.err and KEY not in out.err + out.out


@pytest.mark.usefixtures("real_logging")
def test_a_short_command_key_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FEDBROKER_AGENT_KEY", "short-key")
    assert main(agent(tmp_path, "{}")) == 2
    err = capsys.readouterr().err
    assert err == "fedbroker: error: FEDBROKER_AGENT_KEY must be at least 32 characters\n"


def _tls_rows() -> list[tuple[list[str], str]]:
    """(flags, the one line they give) with ``JUNK`` a file that is no PEM, ``MISSING`` none."""
    return [
        (["--mqtt-ca-file", "MISSING"], "--mqtt-ca-file: no such file: MISSING"),
        (["--mqtt-cert-file", "JUNK"], "--mqtt-cert-file and --mqtt-key-file go together"),
        (["--mqtt-key-file", "JUNK"], "--mqtt-cert-file and --mqtt-key-file go together"),
        (["--mqtt-cert-file", "JUNK", "--mqtt-key-file", "MISSING"],
         "--mqtt-key-file: no such file: MISSING"),
        (["--mqtt-ca-file", "JUNK"], "--mqtt-ca-file: cannot load the CA certificates: "),
        (["--mqtt-cert-file", "JUNK", "--mqtt-key-file", "JUNK"],
         "--mqtt-cert-file/--mqtt-key-file: cannot load the certificate and key: "),
        (["--context", "c"], "--context needs --kubeconfig"),
    ]  # fmt: skip


@pytest.mark.usefixtures("real_logging")
def test_wrong_mqtt_tls_flags_are_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    junk, missing = tmp_path / "junk.pem", tmp_path / "missing.pem"
    junk.write_text("not a certificate")
    base = ["agent", "--cluster", "edge", "--mqtt-host", "h"]  # in-cluster: no kubeconfig
    for flags, line in _tls_rows():
        argv = [str(junk) if f == "JUNK" else str(missing) if f == "MISSING" else f
                for f in flags]  # fmt: skip
        assert main([*base, *argv]) == 2, flags
        err = capsys.readouterr().err
        assert err.count("\n") == 1, err
        assert err.startswith(f"fedbroker: error: {line.replace('MISSING', str(missing))}"), err


@pytest.mark.usefixtures("real_logging")
def test_the_mqtt_client_key_is_redacted(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ca = Authority(tmp_path)
    cert, key = ca.issue("edge", 2)
    tls = ["--mqtt-ca-file", str(ca.ca_file), "--mqtt-cert-file", str(cert),
           "--mqtt-key-file", str(key)]  # fmt: skip
    # The files load; the launch config stops it before anything connects.
    assert main([*agent(tmp_path, "tenants: [{name: a, podSecurity: root}]"), *tls]) == 2
    assert "--launch-config " in capsys.readouterr().err
    body = key.read_text().splitlines()[1]
    logging.getLogger("broker.agent").warning("leaked %s", body)
    out = capsys.readouterr()
    assert "leaked" in out.err and body not in out.err + out.out
