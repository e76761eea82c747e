"""What any parsed body must be before pydantic sees it: nested at most ``MAX_DEPTH``
levels, text that is valid Unicode (no lone surrogates, no NUL), integers that fit 64 bits, and
JSON objects without duplicate keys.

Checked on the plain data JSON or YAML produced, iteratively (so the check itself cannot
overflow the stack), because past these bounds pydantic, the store's JSON encoder or a
member cluster fail later and louder (a 5xx, a job that never starts). Each refusal is one
``ManifestError`` naming the path (cut to its first levels for deep ones).
"""

from __future__ import annotations

from typing import Any

from broker.manifest.errors import ManifestError, field_path, show

MAX_DEPTH = 64  # a pod template is a dozen levels deep; Kubernetes objects stay well below
MAX_INT = 2**63 - 1  # Kubernetes' own integers are int64
_SHOWN_LEVELS = 8  # a too-deep path is named by its first levels


def duplicate_keys_refused(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """``json.loads``' ``object_pairs_hook``: a key given twice is refused, never "the last
    one wins" silently (two readers could disagree on what was submitted)."""
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise ManifestError(f"manifest: duplicate key {show(key)} in a JSON object")
        result[key] = value
    return result


def check_document(data: object) -> None:
    """Raise ManifestError for data too deep, with lone surrogates or oversized integers."""
    stack: list[tuple[tuple[str | int, ...], object]] = [((), data)]
    while stack:
        path, value = stack.pop()
        if isinstance(value, dict | list) and len(path) >= MAX_DEPTH:
            shown = field_path(path[:_SHOWN_LEVELS]) or "manifest"
            raise ManifestError(f"{shown}...: nested more than {MAX_DEPTH} levels deep", shown)
        if isinstance(value, dict):
            for key, item in value.items():
                if isinstance(key, str):
                    _text(path, key, "key ")
                stack.append(((*path, key if isinstance(key, str | int) else str(key)), item))
        elif isinstance(value, list):
            stack.extend(((*path, i), item) for i, item in enumerate(value))
        elif isinstance(value, str):
            _text(path, value, "")
        elif isinstance(value, int) and not isinstance(value, bool) and abs(value) > MAX_INT:
            where = field_path(path) or "manifest"
            raise ManifestError(f"{where}: integer out of range (64-bit)", where)


def _text(path: tuple[str | int, ...], text: str, what: str) -> None:
    if "\x00" in text:  # PostgreSQL's JSONB and Kubernetes refuse NUL characters
        where = field_path(path) or "manifest"
        raise ManifestError(f"{where}: {what}contains a NUL character", where)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        where = field_path(path) or "manifest"
        raise ManifestError(
            f"{where}: {what}is not valid Unicode text (a lone surrogate)", where
        ) from None


__all__ = ["MAX_DEPTH", "check_document", "duplicate_keys_refused"]
