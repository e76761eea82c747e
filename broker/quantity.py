"""Kubernetes resource quantities ("500m", "16Gi", "1Ei", "1e3"), parsed exactly and written
in their canonical form: the one parser of the broker (the manifest's bounds) and of the
adapters (node allocatable, pod requests, Cluster API scale-from-zero annotations), and the
one writer of the quantities admission stores (``canonical``).

It sits at the bottom layer, beside ``broker.model``, because both ``broker.manifest`` and
``adapters`` read quantities and neither may import the other. Pure: the standard library
only.
"""

from __future__ import annotations

import functools
import json
import math
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


_NANO = Fraction(1, 10**9)
# Decimal exponents with an SI letter; others are written as "e<n>" (Kubernetes has no
# letter for them either).
_DECIMAL_LETTERS = {-9: "n", -6: "u", -3: "m", 0: "", 3: "k", 6: "M", 9: "G", 12: "T",
                    15: "P", 18: "E"}  # fmt: skip
_BINARY_LETTERS = ("", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei")


def canonical(value: object) -> str:
    """The canonical string Kubernetes writes for a quantity (what ``Quantity.String()``
    gives once the API server has parsed it): ``0.5`` -> ``"500m"``, ``"1000m"`` -> ``"1"``,
    ``"1024Mi"`` -> ``"1Gi"``, ``1`` -> ``"1"``, ``"1e3"`` -> ``"1e3"``; raises QuantityError.

    As apimachinery's ``resource`` package does: the amount is rounded up to a nano; its
    format is the one its suffix names (binary for ``Ki``..``Ei``, an exponent for ``e<n>``,
    decimal SI otherwise, numbers included); a binary amount below 1024 in magnitude, or not
    whole, is written in decimal SI; decimal amounts take the largest exponent that is a
    multiple of 3 and leaves a whole mantissa.
    """
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise QuantityError(f"not a quantity: {_show(value)}")
    return _canonical_text(value if isinstance(value, str) else str(value))


@functools.lru_cache(maxsize=4096)
def _canonical_text(text: str) -> str:
    amount = _parse_text(text)
    if amount == 0:
        return "0"
    if amount.denominator != 1 and (amount / _NANO).denominator != 1:
        sign = -1 if amount < 0 else 1  # rounded away from zero, as inf.RoundUp does
        amount = sign * math.ceil(abs(amount) / _NANO) * _NANO
    suffix = _QUANTITY.fullmatch(text).group(3) or ""  # type: ignore[union-attr]
    binary = suffix.endswith("i")
    if binary and abs(amount) >= 1024 and amount.denominator == 1:
        return _binary(int(amount))
    return _decimal(amount, exponent_form=suffix[:1] in ("e", "E"))


def _binary(amount: int) -> str:
    mantissa, power = amount, 0
    while mantissa % 1024 == 0 and power < len(_BINARY_LETTERS) - 1:
        mantissa //= 1024
        power += 1
    return f"{mantissa}{_BINARY_LETTERS[power]}"


def _decimal(amount: Fraction, exponent_form: bool) -> str:
    # A whole mantissa at 10^-9 (rounded above), then factors of 1000 moved to the exponent.
    mantissa, exponent = int(amount / _NANO), -9
    while mantissa % 1000 == 0:
        mantissa //= 1000
        exponent += 3
    if exponent_form or exponent not in _DECIMAL_LETTERS:
        return f"{mantissa}e{exponent}" if exponent else str(mantissa)
    return f"{mantissa}{_DECIMAL_LETTERS[exponent]}"


def _show(value: object) -> str:
    text = value if isinstance(value, str) else repr(value)
    return json.dumps(text[:40] + ("..." if len(text) > 40 else ""))


__all__ = ["PATTERN", "SUFFIXES", "QuantityError", "canonical", "parse_quantity"]
