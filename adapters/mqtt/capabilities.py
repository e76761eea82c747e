"""What an agent says it carries out (its retained ``agents/<c>/capabilities``), checked
(pure: the payload is the agent's word, checked like any report).

``{"v": 1, "launch": true, "kinds": ["Pod", "Job", ...], "mode": "pin"}``; an agent that
only reports capacity publishes ``{"v": 1, "launch": false}``; an empty payload (the
retained message cleared) means no capabilities.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from broker.ports import ReportError

MAX_CAPABILITIES = 64 << 10  # bytes
MAX_KINDS = 64
_KIND = re.compile(r"[A-Z][A-Za-z0-9]{0,62}")
MODES = frozenset({"pin", "delegate"})


@dataclass(frozen=True, slots=True)
class Capabilities:
    launch: bool
    kinds: frozenset[str] = frozenset()  # what it launches: "Pod" for gangs of pods
    mode: str = ""

    @property
    def launchable(self) -> frozenset[str]:
        """The job kinds this agent launches (none when it only reports)."""
        return self.kinds if self.launch else frozenset()


NONE = Capabilities(False)


def parse_capabilities(payload: bytes) -> Capabilities:
    """The capabilities; ``ReportError`` naming the field when malformed."""
    if not payload:
        return NONE
    if len(payload) > MAX_CAPABILITIES:
        raise ReportError(f"capabilities: larger than {MAX_CAPABILITIES} bytes")
    try:
        doc = json.loads(payload)
    except (ValueError, UnicodeDecodeError):
        raise ReportError("capabilities: not JSON") from None
    if not isinstance(doc, dict):
        raise ReportError("capabilities: not an object")
    if doc.get("v") != 1:
        raise ReportError(f"capabilities.v: version {doc.get('v')!r} is not 1")
    launch = doc.get("launch")
    if not isinstance(launch, bool):
        raise ReportError("capabilities.launch: not a boolean")
    if not launch:
        return NONE
    kinds = doc.get("kinds")
    if not isinstance(kinds, list) or len(kinds) > MAX_KINDS:
        raise ReportError(f"capabilities.kinds: not a list of at most {MAX_KINDS} kinds")
    for i, kind in enumerate(kinds):
        if not isinstance(kind, str) or not _KIND.fullmatch(kind):
            raise ReportError(f"capabilities.kinds[{i}]: not a kind")
    mode = doc.get("mode", "")
    if mode not in MODES and mode != "":
        raise ReportError(f"capabilities.mode: {str(mode)[:32]!r} is not one of {sorted(MODES)}")
    return Capabilities(True, frozenset(kinds), mode)


__all__ = ["NONE", "Capabilities", "parse_capabilities"]
