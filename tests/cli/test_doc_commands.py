"""Every ``fedbroker ...`` command in the README and docs/ (fenced ``sh`` blocks) parses with
the real CLI: a renamed flag or subcommand fails here, not in a newcomer's terminal. Parsing
only (argparse, as ``--help`` would), nothing runs."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from broker.cli.main import build_parser

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.M | re.S)
# How a command line names the CLI: the installed script or the module.
PROGRAMS = ("fedbroker", ".venv/bin/fedbroker", "$(BIN)/fedbroker")
MODULE = ("-m", "broker.cli")
SEPARATORS = {"|", "||", "&&", ";", "&"}


def sh_blocks(page: Path) -> list[str]:
    return [body for lang, body in FENCE.findall(page.read_text()) if lang in ("sh", "bash")]


def words(block: str) -> list[list[str]]:
    """Each simple command of a block as words: continuations joined, comments dropped,
    pipelines and lists split, redirections and leading VAR=value assignments removed,
    ``$VAR`` and ``<placeholder>`` taken as one word."""
    text = block.replace("\\\n", " ")
    text = re.sub(r"<[^<>\n]+>", "PLACEHOLDER", text)
    commands: list[list[str]] = []
    for line in text.splitlines():
        lexer = shlex.shlex(line, posix=True, punctuation_chars="|&;<>")
        lexer.whitespace_split = True
        lexer.commenters = "#"
        current: list[str] = []
        skip_next = False
        for word in lexer:
            if skip_next:
                skip_next = False
                continue
            if word in SEPARATORS:
                commands.append(current)
                current = []
            elif word in (">", ">>", "<", "2>"):
                skip_next = True
            elif not current and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", word):
                continue
            else:
                current.append(word)
        commands.append(current)
    return [c for c in commands if c]


def cli_args(command: list[str]) -> list[str] | None:
    """The arguments after the program when ``command`` runs the CLI, else None."""
    if command[0] in PROGRAMS:
        return command[1:]
    for i in range(len(command) - 1):
        if tuple(command[i : i + 2]) == MODULE:
            return command[i + 2 :]
    return None


def documented_commands() -> list[tuple[str, list[str]]]:
    found = []
    for page in PAGES:
        for block in sh_blocks(page):
            for command in words(block):
                args = cli_args(command)
                if args is not None:
                    found.append((f"{page.relative_to(ROOT)}: {shlex.join(command)}", args))
    return found


COMMANDS = documented_commands()


def test_the_docs_show_commands_to_check() -> None:
    pages = {where.split(":")[0] for where, _ in COMMANDS}
    assert "README.md" in pages
    assert len(COMMANDS) >= 20, COMMANDS


@pytest.mark.parametrize(("where", "args"), COMMANDS, ids=[w for w, _ in COMMANDS])
def test_a_documented_command_parses(where: str, args: list[str]) -> None:
    parser = build_parser()
    try:
        parser.parse_args(args)
    except SystemExit as exc:  # argparse's way of refusing (or of printing --help)
        assert exc.code == 0, f"{where}: the CLI refuses it"


def test_a_wrong_flag_is_caught() -> None:
    """The check itself can fail: a flag the CLI does not have is refused."""
    with pytest.raises(SystemExit) as refused:
        build_parser().parse_args(["list", "--no-such-flag"])
    assert refused.value.code != 0


def test_the_readme_is_a_front_door() -> None:
    """Short enough to read first, and a map to every page under docs/."""
    readme = (ROOT / "README.md").read_text()
    assert len(readme.encode()) < 10 * 1024
    assert readme.index("make run") < readme.index("make test") < 2000  # the two commands first
    linked = set(re.findall(r"\]\(docs/([^)#\s]+)", readme))
    pages = {page.name for page in (ROOT / "docs").glob("*.md")}
    assert pages - linked == set(), "docs pages the README does not link"
