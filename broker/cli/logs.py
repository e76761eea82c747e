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

import base64
import binascii
import json
import logging
import os
import re
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml
from pydantic import BaseModel, SecretStr

from broker.config import Config, KubeconfigRef

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
    """Every secret the config holds or names: inline values (SecretStr: static tokens, the
    MQTT password), the environment variables a ``{env, value}`` reference reads, the MQTT
    password and agent-fed clusters' command keys as resolved (from a file too), the store
    URL's password, what the kubeconfigs of members and Cluster API pools hold for their
    users (``kubeconfig_secrets``) and the TLS keys of the API and of MQTT. (The OIDC
    issuer needs no secret: tokens are checked against its public keys.)"""
    environ = os.environ if environ is None else environ
    found: list[str] = []

    def walk(node: object) -> None:
        if isinstance(node, SecretStr):
            found.append(node.get_secret_value())
        elif isinstance(node, KubeconfigRef):
            found.extend(kubeconfig_secrets(node.kubeconfig_source()))
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
    if config.mqtt_password is not None:  # resolved from the environment at load
        found.append(config.mqtt_password.get_secret_value())
    # Agent-fed clusters' command keys, as resolved at load (inline, environment or file).
    found.extend(key.get_secret_value() for key in config.command_keys.values())
    if config.api.tls is not None:
        found.extend(key_file_secrets(config.api.tls.key_file))
    mqtt_tls = config.events.mqtt.tls if config.events.mqtt is not None else None
    if mqtt_tls is not None and mqtt_tls.key_file is not None:
        found.extend(key_file_secrets(mqtt_tls.key_file))
    return found


def key_file_secrets(path: str | Path) -> list[str]:
    """What a private key file holds, for the redactor (nothing for one that cannot be read:
    loading it reports that)."""
    return _key_material(_read(Path(path)))


# What a kubeconfig's user may hold that is secret, by client-go's names: a bearer token, a
# basic-auth password, a client key (PEM, base64-encoded), an auth provider's tokens and
# client secret, the environment an exec plugin is given; and files whose content is one.
_USER_SECRETS = ("token", "password", "client-key-data")
_PROVIDER_SECRETS = ("id-token", "refresh-token", "access-token", "client-secret")
_USER_FILES = ("tokenFile", "client-key")


def kubeconfig_secrets(source: Path | str | Mapping[str, Any]) -> list[str]:
    """The secrets of a kubeconfig (a file, or inline as YAML text or a mapping): see
    ``_USER_SECRETS``. Nothing for one that cannot be read: the member reports that."""
    if isinstance(source, Path):
        base, doc = source.parent, _yaml(_read(source))
    else:
        base, doc = Path.cwd(), _yaml(source) if isinstance(source, str) else source
    users = doc.get("users") if isinstance(doc, Mapping) else None
    found: list[str] = []
    for entry in users if isinstance(users, list) else ():
        user = entry.get("user") if isinstance(entry, Mapping) else None
        if not isinstance(user, Mapping):
            continue
        found.extend(v for k in _USER_SECRETS if isinstance(v := user.get(k), str))
        key = user.get("client-key-data")
        if isinstance(key, str):
            found.extend(_key_material(_decoded(key)))
        for name in _USER_FILES:
            if isinstance(path := user.get(name), str):
                found.extend(_key_material(_read(base / path)))
        provider = user.get("auth-provider")
        config = provider.get("config") if isinstance(provider, Mapping) else None
        if isinstance(config, Mapping):
            found.extend(v for k in _PROVIDER_SECRETS if isinstance(v := config.get(k), str))
        plugin = user.get("exec")
        env = plugin.get("env") if isinstance(plugin, Mapping) else None
        for var in env if isinstance(env, list) else ():
            if isinstance(var, Mapping) and isinstance(value := var.get("value"), str):
                found.append(value)
    return found


def _key_material(text: str) -> list[str]:
    """A secret file's or PEM block's text, whole and by line (a log may show a piece)."""
    text = text.strip()
    lines = [line.strip() for line in text.splitlines()]
    return [text, *(line for line in lines if len(line) >= 16 and not line.startswith("-----"))]


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return ""


def _yaml(text: str) -> Any:
    try:
        return yaml.safe_load(text)
    except (yaml.YAMLError, ValueError, TypeError, RecursionError):
        return None


def _decoded(data: str) -> str:
    try:
        return base64.b64decode(data, validate=True).decode("utf-8")
    except (binascii.Error, ValueError):
        return ""


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
    "ACCESS_LOG_FORMAT", "JsonFormatter", "Redactor", "configure_logging", "key_file_secrets",
    "kubeconfig_secrets", "remember_secrets", "secrets_of",
]  # fmt: skip
