"""The list's own filters, applied to each stored job: ``name`` and ``selector``.

``name`` is a substring of the job's name, or a glob when it holds ``*``, ``?`` or ``[``
(``train-*``). ``selector`` is a kubectl-style equality-based label selector: requirements
joined by commas, each ``k=v`` (or ``k==v``), ``k!=v`` (true also when the label is absent,
as in Kubernetes), ``k`` (has the label) or ``!k`` (has not). Set-based requirements
(``in``, ``notin``) are refused with a 400 naming them. Both are bounded (a pattern's
length, a selector's requirements) and so is the cache of compiled globs.
"""

from __future__ import annotations

import fnmatch
import functools
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass

# Every stored job a list reads is checked against these (up to ten pages of a thousand
# per request), so their size is bounded: a job has at most 32 labels, and its name is a
# DNS label of at most 63 characters, which a glob of 128 can spell out with room for
# wildcards and a few character classes.
MAX_REQUIREMENTS = 32
MAX_NAME_PATTERN = 128
# Compiled globs kept, the least recently used dropped first.
GLOB_CACHE_SIZE = 256
_KEY = re.compile(r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?$")


class SelectorError(ValueError):
    """A selector that does not parse; the message names the requirement."""


@dataclass(frozen=True, slots=True)
class Requirement:
    key: str
    op: str  # "=", "!=", "exists", "!exists"
    value: str = ""

    def matches(self, labels: Mapping[str, str]) -> bool:
        match self.op:
            case "=":
                return labels.get(self.key) == self.value
            case "!=":
                return labels.get(self.key) != self.value
            case "exists":
                return self.key in labels
            case _:
                return self.key not in labels


def parse_selector(text: str) -> tuple[Requirement, ...]:
    """``k=v,k2!=v2,k3,!k4`` as requirements (all must hold); SelectorError if malformed
    or past MAX_REQUIREMENTS."""
    out = []
    items = text.split(",")
    if len(items) > MAX_REQUIREMENTS:
        raise SelectorError(f"at most {MAX_REQUIREMENTS} requirements (got {len(items)})")
    for raw in items:
        item = raw.strip()
        if not item:
            raise SelectorError(f"empty requirement in {text!r}")
        if re.search(r"\s(in|notin)\s*\(", f" {item}") or "(" in item:
            raise SelectorError(f"{item!r}: set-based requirements (in, notin) are not supported")
        if "!=" in item:
            key, _, value = item.partition("!=")
            out.append(_checked(Requirement(key.strip(), "!=", value.strip())))
        elif "=" in item:
            key, _, value = item.partition("==") if "==" in item else item.partition("=")
            out.append(_checked(Requirement(key.strip(), "=", value.strip())))
        elif item.startswith("!"):
            out.append(_checked(Requirement(item[1:].strip(), "!exists")))
        else:
            out.append(_checked(Requirement(item, "exists")))
    return tuple(out)


def _checked(req: Requirement) -> Requirement:
    if not _KEY.match(req.key) or len(req.key) > 317:
        raise SelectorError(f"{req.key!r} is not a label key")
    if not _VALUE.match(req.value) or len(req.value) > 63:
        raise SelectorError(f"{req.value!r} is not a label value")
    return req


def name_matcher(pattern: str) -> Callable[[str], bool]:
    """A glob when ``pattern`` has ``*``, ``?`` or ``[``; a substring otherwise.
    SelectorError past MAX_NAME_PATTERN characters."""
    if len(pattern) > MAX_NAME_PATTERN:
        raise SelectorError(f"at most {MAX_NAME_PATTERN} characters (got {len(pattern)})")
    if any(c in pattern for c in "*?["):
        return _glob(pattern)
    return lambda name: pattern in name


@functools.lru_cache(maxsize=GLOB_CACHE_SIZE)
def _glob(pattern: str) -> Callable[[str], bool]:
    # Not fnmatch.fnmatchcase: its cache keeps 32,768 compiled patterns of any length.
    match = re.compile(fnmatch.translate(pattern)).match
    return lambda name: match(name) is not None


__all__ = [
    "GLOB_CACHE_SIZE", "MAX_NAME_PATTERN", "MAX_REQUIREMENTS", "Requirement", "SelectorError",
    "name_matcher", "parse_selector",
]  # fmt: skip
