"""How a client command reaches a broker, and what it says when it cannot.

Shared by every command that talks to a running broker (``submit``, ``list``, ``pods``,
``logs``, ...): the ``--server``/``--token``/``--ca-file`` options and their environment
variables, the ``--context`` of the client's config file (``broker.cli.contexts``) and the
order in which they win (``resolved``), the server's URL (``127.0.0.1:8080`` without a
scheme is taken as ``http://127.0.0.1:8080``; anything else that is not an http(s) URL is
refused in one line naming the flag or the variable it came from), and the one-line messages
for the answers a newcomer meets first: a 401 names the variable and flag that set the
token, a 403 keeps the permission the server named, a refused connection names the URL and
how to start a broker.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aiohttp

from broker.cli.contexts import (
    Context,
    ContextFileError,
    TokenCommandFailed,
    load_config,
    token_from_command,
)

DEFAULT_SERVER = "http://127.0.0.1:8080"
SERVER_ENV = "FEDBROKER_SERVER"
TOKEN_ENV = "FEDBROKER_TOKEN"
CA_FILE_ENV = "FEDBROKER_CA_FILE"
START_HINT = (
    "start one with `fedbroker demo` (or `make run`), or point --server/$FEDBROKER_SERVER at yours"
)


class ClientError(Exception):
    """One line for the user."""


def add_connection_options(parser: argparse.ArgumentParser) -> None:
    """``--server``, ``--token`` and ``--ca-file``, each with its variable and default."""
    parser.add_argument(
        "--server", default=None, metavar="URL",
        help=f"the broker's URL; without a scheme http:// is assumed (default ${SERVER_ENV}, "
        f"else {DEFAULT_SERVER})",
    )  # fmt: skip
    parser.add_argument(
        "--token", default=None,
        help=f"bearer token (default ${TOKEN_ENV}; the demo's banner prints its tokens)",
    )  # fmt: skip
    parser.add_argument(
        "--ca-file", default=None, metavar="FILE",
        help=f"PEM CA certificates an https broker is verified with (default ${CA_FILE_ENV}, "
        "else the system's trust store)",
    )  # fmt: skip
    parser.add_argument(
        "--context", default=None, metavar="NAME",
        help="a context of the config file ($FEDBROKER_CONFIG, else "
        "~/.config/fedbroker/config.yaml; default its current-context)",
    )  # fmt: skip


def server_url(args: argparse.Namespace) -> str:
    """The broker's base URL (no trailing slash): ``--server``, else the context's, else
    $FEDBROKER_SERVER, else the default; ClientError (one line naming where it came from)
    if it is no URL."""
    return normalize_server(*resolved(args).server)


def normalize_server(text: str, source: str) -> str:
    """``host:port`` -> ``http://host:port``; an http(s) URL as it is; else ClientError."""
    url = text.strip()
    if "://" not in url:
        url = f"http://{url}"
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 -- raises ValueError for a port that is no number
    except ValueError as exc:
        raise ClientError(f"{source}: {text!r} is not a URL ({exc})") from None
    if parts.scheme not in ("http", "https"):
        raise ClientError(
            f"{source}: {text!r}: the scheme must be http or https, not {parts.scheme!r}"
        )
    if not parts.hostname:
        raise ClientError(f"{source}: {text!r} has no host (e.g. http://127.0.0.1:8080)")
    return url.rstrip("/")


def token_of(args: argparse.Namespace) -> str:
    return resolved(args).token


def ca_file_of(args: argparse.Namespace) -> str | None:
    return resolved(args).ca_file


@dataclass(frozen=True)
class Resolved:
    """Where a command's connection comes from: the server (its text and where that came
    from, for the error line), the token and the CA file."""

    server: tuple[str, str]
    token: str
    ca_file: str | None


def resolved(args: argparse.Namespace) -> Resolved:
    """Flags first; then a context named by ``--context`` (a flag too); then the
    variables; then the file's current-context, only when no server is given by flag or
    variable (its token is never sent to a server it was not written for). Worked out once
    per command (a tokenCommand runs once)."""
    cached = getattr(args, "_resolved", None)
    if isinstance(cached, Resolved):
        return cached
    context, explicit = _context_of(args)
    given = getattr(args, "server", None)
    if given:
        server = (given, "--server")
    elif context is not None and context.server:
        server = (context.server, f"context {context.name!r}: server")
    elif os.environ.get(SERVER_ENV):
        server = (os.environ[SERVER_ENV], f"${SERVER_ENV}")
    else:
        server = (DEFAULT_SERVER, "the default server")
    ca_file = getattr(args, "ca_file", None)
    if not ca_file and (explicit or not os.environ.get(CA_FILE_ENV)):
        ca_file = _ca_file(context)
    ca_file = ca_file or os.environ.get(CA_FILE_ENV) or None
    token = getattr(args, "token", None)
    if not token and (explicit or not os.environ.get(TOKEN_ENV)):
        token = _context_token(context)
    token = token or os.environ.get(TOKEN_ENV, "")
    answer = Resolved(server, token, ca_file)
    args._resolved = answer
    return answer


def _context_token(context: Context | None) -> str | None:
    if context is None or context.token is not None or context.token_command is None:
        return None if context is None else context.token
    try:
        return token_from_command(context)
    except TokenCommandFailed as exc:
        raise ClientError(str(exc)) from None


def _ca_file(context: Context | None) -> str | None:
    if context is None or context.ca_file is None:
        return None
    return str(Path(context.ca_file).expanduser())


def _context_of(args: argparse.Namespace) -> tuple[Context | None, bool]:
    """The context in use and whether ``--context`` named it."""
    named = getattr(args, "context", None)
    if named is None and (getattr(args, "server", None) or os.environ.get(SERVER_ENV)):
        return None, False
    file = load_config()
    if named is None:
        current = file.config.current_context
        return (file.config.context(current) if current else None), False
    context = file.config.context(named)
    if context is None:
        known = ", ".join(c.name for c in file.config.contexts) or "none"
        raise ContextFileError(
            f"--context {named}: no such context in {file.path} (known: {known})"
        )
    return context, True


def trust(ca_file: str | None) -> ssl.SSLContext | bool:
    """How an https broker is verified: against ``ca_file``, else the system's trust."""
    if ca_file is None:
        return True
    try:
        return ssl.create_default_context(cafile=ca_file)
    except (OSError, ssl.SSLError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else "not PEM"
        raise ClientError(f"--ca-file {ca_file}: cannot load: {reason}") from None


def answer_body(text: str) -> Any:
    """An answer's body as JSON (empty: ``{}``); one that is not JSON (a proxy's HTML page)
    as ``{"error": its first 200 characters}``, so an error line still says something."""
    try:
        return json.loads(text) if text else {}
    except json.JSONDecodeError:
        return {"error": text.strip()[:200]}


def error_of(doc: Any) -> str | None:
    """The server's message in an error answer's body, if it has one."""
    message = doc.get("error") if isinstance(doc, dict) else None
    return message if isinstance(message, str) else None


def http_error(status: int, message: str | None, reason: str | None, token: str) -> str:
    """The line for an error answer: the server's message, and for 401 what sets the token.
    A 403's message is the server's own: it names the permission missing (``forbidden:
    ci lacks "submit" on queue training``) or the rule refused (a queue, a cap)."""
    line = " ".join(f"{status} {message or reason or ''}".split())
    if status == 401:
        if not token:
            return f"{line} (no token given: set ${TOKEN_ENV} or pass --token, or use a context)"
        source = f"--token or ${TOKEN_ENV}, or the context's"
        return f"{line} (the token from {source}, was not accepted)"
    return line


def unreachable(base: str, exc: BaseException) -> str:
    """The line for a broker that could not be reached at all."""
    if isinstance(exc, aiohttp.ClientConnectorError):
        return f"cannot reach the broker at {base}: {_why(exc.os_error)}; {START_HINT}"
    if isinstance(exc, aiohttp.ServerDisconnectedError | aiohttp.ClientPayloadError):
        return f"the broker at {base} closed the connection before answering"
    return f"cannot talk to the broker at {base}: {type(exc).__name__}: {exc}"


def _why(error: OSError) -> str:
    if isinstance(error, ConnectionRefusedError):
        return "connection refused"
    if isinstance(error, socket.gaierror):
        return "no such host"
    return (error.strerror or str(error) or type(error).__name__).lower()


__all__ = [
    "CA_FILE_ENV",
    "DEFAULT_SERVER",
    "SERVER_ENV",
    "TOKEN_ENV",
    "ClientError",
    "add_connection_options",
    "ca_file_of",
    "http_error",
    "normalize_server",
    "resolved",
    "server_url",
    "token_of",
    "unreachable",
]
