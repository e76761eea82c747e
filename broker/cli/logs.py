"""The process's log output: JSON lines (or readable lines on a terminal), the access log's
format, where the audit trail goes, and the redaction of secrets from every record.

``Redactor`` is installed on every handler this module sets up, so every record is cleaned
whatever logger it came from (aiohttp's ``aiohttp.server``, ``aiohttp.access`` and
``aiohttp.web`` included): its message and arguments, its exception (the formatted
traceback: aiohttp logs a malformed request with the raw header in its exception), its
stack, and every extra attribute. It blanks the secrets it is given (the config's tokens
and passwords) wherever they appear, and anything after ``Bearer ``/``Basic `` or in a
``token=``/``password=``/``secret=`` pair, which covers tokens it was not told about
(hashed ones, OIDC JWTs).
"""

from __future__ import annotations

import json
import logging
import os
import re
import sys
from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import urlsplit

from pydantic import BaseModel, SecretStr

from broker.config import Config

MASK = "***"
# Secrets shorter than this are not searched for (they would blank ordinary words); longer
# than MASK, so every replacement shortens the text.
MIN_SECRET_LENGTH = 4
_AFTER = re.compile(
    r"""(?ix)
    ( \b(?:bearer|basic)\s+
    | \b(?:access_token|token|password|secret)=
    | "(?:access_token|token|password|secret)"\s*:\s*"
    ) [^\s,"'&]+
    """
)
# aiohttp's access log: who, the request line, status, size, seconds, the request id; no
# request header (Authorization, cookies and the like can carry secrets; so can Referer).
ACCESS_LOG_FORMAT = '%a "%r" %s %b %Tf %{X-Request-Id}o'
_STANDARD = frozenset(
    [*logging.LogRecord("", 0, "", 0, "", (), None).__dict__, "message", "asctime", "taskName"]
)


class Redactor(logging.Filter):
    """Blanks secrets in every field of a record (see the module's docstring)."""

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        super().__init__()
        self._known: list[str] = []
        self.remember(secrets)

    def remember(self, secrets: Iterable[str]) -> None:
        """Blank these too from now on (tokens read again on a reload, say)."""
        known = {*self._known, *(s for s in secrets if len(s) >= MIN_SECRET_LENGTH)}
        self._known = sorted(known, key=len, reverse=True)

    def redact(self, text: str) -> str:
        text = _AFTER.sub(lambda m: m.group(1) + MASK, text)
        changed = True
        while changed:  # a replacement can make another occurrence; each one shortens text
            changed = False
            for secret in self._known:
                if secret in text:
                    text, changed = text.replace(secret, MASK), True
        return text

    def _value(self, value: Any) -> Any:
        if value is None or isinstance(value, bool | int | float):
            return value
        if isinstance(value, str):
            return self.redact(value)
        if isinstance(value, dict):
            return {self._value(k): self._value(v) for k, v in value.items()}
        if isinstance(value, list | tuple | set | frozenset):
            return type(value)(self._value(v) for v in value)
        text = _text(value)
        cleaned = self.redact(text)
        return value if cleaned == text else cleaned

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a bad format: show what there is
            message = f"{record.msg} {record.args}"
        cleaned = self.redact(message)
        if cleaned != message or record.args:
            record.msg, record.args = cleaned, None
        if record.exc_info and record.exc_info[0] is not None:
            text = record.exc_text or logging.Formatter().formatException(record.exc_info)
            cleaned, shown = self.redact(text), _text(repr(record.exc_info[1]))
            if cleaned != text or self.redact(shown) != shown:
                # The exception object carries the secret (in its message or its args,
                # as aiohttp's and a codec's do): only the cleaned text is kept.
                record.exc_info, record.exc_text = None, cleaned
        elif record.exc_text:
            record.exc_text = self.redact(record.exc_text)
        if record.stack_info:
            record.stack_info = self.redact(record.stack_info)
        for key in [k for k in record.__dict__ if k not in _STANDARD]:
            record.__dict__[key] = self._value(record.__dict__[key])
        return True


def _text(value: object) -> str:
    try:
        return str(value)
    except Exception:
        return ""


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {
            "ts": round(record.created, 3),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key in ("task", "url", "store"):
            value = record.__dict__.get(key)
            if value is not None:
                doc[key] = value
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            doc["exc"] = record.exc_text
        if record.stack_info:
            doc["stack"] = record.stack_info
        return json.dumps(doc)


def configure_logging(
    level: int = logging.INFO, *, secrets: Iterable[str] = (), audit_file: str | None = None
) -> Redactor:
    """JSON lines on stderr when it is not a terminal, readable lines when it is; every
    handler redacts ``secrets`` (and anything shaped like a token). The audit trail
    (``fedbroker.audit``) goes to ``audit_file`` (appended) or, without one, to stderr as
    its own JSON lines; raises OSError when the file cannot be opened. Returns the
    redactor every handler shares (``remember`` adds secrets to it)."""
    redactor = Redactor(secrets)
    handler = logging.StreamHandler(sys.stderr)
    if sys.stderr.isatty():
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    else:
        handler.setFormatter(JsonFormatter())
    handler.addFilter(redactor)
    audit_handler = (
        logging.FileHandler(audit_file, encoding="utf-8")
        if audit_file is not None
        else logging.StreamHandler(sys.stderr)
    )
    audit_handler.setFormatter(logging.Formatter("%(message)s"))  # the line is JSON already
    audit_handler.addFilter(redactor)
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    audit = logging.getLogger("fedbroker.audit")
    for old in audit.handlers:
        old.close()
    audit.handlers[:] = [audit_handler]
    audit.propagate = False  # apart from the process's log lines
    audit.setLevel(logging.INFO if audit_file is not None else level)
    logging.getLogger("aiohttp.access").setLevel(logging.NOTSET)  # on, at the root's level
    return redactor


def secrets_of(config: Config, environ: Mapping[str, str] | None = None) -> list[str]:
    """Every secret the config holds or names: inline values (SecretStr), the environment
    variables a ``{env, value}`` reference reads, and the store URL's password."""
    environ = os.environ if environ is None else environ
    found: list[str] = []

    def walk(node: object) -> None:
        if isinstance(node, SecretStr):
            found.append(node.get_secret_value())
        elif isinstance(node, BaseModel):
            fields = type(node).model_fields
            env = getattr(node, "env", None)
            if "value" in fields and isinstance(env, str) and env in environ:
                found.append(environ[env])
            for name in fields:
                walk(getattr(node, name))
        elif isinstance(node, list | tuple):
            for item in node:
                walk(item)
        elif isinstance(node, dict):
            for item in node.values():
                walk(item)

    walk(config)
    password = urlsplit(config.store.url).password
    if password:
        found.append(password)
    return found


def remember_secrets(config: Config) -> None:
    """Teach every redactor on the process's handlers the secrets of ``config`` (a reloaded
    file's new tokens are blanked by value from then on)."""
    found = secrets_of(config)
    for name in ("", "fedbroker.audit"):
        for handler in logging.getLogger(name).handlers:
            for f in handler.filters:
                if isinstance(f, Redactor):
                    f.remember(found)


__all__ = [
    "ACCESS_LOG_FORMAT", "JsonFormatter", "Redactor", "configure_logging", "remember_secrets",
    "secrets_of",
]  # fmt: skip
