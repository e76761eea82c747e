"""What waits, in sum: the queue's reports, kept as jobs come and go (``JobQueue`` owns one).

A /metrics scrape or dashboard read must not walk the jobs waiting: with 100,000 queued, a
walk of them took 0.26 s of the loop (the queues' report) and each stranded-GPU reading
built the fitting shape of every waiting pod again. So per queue: GPU milli asked, gangs,
and heaps by enqueued time of every job and of gangs (their heads are the longest waits);
and across queues, how many waiting jobs have each fitting shape (``policies.stranded``),
for the stranded GPUs.

Complexity: ``wait``/``unwait`` O(log n + the job's pod sets); ``waits`` O(1) amortised (a
head whose job left is popped once); ``shapes`` O(distinct shapes), whatever waits. A heap
entry is live while its token is still its job's in ``tokens`` (the queue's): one whose job
left or was pushed again is dropped when it comes up, and a heap mostly of those is rebuilt
(O(n) amortised).
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from broker.model import MILLI_PER_GPU, Job
from policies.stranded import FitShape, fit_shapes

# A wait heap's entry: (enqueued_at, token, job key), live while its token is its job's.
Since = tuple[float, int, str]


@dataclass(slots=True)
class _Waits:
    demand_milli: int = 0
    gangs: int = 0
    since: list[Since] = field(default_factory=list)
    gang_since: list[Since] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class QueueWaits:
    """A queue's waiting jobs in sum: how many, the GPUs they ask for, and the longest any
    job and any gang has waited (seconds, 0 when none)."""

    pending: int
    demand_gpus: float
    longest_wait: float
    oldest_gang_wait: float


class WaitReports:
    """The sums of the module's docstring for the queues ``names``."""

    def __init__(self, names: Iterable[str], tokens: Mapping[str, int]) -> None:
        self._tokens = tokens  # job key -> the token of its live entry (the queue's own)
        self._waits = {name: _Waits() for name in names}
        self._shapes: dict[FitShape, int] = {}  # fitting shape -> waiting jobs with it

    def wait(self, job: Job, entry: Since, live: int) -> None:
        """``job`` waits in its queue from now (``live``: the queue's waiting jobs)."""
        waits = self._waits[job.queue]
        waits.demand_milli += job.gpu_request_milli
        self._push(waits.since, entry, live)
        if job.total_pods > 1:
            waits.gangs += 1
            self._push(waits.gang_since, entry, waits.gangs)
        shapes = self._shapes
        for shape in fit_shapes(job):
            shapes[shape] = shapes.get(shape, 0) + 1

    def unwait(self, job: Job) -> None:
        """``job`` left its queue (its heap entries are stale from now: token gone)."""
        waits = self._waits[job.queue]
        waits.demand_milli -= job.gpu_request_milli
        waits.gangs -= job.total_pods > 1
        shapes = self._shapes
        for shape in fit_shapes(job):
            left = shapes[shape] - 1
            if left:
                shapes[shape] = left
            else:
                del shapes[shape]

    def waits(self, queue: str, live: int, now: float) -> QueueWaits:
        waits = self._waits[queue]
        return QueueWaits(
            live, waits.demand_milli / MILLI_PER_GPU,
            self._waited(waits.since, now), self._waited(waits.gang_since, now),
        )  # fmt: skip

    def shapes(self) -> tuple[FitShape, ...]:
        """The fitting shape of every GPU pod of every waiting job, each once."""
        return tuple(self._shapes)

    def heap_sizes(self, queue: str) -> tuple[int, int]:
        """Entries in the queue's two wait heaps, stale ones included (for tests)."""
        waits = self._waits[queue]
        return len(waits.since), len(waits.gang_since)

    def _push(self, heap: list[Since], entry: Since, live: int) -> None:
        heapq.heappush(heap, entry)
        if len(heap) > 64 and len(heap) > 2 * live:  # mostly stale: rebuilt, O(n) amortised
            tokens = self._tokens
            heap[:] = [e for e in heap if tokens.get(e[2]) == e[1]]
            heapq.heapify(heap)

    def _waited(self, heap: list[Since], now: float) -> float:
        """The longest wait of a wait heap's live entries: stale heads dropped first."""
        tokens = self._tokens
        while heap and tokens.get(heap[0][2]) != heap[0][1]:
            heapq.heappop(heap)
        return max(0.0, now - heap[0][0]) if heap else 0.0


__all__ = ["QueueWaits", "Since", "WaitReports"]
