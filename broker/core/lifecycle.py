"""The gang lifecycle after a placement: launching -> running, or rolled back and requeued.

It owns the jobs that are *Placed* (reserved in the ledger, being launched) and *Running*,
and enforces DESIGN.md invariant 2: if a gang's pods are not all running within its
``scheduleTimeoutSeconds`` (or its launch fails), every pod of it is deleted, the
reservation released, and the job requeued with exponential backoff (60 s base, doubling,
3600 s cap; after ``backoffLimit`` requeues it fails for good). A launch its member refused
for good (invariant 9) is rolled back the same way, and fails the job at the
``refusal_limit``-th such refusal. Running jobs hold bound capacity until they end.

The state machine is synchronous and takes ``now`` from its caller (an injected clock), so
timeouts and backoff are tested without sleeping.

What a cycle asks of it costs nothing per live job: the gangs still starting sit
in a deadline heap (``expired``: O(k log n) for the k due, entries of launches that ran or
ended dropped lazily when they come up), and the priorities of the launches preemption may
reclaim are counted (``lowest_reclaimable``: O(distinct priorities); ``reclaimable``: the
launches of reclaimable queues, indexed by cluster). The service drives it: it calls the
launcher's async ``launch``/``delete`` and reports what the clusters say back here.
"""

from __future__ import annotations

import heapq
from collections import Counter
from collections.abc import Iterable
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
    # A member's permanent refusals of a job's launch before the job fails (invariant 9).
    refusal_limit: int = 3


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


def running_reason(launch: Launch, now: float) -> str:
    """Why a gang is Running: its pods, how long they took to start once placed, and its
    whole wait from submission (the queue's share is the difference)."""
    pods = len(launch.placement.pods)
    which = "its 1 pod" if pods == 1 else f"all {pods} pods"
    started = max(0.0, now - launch.placed_at)
    waited = max(0.0, now - launch.pending.enqueued_at)
    return f"{which} running {started:.0f}s after placement ({waited:.0f}s after submission)"


class Lifecycle:
    def __init__(self, ledger: Ledger, queue: JobQueue, settings: LifecycleSettings) -> None:
        self._ledger = ledger
        self._queue = queue
        self._settings = settings
        self._launches: dict[str, Launch] = {}
        # (deadline, placed order, job, launch) of gangs not yet running; stale entries
        # (the launch ran, ended or was replaced) are dropped when they come up.
        self._deadlines: list[tuple[float, int, str, Launch]] = []
        self._placed = 0
        self._starting = 0  # launches not yet running: the live entries of the heap
        # Launches of reclaimable queues: their priorities counted, and by cluster.
        self._reclaimable_priorities: Counter[int] = Counter()
        self._reclaimable: dict[str, dict[str, Launch]] = {}
        # Bumped whenever a launch preemption could reclaim appears: a job found
        # unplaceable even by preemption stays so while this and the ledger's growth hold.
        self.reclaim_version = 0

    def get(self, job: str) -> Launch | None:
        return self._launches.get(job)

    def launches(self) -> list[Launch]:
        """Every live launch: O(live jobs), for rebuilds and reports, never per cycle."""
        return list(self._launches.values())

    def __len__(self) -> int:
        return len(self._launches)

    def placed(self, pending: Pending, placement: Placement, now: float) -> Launch:
        """A placement was reserved (the scheduler assumed it): start its timeout."""
        job = placement.job
        if job in self._launches:
            self._forget(job)
        launch = Launch(pending, placement, now, now + pending.job.schedule_timeout_seconds)
        self._launches[job] = launch
        self._placed += 1
        heapq.heappush(self._deadlines, (launch.deadline, self._placed, job, launch))
        self._starting += 1
        self._compact()
        if self._queue.spec(pending.job.queue).reclaimable:
            self._reclaimable_priorities[pending.job.priority] += 1
            self.reclaim_version += 1
            self._reclaimable.setdefault(placement.cluster, {})[job] = launch
        return launch

    def _forget(self, job: str) -> Launch | None:
        """Drop a launch from every index (its deadline entry goes stale)."""
        launch = self._launches.pop(job, None)
        if launch is None:
            return None
        if not launch.running:
            self._starting -= 1
        by_job = self._reclaimable.get(launch.placement.cluster)
        if by_job is not None and by_job.get(job) is launch:
            del by_job[job]
            if not by_job:
                del self._reclaimable[launch.placement.cluster]
            priority = launch.pending.job.priority
            self._reclaimable_priorities[priority] -= 1
            if not self._reclaimable_priorities[priority]:
                del self._reclaimable_priorities[priority]
        return launch

    def _compact(self) -> None:
        """Rebuild the deadline heap once stale entries outnumber live ones (amortised
        O(1) per launch): its size follows the gangs starting, not those placed lately."""
        heap = self._deadlines
        if len(heap) > 64 and len(heap) > 2 * self._starting:
            self._deadlines = [
                e for e in heap if self._launches.get(e[2]) is e[3] and not e[3].running
            ]
            heapq.heapify(self._deadlines)

    def lowest_reclaimable(self) -> int | None:
        """The lowest priority among launches of reclaimable queues (None: there are none)."""
        return min(self._reclaimable_priorities, default=None)

    def reclaimable(self) -> Iterable[Launch]:
        """The launches of reclaimable queues (what preemption may evict)."""
        for by_job in self._reclaimable.values():
            yield from by_job.values()

    def all_running(self, job: str, now: float) -> Outcome | None:
        """Every pod of the gang runs: the reservation becomes bound usage."""
        launch = self._launches.get(job)
        if launch is None or launch.running:
            return None
        launch.running = True
        self._starting -= 1
        self._ledger.confirm(job)
        return Outcome(job, "Running", running_reason(launch, now))

    def expired(self, now: float) -> list[Launch]:
        """Launches whose gang did not fully start in time (the caller rolls them back).
        They stay due until then: asked again, they are returned again."""
        due: list[Launch] = []
        heap = self._deadlines
        while heap and heap[0][0] <= now:
            entry = heapq.heappop(heap)
            launch = entry[3]
            if self._launches.get(entry[2]) is launch and not launch.running:
                due.append(launch)
        for launch in due:
            self._placed += 1
            heapq.heappush(heap, (launch.deadline, self._placed, launch.placement.job, launch))
        return due

    def roll_back(
        self, job: str, now: float, reason: str, *, refused: bool = False
    ) -> Outcome | None:
        """The gang's pods are deleted (or never made it): release everything it held (its
        reservation, or its bound usage if it ran) and requeue it with backoff, or fail it
        once past its backoff limit. ``refused``: its member refused the launch for good;
        the ``refusal_limit``-th such refusal fails the job (a retry would be refused
        again), the ones before it back off as any failure does."""
        launch = self._release(job)
        if launch is None:
            return None
        pending = launch.pending
        attempts = pending.attempts + 1
        if refused:
            pending.refusals += 1
            refusals, most = pending.refusals, self._settings.refusal_limit
            if refusals >= most:
                return Outcome(job, "Failed", f"{reason}; refused {refusals} times", attempts)
            reason = f"{reason}; refusal {refusals} of {most}"
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
        launch = self._forget(job)
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
