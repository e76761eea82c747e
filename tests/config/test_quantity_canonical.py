"""``broker.quantity.canonical``: a quantity written as Kubernetes writes it once its API
server has parsed it (apimachinery's ``Quantity.String()``), as a table of the forms users
write, and as properties: the canonical form means the same amount (rounded up to a nano),
and writing it again changes nothing."""

from __future__ import annotations

import math
from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from broker.quantity import QuantityError, canonical, parse_quantity

# (what a user writes, what the API server stores); the right column is what
# apimachinery's resource.MustParse(x).String() gives.
TABLE: list[tuple[object, str]] = [
    (1, "1"),
    (8, "8"),
    (0.5, "500m"),
    (7.5, "7500m"),
    ("1000m", "1"),
    ("1500m", "1500m"),
    ("1.5", "1500m"),
    ("0.1", "100m"),
    ("100m", "100m"),
    ("1000", "1k"),
    ("1100", "1100"),
    (2048, "2048"),
    ("500M", "500M"),
    ("1G", "1G"),
    ("1024Mi", "1Gi"),
    ("1536Mi", "1536Mi"),
    ("1.5Gi", "1536Mi"),
    ("0.5Gi", "512Mi"),
    ("2Ki", "2Ki"),
    ("1.5Ki", "1536"),  # binary, but not a whole number of Ki: written in decimal SI
    ("0.5Ki", "512"),  # below 1024: decimal SI
    ("1Ei", "1Ei"),
    ("1e3", "1e3"),  # an exponent keeps the exponent form
    ("12e6", "12e6"),
    ("1.5e3", "1500"),
    ("1e21", "1e21"),
    (1e22, "10e21"),
    ("0.1n", "1n"),  # rounded up to a nano
    ("1.0001", "1000100u"),
    ("0", "0"),
    ("0.0", "0"),
    ("-1", "-1"),
    ("+2", "2"),
]


@pytest.mark.parametrize(("value", "expected"), TABLE, ids=[repr(v) for v, _ in TABLE])
def test_canonical_is_what_the_api_server_writes(value: object, expected: str) -> None:
    assert canonical(value) == expected


@pytest.mark.parametrize("value", ["", "abc", "1.2.3", "1Kb", True, None, [1], "5" * 80])
def test_what_is_no_quantity_is_refused(value: object) -> None:
    with pytest.raises(QuantityError):
        canonical(value)


def _nano_ceiling(amount: Fraction) -> Fraction:
    nano = Fraction(1, 10**9)
    scaled = amount / nano
    return (math.ceil(scaled) if amount >= 0 else -math.ceil(-scaled)) * nano


amounts = st.one_of(
    st.integers(min_value=-(10**12), max_value=10**15),
    st.decimals(min_value=-(10**6), max_value=10**9, places=12, allow_nan=False).map(str),
    st.builds(lambda n, s: f"{n}{s}", st.integers(0, 10**6),
              st.sampled_from(["", "m", "k", "M", "G", "Ki", "Mi", "Gi", "Ti", "e3", "e-3"])),
)  # fmt: skip


@given(amounts)
def test_the_canonical_form_means_the_same_amount_and_is_a_fixed_point(value: object) -> None:
    text = canonical(value)
    assert isinstance(text, str)
    assert parse_quantity(text) == _nano_ceiling(parse_quantity(value))
    assert canonical(text) == text
