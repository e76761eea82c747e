"""What each size of shared-GPU pod is worth when GPUs are packed as well as they can be.

Shared pods (a fraction of one GPU) are a bin-packing problem: each GPU is a bin of 1000
milli, and a *pattern* is a set of pod sizes that fits in one. Packing a known mix of sizes
in the fewest GPUs is Gilmore and Gomory's cutting-stock linear programme (Operations
Research 9(6), 1961):

    minimise  sum_p x_p   subject to   sum_p a_sp x_p >= d_s  for every size s,  x >= 0

where ``d_s`` is how often size ``s`` comes and ``a_sp`` how many of it pattern ``p`` holds.
Its dual gives every size a *price* ``y_s``, the part of a GPU that one pod of the size is
worth: no pattern is worth more than a whole GPU (``sum_s a_sp y_s <= 1``), and the patterns
an optimal packing uses are worth exactly one.

A GPU with ``f`` milli free can still take pods worth ``K(f)``, the best set of prices that
fits in ``f`` (a knapsack). Putting a pod of size ``s`` there keeps ``y_s + K(f - s)`` of it,
so the placement *loses* ``K(f) - y_s - K(f - s)`` (never negative). It loses nothing when
the pod is part of some best completion of the GPU, and something when it leaves a hole the
mix cannot fill as well: a 230-milli pod beside a 650-milli one, where a 320 would fit.

The programme is solved by column generation: start from one pattern per size (as many of
it as fit), read the prices, let the knapsack find the pattern they undervalue most, add it,
and pivot on (revised simplex with an explicit basis inverse, Bland's rule) until no pattern
is worth more than a GPU. The pivots run in floats, which keeps a mix of a hundred sizes
to about a second; the prices are then read back as the nearest fractions, and everything after
(what a GPU can still hold, what a placement loses) is exact, so placements that lose the
same tie exactly. Pure and deterministic: the same mix gives the same prices.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from functools import lru_cache
from typing import TypeVar

from broker.model import MILLI_PER_GPU

# A safety net only: column generation for a hundred sizes ends in a few hundred pivots.
_MAX_PIVOTS = 10_000
# Below this a reduced cost or a ratio is rounding, not a difference.
_EPS = 1e-9
# Prices and amounts are mostly fractions with small denominators (a basis of patterns of
# small counts); read back from floats as the nearest fraction with at most this denominator.
_DENOMINATOR = 10**6


@dataclass(frozen=True, slots=True)
class SharePacking:
    """The programme's solution: each size's price, and the optimal packing it prices (each
    pattern, as pod counts by size, with how many GPUs of it per unit of demand)."""

    prices: dict[int, Fraction]
    patterns: tuple[tuple[dict[int, int], Fraction], ...]


def lp_prices(demand: Mapping[int, float]) -> dict[int, Fraction]:
    """Each shared size's price (a fraction of a GPU) for a mix of sizes in milli (1..999)
    that come with the given frequencies; sizes with no demand are left out."""
    return lp_packing(demand).prices


def lp_packing(demand: Mapping[int, float]) -> SharePacking:
    """The cutting-stock programme of ``demand``, solved: prices and packing."""
    items = tuple(sorted((s, d) for s, d in demand.items() if d > 0 and 0 < s < MILLI_PER_GPU))
    sizes, prices, basis, x = _solve(items)
    amounts = [_fraction(amount) for amount in x]
    return SharePacking(
        {s: _fraction(p) for s, p in zip(sizes, prices, strict=True)},
        tuple(
            ({s: a for s, a in zip(sizes, col, strict=True) if a}, amount)
            for col, amount in zip(basis, amounts, strict=True)
            if amount
        ),
    )


def _fraction(value: float) -> Fraction:
    """``value`` as the nearest fraction of small denominator where that is ``value`` up to
    rounding (prices and amounts are mostly ratios of small counts), else exactly."""
    if value <= 0:
        return Fraction(0)
    near = Fraction(value).limit_denominator(_DENOMINATOR)
    return near if abs(float(near) - value) <= 1e-12 * value else Fraction(value)


@lru_cache(maxsize=64)
def _solve(
    items: tuple[tuple[int, float], ...],
) -> tuple[list[int], list[float], list[list[int]], list[float]]:
    sizes = [s for s, _ in items]
    n = len(sizes)
    if not n:
        return [], [], [], []
    # The basis starts as the single-size patterns: pattern i holds k_i pods of size i.
    basis = [[MILLI_PER_GPU // s if j == i else 0 for j in range(n)] for i, s in enumerate(sizes)]
    inverse = [[1 / col[i] if j == i else 0.0 for j in range(n)] for i, col in enumerate(basis)]
    x = [inverse[i][i] * d for i, (_, d) in enumerate(items)]
    knapsack = _Knapsack(sizes)
    for _ in range(_MAX_PIVOTS):
        column, worth = knapsack.best(_duals(inverse))
        if worth <= 1 + _EPS:
            break
        _pivot(inverse, x, basis, column)
    return sizes, _duals(inverse), basis, x


def _duals(inverse: list[list[float]]) -> list[float]:
    """y = c_B B^-1 with every pattern costing one GPU: the column sums of B^-1, where row
    i of ``inverse`` is the row of B^-1 for the basic pattern i."""
    return [sum(column) for column in zip(*inverse, strict=True)]


def _pivot(
    inverse: list[list[float]], x: list[float], basis: list[list[int]], column: list[int]
) -> None:
    """Bring ``column`` into the basis (the ratio test's leaving pattern: the smallest
    ratio, then the lowest position, Bland's rule) and update B^-1 and the solution."""
    n = len(inverse)
    u = [sum(row[j] * column[j] for j in range(n) if column[j]) for row in inverse]
    leaving, ratio = -1, math.inf
    for i in range(n):
        if u[i] > _EPS and x[i] / u[i] < ratio - _EPS:
            leaving, ratio = i, x[i] / u[i]
    pivot = u[leaving]
    inverse[leaving] = [v / pivot for v in inverse[leaving]]
    x[leaving] /= pivot
    for i in range(n):
        if i != leaving and u[i] != 0:
            factor = u[i]
            inverse[i] = [a - factor * b for a, b in zip(inverse[i], inverse[leaving], strict=True)]
            x[i] -= factor * x[leaving]
    basis[leaving] = column


N = TypeVar("N", float, Fraction)


def _knapsack(
    steps: Sequence[int], prices: Sequence[N], cells: int, zero: N, slack: N
) -> tuple[list[N], list[int]]:
    """An unbounded knapsack over ``cells``: the most ``prices`` fit in f cells, for every f,
    and the item taken last for it (-1: none). ``slack``: how much more counts as more."""
    value = [zero] * (cells + 1)
    last = [-1] * (cells + 1)
    items = [(i, step, p) for i, (step, p) in enumerate(zip(steps, prices, strict=True)) if p > 0]
    for f in range(1, cells + 1):
        best, took = value[f - 1], -1
        for i, step, p in items:
            if step <= f and value[f - step] + p > best + slack:
                best, took = value[f - step] + p, i
        value[f], last[f] = best, took
    return value, last


class _Knapsack:
    """The pattern that prices value most: the knapsack over one GPU, counted in the sizes'
    greatest common divisor (10 milli for openb: a hundred cells, not 1000), in floats."""

    def __init__(self, sizes: list[int]) -> None:
        unit = math.gcd(*sizes)
        self.cells = MILLI_PER_GPU // unit
        self.steps = [s // unit for s in sizes]

    def best(self, prices: list[float]) -> tuple[list[int], float]:
        value, last = _knapsack(self.steps, prices, self.cells, 0.0, 1e-12)
        counts = [0] * len(self.steps)
        f = self.cells
        while f > 0:
            if last[f] < 0:
                f -= 1
            else:
                counts[last[f]] += 1
                f -= self.steps[last[f]]
        return counts, value[self.cells]


class ShareLoss:
    """The pattern value a shared pod loses on a GPU with ``free`` milli: K(f) - y_s - K(f-s),
    exactly, in milli of a GPU. K is counted in the priced sizes' greatest common divisor:
    no set of them fills the milli below the next multiple."""

    def __init__(self, prices: Mapping[int, Fraction]) -> None:
        self.prices = dict(prices)
        priced = [s for s, p in self.prices.items() if p > 0]
        self._unit = math.gcd(*priced) if priced else MILLI_PER_GPU
        steps = [s // self._unit for s in self.prices]
        cells = MILLI_PER_GPU // self._unit
        zero = Fraction(0)
        self._worth, _ = _knapsack(steps, list(self.prices.values()), cells, zero, zero)
        self._tables: dict[int, list[float]] = {}

    def worth(self, free: int) -> Fraction:
        """K(free): the most the prices say ``free`` milli of one GPU can still hold."""
        return self._worth[free // self._unit]

    def milli(self, free: int, size: int) -> float:
        table = self._tables.get(size)
        if table is None:
            price = self.prices.get(size, Fraction(0))
            table = self._tables[size] = [
                float(MILLI_PER_GPU * (self.worth(f) - price - self.worth(f - size)))
                if f >= size
                else 0.0
                for f in range(MILLI_PER_GPU + 1)
            ]
        return table[free]
