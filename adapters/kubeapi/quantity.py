"""Kubernetes resource quantities ("500m", "16Gi", "1e3"), parsed exactly.

One parser for every adapter that reads quantities from the API server: node allocatable
and pod requests (``adapters.kube``), the Cluster API scale-from-zero annotations
(``adapters.capi``). (Adapters may not import broker.manifest, the manifest's own parser.)
"""

from __future__ import annotations

import re
from fractions import Fraction

_SUFFIX: dict[str, Fraction] = {
    "n": Fraction(1, 10**9),
    "u": Fraction(1, 10**6),
    "m": Fraction(1, 1000),
    "": Fraction(1),
    "k": Fraction(10**3),
    "M": Fraction(10**6),
    "G": Fraction(10**9),
    "T": Fraction(10**12),
    "P": Fraction(10**15),
    "E": Fraction(10**18),
    "Ki": Fraction(2**10),
    "Mi": Fraction(2**20),
    "Gi": Fraction(2**30),
    "Ti": Fraction(2**40),
    "Pi": Fraction(2**50),
    "Ei": Fraction(2**60),
}
_QUANTITY = re.compile(
    r"^([+-]?(?:\d+\.?\d*|\.\d+))(?:([eE][+-]?\d+)|(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE])?)$"
)


class QuantityError(ValueError):
    """A Kubernetes quantity string that does not parse."""


def parse_quantity(value: object) -> Fraction:
    """A Kubernetes resource quantity (``"500m"``, ``"16Gi"``, ``"1e3"``, ``4``) as an exact
    fraction of its base unit."""
    if isinstance(value, bool):
        raise QuantityError(f"not a quantity: {value!r}")
    if isinstance(value, int):
        return Fraction(value)
    if isinstance(value, float):
        return Fraction(str(value))
    if not isinstance(value, str):
        raise QuantityError(f"not a quantity: {value!r}")
    match = _QUANTITY.match(value.strip())
    if match is None:
        raise QuantityError(f"not a quantity: {value!r}")
    number, exponent, suffix = match.groups()
    base = Fraction(number)
    if exponent:
        return base * Fraction(10) ** int(exponent[1:])
    return base * _SUFFIX[suffix or ""]
