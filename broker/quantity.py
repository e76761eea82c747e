"""Kubernetes resource quantities ("500m", "16Gi", "1Ei", "1e3"), parsed exactly: the one
parser of the broker (the manifest's bounds) and of the adapters (node allocatable, pod
requests, Cluster API scale-from-zero annotations).

It sits at the bottom layer, beside ``broker.model``, because both ``broker.manifest`` and
``adapters`` read quantities and neither may import the other. Pure: the standard library
only.
"""

from __future__ import annotations

import functools
import json
import re
from fractions import Fraction

# Decimal SI (n u m k M G T P E) and binary SI (Ki .. Ei) suffixes, as Kubernetes spells
# them; "e<n>"/"E<n>" decimal exponents are handled apart.
SUFFIXES: dict[str, Fraction] = {
    "n": Fraction(1, 10**9),
    "u": Fraction(1, 10**6),
    "m": Fraction(1, 1000),
    "": Fraction(1),
    **{s: Fraction(10 ** (3 * i)) for i, s in enumerate("kMGTPE", 1)},
    **{f"{s}i": Fraction(2 ** (10 * i)) for i, s in enumerate("KMGTPE", 1)},
}
# The binary suffixes first, then the exponent, then one letter: "1Ei" is 2^60, "1E3" is
# 1000 and "1E" is 10^18 (Kubernetes reads them the same way).
PATTERN = r"^[+-]?(\d+(\.\d*)?|\.\d+)(Ki|Mi|Gi|Ti|Pi|Ei|[eE][+-]?\d+|[numkMGTPE])?$"
_QUANTITY = re.compile(r"([+-]?)(\d+(?:\.\d*)?|\.\d+)(Ki|Mi|Gi|Ti|Pi|Ei|[eE][+-]?\d+|[numkMGTPE])?")
MAX_TEXT = 64  # longer is no quantity anyone means; Fraction of a huge string burns CPU
MAX_EXPONENT = 30  # exact powers of ten beyond this would only burn CPU


class QuantityError(ValueError):
    """A value that is not a Kubernetes quantity; ``str()`` is one line and shows at most
    40 characters of the value."""


def parse_quantity(value: object) -> Fraction:
    """A Kubernetes quantity (``"64"``, ``"500m"``, ``"512Gi"``, ``"1Ei"``, ``"1e3"``, ``4``,
    ``0.5``) as an exact fraction of its base unit; raises QuantityError.

    Numbers (from YAML or JSON) are accepted, booleans are not. Exact arithmetic, so "0.1"
    CPU is exactly 100 millicores and rounding happens once, upward, by the caller.
    """
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise QuantityError(f"not a quantity: {_show(value)}")
    return _parse_text(value if isinstance(value, str) else str(value))


# A broker reads the same few spellings ("4", "16Gi", "500m") over and over, most of all
# when a restart rebuilds every live job: each is parsed once (a Fraction is immutable).
@functools.lru_cache(maxsize=4096)
def _parse_text(text: str) -> Fraction:
    """``parse_quantity`` of a string; errors show ``text`` (a number's str is its repr)."""
    match = _QUANTITY.fullmatch(text) if len(text) <= MAX_TEXT else None
    if match is None:
        raise QuantityError(f"not a quantity: {_show(text)}")
    sign, number, suffix = match.group(1), match.group(2), match.group(3) or ""
    amount = Fraction(number)
    if suffix in SUFFIXES:
        amount *= SUFFIXES[suffix]
    else:  # an exponent: e3, E-2, e+5
        exponent = int(suffix[1:])
        if abs(exponent) > MAX_EXPONENT:
            raise QuantityError(f"not a quantity: {_show(text)} (exponent out of range)")
        amount *= Fraction(10) ** exponent
    return -amount if sign == "-" else amount


def _show(value: object) -> str:
    text = value if isinstance(value, str) else repr(value)
    return json.dumps(text[:40] + ("..." if len(text) > 40 else ""))


__all__ = ["PATTERN", "SUFFIXES", "QuantityError", "parse_quantity"]
