"""Whether a waiting job can never fit the federation as it is made (``policies.never_fits``),
asked by a list's REASON column and by explain.

``Largest`` keeps the federation at its largest and reads it again only when the snapshot,
the pools or the members not read yet have changed, so a list of a hundred waiting jobs
reads the nodes once. A job that may burst while a Cluster API pool cannot be read yet is
not judged: that pool may be the one it waits for.
"""

from __future__ import annotations

from broker.core.ledger import Ledger
from broker.model import Job
from broker.service.members import KubeMembers
from broker.service.pools import BurstPools
from policies.never_fits import ClusterMaximum, NeverFits, maxima, never_fits

Key = tuple[int, tuple[str, ...], frozenset[str]]


class Largest:
    """The federation at its largest, and the jobs that can never fit it."""

    def __init__(self, ledger: Ledger, pools: BurstPools, kube: KubeMembers) -> None:
        self.ledger = ledger
        self.pools = pools
        self.kube = kube
        self._key: Key | None = None
        self._maxima: dict[str, ClusterMaximum] = {}

    def never_fits(self, job: Job) -> NeverFits | None:
        """Why ``job`` can never fit, or None (it may, or that is not known yet)."""
        if job.allow_burst and self.pools.unavailable():
            return None
        snapshot = self.ledger.snapshot()
        pools = self.pools.controller.pools
        unread = frozenset(n for n in self.kube.names() if not self.kube.connected(n))
        key = (snapshot.version, tuple(pools), unread)
        if key != self._key:
            self._maxima = maxima(snapshot, pools.values(), unread)
            self._key = key
        return never_fits(job, self._maxima)


__all__ = ["Largest"]
