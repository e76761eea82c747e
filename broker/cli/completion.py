"""``fedbroker completion bash|zsh``: a shell completion script, made from the parser.

The script is written out from ``build_parser()``'s own subcommands and options (no extra
dependency, nothing to keep in step by hand): it completes the subcommand, then that
subcommand's options, the choices of an option that has them (``-o json``), file names
after options that take a file, and, where a job's name is expected (``JOB_COMMANDS``), the
names of the caller's jobs, asked of the broker as kubectl does (``fedbroker __complete
jobs``, ``broker.cli.jobnames``, with the line's connection flags, ``--context`` too).
Install it with ``source <(fedbroker completion bash)`` (bash) or ``source <(fedbroker
completion zsh)`` (zsh), e.g. from ~/.bashrc or ~/.zshrc.
"""

from __future__ import annotations

import argparse
from typing import Any

SHELLS = ("bash", "zsh")
JOB_COMMANDS = ("get", "explain", "cancel", "pods", "logs")  # their positional is a job's name


def add_completion_command(sub: Any) -> None:
    cmd = sub.add_parser(
        "completion", help="print a shell completion script (bash or zsh)",
        description="Print a completion script for your shell; load it with "
        "`source <(fedbroker completion bash)` (or zsh), e.g. from ~/.bashrc.",
    )  # fmt: skip
    cmd.add_argument("shell", choices=SHELLS, help="the shell to complete in")


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _words(parser: argparse.ArgumentParser) -> tuple[list[str], dict[str, list[str]], list[str]]:
    """A parser's option strings, the choices of those that have them, and those taking a
    file (their metavar says FILE or their type is Path)."""
    options: list[str] = []
    choices: dict[str, list[str]] = {}
    files: list[str] = []
    for action in parser._actions:
        options.extend(action.option_strings)
        if action.option_strings and action.choices:
            for opt in action.option_strings:
                choices[opt] = [str(c) for c in action.choices]
        takes_file = getattr(action.type, "__name__", "") in ("Path", "PosixPath") or (
            isinstance(action.metavar, str) and "FILE" in action.metavar
        )
        if action.option_strings and takes_file:
            files.extend(action.option_strings)
    return options, choices, files


def _takes_value(parser: argparse.ArgumentParser) -> list[str]:
    """The options followed by a value (``-p POD``), where no job name is offered."""
    return [
        opt
        for a in parser._actions
        if a.option_strings and a.nargs != 0
        for opt in a.option_strings
    ]


# The job names of the line's broker: its connection flags passed on (``--server x``, and
# ``--server=x``, which bash splits into three words).
_JOBS_FUNCTION = """\
_fedbroker_jobs() {
    local i w flags=()
    for ((i = 1; i < COMP_CWORD; i++)); do
        w="${COMP_WORDS[i]}"
        case "$w" in --server|--token|--ca-file|--context)
            if [[ "${COMP_WORDS[i+1]}" == "=" ]]; then flags+=("$w=${COMP_WORDS[i+2]}")
            else flags+=("$w" "${COMP_WORDS[i+1]}"); fi;;
        esac
    done
    "${COMP_WORDS[0]}" __complete jobs "${flags[@]}" -- "$1" 2>/dev/null
}
"""
_JOBS_REPLY = (
    '            [[ "$cur" != -* ]] && '
    'COMPREPLY=($(compgen -W "$(_fedbroker_jobs "$cur")" -- "$cur")) && return\n'
)


def bash_script(parser: argparse.ArgumentParser) -> str:
    subs = _subparsers(parser)
    cases = []
    for name, sub in subs.items():
        options, choices, files = _words(sub)
        positional = [a for a in sub._actions if not a.option_strings and a.choices]
        values = " ".join(str(c) for a in positional for c in (a.choices or ()))
        reply = '            {}) COMPREPLY=($(compgen {} -- "$cur")); return;;'
        inner = [
            reply.format("|".join(opts), f'-W "{" ".join(vals)}"')
            for opts, vals in _group(choices).items()
        ]
        if files:
            inner.append(reply.format("|".join(files), "-f"))
        jobs = ""
        if name in JOB_COMMANDS:
            inner.append(f"            {'|'.join(_takes_value(sub))}) return;;")
            jobs = _JOBS_REPLY
        cases.append(
            f"        {name})\n"
            f'            case "$prev" in\n' + "\n".join(inner) + ("\n" if inner else "")
            + "            esac\n" + jobs
            + f'            COMPREPLY=($(compgen -W "{" ".join(options)} {values}" -- "$cur"));;'
        )  # fmt: skip
    top = " ".join([*subs, "--version", "-h", "--help"])
    return (
        "# fedbroker bash completion: source <(fedbroker completion bash)\n"
        + _JOBS_FUNCTION
        + "_fedbroker() {\n"
        '    local cur="${COMP_WORDS[COMP_CWORD]}" prev="${COMP_WORDS[COMP_CWORD-1]}" cmd=""\n'
        "    local i\n"
        "    for ((i = 1; i < COMP_CWORD; i++)); do\n"
        '        case "${COMP_WORDS[i]}" in -*) ;; *) cmd="${COMP_WORDS[i]}"; break;; esac\n'
        "    done\n"
        '    case "$cmd" in\n'
        f'        "") COMPREPLY=($(compgen -W "{top}" -- "$cur"));;\n'
        + "\n".join(cases) + "\n"
        "    esac\n"
        "}\n"
        "complete -o default -F _fedbroker fedbroker\n"
    )  # fmt: skip


def _group(choices: dict[str, list[str]]) -> dict[tuple[str, ...], list[str]]:
    """Options with the same choices on one ``case`` line: {options: choices}."""
    by_values: dict[tuple[str, ...], list[str]] = {}
    for opt, vals in choices.items():
        by_values.setdefault(tuple(vals), []).append(opt)
    return {tuple(opts): list(vals) for vals, opts in by_values.items()}


def zsh_script(parser: argparse.ArgumentParser) -> str:
    """zsh: the bash script through zsh's bashcompinit (one script to keep right)."""
    return (
        "# fedbroker zsh completion: source <(fedbroker completion zsh)\n"
        "(( $+functions[compdef] )) || { autoload -U +X compinit && compinit; }\n"
        "autoload -U +X bashcompinit && bashcompinit\n" + bash_script(parser)
    )


def completion_script(parser: argparse.ArgumentParser, shell: str) -> str:
    return bash_script(parser) if shell == "bash" else zsh_script(parser)


__all__ = [
    "JOB_COMMANDS",
    "SHELLS",
    "add_completion_command",
    "bash_script",
    "completion_script",
    "zsh_script",
]
