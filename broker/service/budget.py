"""A dry run's time budget, checked while the policy works: ``Budget`` and the snapshot
that checks it (``budgeted``).

A policy is pure and synchronous and knows nothing of time, and a single decision can be
long (a maximum-size gang that fits nowhere makes binpack try every pod on every node of
every cluster). So the budget is checked where the policy reads the federation: each
cluster view of a budgeted snapshot checks it whenever the policy asks it for candidate
nodes (``by_free_at_least``, ``by_whole_at_least``, ``whole_histogram``, ``groups``),
which a policy does for every pod it places. A decision past its budget, or one its
caller gave up on, stops there with ``OverBudget`` or ``Abandoned``; the policies keep no
state between calls, so nothing is left half-done. The views are the snapshot's own,
frozen ones: wrapping them copies nothing.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping

from broker.core.views import Filtered
from broker.model import (
    CapacitySnapshot,
    Cluster,
    ClusterCapacity,
    GpuType,
    NodeGroup,
    NodeState,
)


class PlanRefused(Exception):
    """A dry run not answered; asking again after ``retry_after`` seconds may succeed."""

    def __init__(self, message: str, retry_after: int) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class OverBudget(PlanRefused):
    """The dry run used up its time budget before it had an answer."""


class Abandoned(Exception):
    """The dry run's caller is gone (its request was cancelled): stop working for it."""


class Budget:
    """``seconds`` of ``clock`` from ``start()``; ``check()`` raises once they are spent
    (``OverBudget``) or the caller gave up (``Abandoned``, after ``abandon()``)."""

    __slots__ = ("_clock", "_deadline", "abandoned", "seconds")

    def __init__(self, seconds: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.seconds = seconds
        self._clock = clock
        self._deadline = math.inf
        self.abandoned = False

    def start(self) -> None:
        self._deadline = self._clock() + self.seconds

    def abandon(self) -> None:
        """From any thread: the next ``check`` raises ``Abandoned``."""
        self.abandoned = True

    def check(self) -> None:
        if self.abandoned:
            raise Abandoned
        if self._clock() > self._deadline:
            raise OverBudget(
                f"plan: stopped after its budget of {self.seconds:g} s "
                "(api.plans.budgetSeconds); narrow the job (fewer pods, "
                "placement.gpuTypes or clusterSelector) or retry later",
                max(1, math.ceil(self.seconds)),
            )


class _BudgetedView:
    """One cluster's view as a policy reads it, checking the budget on the calls a policy
    makes for every pod it places."""

    __slots__ = ("_budget", "_view")

    def __init__(self, view: ClusterCapacity, budget: Budget) -> None:
        self._view = view
        self._budget = budget

    @property
    def cluster(self) -> Cluster:
        return self._view.cluster

    @property
    def name(self) -> str:
        return self._view.name

    @property
    def stale(self) -> bool:
        return self._view.stale

    @property
    def launchable(self) -> frozenset[str] | None:
        return self._view.launchable

    @property
    def nodes(self) -> Mapping[str, NodeState]:
        return self._view.nodes

    def groups(self) -> Iterable[NodeGroup]:
        self._budget.check()
        return self._view.groups()

    def gpu_types(self) -> set[GpuType | None]:
        return self._view.gpu_types()

    def by_free_at_least(
        self, group: NodeGroup, milli: int
    ) -> Iterator[tuple[int, Collection[str]]]:
        self._budget.check()
        return self._view.by_free_at_least(group, milli)

    def by_whole_at_least(
        self, group: NodeGroup, whole: int
    ) -> Iterator[tuple[int, Collection[str]]]:
        self._budget.check()
        return self._view.by_whole_at_least(group, whole)

    def whole_histogram(self, group: NodeGroup) -> list[tuple[int, int]]:
        self._budget.check()
        return self._view.whole_histogram(group)

    def gpus_total(self, group: NodeGroup | None = None) -> int:
        return self._view.gpus_total(group)

    def free_milli(self, group: NodeGroup | None = None) -> int:
        return self._view.free_milli(group)

    def allocation(self) -> float:
        return self._view.allocation()


def budgeted(snapshot: CapacitySnapshot, budget: Budget) -> CapacitySnapshot:
    """``snapshot`` as policies read it, checking ``budget`` as they work (O(clusters))."""
    views = {n: _BudgetedView(v, budget) for n, v in snapshot.clusters.items()}
    return Filtered(views, snapshot.version)


__all__ = ["Abandoned", "Budget", "OverBudget", "PlanRefused", "budgeted"]
