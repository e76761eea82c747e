"""``fedbroker agent --launch-config``: a wrong file or key is one line and exit 2, before
anything connects; the command key is given to the log redactor like the MQTT password."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

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
