"""What any parsed body must be before pydantic sees it: nested at most ``MAX_DEPTH``
levels, text that is valid Unicode (no lone surrogates, no NUL), integers that fit 64 bits, and
JSON objects and YAML mappings without duplicate keys (``RefusesDuplicateKeys``, for every
YAML loader of the broker: manifests, the CLI's ``submit -f``, the config file).

Checked on the plain data JSON or YAML produced, iteratively (so the check itself cannot
overflow the stack), because past these bounds pydantic, the store's JSON encoder or a
member cluster fail later and louder (a 5xx, a job that never starts). Each refusal is one
``ManifestError`` naming the path (cut to its first levels for deep ones).
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

from yaml.constructor import SafeConstructor
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

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


class DuplicateKey(Exception):
    """A YAML mapping that gives ``key`` twice: the mapping's ``path`` and the (1-based)
    ``lines`` of both. ``message`` is the one line, ``top`` naming the document itself."""

    def __init__(self, path: tuple[str | int, ...], key: object, lines: tuple[int, int]) -> None:
        self.path, self.key, self.lines = path, key, lines
        super().__init__(self.message("document"))

    def message(self, top: str | None) -> str:
        """``spec.podSets[0].resources: duplicate key "cpu" in a YAML mapping (lines 9 and
        11)`` (``line 9``: both on one); at the top, ``top`` stands for the path (None: no
        path at all)."""
        where = field_path(self.path) or top
        first, second = self.lines
        lines = f"line {first}" if first == second else f"lines {first} and {second}"
        problem = f"duplicate key {show(self.key)} in a YAML mapping ({lines})"
        return f"{where}: {problem}" if where else problem


class DuplicateKeyError(ManifestError):
    """A manifest whose YAML gives a key twice (the ManifestError of a DuplicateKey)."""


class RefusesDuplicateKeys(SafeConstructor):
    """For a YAML loader (first among its bases): a mapping that gives a key twice raises
    DuplicateKey instead of the last one silently winning, as JSON's duplicates do
    (``duplicate_keys_refused``). Keys merged in with ``<<`` may be overridden, as YAML
    says. A duplicate costs a walk from the document's root to name the mapping's path;
    any other mapping, a length check."""

    _document: Node | None = None

    def construct_document(self, node: Node) -> Any:
        self._document = node
        return super().construct_document(node)

    def construct_mapping(self, node: MappingNode, deep: bool = False) -> dict[Hashable, Any]:
        own = [key for key, _ in node.value if key.tag != _MERGE]
        merged = len(own) < len(node.value)
        mapping = super().construct_mapping(node, deep=deep)
        if len(mapping) == len(own) and not merged:
            return mapping
        seen: dict[Hashable, int] = {}
        for key_node in own:
            key = self.constructed_objects[key_node]
            line = key_node.start_mark.line + 1
            if key in seen:
                raise DuplicateKey(self._path_to(node), key, (seen[key], line))
            seen[key] = line
        return mapping

    def _path_to(self, target: Node) -> tuple[str | int, ...]:
        stack: list[tuple[Node | None, tuple[str | int, ...]]] = [(self._document, ())]
        while stack:
            node, path = stack.pop()
            if node is target:
                return path
            if isinstance(node, MappingNode):
                stack.extend((v, (*path, _key_name(k))) for k, v in node.value)
            elif isinstance(node, SequenceNode):
                stack.extend((v, (*path, i)) for i, v in enumerate(node.value))
        return ()


_MERGE = "tag:yaml.org,2002:merge"


def _key_name(node: Node) -> str | int:
    value = node.value if isinstance(node, ScalarNode) else None
    return value if isinstance(value, str) else "?"


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


__all__ = [
    "MAX_DEPTH", "DuplicateKey", "DuplicateKeyError", "RefusesDuplicateKeys", "check_document",
    "duplicate_keys_refused",
]  # fmt: skip
