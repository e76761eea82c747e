"""One-line errors for what users write: the manifest's errors and pydantic's, as
``<field path>: <problem>``.

``first_error`` turns pydantic's first error into ``(path, message)`` without ever repeating
the input value (a config error may be about a secret); validators raise ``FieldError`` to
point below the field they check. The config (broker.config) reports its errors the same way.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence

from pydantic import ValidationError


class ManifestError(ValueError):
    """A manifest the user got wrong; ``str()`` is one line naming the field path."""

    def __init__(self, message: str, path: str = "manifest") -> None:
        super().__init__(one_line(message))
        self.path = path


class FieldError(ValueError):
    """Raised inside validators to point below the field being validated, e.g. at
    ``gang.minMember`` from the spec's cross-field check. `first_error` appends ``path``."""

    def __init__(self, path: Sequence[str | int], message: str) -> None:
        super().__init__(message)
        self.path = tuple(path)
        self.message = message


_MESSAGES = {
    "missing": "required",
    "extra_forbidden": "unknown field",
    "int_type": "must be an integer",
    "string_type": "must be a string",
    "bool_type": "must be a boolean (true or false)",
    "float_type": "must be a number",
    "dict_type": "must be a mapping",
    "model_type": "must be a mapping",
    "model_attributes_type": "must be a mapping",
    "list_type": "must be a list",
    "finite_number": "must be a finite number",
    "greater_than_equal": "must be >= {ge}",
    "greater_than": "must be > {gt}",
    "less_than_equal": "must be <= {le}",
    "less_than": "must be < {lt}",
    "literal_error": "must be {expected}",
}


def first_error(exc: ValidationError) -> tuple[str, str]:
    """(field path, message) for pydantic's first error, plus " (and N more)".

    The input value is never repeated (a config error may be about a secret); messages
    that show a value build it themselves, from values that are safe to show.
    """
    errors = exc.errors(include_url=False)
    error = errors[0]
    loc: list[str | int] = list(error["loc"])
    ctx = error.get("ctx") or {}
    kind = error["type"]
    cause = ctx.get("error")
    prefix = ""
    if "[key]" in loc:
        loc = loc[: loc.index("[key]")]
        prefix = "key "
    if isinstance(cause, FieldError):
        loc.extend(cause.path)
        message = cause.message
    elif isinstance(cause, Exception) and kind in ("value_error", "assertion_error"):
        message = str(cause)
    elif kind in ("too_short", "too_long"):
        n = ctx.get("min_length" if kind == "too_short" else "max_length", 0)
        least = "at least" if kind == "too_short" else "at most"
        message = f"must have {least} {n} item{'' if n == 1 else 's'}"
    elif kind in _MESSAGES:
        message = _MESSAGES[kind].format(**ctx)
    else:
        message = error["msg"][:1].lower() + error["msg"][1:]
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    return field_path(loc), one_line(prefix + message + more)


_PLAIN_KEY = re.compile(r"[A-Za-z0-9_./-]+")


def field_path(loc: Sequence[str | int]) -> str:
    """``("spec", "podSets", 0, "name")`` -> ``spec.podSets[0].name``. A key that is not
    plain (``nvidia.com/gpu`` is) is quoted as JSON, ASCII only: ``template[":x\\n"]``,
    so a path stays one line and never reads as the message's own ``: ``."""
    path = ""
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        elif not _PLAIN_KEY.fullmatch(part):
            path += f"[{json.dumps(part)}]"
        else:
            path += f".{part}" if path else str(part)
    return path


def one_line(text: str) -> str:
    return " ".join(text.split())


def show(value: object) -> str:
    """A value quoted for a message, cut to 40 characters."""
    text = value if isinstance(value, str) else repr(value)
    return json.dumps(text[:40] + ("..." if len(text) > 40 else ""))


def kind_of(value: object) -> str:
    """What a parsed document is, in words (\"a list\", \"nothing\")."""
    return {list: "a list", str: "a string", type(None): "nothing"}.get(
        type(value), type(value).__name__
    )


def reason(exc: BaseException) -> str:
    """A parser's error, short."""
    return "nested too deeply" if isinstance(exc, RecursionError) else str(exc)[:200]
