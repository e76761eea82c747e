"""Failover when a member is lost, and the cleanup before a returning member is trusted.

``Failover.fail_over`` (every cycle, under the lock): a job Placed or Running on a
Kubernetes member that has been stale for at least its queue's ``failoverAfterSeconds``
(``broker.core.failover.due``) has its launch and run watch stopped, its reservation or
bound usage on that member released in the ledger and is requeued at once with its attempt
count kept (``Lifecycle.fail_over``; an agent-fed member is lost when its agent goes
unheard); the store records a Queued transition whose reason
starts with ``FailedOver:`` and names the lost cluster; ``fedbroker_failovers_total`` counts
it per cluster. Nothing is deleted then: the member cannot be reached.

``Failover.collect`` (garbage collection per member): our objects on a member whose job is
not live ON THAT member are deleted. A member seen stale is dirty (``KubeMembers.stale``)
and stays out of placements until a collection on it succeeded once it is back
(``clean_returned``, at the start of every cycle), so the old gang of a job that failed over
is gone before that member takes any placement: no job runs twice.
"""

from __future__ import annotations

import logging

import aiohttp

from broker.core.failover import due
from broker.ports import LaunchError
from broker.service.binding import Binding
from broker.service.state import Shared

log = logging.getLogger(__name__)

_UNREACHABLE = (LaunchError, aiohttp.ClientError, OSError, TimeoutError)


class Failover:
    """Jobs off lost members; members cleaned before they are trusted again."""

    def __init__(self, shared: Shared, binding: Binding) -> None:
        self.s = shared
        self.binding = binding

    def _bounds(self) -> dict[str, float | None]:
        return {q.name: q.failover_after_seconds for q in self.s.config.queues}

    async def fail_over(self, now: float) -> None:
        """Requeue the jobs of members lost for longer than their queue allows (under the
        lock)."""
        s = self.s
        if not s.kube:
            return
        bounds = self._bounds()
        if not any(bounds.values()):
            return  # off by default
        stale = s.kube.stale_since()
        if not stale:
            return  # the usual cycle: no need to walk every live launch
        for lost in due(s.lifecycle.launches(), stale, bounds, now):
            job = lost.launch.placement.job
            log.warning("job %s: %s", job, lost.reason)
            self.binding.stop(job)
            outcome = s.lifecycle.fail_over(job, now, lost.reason)
            if outcome is None:
                continue
            s.metrics.failovers.labels(lost.cluster).inc()
            s.metrics.requeues.labels("failover").inc()
            await self.binding.record(outcome, now, expect=("Placed", "Running"))

    async def clean_returned(self) -> None:
        """Collect the garbage of members back from staleness, then trust them (under the
        lock, before the cycle decides)."""
        returned = self.s.kube.returned() if self.s.kube else []
        if returned:
            await self.collect(returned)
            self.s.check_stale()

    async def collect(self, names: list[str] | None = None) -> None:
        """Delete, on each member (up, of ``names`` or all), our objects whose job is not
        live on it (under the lock: no launch creates objects the live set missed); a
        member collected without error is trusted again."""
        s = self.s
        for name, launcher in s.kube.recoverable():
            if (names is not None and name not in names) or s.kube.down(name):
                continue
            live = {
                launch.placement.job
                for launch in s.lifecycle.launches()
                if launch.placement.cluster == name
            } | s.finished_pods.live(name)  # finished, with pods kept for their logs
            try:
                deleted = await launcher.collect_garbage(live)
            except Exception as exc:  # any: tried again at the next collection
                if name in s.kube.agents:  # read back but not collected: not trusted yet
                    s.kube.dirty.add(name)
                unexpected = not isinstance(exc, _UNREACHABLE)
                log.warning("cluster %s: garbage collection failed: %s", name,
                            type(exc).__name__ if unexpected else exc,
                            exc_info=exc if unexpected else None)  # fmt: skip
                continue
            if name in s.kube.dirty:
                log.warning("cluster %s is back: %d objects of ours deleted", name, len(deleted))
            s.kube.cleaned(name)


__all__ = ["Failover"]
