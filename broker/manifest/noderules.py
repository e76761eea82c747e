"""What a pod template reaches of its node beyond what the placement counts (pure, no I/O):
for now, its ``tolerations`` read for the placement (``toleration_of``; ``broker.taints``
matches them), each entry as the API server would keep it: an operator of ``Equal`` or
``Exists``, ``Exists`` with no value, a keyless one only with ``Exists``, a known effect.
"""

from __future__ import annotations

from collections.abc import Mapping

from broker.taints import Toleration, TolerationOperator

_OPERATORS: Mapping[str, TolerationOperator] = {"": "Equal", "Equal": "Equal", "Exists": "Exists"}
_EFFECTS = frozenset({"", "NoSchedule", "PreferNoSchedule", "NoExecute"})


def toleration_of(item: object) -> Toleration | None:
    """One ``spec.tolerations`` entry as the placement matches it; None for an entry the
    API server would refuse (and ``node_rules`` refuses)."""
    if not isinstance(item, Mapping):
        return None
    fields = [item.get(name) or "" for name in ("key", "operator", "value", "effect")]
    if not all(isinstance(field, str) for field in fields):
        return None
    key, given, value, effect = fields
    operator = _OPERATORS.get(given)
    if operator is None or effect not in _EFFECTS or (not key and operator != "Exists"):
        return None
    if operator == "Exists" and value:
        return None
    return Toleration(key, operator, value, effect)


__all__ = ["toleration_of"]
