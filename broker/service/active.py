"""Active jobs per tenant, counted as the leader writes them: the ``maxActiveJobs`` check on
every submission in O(1) instead of a count over the tenant's active rows (an index range
of every live job: at 100,000 live jobs it was most of the store's time per submission).

A tenant's count is read from the store the first time it is asked for, then moved by each
committed write the service makes (``PublishingStore`` reports them): +1 for a job created
(a new generation too: the old one had finished), -1 for a move from an active state into a
final one. A write whose previous state is not known (no ``expect``, or one that admits both
kinds) forgets the tenant's count, so the next check reads the store again. Only the leader
writes jobs, so ``clear`` at every election and deposition drops whatever another replica
changed meanwhile. A count read while other creations of the tenant are committing may be
off by their number, the same overshoot the check always had (it runs before the insert).
"""

from __future__ import annotations

from collections.abc import Collection

from broker.store import FINAL_STATES, JobState


class ActiveCounts:
    """tenant -> active jobs, where known. Every operation is O(1) (a dict entry)."""

    __slots__ = ("_counts",)

    def __init__(self) -> None:
        self._counts: dict[str, int] = {}

    def get(self, tenant: str) -> int | None:
        return self._counts.get(tenant)

    def seed(self, tenant: str, count: int) -> None:
        """The store's count, unless a write has already re-seeded or moved it."""
        self._counts.setdefault(tenant, count)

    def created(self, tenant: str) -> None:
        self._move(tenant, 1)

    def moved(
        self, tenant: str, state: JobState, expect: Collection[JobState] | None, jobs: int = 1
    ) -> None:
        """``jobs`` jobs of ``tenant`` moved to ``state`` from one of ``expect``."""
        if expect is None:
            self.forget(tenant)
            return
        before_final = {s in FINAL_STATES for s in expect}
        if len(before_final) != 1:
            self.forget(tenant)  # from either kind: which one is not known here
            return
        was_active = not before_final.pop()
        is_active = state not in FINAL_STATES
        self._move(tenant, jobs * (int(is_active) - int(was_active)))

    def forget(self, tenant: str) -> None:
        self._counts.pop(tenant, None)

    def clear(self) -> None:
        self._counts.clear()

    def _move(self, tenant: str, delta: int) -> None:
        count = self._counts.get(tenant)
        if count is not None and delta:
            self._counts[tenant] = max(0, count + delta)


__all__ = ["ActiveCounts"]
