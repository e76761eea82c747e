"""The CLI explains itself (issue 16, acceptance 2): every option of every subcommand has
help text, and an option with a default says it; ``--version`` comes from the package's
metadata; ``fedbroker completion bash|zsh`` prints a script that bash runs."""

from __future__ import annotations

import argparse
import importlib.metadata
import shutil
import subprocess
from pathlib import Path

import pytest

from broker.cli.completion import bash_script
from broker.cli.main import build_parser, main


def parsers() -> dict[str, argparse.ArgumentParser]:
    """``fedbroker`` and each of its subcommands' parsers, by command line."""
    top = build_parser()
    found = {"fedbroker": top}
    for action in top._actions:
        if isinstance(action, argparse._SubParsersAction):
            found.update({f"fedbroker {n}": p for n, p in action.choices.items()})
    return found


PARSERS = parsers()


def _undocumented(parser: argparse.ArgumentParser) -> list[str]:
    """Options (and positionals) without help, and options whose default goes unsaid."""
    formatter = parser._get_formatter()
    missing = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction | argparse._HelpAction):
            continue
        name = "/".join(action.option_strings) or action.dest
        if not (action.help or "").strip() or action.help is argparse.SUPPRESS:
            missing.append(f"{name}: no help")
            continue
        shown = formatter._expand_help(action)
        silent = action.default in (None, False, [], argparse.SUPPRESS)
        if action.option_strings and not silent and "default" not in shown:
            missing.append(f"{name}: default {action.default!r} not stated")
    return missing


@pytest.mark.parametrize("command", list(PARSERS))
def test_every_option_has_help_and_states_its_default(command: str) -> None:
    assert _undocumented(PARSERS[command]) == []


def test_server_help_states_its_default_and_variable() -> None:
    text = PARSERS["fedbroker list"].format_help()
    assert "--server URL" in text
    flat = " ".join(text.split())
    assert "default $FEDBROKER_SERVER, else http://127.0.0.1:8080" in flat
    assert "default $FEDBROKER_TOKEN" in flat


def test_version_is_the_package_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    assert exited.value.code == 0
    assert capsys.readouterr().out == f"fedbroker {importlib.metadata.version('fedbroker')}\n"


@pytest.mark.parametrize("shell", ["bash", "zsh"])
def test_completion_prints_a_script(shell: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["completion", shell]) == 0
    script = capsys.readouterr().out
    assert "complete -o default -F _fedbroker fedbroker" in script
    for word in ("submit", "list", "--selector", "--watch", "--mine"):
        assert word in script


def _complete(words: list[str]) -> list[str]:
    """What bash offers after ``words`` (the last is the word being completed)."""
    line = " ".join(words)
    program = (
        bash_script(build_parser())
        + f"COMP_WORDS=({line}); COMP_CWORD={len(words) - 1}; _fedbroker; "
        + 'printf "%s\\n" "${COMPREPLY[@]}"\n'
    )
    done = subprocess.run(
        ["bash", "--norc", "--noprofile"], input=program, capture_output=True, text=True,
        check=True,
    )  # fmt: skip
    return done.stdout.split()


@pytest.mark.skipif(shutil.which("bash") is None, reason="no bash")
def test_bash_completes_commands_options_and_choices() -> None:
    assert _complete(["fedbroker", "ex"]) == ["explain"]
    assert set(_complete(["fedbroker", "list", "--s"])) == {
        "--server",
        "--state",
        "--selector",
        "--sort-by",
    }
    assert _complete(["fedbroker", "get", "-o", "y"]) == ["yaml"]
    assert set(_complete(["fedbroker", "completion", ""])) >= {"bash", "zsh"}


def test_the_reference_names_every_command_and_flag() -> None:
    """docs/cli.md keeps up with the parser: every command has its section, every flag
    appears in it."""
    text = (Path(__file__).resolve().parents[2] / "docs" / "cli.md").read_text()
    sections = {s.split("`", 2)[1]: s for s in text.split("\n### ")[1:]}
    connection = {"--server", "--token", "--ca-file", "--context"}
    for command, parser in PARSERS.items():
        if command == "fedbroker":
            continue
        assert command in sections, f"docs/cli.md has no section for {command}"
        for action in parser._actions:
            for flag in action.option_strings:
                if flag in ("-h", "--help"):
                    continue
                where = text if flag in connection else sections[command]
                assert f"`{flag}" in where, f"docs/cli.md: {command} {flag} missing"
