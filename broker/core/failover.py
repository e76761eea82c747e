"""Failover decisions: which placed or running jobs to take off a lost member, and when.

A job fails over when its cluster has been stale for at least its queue's
``failoverAfterSeconds`` (queues without it never fail over). Staleness is measured from
the moment the member became stale (``stale_since``: the watch went down, plus
staleAfterSeconds). Pure: ``now`` is passed in.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from broker.core.lifecycle import Launch


@dataclass(frozen=True, slots=True)
class Lost:
    """A launch to fail over: its cluster, how long that cluster has been stale, the bound."""

    launch: Launch
    cluster: str
    stale_for: float
    bound: float

    @property
    def reason(self) -> str:
        return (
            f"FailedOver: cluster {self.cluster} lost (stale for {self.stale_for:.0f}s, "
            f"failoverAfterSeconds {self.bound:g}); requeued, attempts kept"
        )


def due(
    launches: Iterable[Launch],
    stale_since: Mapping[str, float],
    after: Mapping[str, float | None],
    now: float,
) -> list[Lost]:
    """The launches to fail over now. ``stale_since``: cluster -> when it became stale (only
    stale clusters); ``after``: queue -> its failoverAfterSeconds (None or absent: off)."""
    out: list[Lost] = []
    for launch in launches:
        cluster = launch.placement.cluster
        since = stale_since.get(cluster)
        bound = after.get(launch.pending.job.queue)
        if since is None or bound is None:
            continue
        if now - since >= bound:
            out.append(Lost(launch, cluster, now - since, bound))
    return sorted(out, key=lambda lost: lost.launch.placement.job)


__all__ = ["Lost", "due"]
