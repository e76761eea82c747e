"""Kubernetes resource quantities as the API server reads and writes them: the test
member's parse (``resource.ParseQuantity``) and canonical string (``Quantity.String``).

Upstream (kubernetes/kubernetes, staging/src/k8s.io/apimachinery/pkg/api/resource/quantity.go):
``Quantity.UnmarshalJSON`` takes a JSON string or a bare JSON number (``1``, ``0.5``), so a
built-in object may carry numbers for quantities; the server stores each one in canonical
form (``CanonicalizeBytes``): the value rounded up to a nano, then written with the suffix
family it was given in: binary (``Ki``..``Ei``) when the value is a whole number of at least
1024 in magnitude, else decimal SI (``n``, ``u``, ``m``, ``""``, ``k``..``E``) or a decimal
exponent (``e3``), the mantissa an integer and the exponent a multiple of 3 (``1000m`` ->
``1``, ``0.5`` -> ``500m``, ``1.5Gi`` -> ``1536Mi``, ``2000`` -> ``2k``).
"""

from __future__ import annotations

import math
import re
from fractions import Fraction

# The message ParseQuantity's callers report (resource.ErrFormatWrong's text).
FORMAT_WRONG = (
    "quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'"
)
_NUMBER = re.compile(r"([+-]?)([0-9]*)(?:\.([0-9]*))?(.*)", re.DOTALL)
_EXPONENT = re.compile(r"[eE]([+-]?[0-9]+)")
_DECIMAL = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
_BINARY = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}
_DECIMAL_SUFFIX = {e: s for s, e in _DECIMAL.items()}
_BINARY_SUFFIX = {e // 10: s for s, e in _BINARY.items()}
_NANO = 10**9


def parse(text: str) -> tuple[Fraction, str]:
    """The value of a quantity string and its format (``DecimalSI``, ``BinarySI`` or
    ``DecimalExponent``); ``ValueError(FORMAT_WRONG)`` when it is not one."""
    match = _NUMBER.fullmatch(text.strip())
    if match is None or not (match.group(2) or match.group(3)):
        raise ValueError(FORMAT_WRONG)
    sign, whole, fraction, suffix = match.groups()
    fraction = fraction or ""
    digits = Fraction(int(whole + fraction or "0"), 10 ** len(fraction))
    if suffix in _DECIMAL:
        value, form = digits * Fraction(10) ** _DECIMAL[suffix], "DecimalSI"
    elif suffix in _BINARY:
        value, form = digits * 2 ** _BINARY[suffix], "BinarySI"
    elif (exponent := _EXPONENT.fullmatch(suffix)) is not None:
        value, form = digits * Fraction(10) ** int(exponent.group(1)), "DecimalExponent"
    else:
        raise ValueError(FORMAT_WRONG)
    return (-value if sign == "-" else value), form


def of(value: object) -> tuple[Fraction, str]:
    """A JSON value (string or number) read as ``Quantity.UnmarshalJSON`` reads it."""
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise ValueError(FORMAT_WRONG)
    return parse(value if isinstance(value, str) else repr(value))


def _round_up_to_nano(value: Fraction) -> Fraction:
    scaled = value * _NANO
    if scaled.denominator == 1:
        return value
    away = math.ceil(scaled) if scaled > 0 else math.floor(scaled)
    return Fraction(away, _NANO)


def canonical(value: Fraction, form: str) -> str:
    """The string the API server stores for a quantity of ``value`` given in ``form``."""
    value = _round_up_to_nano(value)
    if value == 0:
        return "0"
    if form == "BinarySI" and abs(value) >= 1024 and value.denominator == 1:
        amount, exponent = int(value), 0
        while amount % 1024 == 0 and exponent < 6:
            amount, exponent = amount // 1024, exponent + 1
        return f"{amount}{_BINARY_SUFFIX.get(exponent, '')}"
    mantissa = value * _NANO
    amount, exponent = int(mantissa), -9
    while amount % 10 == 0:
        amount, exponent = amount // 10, exponent + 1
    while exponent % 3:
        amount, exponent = amount * 10, exponent - 1
    if form == "DecimalExponent" or exponent not in _DECIMAL_SUFFIX:
        return f"{amount}e{exponent}" if exponent else str(amount)
    return f"{amount}{_DECIMAL_SUFFIX[exponent]}"


def normalised(value: object) -> str:
    """A JSON quantity (string or number) as the server stores it; ``ValueError`` when it
    does not parse."""
    return canonical(*of(value))


def value_of(value: object) -> Fraction:
    return of(value)[0]
