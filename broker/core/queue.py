"""The queue: the one owner of pending work (Kueue's queue cache, in small).

It holds the jobs waiting for capacity, in the queues of the config, and answers one
question per scheduling cycle: in which order should they be tried? The order is job
priority, then queue priority, then fair share across queues (the weighted dominant resource
share: a queue's largest share of any GPU type's federation capacity, divided by its
weight), then FIFO by submission. A requeued job (gang timeout, launch failure) waits out
its backoff (``not_before``) before it is tried again. Quotas (nominal GPUs per type, with
or without borrowing idle capacity) are checked here against what each queue has admitted.

Pure and synchronous: the clock is passed in.

Kept in order as jobs come and go, not sorted per cycle, as Kueue keeps a heap
per ClusterQueue: each queue's eligible jobs sit in a heap by (-priority, seq), jobs in
backoff in one heap by ``not_before``; a cycle walks the queues' heads merged by the full
order (``Ordering``), so taking the first k jobs costs O(q + k log n) for q queues and n
jobs, whatever else waits. Removal is O(1) (an entry whose token is no longer its job's is
dropped when it comes up); a heap is rebuilt once stale entries outnumber live ones. What
reports read (each queue's sums, the fitting shapes waiting) is kept the same way, by
``broker.core.waits``.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from broker.core.waits import QueueWaits, WaitReports
from broker.interned import shared
from broker.model import MILLI_PER_GPU, GpuType, Job, Placement, Reason
from policies.stranded import FitShape


@dataclass(frozen=True, slots=True)
class QueueSpec:
    name: str
    policy: str = "auto"
    priority: int = 0
    weight: float = 1.0
    # Nominal GPUs per type; None = no quota (the federation is the limit).
    quota: Mapping[str, int] | None = None
    borrow: bool = True
    reclaimable: bool = False


@dataclass(slots=True)
class Pending:
    job: Job
    seq: int
    enqueued_at: float
    attempts: int = 0
    not_before: float = 0.0
    # Pod set name -> the manifest's pod template (API JSON), for launchers that create
    # real pods; the placement core never reads it.
    pod_templates: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    # The manifest's rendezvous port (MASTER_PORT of a launched gang's pods).
    master_port: int = 29500
    # A ``spec.workload`` job's Kubernetes object (API JSON), which the launcher creates
    # instead of pods; plain data here (the service builds the launcher's WorkloadSpec).
    workload: Mapping[str, Any] | None = None
    # Why it waited at the last cycle that looked at it (the refusal's reasons, shared
    # between jobs of one shape); None until a cycle has. For lists: no explain per job.
    waiting: tuple[Reason, ...] | None = None
    # Launches a member refused for good (``LaunchError.permanent``) since this replica
    # took the job in; past the scheduler's launchRefusalLimit the job fails.
    refusals: int = 0


@dataclass(slots=True)
class _QueueState:
    spec: QueueSpec
    # Admitted (placed or running) GPU milli per GPU type.
    usage: dict[str, int] = field(default_factory=dict)


def backoff_seconds(attempts: int, base: float = 60.0, cap: float = 3600.0) -> float:
    """Kueue's requeue backoff: ``base`` after the first failure, doubling, at most ``cap``."""
    if attempts <= 0:
        return 0.0
    return float(min(cap, base * 2 ** (attempts - 1)))


def gpu_milli_by_type(
    placement: Placement, gpu_type_of: Mapping[str, GpuType | None]
) -> dict[str, int]:
    """A placement's GPU milli per GPU type (``gpu_type_of`` maps its nodes to types)."""
    out: dict[str, int] = {}
    for pod in placement.pods:
        milli = pod.resources.gpu_request_milli
        if milli:
            key = str(gpu_type_of.get(pod.node) or "")
            out[key] = out.get(key, 0) + milli
    return out


def fair_share(usage: Mapping[str, int], capacity: Mapping[str, int], weight: float) -> float:
    """The weighted dominant share: the largest share of any GPU type's capacity in use,
    divided by the queue's weight."""
    share = max((used / capacity[t] for t, used in usage.items() if capacity.get(t)), default=0.0)
    return share / weight


@dataclass(frozen=True, slots=True)
class QueuePosition:
    """A waiting job's place in the order the next cycles try jobs in (1 = next), among
    every queue's eligible jobs and among its own queue's; and how many of the jobs ahead
    may take GPUs of a type it may take. A job backing off after a failed attempt has no
    place until ``backoff_until``."""

    queue: str
    position: int | None = None
    waiting: int | None = None
    in_queue: int | None = None
    queue_waiting: int | None = None
    same_gpu_type_ahead: int | None = None
    backoff_until: float | None = None

    def as_json(self) -> dict[str, object]:
        return {
            "queue": self.queue, "position": self.position, "waiting": self.waiting,
            "inQueue": self.in_queue, "queueWaiting": self.queue_waiting,
            "sameGpuTypeAhead": self.same_gpu_type_ahead, "backoffUntil": self.backoff_until,
        }  # fmt: skip


def _competes(job: Job, other: Job) -> bool:
    """May ``job`` take GPUs of a type ``other`` may take?"""
    if not job.gpu_request_milli:
        return False
    return not job.gpu_types or not other.gpu_types or bool(job.gpu_types & other.gpu_types)


# A queue heap's entry: (-priority, seq, token, job key). The token is the push it came
# from: an entry is live while its token is still its job's.
_Entry = tuple[int, int, int, str]


@dataclass(frozen=True, slots=True)
class PositionFrame:
    """A waiting job's place, to be walked from copies of the queue taken at one moment
    (``JobQueue.position_frame``): every queue's eligible jobs merged in the cycles' order,
    each job ahead taken as placed in turn and charged to its queue's fair share (on its
    GPU type, when it names one), as the cycles that place them one after another will do:
    queues take turns as they will. The Pending objects are the queue's own; a job
    requeued meanwhile (its backoff set again) is read as it is then."""

    key: str
    now: float
    heaps: dict[str, list[_Entry]]
    tokens: dict[str, int]
    pending: dict[str, Pending]
    queues: dict[str, tuple[QueueSpec, dict[str, int]]]  # spec, admitted GPU milli by type

    def walk(
        self, capacity: Mapping[str, int], check: Callable[[], None] = lambda: None
    ) -> QueuePosition:
        """O(n log n) for n waiting jobs; ``check`` is called as it goes (a dry run's
        budget: it may raise to stop the walk)."""
        tokens, pending, now = self.tokens, self.pending, self.now
        target = pending[self.key]
        name = target.job.queue
        heaps: dict[str, list[_Entry]] = {}
        for queue, heap in self.heaps.items():
            live = [e for e in heap if tokens.get(e[3]) == e[2] and pending[e[3]].not_before <= now]
            heapq.heapify(live)
            heaps[queue] = live
        waiting, queue_waiting = sum(map(len, heaps.values())), len(heaps[name])
        usage = {queue: dict(used) for queue, (_, used) in self.queues.items()}
        heads: list[tuple[int, int, float, int, int, str, str]] = []

        def advance(queue: str) -> None:
            if heaps[queue]:
                prio, seq, token, job = heapq.heappop(heaps[queue])
                spec = self.queues[queue][0]
                share = fair_share(usage[queue], capacity, spec.weight)
                heapq.heappush(heads, (prio, -spec.priority, share, seq, token, job, queue))

        for queue in heaps:
            advance(queue)
        ahead = in_queue = same_type = 0
        while heads:
            check()
            *_, job_key, queue = heapq.heappop(heads)
            if job_key == self.key:
                break
            job = pending[job_key].job
            ahead += 1
            in_queue += queue == name
            same_type += _competes(job, target.job)
            if len(job.gpu_types) == 1:
                [gpu_type] = job.gpu_types
                used = usage[queue]
                used[gpu_type] = used.get(gpu_type, 0) + job.gpu_request_milli
            advance(queue)
        return QueuePosition(name, ahead + 1, waiting, in_queue + 1, queue_waiting, same_type)


class JobQueue:
    def __init__(self, queues: Iterable[QueueSpec]) -> None:
        self._queues = {q.name: _QueueState(q) for q in queues}
        self._pending: dict[str, Pending] = {}
        # job -> (queue, its GPU milli by type as pairs: smaller than a dict per job)
        self._charged: dict[str, tuple[str, tuple[tuple[str, int], ...]]] = {}
        self._token: dict[str, int] = {}  # job key -> the token of its live entry
        self._pushes = 0
        self._ready: dict[str, list[_Entry]] = {name: [] for name in self._queues}
        self._live: dict[str, int] = dict.fromkeys(self._queues, 0)  # pending per queue
        self._backoff: list[tuple[float, int, str]] = []  # (not_before, token, job key)
        self._reports = WaitReports(self._queues, self._token)
        self._now = float("-inf")  # the latest ``now`` an ordering was asked for

    # -- what is waiting --------------------------------------------------------------------

    def spec(self, queue: str) -> QueueSpec:
        state = self._queues.get(queue)
        if state is None:
            raise KeyError(f"unknown queue {queue!r}")
        return state.spec

    def queues(self) -> list[QueueSpec]:
        return [s.spec for s in self._queues.values()]

    def push(self, pending: Pending) -> None:
        """Queue a job (again): O(log n). A job already queued is replaced."""
        name = pending.job.queue
        if name not in self._queues:
            raise KeyError(f"unknown queue {name!r}")
        key = pending.job.key
        before = self._pending.pop(key, None)
        if before is not None:
            self._live[before.job.queue] -= 1
            self._reports.unwait(before.job)
        self._pending[key] = pending
        self._live[name] += 1
        self._pushes += 1
        token = self._token[key] = self._pushes
        self._reports.wait(pending.job, (pending.enqueued_at, token, key), self._live[name])
        if pending.not_before <= self._now:
            self._heap_push(name, (-pending.job.priority, pending.seq, token, key))
        else:
            heapq.heappush(self._backoff, (pending.not_before, token, key))

    def _heap_push(self, name: str, entry: _Entry) -> None:
        heap = self._ready[name]
        heapq.heappush(heap, entry)
        if len(heap) > 64 and len(heap) > 2 * self._live[name]:
            self._ready[name] = [e for e in heap if self._token.get(e[3]) == e[2]]
            heapq.heapify(self._ready[name])

    def remove(self, job: str) -> Pending | None:
        """O(1): its heap entry goes stale."""
        pending = self._pending.pop(job, None)
        if pending is not None:
            del self._token[job]
            self._live[pending.job.queue] -= 1
            self._reports.unwait(pending.job)
        return pending

    def waits(self, queue: str, now: float) -> QueueWaits:
        """The queue's waiting jobs in sum, O(1) amortised (``broker.core.waits``)."""
        return self._reports.waits(queue, self._live[queue], now)

    def fit_shapes(self) -> tuple[FitShape, ...]:
        """The fitting shape of every GPU pod waiting (``policies.stranded``), each once:
        O(distinct shapes), however many jobs wait."""
        return self._reports.shapes()

    def wait_heap_sizes(self, queue: str) -> tuple[int, int]:
        """Entries in the queue's wait heaps, stale ones included (for tests)."""
        return self._reports.heap_sizes(queue)

    def get(self, job: str) -> Pending | None:
        return self._pending.get(job)

    def __len__(self) -> int:
        return len(self._pending)

    def pending(self, queue: str | None = None) -> list[Pending]:
        """Every waiting job (O(n): for reports and rebuilds, never per cycle)."""
        return [p for p in self._pending.values() if queue is None or p.job.queue == queue]

    def ordering(self, now: float, capacity: Mapping[str, int]) -> Ordering:
        """The jobs eligible now (backoff over), lazily in the order to try them: job
        priority, queue priority, fair share (``capacity``: the federation's GPU milli per
        type, the denominator of the dominant shares, taken once), FIFO. Close it when done
        (``with``): the jobs it yielded that are still queued go back into their heaps."""
        self._release(now)
        shares = {name: self.dominant_share(name, capacity) for name in self._queues}
        return Ordering(self, now, shares, self._pushes)

    def _release(self, now: float) -> None:
        """Jobs whose backoff is over by ``now`` into their queue's heap."""
        self._now = max(self._now, now)
        backoff = self._backoff
        while backoff and backoff[0][0] <= now:
            _, token, key = heapq.heappop(backoff)
            pending = self._pending.get(key)
            if pending is not None and self._token[key] == token:
                self._heap_push(pending.job.queue, (-pending.job.priority, pending.seq, token, key))

    def ordered(self, now: float, capacity: Mapping[str, int]) -> list[Pending]:
        """Every job eligible now, in order (O(n log n): the whole ``ordering``)."""
        with self.ordering(now, capacity) as ordering:
            return list(ordering)

    def position(self, key: str, now: float, capacity: Mapping[str, int]) -> QueuePosition | None:
        """Where the queued job ``key`` stands in the order the next cycles try jobs in
        (None: not queued): ``position_frame`` walked at once. O(n) for n waiting jobs, for
        one explain (never per listed job)."""
        frame = self.position_frame(key, now)
        return frame.walk(capacity) if isinstance(frame, PositionFrame) else frame

    def position_frame(self, key: str, now: float) -> PositionFrame | QueuePosition | None:
        """What ``position`` reads of the queue, copied now (None: ``key`` is not queued; a
        job backing off has no place: its QueuePosition at once). The copies are of the
        heaps and maps themselves (C-speed, no walk), so the O(n log n) walk can run in
        another thread while the queue moves on."""
        target = self._pending.get(key)
        if target is None:
            return None
        if target.not_before > now:
            return QueuePosition(target.job.queue, backoff_until=target.not_before)
        self._release(now)
        return PositionFrame(
            key, now, {queue: list(heap) for queue, heap in self._ready.items()},
            dict(self._token), dict(self._pending),
            {queue: (state.spec, dict(state.usage)) for queue, state in self._queues.items()},
        )  # fmt: skip

    # -- fair share and quota -------------------------------------------------------------------

    def dominant_share(self, queue: str, capacity: Mapping[str, int]) -> float:
        state = self._queues[queue]
        return fair_share(state.usage, capacity, state.spec.weight)

    def usage(self, queue: str) -> Mapping[str, int]:
        return dict(self._queues[queue].usage)

    def quota_allows(
        self, queue: str, demand: Mapping[str, int], idle: Mapping[str, int]
    ) -> str | None:
        """None when the queue may admit ``demand`` (GPU milli per type), else why not.

        Within nominal quota always; beyond it only when the queue may borrow and the
        capacity it would borrow is idle (not within some other queue's unused quota is
        not tracked yet: idle here means free in the federation)."""
        state = self._queues[queue]
        quota = state.spec.quota
        if quota is None:
            return None
        for gpu_type, milli in demand.items():
            nominal = quota.get(gpu_type, 0) * MILLI_PER_GPU
            after = state.usage.get(gpu_type, 0) + milli
            if after <= nominal:
                continue
            if not state.spec.borrow:
                return (
                    f"queue {queue} quota for {gpu_type or 'GPUs'} is {nominal // MILLI_PER_GPU}, "
                    f"{after / MILLI_PER_GPU:g} would be in use"
                )
            if idle.get(gpu_type, 0) < milli:
                return f"queue {queue} is over its {gpu_type} quota and nothing idle to borrow"
        return None

    def charge(self, job: str, queue: str, demand: Mapping[str, int]) -> None:
        """Count an admitted job against its queue (once; a second charge replaces it)."""
        self.release(job)
        usage = self._queues[queue].usage
        for gpu_type, milli in demand.items():
            usage[gpu_type] = usage.get(gpu_type, 0) + milli
        self._charged[job] = (queue, shared(tuple(demand.items())))

    def release(self, job: str) -> None:
        charged = self._charged.pop(job, None)
        if charged is None:
            return
        queue, demand = charged
        usage = self._queues[queue].usage
        for gpu_type, milli in demand:
            usage[gpu_type] = usage.get(gpu_type, 0) - milli
            if usage[gpu_type] <= 0:
                del usage[gpu_type]


class Ordering(Iterator[Pending]):
    """The queues' heads merged by the full order (see ``JobQueue.ordering``). Jobs queued
    after it began are not yielded (a victim requeued during the cycle waits for the next);
    a job yielded and still queued when it closes is put back."""

    def __init__(
        self, queue: JobQueue, now: float, shares: Mapping[str, float], last_token: int
    ) -> None:
        self._queue = queue
        self._now = now
        self._last_token = last_token
        self._rank = {n: (-s.spec.priority, shares[n]) for n, s in queue._queues.items()}
        self._heads: list[tuple[int, int, float, int, int, str, str]] = []
        self._taken: list[tuple[str, _Entry]] = []  # popped from their queue's heap
        for name in queue._queues:
            self._advance(name)

    def _advance(self, name: str) -> None:
        """Move the queue's next live entry from its heap to the heads."""
        heap = self._queue._ready[name]
        tokens = self._queue._token
        while heap:
            entry = heapq.heappop(heap)
            if tokens.get(entry[3]) != entry[2]:
                continue  # stale: dropped for good
            self._taken.append((name, entry))
            if entry[2] > self._last_token:
                continue  # queued during this ordering: put back at close
            qprio, share = self._rank[name]
            head = (entry[0], qprio, share, entry[1], entry[2], entry[3], name)
            heapq.heappush(self._heads, head)
            return

    def __next__(self) -> Pending:
        while self._heads:
            _, _, _, _, token, key, name = heapq.heappop(self._heads)
            self._advance(name)
            pending = self._queue._pending.get(key)
            if pending is None or self._queue._token.get(key) != token:
                continue
            if pending.not_before > self._now:
                continue  # asked for an earlier ``now`` than before: not yet
            return pending
        raise StopIteration

    def close(self) -> None:
        """Put back what was taken from the heaps and is still queued."""
        queue, taken = self._queue, self._taken
        self._taken, self._heads = [], []
        for name, entry in taken:
            if queue._token.get(entry[3]) == entry[2]:
                queue._heap_push(name, entry)

    def __enter__(self) -> Ordering:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()
