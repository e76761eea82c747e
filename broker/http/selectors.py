"""The list's own filters, applied to each stored job: ``name`` and ``selector``.

``name`` is a substring of the job's name, or a glob when it holds ``*``, ``?`` or ``[``
(``train-*``). ``selector`` is a kubectl-style equality-based label selector: requirements
joined by commas, each ``k=v`` (or ``k==v``), ``k!=v`` (true also when the label is absent,
as in Kubernetes), ``k`` (has the label) or ``!k`` (has not). Set-based requirements
(``in``, ``notin``) are refused with a 400 naming them.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass

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
    """``k=v,k2!=v2,k3,!k4`` as requirements (all must hold); SelectorError if malformed."""
    out = []
    for raw in text.split(","):
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
    """A glob when ``pattern`` has ``*``, ``?`` or ``[``; a substring otherwise."""
    if any(c in pattern for c in "*?["):
        return lambda name: fnmatch.fnmatchcase(name, pattern)
    return lambda name: pattern in name


__all__ = ["Requirement", "SelectorError", "name_matcher", "parse_selector"]
