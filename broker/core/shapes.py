"""The unplaceable-shape memo: job shapes found not to fit, skipped until room may appear.

A backlog of jobs that do not fit (a full federation, 100,000 queued) would cost a whole
policy decision each, every cycle. ``UnplaceableShapes`` remembers the *shapes* (everything
a decision depends on but the name) found unplaceable, as Armada skips jobs whose
scheduling key already failed in a round: a job of a remembered shape waits without a
decision, for as long as the federation has only lost room since (``Ledger.growth``
unchanged: only assumptions happened) and no node held then (``broker.core.holds``) is
free now. The cycle
decides which jobs may be skipped (see ``broker.core.scheduler``).
"""

from __future__ import annotations

from collections.abc import Collection, Hashable, Mapping
from dataclasses import dataclass, field

from broker.core.ledger import Ledger
from broker.model import Job, Unplaceable


def shape_of(job: Job, policy: str, hidden: Mapping[str, Collection[str]] | None) -> Hashable:
    """Everything a placement decision depends on but the job's name: two jobs of one shape
    fit in exactly the same places."""
    return (
        policy, job.queue, job.priority, job.min_member, job.allow_burst, job.gpu_types,
        tuple(sorted(job.cluster_selector.items())), job.clusters, job.kind,
        tuple((ps.count, ps.resources, ps.tolerations, ps.topology) for ps in job.pod_sets),
        tuple(sorted((c, tuple(sorted(n))) for c, n in hidden.items())) if hidden else (),
    )  # fmt: skip


@dataclass(slots=True)
class UnplaceableShapes:
    """Job shapes a decision found unplaceable, with the reasons and the clusters held at
    the time; kept across cycles while ``Ledger.growth`` stays put (see the module doc)."""

    ledger: Ledger | None = None  # whose growth it is (a rebuilt service has a new one)
    growth: int = -1
    shapes: dict[Hashable, tuple[frozenset[Hashable], Unplaceable]] = field(default_factory=dict)

    def _current(self, ledger: Ledger) -> bool:
        if ledger is self.ledger and ledger.growth == self.growth:
            return True
        self.shapes.clear()
        self.ledger, self.growth = ledger, ledger.growth
        return False

    def lookup(
        self, shape: Hashable, ledger: Ledger, held: Collection[Hashable]
    ) -> Unplaceable | None:
        """The remembered refusal of ``shape``, unless room may have appeared since: the
        ledger grew, or something ``held`` then (held nodes) is not held now."""
        if not self._current(ledger):
            return None
        known = self.shapes.get(shape)
        if known is None or not all(key in held for key in known[0]):
            return None  # a node hidden then is visible now: decide again
        return known[1]

    def remember(
        self, shape: Hashable, ledger: Ledger, held: Collection[Hashable], why: Unplaceable
    ) -> None:
        self._current(ledger)
        self.shapes[shape] = (frozenset(held), why)
