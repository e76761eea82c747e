"""The field types of what users write, with their bounds and JSON schemas: Kubernetes
quantities (exact, rounded up once), DNS labels, GPU type names and label maps.

The bounds keep one bad manifest from hurting the broker (invariant 7); the config's
sections (broker.config) use the same types, so a node shape is checked as a pod is.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from fractions import Fraction
from typing import Annotated

from pydantic import AfterValidator, BeforeValidator, Field, WithJsonSchema

from broker.manifest.errors import show

# Bounds (invariant 7). Pod sets per job follow Kueue's limit of 8; the pod limits keep one
# gang's placement search and its launch fan-out small enough for one scheduling cycle.
MAX_POD_SETS = 8
MAX_PODS_PER_SET = 1024
MAX_PODS = 4096
MAX_GPUS_PER_POD = 16
MAX_PRIORITY = 1_000_000
MAX_TIMEOUT_SECONDS = 86_400
MAX_BACKOFF_LIMIT = 1000
MAX_CPU_MILLI = 1024 * 1000  # 1024 cores, above any node we know of
MAX_MEMORY_MIB = 16 * 1024 * 1024  # 16 TiB
MAX_LABELS = 32
MAX_GPU_TYPES = 32


# --- Kubernetes quantities -------------------------------------------------------------

_QUANTITY_PATTERN = r"^[+-]?(\d+(\.\d*)?|\.\d+)(Ki|Mi|Gi|Ti|Pi|Ei|[eE][+-]?\d+|m|k|M|G|T|P|E)?$"
_QUANTITY = re.compile(
    r"([+-]?)(\d+(?:\.\d*)?|\.\d+)(Ki|Mi|Gi|Ti|Pi|Ei|[eE][+-]?\d+|m|k|M|G|T|P|E)?"
)
# Decimal SI (m, k..E) and binary SI (Ki..Ei) suffixes; "e<n>" exponents are handled apart.
_SUFFIX: dict[str, Fraction] = {
    "": Fraction(1),
    "m": Fraction(1, 1000),
    **{s: Fraction(10 ** (3 * i)) for i, s in enumerate("kMGTPE", 1)},
    **{f"{s}i": Fraction(2 ** (10 * i)) for i, s in enumerate("KMGTPE", 1)},
}


def parse_quantity(value: object) -> Fraction:
    """A Kubernetes quantity ("64", "500m", "0.5", "512Gi", "1G", "1e3") as an exact number.

    Numbers (from YAML or JSON) are accepted too, booleans are not. Exact arithmetic, so
    "0.1" CPU is exactly 100 millicores and rounding happens once, upward, by the caller.
    """
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise ValueError(f"not a quantity: {show(value)}")
    text = value if isinstance(value, str) else str(value)
    match = _QUANTITY.fullmatch(text) if len(text) <= 64 else None
    if match is None:
        raise ValueError(f"not a quantity: {show(value)}")
    sign, number, suffix = match.group(1), match.group(2), match.group(3) or ""
    amount = Fraction(number)
    if suffix[:1] in ("e", "E") and len(suffix) > 1:
        exponent = int(suffix[1:])
        if abs(exponent) > 30:  # exact powers of ten this large would only burn CPU
            raise ValueError(f"not a quantity: {show(value)} (exponent out of range)")
        amount *= Fraction(10) ** exponent
    else:
        amount *= _SUFFIX[suffix]
    return -amount if sign == "-" else amount


def cpu_millicores(value: object) -> int:
    """CPU in millicores, rounded up (a request is never shrunk)."""
    return math.ceil(parse_quantity(value) * 1000)


def memory_mebibytes(value: object) -> int:
    """Memory in MiB, rounded up, so "1G" (10^9 bytes) is 954 MiB."""
    return math.ceil(parse_quantity(value) / 2**20)


def _bounded_quantity(value: object, to_int: Callable[[object], int], limit: int, unit: str) -> str:
    amount = to_int(value)
    if parse_quantity(value) <= 0:
        raise ValueError("must be positive")
    if amount > limit:
        raise ValueError(f"must be at most {unit}")
    return value if isinstance(value, str) else str(value)


def _cpu(value: object) -> str:
    return _bounded_quantity(value, cpu_millicores, MAX_CPU_MILLI, "1024 cores")


def _memory(value: object) -> str:
    return _bounded_quantity(value, memory_mebibytes, MAX_MEMORY_MIB, "16Ti")


_QUANTITY_SCHEMA = WithJsonSchema(
    {
        "anyOf": [
            {"type": "string", "pattern": _QUANTITY_PATTERN},
            {"type": "number", "exclusiveMinimum": 0},
        ]
    }
)
# The user's text is kept (numbers become their decimal text) so the manifest round-trips.
CpuQuantity = Annotated[str, BeforeValidator(_cpu), _QUANTITY_SCHEMA]
MemoryQuantity = Annotated[str, BeforeValidator(_memory), _QUANTITY_SCHEMA]


# --- names ---------------------------------------------------------------------------

_DNS_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
_LABEL_NAME = r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
_LABEL_KEY = r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
_LABEL_VALUE = r"^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?$"


def _name_check(pattern: str, max_length: int, what: str) -> Callable[[str], str]:
    compiled = re.compile(pattern)

    def check(value: str) -> str:
        if len(value) > max_length or not compiled.match(value):
            raise ValueError(f"{show(value)} is not {what}")
        return value

    return check


def _name_schema(pattern: str, max_length: int) -> WithJsonSchema:
    return WithJsonSchema({"type": "string", "pattern": pattern, "maxLength": max_length})


_DNS_WHAT = (
    "a DNS-1123 label (lowercase letters, digits and '-', starting and ending with a "
    "letter or digit, at most 63 characters)"
)
DnsLabel = Annotated[
    str, AfterValidator(_name_check(_DNS_LABEL, 63, _DNS_WHAT)), _name_schema(_DNS_LABEL, 63)
]
GpuTypeName = Annotated[
    str,
    AfterValidator(_name_check(_LABEL_NAME, 63, "a GPU type name (letters, digits, '-_.')")),
    _name_schema(_LABEL_NAME, 63),
]
LabelKey = Annotated[
    str, AfterValidator(_name_check(_LABEL_KEY, 317, "a label key")), _name_schema(_LABEL_KEY, 317)
]
LabelValue = Annotated[
    str,
    AfterValidator(_name_check(_LABEL_VALUE, 63, "a label value")),
    _name_schema(_LABEL_VALUE, 63),
]
Labels = Annotated[dict[LabelKey, LabelValue], Field(max_length=MAX_LABELS)]
