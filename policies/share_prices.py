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
and pivot on (revised simplex, exact fractions, Bland's rule) until no pattern is worth more
than a GPU. Pure and deterministic: the same mix gives the same prices.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction
from functools import lru_cache

from broker.model import MILLI_PER_GPU

# A safety net only: column generation for a few dozen sizes ends in tens of pivots.
_MAX_PIVOTS = 10_000
# Demands are popularities (floats); as fractions they keep this many digits.
_DEMAND_DENOMINATOR = 10**6


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
    return SharePacking(
        dict(zip(sizes, prices, strict=True)),
        tuple(
            ({s: a for s, a in zip(sizes, col, strict=True) if a}, amount)
            for col, amount in zip(basis, x, strict=True)
            if amount
        ),
    )


@lru_cache(maxsize=64)
def _solve(
    items: tuple[tuple[int, float], ...],
) -> tuple[list[int], list[Fraction], list[list[int]], list[Fraction]]:
    sizes = [s for s, _ in items]
    d = [Fraction(x).limit_denominator(_DEMAND_DENOMINATOR) for _, x in items]
    n = len(sizes)
    # The basis starts as the single-size patterns: pattern i holds k_i pods of size i.
    basis = [[MILLI_PER_GPU // s if j == i else 0 for j in range(n)] for i, s in enumerate(sizes)]
    inverse = [
        [Fraction(1, col[i]) if j == i else Fraction(0) for j in range(n)]
        for i, col in enumerate(basis)
    ]
    x = [inverse[i][i] * d[i] for i in range(n)]
    for _ in range(_MAX_PIVOTS):
        y = _duals(inverse)
        column = _best_pattern(sizes, y)
        if sum(a * p for a, p in zip(column, y, strict=True)) <= 1:
            break
        _pivot(inverse, x, basis, column)
    return sizes, _duals(inverse), basis, x


def _duals(inverse: list[list[Fraction]]) -> list[Fraction]:
    """y = c_B B^-1 with every pattern costing one GPU: the column sums of B^-1, where row
    i of ``inverse`` is the row of B^-1 for the basic pattern i."""
    n = len(inverse)
    return [sum((inverse[i][j] for i in range(n)), Fraction(0)) for j in range(n)]


def _pivot(
    inverse: list[list[Fraction]], x: list[Fraction], basis: list[list[int]], column: list[int]
) -> None:
    """Bring ``column`` into the basis (the ratio test's leaving pattern: the smallest
    ratio, then the lowest position, Bland's rule) and update B^-1 and the solution."""
    n = len(inverse)
    u = [sum((inverse[i][j] * column[j] for j in range(n)), Fraction(0)) for i in range(n)]
    leaving = min((x[i] / u[i], i) for i in range(n) if u[i] > 0)[1]
    pivot = u[leaving]
    inverse[leaving] = [v / pivot for v in inverse[leaving]]
    x[leaving] /= pivot
    for i in range(n):
        if i != leaving and u[i] != 0:
            factor = u[i]
            inverse[i] = [a - factor * b for a, b in zip(inverse[i], inverse[leaving], strict=True)]
            x[i] -= factor * x[leaving]
    basis[leaving] = column


def _best_pattern(sizes: list[int], y: list[Fraction]) -> list[int]:
    """The pattern the prices value most (unbounded knapsack over one GPU's milli, in
    floats to find it; the caller checks its worth exactly)."""
    value = [0.0] * (MILLI_PER_GPU + 1)
    last = [-1] * (MILLI_PER_GPU + 1)
    prices = [float(p) for p in y]
    for f in range(1, MILLI_PER_GPU + 1):
        value[f], last[f] = value[f - 1], -1
        for i, s in enumerate(sizes):
            if s <= f and prices[i] > 0 and value[f - s] + prices[i] > value[f] + 1e-12:
                value[f], last[f] = value[f - s] + prices[i], i
    counts = [0] * len(sizes)
    f = MILLI_PER_GPU
    while f > 0:
        if last[f] < 0:
            f -= 1
        else:
            counts[last[f]] += 1
            f -= sizes[last[f]]
    return counts


class ShareLoss:
    """The pattern value a shared pod loses on a GPU with ``free`` milli: K(f) - y_s - K(f-s),
    exactly, in milli of a GPU."""

    def __init__(self, prices: Mapping[int, Fraction]) -> None:
        self.prices = dict(prices)
        self._worth = self._knapsack()
        self._tables: dict[int, list[float]] = {}

    def _knapsack(self) -> list[Fraction]:
        worth = [Fraction(0)] * (MILLI_PER_GPU + 1)
        for f in range(1, MILLI_PER_GPU + 1):
            best = worth[f - 1]
            for s, p in self.prices.items():
                if s <= f and p > 0 and worth[f - s] + p > best:
                    best = worth[f - s] + p
            worth[f] = best
        return worth

    def milli(self, free: int, size: int) -> float:
        table = self._tables.get(size)
        if table is None:
            price = self.prices.get(size, Fraction(0))
            worth = self._worth
            table = self._tables[size] = [
                float(MILLI_PER_GPU * (worth[f] - price - worth[f - size])) if f >= size else 0.0
                for f in range(MILLI_PER_GPU + 1)
            ]
        return table[free]
