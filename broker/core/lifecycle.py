"""The gang lifecycle after a placement: launching -> running, or rolled back and requeued.

It owns the jobs that are *Placed* (reserved in the ledger, being launched) and *Running*,
and enforces DESIGN.md invariant 2: if a gang's pods are not all running within its
``scheduleTimeoutSeconds`` (or its launch fails), every pod of it is deleted, the
reservation released, and the job requeued with exponential backoff (60 s base, doubling,
3600 s cap; after ``backoffLimit`` requeues it fails for good). Running jobs hold bound
capacity until they end.

The state machine is synchronous and takes ``now`` from its caller (an injected clock), so
timeouts and backoff are tested without sleeping. The service drives it: it calls the
launcher's async ``launch``/``delete`` and reports what the clusters say back here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from broker.core.ledger import Ledger
from broker.core.queue import JobQueue, Pending, backoff_seconds
from broker.model import Placement


@dataclass(frozen=True, slots=True)
class LifecycleSettings:
    backoff_base_seconds: float = 60.0
    backoff_cap_seconds: float = 3600.0
    backoff_limit: int | None = None


@dataclass(slots=True)
class Launch:
    pending: Pending
    placement: Placement
    placed_at: float
    deadline: float
    running: bool = False


@dataclass(frozen=True, slots=True)
class Outcome:
    """What happened to a job, for the store and the events: its new state and why."""

    job: str
    state: Literal["Queued", "Running", "Succeeded", "Failed", "Cancelled"]
    reason: str
    attempts: int = 0
    not_before: float | None = None


class Lifecycle:
    def __init__(self, ledger: Ledger, queue: JobQueue, settings: LifecycleSettings) -> None:
        self._ledger = ledger
        self._queue = queue
        self._settings = settings
        self._launches: dict[str, Launch] = {}

    def get(self, job: str) -> Launch | None:
        return self._launches.get(job)

    def launches(self) -> list[Launch]:
        return list(self._launches.values())

    def placed(self, pending: Pending, placement: Placement, now: float) -> Launch:
        """A placement was reserved (the scheduler assumed it): start its timeout."""
        launch = Launch(pending, placement, now, now + pending.job.schedule_timeout_seconds)
        self._launches[placement.job] = launch
        return launch

    def all_running(self, job: str, now: float) -> Outcome | None:
        """Every pod of the gang runs: the reservation becomes bound usage."""
        launch = self._launches.get(job)
        if launch is None or launch.running:
            return None
        launch.running = True
        self._ledger.confirm(job)
        waited = now - launch.pending.enqueued_at
        return Outcome(
            job, "Running", f"all {len(launch.placement.pods)} pods running after {waited:.0f}s"
        )

    def expired(self, now: float) -> list[Launch]:
        """Launches whose gang did not fully start in time (the caller deletes their pods)."""
        return [la for la in self._launches.values() if not la.running and la.deadline <= now]

    def roll_back(self, job: str, now: float, reason: str) -> Outcome | None:
        """The gang's pods are deleted (or never made it): release everything it held and
        requeue it with backoff, or fail it once past its backoff limit."""
        launch = self._launches.pop(job, None)
        if launch is None:
            return None
        self._ledger.forget(job)
        self._queue.release(job)
        pending = launch.pending
        attempts = pending.attempts + 1
        limit = self._settings.backoff_limit
        if limit is not None and attempts > limit:
            return Outcome(job, "Failed", f"{reason}; backoff limit {limit} reached", attempts)
        delay = backoff_seconds(
            attempts, self._settings.backoff_base_seconds, self._settings.backoff_cap_seconds
        )
        pending.attempts = attempts
        pending.not_before = now + delay
        self._queue.push(pending)
        return Outcome(job, "Queued", f"{reason}; retry in {delay:.0f}s", attempts, now + delay)

    def preempt(self, job: str, now: float, by: str) -> Outcome | None:
        """Evicted for a higher-priority gang: release everything, requeue at once (no
        backoff: the job did nothing wrong). The caller deletes its pods."""
        return self._requeue_now(job, now, f"preempted by {by}")

    def fail_over(self, job: str, now: float, reason: str) -> Outcome | None:
        """Its member was lost (stale past the queue's failoverAfterSeconds): release what
        it held there and requeue it at once, its attempt count kept (no backoff: the job
        did nothing wrong). The caller stops its tasks; its objects there are deleted when
        the member is back, before the member takes placements again."""
        return self._requeue_now(job, now, reason)

    def _requeue_now(self, job: str, now: float, reason: str) -> Outcome | None:
        launch = self._release(job)
        if launch is None:
            return None
        launch.pending.not_before = now
        self._queue.push(launch.pending)
        return Outcome(job, "Queued", reason, launch.pending.attempts, now)

    def finished(self, job: str, succeeded: bool, reason: str) -> Outcome | None:
        """A running job ended: its pods are gone, its capacity is free."""
        launch = self._release(job)
        if launch is None:
            return None
        return Outcome(job, "Succeeded" if succeeded else "Failed", reason, launch.pending.attempts)

    def _release(self, job: str) -> Launch | None:
        """Forget a launch and give back what it held: bound usage if it ran, else its
        reservation; and its queue's charge."""
        launch = self._launches.pop(job, None)
        if launch is None:
            return None
        if launch.running:
            self._ledger.release(job, launch.placement)
        else:
            self._ledger.forget(job)
        self._queue.release(job)
        return launch

    def cancel(self, job: str) -> Outcome:
        """Cancel wherever the job is: waiting, launching or running."""
        if self._queue.remove(job) is None:
            self.finished(job, False, "cancelled")
        return Outcome(job, "Cancelled", "cancelled by request")
