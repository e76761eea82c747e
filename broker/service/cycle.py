"""Driving the scheduler: the loop of cycles, one cycle, and the placements it records.

``Cycles.schedule_once`` is one cycle under the lock: clean members back from staleness
before trusting them, roll back expired gangs, fail over the jobs of lost members
(``failover``), run the core's ``run_cycle`` (queues, quotas, fair share, preemption, holds,
the shape memo), delete and record the preempted, record the admitted placements in one
statement, start their launches (``Binding``), and let the burst pools decide. A
placement whose write is in doubt (the store went away) keeps its reservation until the
store says whether it committed.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time

from broker.core.queue import Pending
from broker.core.scheduler import CycleResult, run_cycle
from broker.model import Placement
from broker.service.binding import STORE_RETRY_SECONDS, Binding
from broker.service.failover import Failover
from broker.service.state import Shared, placement_json
from broker.store import PLACE_BATCH, JobState, Placing, StoreError, StoreUnavailable

log = logging.getLogger(__name__)

# How long a woken scheduler lets more submissions arrive before it decides (a latency of a
# few milliseconds traded for far fewer cycles under load).
BATCH_SECONDS = 0.005


class Cycles:
    """The scheduling cycles of one service."""

    def __init__(self, shared: Shared, binding: Binding) -> None:
        self.s = shared
        self.binding = binding
        self.failover = Failover(shared, binding)
        self.current: asyncio.Task[None] | None = None

    async def run(self) -> None:
        """Schedule every cycleSeconds, and soon after a submission: a wake-up waits
        BATCH_SECONDS more so that a burst of submissions is decided in one cycle (one
        snapshot, one group commit of its placements) instead of one cycle each."""
        s = self.s
        while True:
            # asyncio.timeout, not wait_for: Python 3.11's wait_for swallows a cancellation
            # that arrives as the wake-up does (SIGTERM to a busy broker then waited out
            # serve's 10 s shutdown bound, the loop running on as if never cancelled).
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(s.config.scheduler.cycle_seconds):
                    await s.wake.wait()
                await asyncio.sleep(BATCH_SECONDS)
            _stop_if_cancelled()
            s.wake.clear()
            if not s.leading:
                continue  # a follower (or a leader whose lease is in doubt) places nothing
            self.current = asyncio.ensure_future(self.schedule_once())
            try:
                await self.current
            except asyncio.CancelledError:
                if self.current.cancelled() and not _cancelling():
                    continue  # the cycle was stopped on losing the lease; the loop goes on
                raise
            except Exception:
                log.exception("scheduling cycle failed; retrying next cycle")
            finally:
                self.current = None
            _stop_if_cancelled()  # a cancellation the cycle's awaits absorbed still stops us

    async def schedule_once(self, now: float | None = None) -> None:
        """One cycle: roll back expired gangs, place what fits, start the launches. ``now``
        is read inside the lock (tests pass it): a job submitted while the cycle waited for
        the lock must not look placed before it was queued."""
        s = self.s
        async with s.lock:
            if not s.leading:
                return  # lost the lease while waiting for the lock
            if now is None:
                now = s.clock()
            s.check_stale()
            await self.failover.clean_returned()  # a member back is cleaned before trusted
            if s.pools:
                self.binding.on_capacity(s.pools.due(now))
            await self._expire(now)
            await self.failover.fail_over(now)
            result = self._decide(now)
            await self._preempt(result, now)
            await self._admit(result, now)
            if s.pools:
                waiting = [p.job for key in result.waiting if (p := s.queue.get(key))]
                s.pools.tick(now, s.ledger, waiting)

    async def _expire(self, now: float) -> None:
        for launch in self.s.lifecycle.expired(now):
            timeout = launch.pending.job.schedule_timeout_seconds
            self.s.metrics.gang_timeouts.inc()
            await self.binding.roll_back(
                launch.placement, now, f"gang did not start within {timeout}s", "timeout"
            )

    def _decide(self, now: float) -> CycleResult:
        s, metrics = self.s, self.s.metrics
        hiding = s.pools.hiding(s.ledger.snapshot()) if s.pools else None
        began = time.perf_counter()
        result = run_cycle(
            s.queue, s.ledger, s.policies, now, s.settings,
            lifecycle=s.lifecycle, hiding=hiding, memo=s.unplaceable,
        )  # fmt: skip
        metrics.cycle.observe(time.perf_counter() - began)
        metrics.skipped.inc(result.skipped)
        if result.cut_short:
            metrics.cut_short.inc()
        for seconds, policy, placed in result.decisions:
            if seconds is not None:
                metrics.decision.observe(seconds)
            metrics.placements.labels(policy, "placed" if placed else "unplaceable").inc()
        return result

    async def _preempt(self, result: CycleResult, now: float) -> None:
        """Already released and requeued by the lifecycle: stop watching each victim,
        delete every pod of it, record why."""
        for victim, evicted in result.preempted:
            self.s.metrics.preemptions.inc()
            self.s.metrics.requeues.labels("preempted").inc()
            self.binding.stop(victim.placement.job)
            await self.binding.delete(victim.placement, victim)
            was: JobState = "Running" if victim.running else "Placed"
            await self.binding.record(evicted, now, expect=was)

    async def _admit(self, result: CycleResult, now: float) -> None:
        """Record the cycle's placements together, then launch what was recorded: one
        compare-and-set statement per PLACE_BATCH of them (one round trip and one commit
        for a cycle, not one per job), the batches of a large cycle sharing a group commit."""
        s, admitted = self.s, result.admitted
        batches = [admitted[i : i + PLACE_BATCH] for i in range(0, len(admitted), PLACE_BATCH)]
        writes = [
            s.store.place_many([_placing(*admit) for admit in batch], now) for batch in batches
        ]
        written = await asyncio.gather(*writes, return_exceptions=True)
        for batch, outcome in zip(batches, written, strict=True):
            if isinstance(outcome, BaseException):
                for pending, placement in batch:
                    self._not_recorded(pending, placement, outcome)
                continue
            moved = {record.seq for record in outcome}
            for pending, placement in batch:
                if pending.seq in moved:
                    self._launch(pending, placement, now)
                else:  # cancelled (or failed by an operator) since the cycle read the queue
                    self._not_recorded(pending, placement, "no longer Queued in the store")

    def _not_recorded(
        self, pending: Pending, placement: Placement, why: BaseException | str
    ) -> None:
        s, key = self.s, pending.job.key
        if isinstance(why, StoreUnavailable):
            # In doubt: the write may have committed before the connection went. The
            # reservation is held until the store answers again and says which.
            log.warning("placement of %s in doubt: %s", key, why)
            s.tasks.spawn(f"settle {key}", self._settle(pending, placement))
            return
        # Moved on meanwhile, cancelled, or the store failed: give the capacity back.
        s.ledger.forget(key)
        s.queue.release(key)
        log.warning("could not record placement of %s: %s", key, why)

    def _launch(self, pending: Pending, placement: Placement, now: float) -> None:
        self.s.lifecycle.placed(pending, placement, now)
        self.s.pools.placed(placement, now)
        self.binding.start_launch(placement)

    async def _settle(self, pending: Pending, placement: Placement) -> None:
        """A placement whose write failed with StoreUnavailable, its reservation held:
        once the store answers, launch it if the write committed after all (the job is
        Placed there, so); give the capacity back and queue the job again if it is still
        Queued; only give the capacity back otherwise (cancelled meanwhile). A replica that
        stops leading drops it with the rest: the next leader rebuilds from the store."""
        s, key, job = self.s, pending.job.key, pending.job
        await asyncio.sleep(STORE_RETRY_SECONDS[0])
        if not s.rebuilt:
            return
        retrying = self.binding.while_leading(StoreError, f"placement of {key} in doubt")
        try:
            async for attempt in retrying:
                with attempt:
                    record = await s.store.get_job(job.tenant, job.name)
        except StoreError:
            return  # no longer leading: the next leader rebuilds from the store
        stored = json.loads(json.dumps(placement_json(placement)))
        async with s.lock:
            if not s.rebuilt or s.ledger.reservations().get(key) is not placement:
                return  # dropped meanwhile (the lease was lost)
            if record is not None and record.state == "Placed" and record.placement == stored:
                log.info("placement of %s was recorded after all; launching it", key)
                self._launch(pending, placement, s.clock())
                return
            s.ledger.forget(key)
            s.queue.release(key)
            if record is not None and record.state == "Queued":
                s.queue.push(pending)
                s.wake.set()


def _placing(pending: Pending, placement: Placement) -> Placing:
    reason = f"placed on {placement.cluster} by {placement.policy or 'policy'}"
    return Placing(
        pending.seq, placement.cluster, placement_json(placement), pending.attempts, reason
    )


def _stop_if_cancelled() -> None:
    """Raise CancelledError when the current task was asked to stop but something it
    awaited absorbed the request: the loop must end, not start another cycle."""
    if _cancelling():
        raise asyncio.CancelledError


def _cancelling() -> bool:
    """Whether the current task itself is being cancelled (not just something it awaited)."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


__all__ = ["BATCH_SECONDS", "Cycles"]
