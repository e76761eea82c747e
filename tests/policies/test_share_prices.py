"""The share prices: the cutting-stock programme solved to optimality (a primal packing and
dual prices of the same value, both feasible), and the pattern value a placement loses."""

from __future__ import annotations

from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from policies.share_prices import ShareLoss, lp_packing, lp_prices


def _patterns(sizes: list[int], left: int = 1000) -> list[dict[int, int]]:
    """Every multiset of ``sizes`` that fits in one GPU (brute force, for small mixes)."""
    if not sizes:
        return [{}]
    first, rest = sizes[0], sizes[1:]
    out = []
    for k in range(left // first + 1):
        for tail in _patterns(rest, left - k * first):
            out.append({first: k, **tail} if k else tail)
    return out


def test_a_hand_solved_mix() -> None:
    # One 600 for every two 400s: a 600 pairs with a 400, two 400s share a GPU, so 1.5 GPUs
    # per 600. The only prices worth 1.5 are a half each (600 + 400 and 400 + 400 are full).
    packing = lp_packing({600: 1.0, 400: 2.0})
    assert packing.prices == {600: Fraction(1, 2), 400: Fraction(1, 2)}
    assert sorted((sorted(p.items()), x) for p, x in packing.patterns) == [
        ([(400, 1), (600, 1)], Fraction(1)),
        ([(400, 2)], Fraction(1, 2)),
    ]


def test_sizes_with_no_demand_or_out_of_range_get_no_price() -> None:
    assert lp_prices({500: 1.0, 250: 0.0, 1000: 3.0, 0: 1.0}) == {500: Fraction(1, 2)}
    assert lp_prices({}) == {}


@settings(max_examples=60, deadline=None)
@given(
    mix=st.dictionaries(
        st.integers(12, 95).map(lambda s: s * 10),  # 120..950 milli: patterns stay few
        st.integers(1, 40),
        min_size=1,
        max_size=5,
    )
)
def test_the_prices_and_the_packing_are_both_optimal(mix: dict[int, int]) -> None:
    packing = lp_packing({s: float(n) for s, n in mix.items()})
    # primal: the packing covers every size's demand with patterns that fit a GPU
    for pattern, amount in packing.patterns:
        assert amount > 0 and sum(s * a for s, a in pattern.items()) <= 1000
    for size, demand in mix.items():
        assert sum(p.get(size, 0) * x for p, x in packing.patterns) >= demand
    # dual: no pattern is worth more than a GPU, and no price is negative
    assert all(price >= 0 for price in packing.prices.values())
    for pattern in _patterns(sorted(mix)):
        assert sum(packing.prices[s] * a for s, a in pattern.items()) <= 1
    # equal values: by weak duality both are optimal
    gpus = sum(x for _, x in packing.patterns)
    assert gpus == sum(packing.prices[s] * n for s, n in mix.items())


def _most_a_gpu_holds(prices: dict[int, Fraction]) -> Fraction:
    """The best pattern's worth at ``prices`` (an unbounded knapsack over 1000 milli)."""
    worth = [Fraction(0)] * 1001
    for f in range(1, 1001):
        worth[f] = max([worth[f - 1]] + [worth[f - s] + p for s, p in prices.items() if s <= f])
    return worth[1000]


@settings(max_examples=15, deadline=None)
@given(mix=st.dictionaries(st.integers(10, 999), st.floats(0.001, 1.0), min_size=6, max_size=40))
def test_a_mix_of_many_sizes_is_solved_to_optimality(mix: dict[int, float]) -> None:
    # Too many patterns to list: dual feasibility by a knapsack, optimality by equal values.
    packing = lp_packing(mix)
    assert _most_a_gpu_holds(packing.prices) <= 1 + Fraction(1, 10**6)
    for size, demand in mix.items():
        covered = sum((p.get(size, 0) * x for p, x in packing.patterns), Fraction(0))
        assert covered >= Fraction(demand) - Fraction(1, 10**6), size
    gpus = sum((x for _, x in packing.patterns), Fraction(0))
    worth = sum((packing.prices[s] * Fraction(d) for s, d in mix.items()), Fraction(0))
    assert abs(gpus - worth) <= Fraction(1, 10**5) * max(gpus, Fraction(1))


PRICES = {
    650: Fraction(2, 3),
    550: Fraction(2, 3),
    320: Fraction(1, 3),
    230: Fraction(1, 4),
    220: Fraction(1, 12),
}


@pytest.mark.parametrize(
    ("free", "size", "lost"),
    [
        (350, 230, 1000 / 12),  # beside a 650: K(350) = 1/3 (a 320), 1/4 kept, 120 worth 0
        (450, 230, 0.0),  # beside a 550: 230 + 220 is the GPU's best completion
        (350, 320, 0.0),
        (1000, 650, 0.0),  # 650 + 320 fills a GPU at these prices
        (1000, 230, 0.0),  # 550 + 230 + 220
        (230, 220, 1000 / 4 - 1000 / 12),  # a 220 where a 230 fits, leaving 10
        (500, 100, 1000 / 2 - 1000 / 3),  # no price: K(500) = 230 + 230, K(400) = a 320
    ],
)
def test_the_loss_of_a_placement_by_hand(free: int, size: int, lost: float) -> None:
    assert ShareLoss(PRICES).milli(free, size) == pytest.approx(lost)


def test_no_placement_gains_pattern_value() -> None:
    loss = ShareLoss(PRICES)
    for size in (*PRICES, 100, 500):
        assert all(loss.milli(free, size) >= 0 for free in range(size, 1001)), size
