"""Interned values: one instance of equal immutable values that every job would otherwise
hold its own copy of (the heap a live job costs). Pure; the model's lowest layer."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, TypeVar

_T = TypeVar("_T")
_EMPTY: frozenset[Any] = frozenset()


_SHARED: dict[Any, Any] = {}
_SHARED_MAX = 65_536


def shared(value: _T) -> _T:
    """One instance of equal immutable values (a job's resources and pod sets, a queue's
    demand): a hundred thousand jobs of a few shapes hold a few objects, not one each. The
    table is bounded; past it, values are kept as given."""
    found = _SHARED.get(value)
    if found is not None:
        return found  # type: ignore[no-any-return]
    if len(_SHARED) < _SHARED_MAX:
        _SHARED[value] = value
    return value


def frozen(items: Iterable[_T]) -> frozenset[_T]:
    """``frozenset(items)``, the one shared empty set when there are none: every job has
    GPU types and tolerations, nearly all none, and each new empty set costs 216 bytes."""
    made = frozenset(items)
    return made if made else _EMPTY
