"""The client's config file: named contexts, one per broker (or per identity on a broker),
like kubeconfig's.

The file is YAML at ``$FEDBROKER_CONFIG``, else ``$XDG_CONFIG_HOME/fedbroker/config.yaml``
(``~/.config/fedbroker/config.yaml``)::

    current-context: prod
    contexts:
      - {name: demo, server: 127.0.0.1:8080, token: tok-a-...}
      - name: prod
        server: https://broker.example.com
        caFile: ~/.config/fedbroker/prod-ca.pem
        tokenCommand: [vault, read, -field=token, secret/fedbroker/prod]

``tokenCommand`` is an argv list, run without a shell (no quoting to get wrong, nothing of
the user's environment expanded); its standard output, stripped, is the token. The token is
never printed or logged: a failing command is reported by its exit status and its first
argument only. A file that holds a literal ``token`` and that the group or others may read
draws a warning on stderr (as kubectl and ssh do), not a refusal: the token is the user's
and the warning says how to fix the mode.

A file that is not YAML, or whose fields are wrong, is one line naming the file and the
field, exit 2 (``ContextFileError`` is a ``UsageError``). No file at all is no context.
"""

from __future__ import annotations

import argparse
import os
import stat
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from broker.cli.args import UsageError
from broker.cli.output import add_output_options, emit
from broker.cli.render import table

CONFIG_ENV = "FEDBROKER_CONFIG"
TOKEN_COMMAND_TIMEOUT_SECONDS = 30.0


class ContextFileError(UsageError):
    """The config file is unreadable or wrong: one line naming the file and the field."""


class TokenCommandFailed(Exception):
    """A context's tokenCommand could not give a token (not the file's fault)."""


class Context(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True, frozen=True)

    name: str = Field(min_length=1)
    server: str | None = None
    token: str | None = None
    token_command: list[str] | None = Field(default=None, alias="tokenCommand", min_length=1)
    ca_file: str | None = Field(default=None, alias="caFile")

    @model_validator(mode="after")
    def _one_token_source(self) -> Context:
        if self.token is not None and self.token_command is not None:
            raise ValueError("give token or tokenCommand, not both")
        return self


class ClientConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    contexts: list[Context] = Field(default_factory=list)
    current_context: str | None = Field(default=None, alias="current-context")

    @model_validator(mode="after")
    def _names_known_and_unique(self) -> ClientConfig:
        names = [c.name for c in self.contexts]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"context {twice[0]!r} is named twice")
        if self.current_context is not None and self.current_context not in names:
            raise ValueError(f"current-context: no context named {self.current_context!r}")
        return self

    def context(self, name: str) -> Context | None:
        return next((c for c in self.contexts if c.name == name), None)


@dataclass(frozen=True)
class ConfigFile:
    path: Path
    config: ClientConfig


def config_path() -> Path:
    """Where the file is: $FEDBROKER_CONFIG, else under $XDG_CONFIG_HOME or ~/.config."""
    given = os.environ.get(CONFIG_ENV)
    if given:
        return Path(given).expanduser()
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path("~/.config").expanduser())
    return Path(base) / "fedbroker" / "config.yaml"


def load_config(path: Path | None = None) -> ConfigFile:
    """The file read and checked; an empty config for a file that does not exist."""
    path = path or config_path()
    try:
        text = path.read_text()
    except FileNotFoundError:
        return ConfigFile(path, ClientConfig())
    except OSError as exc:
        raise ContextFileError(f"{path}: cannot read: {exc.strerror}") from None
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark is not None else ""
        raise ContextFileError(f"{path}: not YAML{where}") from None
    try:
        config = ClientConfig.model_validate(raw or {})
    except ValidationError as exc:
        raise ContextFileError(f"{path}: {_first_error(exc)}") from None
    if any(c.token is not None for c in config.contexts):
        _warn_if_readable(path)
    return ConfigFile(path, config)


def _first_error(exc: ValidationError) -> str:
    error = exc.errors()[0]
    where = ".".join(str(p) for p in error["loc"])
    message = str(error["msg"]).removeprefix("Value error, ")
    if error["type"] == "extra_forbidden":
        message = "unknown field"
    return f"{where}: {message}" if where else message


def _warn_if_readable(path: Path) -> None:
    try:
        mode = path.stat().st_mode
    except OSError:
        return
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        sys.stderr.write(
            f"fedbroker: warning: {path} holds a token and others can read it "
            f"(mode {stat.S_IMODE(mode):o}); chmod 600 {path}\n"
        )


def token_from_command(context: Context) -> str:
    """The token a context's tokenCommand prints (its stdout, stripped)."""
    argv = context.token_command or []
    what = f"context {context.name!r}: tokenCommand {argv[0]!r}"
    try:
        done = subprocess.run(  # the user's own command, from the user's own file
            argv, capture_output=True, text=True, timeout=TOKEN_COMMAND_TIMEOUT_SECONDS,
            check=False,
        )  # fmt: skip
    except OSError as exc:
        raise TokenCommandFailed(f"{what}: {exc.strerror}") from None
    except subprocess.TimeoutExpired:
        raise TokenCommandFailed(
            f"{what}: no answer within {TOKEN_COMMAND_TIMEOUT_SECONDS:g} s"
        ) from None
    if done.returncode != 0:
        raise TokenCommandFailed(f"{what} exited {done.returncode}")
    token = done.stdout.strip()
    if not token:
        raise TokenCommandFailed(f"{what} printed nothing")
    return token


def set_current_context(file: ConfigFile, name: str) -> None:
    """Rewrite the file with ``current-context: name`` (the rest kept as read; comments are
    not kept). Written beside it and renamed over it, with the file's own mode."""
    raw: dict[str, Any] = yaml.safe_load(file.path.read_text()) or {}
    raw["current-context"] = name
    mode = stat.S_IMODE(file.path.stat().st_mode)
    temp = file.path.with_name(file.path.name + ".tmp")
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "w") as out:
        yaml.safe_dump(raw, out, sort_keys=False)
    os.replace(temp, file.path)


# -- fedbroker config get-contexts | current-context | use-context NAME ----------------------


def add_config_command(sub: Any) -> None:
    cmd = sub.add_parser(
        "config", help="the client's contexts (brokers and their tokens) in its config file",
        description=f"Contexts of the config file (${CONFIG_ENV}, else "
        "$XDG_CONFIG_HOME/fedbroker/config.yaml or ~/.config/fedbroker/config.yaml).",
    )  # fmt: skip
    verbs = cmd.add_subparsers(dest="verb", required=True, parser_class=type(cmd))
    listing = verbs.add_parser("get-contexts", help="the contexts; * marks the current one")
    add_output_options(listing)
    verbs.add_parser("current-context", help="the current context's name")
    use = verbs.add_parser("use-context", help="make a context the current one")
    use.add_argument("name", help="the context's name")


def run_config(args: argparse.Namespace) -> int:
    file = load_config()
    config = file.config
    if args.verb == "get-contexts":
        emit(contexts_document(config), args.output, _contexts_table)
    elif args.verb == "current-context":
        if config.current_context is None:
            sys.stderr.write(f"fedbroker: error: {file.path}: no current-context is set\n")
            return 1
        print(config.current_context)
    else:
        if config.context(args.name) is None:
            known = ", ".join(c.name for c in config.contexts) or "none"
            raise ContextFileError(f"{file.path}: no context named {args.name!r} (known: {known})")
        set_current_context(file, args.name)
        print(f"switched to context {args.name!r}")
    return 0


def contexts_document(config: ClientConfig) -> dict[str, Any]:
    """The contexts as ``get-contexts -o json`` prints them: how each authenticates, never
    its token."""
    return {
        "current-context": config.current_context,
        "contexts": [
            {"name": c.name, "server": c.server, "caFile": c.ca_file,
             "auth": "token" if c.token else "tokenCommand" if c.token_command else "none"}
            for c in config.contexts
        ],
    }  # fmt: skip


def _contexts_table(doc: dict[str, Any]) -> str:
    current = doc["current-context"]
    rows = [
        ["*" if c["name"] == current else "", c["name"], c["server"], c["auth"], c["caFile"]]
        for c in doc["contexts"]
    ]
    return table(("CURRENT", "NAME", "SERVER", "AUTH", "CA-FILE"), rows)


__all__ = [
    "CONFIG_ENV",
    "ClientConfig",
    "ConfigFile",
    "Context",
    "ContextFileError",
    "TokenCommandFailed",
    "add_config_command",
    "config_path",
    "contexts_document",
    "load_config",
    "run_config",
    "set_current_context",
    "token_from_command",
]
