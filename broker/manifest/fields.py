"""The field types of what users write, with their bounds and JSON schemas: Kubernetes
quantities (exact, rounded up once), DNS labels, GPU type names and label maps.

The bounds keep one bad manifest from hurting the broker (invariant 7); the config's
sections (broker.config) use the same types, so a node shape is checked as a pod is.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Annotated

from pydantic import AfterValidator, BeforeValidator, Field, WithJsonSchema

from broker.manifest.errors import show
from broker.quantity import PATTERN, canonical, parse_quantity

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
MAX_ANNOTATION_LENGTH = 4096
MAX_KIND_LENGTH = 253


# --- Kubernetes quantities -------------------------------------------------------------

_QUANTITY_PATTERN = PATTERN


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
    return canonical(value)


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
# Stored as Kubernetes writes them (``0.5`` -> ``"500m"``), so no number reaches a pod.
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
        # fullmatch: with match, "$" also matches before a trailing newline ("abc\n").
        if len(value) > max_length or not compiled.fullmatch(value):
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
dns_label = _name_check(_DNS_LABEL, 63, _DNS_WHAT)
"""``value`` if it is a DNS-1123 label, else ValueError saying what it must be."""
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
AnnotationValue = Annotated[str, Field(max_length=MAX_ANNOTATION_LENGTH)]
Annotations = Annotated[dict[LabelKey, AnnotationValue], Field(max_length=MAX_LABELS)]
