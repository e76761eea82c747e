"""Node taints and pod tolerations, matched as Kubernetes matches them (pure, standard
library only; the model's vocabulary re-exports both).

``Toleration.tolerates`` is ``ToleratesTaint`` of k8s.io/api core/v1 (toleration.go): an
empty effect matches every effect, an empty key every key (the API server allows that only
with ``Exists``: a keyless ``Exists`` tolerates every taint), ``Exists`` every value, an
empty operator is ``Equal`` (the values must be equal), and ``Lt``/``Gt`` compare the two
values as 64-bit integers (a value that is none tolerates nothing). ``tolerated`` asks it of
a pod set's tolerations and a node group's blocking taints, remembered per pair: a
federation has a few distinct tolerations and taint sets, and placement asks about every
node group of every cluster in each decision.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal, NamedTuple

TaintEffect = Literal["NoSchedule", "NoExecute", "PreferNoSchedule"]
TolerationOperator = Literal["Equal", "Exists", "Lt", "Gt"]
BLOCKING_EFFECTS: frozenset[str] = frozenset({"NoSchedule", "NoExecute"})
_INT64 = re.compile(r"[+-]?[0-9]+")  # what Go's strconv.ParseInt(s, 10, 64) reads
_MEMO_MAX = 4_096


class Taint(NamedTuple):
    """One taint of a node. A tuple: placement hashes and compares a node's blocking taints
    (its index group) for every node it looks at, and a tuple does both in C."""

    key: str
    value: str = ""
    effect: TaintEffect = "NoSchedule"

    @property
    def blocks(self) -> bool:
        """Whether an untolerating pod is kept off the node (PreferNoSchedule only steers)."""
        return self.effect in BLOCKING_EFFECTS


def _int64(text: str) -> int | None:
    if not _INT64.fullmatch(text):
        return None
    value = int(text)
    return value if -(2**63) <= value < 2**63 else None


@dataclass(frozen=True, slots=True)
class Toleration:
    """One entry of a pod's ``spec.tolerations`` (``tolerationSeconds`` left out: it says
    how long a NoExecute taint is borne once bound, not where a pod may go)."""

    key: str = ""
    operator: TolerationOperator = "Equal"
    value: str = ""
    effect: str = ""

    def tolerates(self, taint: Taint) -> bool:
        if self.effect and self.effect != taint.effect:
            return False
        if self.key and self.key != taint.key:
            return False
        if self.operator == "Exists":
            return True
        if self.operator == "Equal":
            return self.value == taint.value
        mine, theirs = _int64(self.value), _int64(taint.value)
        if mine is None or theirs is None:
            return False
        return theirs < mine if self.operator == "Lt" else theirs > mine


_MEMO: dict[tuple[frozenset[Toleration], frozenset[Taint]], bool] = {}


def tolerated(tolerations: frozenset[Toleration], taints: frozenset[Taint]) -> bool:
    """Whether every one of ``taints`` is tolerated by one of ``tolerations``. The answer
    is a function of the two sets alone, so it is remembered (a bounded table; past it,
    worked out each time)."""
    if not taints:
        return True
    if not tolerations:
        return False
    pair = (tolerations, taints)
    found = _MEMO.get(pair)
    if found is None:
        found = all(any(t.tolerates(taint) for t in tolerations) for taint in taints)
        if len(_MEMO) < _MEMO_MAX:
            _MEMO[pair] = found
    return found


def blocking(taints: tuple[Taint, ...]) -> frozenset[Taint]:
    """The taints of a node that keep untolerating pods off it."""
    return frozenset([t for t in taints if t.blocks]) if taints else frozenset()


__all__ = ["BLOCKING_EFFECTS", "Taint", "TaintEffect", "Toleration", "TolerationOperator",
           "blocking", "tolerated"]  # fmt: skip
