"""One policy's replay in progress: the core (queue, policies, lifecycle, shape memo and
``run_cycle``) wired to a simulated federation on the virtual clock, and the tallies.

Only the clock and the adapters differ from the service: jobs wait in a ``JobQueue`` of
the config's queues (quotas, fair share, priorities), every cycle is the scheduler's own
``run_cycle`` (with the ``Lifecycle`` for preemption, the ``UnplaceableShapes`` memo and
the burst controller's ``hiding``), and what it admits is launched on the
``SimulatedFederation``, whose ``PodBound`` events reach the ledger before the lifecycle
confirms the gang running. At the end of its run a job's ``PodDeleted`` events free its
capacity and the lifecycle finishes it. A preempted job's pods are deleted at once and
the job is requeued by the lifecycle; the endings the federation still has for those pods
are dropped when they come (``_stale``), so a restarted job is not ended by its old run.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from adapters.simulated import SimulatedFederation
from broker.core.ledger import Ledger
from broker.core.lifecycle import Launch, Lifecycle, LifecycleSettings
from broker.core.queue import JobQueue, Pending, QueueSpec
from broker.core.scheduler import PolicyBook, SchedulerSettings, run_cycle
from broker.core.shapes import UnplaceableShapes
from broker.model import (
    MILLI_PER_GPU,
    NodeUpdated,
    Placement,
    PodDeleted,
    ReasonCode,
)
from broker.sim.arrivals import Arrival
from broker.sim.replay_burst import Bursting
from broker.sim.replay_topology import Spans
from policies import Policy


class OnePolicy(PolicyBook):
    """Every job is decided by the policy under test (made once, with the workload's pod
    shapes for FGD), whatever its queue's policy."""

    def __init__(self, queue: JobQueue, policy: Policy) -> None:
        super().__init__(queue)
        self._policy = policy

    def for_job(self, pending: Pending) -> Policy:
        return self._policy


@dataclass(slots=True)
class ReplayRun:
    """The federation, the ledger, the core's state and the tallies of one replay."""

    policy: Policy
    fed: SimulatedFederation
    ledger: Ledger
    queues: tuple[QueueSpec, ...]
    settings: SchedulerSettings
    late_from: float = 0.0
    burst: Bursting | None = None
    onprem: frozenset[str] = frozenset()  # the clusters utilisation counts
    spans: Spans | None = None  # with a topology: the domains each gang spans
    queue: JobQueue = field(init=False)
    book: OnePolicy = field(init=False)
    lifecycle: Lifecycle = field(init=False)
    memo: UnplaceableShapes = field(default_factory=UnplaceableShapes)
    arrivals: dict[str, Arrival] = field(default_factory=dict)  # job -> its arrival
    waits: dict[str, float] = field(default_factory=dict)  # job -> wait to its first start
    running_milli: dict[tuple[str, str], int] = field(default_factory=dict)
    allocated_milli: int = 0
    pods_placed: int = 0
    conflicts: int = 0
    preemptions: int = 0
    quota_refusals: int = 0
    peak_queue_gpus: dict[str, float] = field(default_factory=dict)
    now: float = 0.0
    area: float = 0.0  # allocated milli-GPU seconds over the window
    late_area: float = 0.0  # the same from late_from on
    pods_left: dict[str, int] = field(default_factory=dict)  # running job -> pods running
    pod_job: dict[tuple[str, str], str] = field(default_factory=dict)
    _stale: Counter[tuple[str, str]] = field(default_factory=Counter)
    _seq: int = 0
    unexamined: bool = False  # the last cycle left eligible jobs undecided
    # Whether any queue is reclaimable: without one nothing can be preempted, and the
    # cycle is spared the search for victims over every running job (same outcome).
    reclaimable: bool = False

    def __post_init__(self) -> None:
        self.queue = JobQueue(self.queues)
        self.book = OnePolicy(self.queue, self.policy)
        self.lifecycle = Lifecycle(self.ledger, self.queue, LifecycleSettings())
        self.reclaimable = any(spec.reclaimable for spec in self.queues)

    def integrate(self, t: float) -> None:
        """Allocation is constant between events, so the time-weighted means are exact."""
        self.area += self.allocated_milli * (t - self.now)
        self.late_area += self.allocated_milli * max(0.0, t - max(self.now, self.late_from))
        self.now = t

    def push(self, arrival: Arrival) -> None:
        self._seq += 1
        self.arrivals[arrival.job.key] = arrival
        self.queue.push(Pending(arrival.job, self._seq, arrival.at))

    def depart(self, now: float) -> bool:
        """The pods whose run is over end; a job whose last pod ended is finished."""
        changed = False
        for event in self.fed.advance(now):
            assert isinstance(event, PodDeleted)
            pod = (event.cluster, event.pod)
            if self._stale[pod]:
                self._stale[pod] -= 1  # the old run of a preempted job's pod
                continue
            changed = True
            self.ledger.apply(event)
            self.allocated_milli -= self.running_milli.pop(pod, 0)
            job = self.pod_job.pop(pod, None)
            if job is None:
                continue
            self.pods_left[job] -= 1
            if not self.pods_left[job]:
                del self.pods_left[job]
                self.lifecycle.finished(job, True, "ended")
                if self.burst is not None:
                    self.burst.controller.ended(job)
        return changed

    def pool_events(self, now: float) -> bool:
        """Apply the pool's node events up to ``now``; True when a node came up (not when
        one is relabelled or goes away)."""
        if self.burst is None:
            return False
        view = self.ledger.snapshot().clusters[self.burst.spec.cluster]
        known, came = set(view.nodes), False
        for event in self.burst.pool.due(now):
            self.ledger.apply(event)
            if isinstance(event, NodeUpdated) and event.node.name not in known:
                came = True
        return came

    def waiting_burstable(self) -> list[Pending]:
        return sorted((p for p in self.queue.pending() if p.job.allow_burst), key=_seq_of)

    def bursting(self) -> bool:
        """Whether the controller must be ticked on: it has requests, burst nodes exist (to
        be given back once idle), or jobs that may burst are waiting (for burstAfter)."""
        b = self.burst
        if b is None:
            return False
        return bool(b.pool.replicas or b.controller.requests() or self.waiting_burstable())

    def tick(self, now: float) -> None:
        """The controller's turn after a cycle; a removed node's NodeDeleted reaches the
        ledger at once."""
        if self.burst is None:
            return
        waiting = [p.job for p in self.waiting_burstable()]
        self.burst.tick(now, self.ledger.snapshot(), waiting)
        self.pool_events(now)

    def cycle(self, now: float) -> None:
        """The scheduler's cycle; then the victims' pods are deleted and what it admitted
        is launched and confirmed running."""
        hiding = self.burst.hiding(self.ledger.snapshot()) if self.burst is not None else None
        result = run_cycle(
            self.queue, self.ledger, self.book, now, self.settings,
            lifecycle=self.lifecycle if self.reclaimable else None, hiding=hiding, memo=self.memo,
        )  # fmt: skip
        for victim, _ in result.preempted:
            self._evict(victim)
        for pending, placement in result.admitted:
            self._launch(pending, placement, now)
        self.conflicts += result.conflicts
        self.quota_refusals += sum(
            1
            for why in result.waiting.values()
            if any(r.code is ReasonCode.QUOTA for r in why.reasons)
        )
        for spec in self.queues:
            gpus = sum(self.queue.usage(spec.name).values()) / MILLI_PER_GPU
            self.peak_queue_gpus[spec.name] = max(self.peak_queue_gpus.get(spec.name, 0.0), gpus)
        # Jobs the cycle did not reach (max_jobs_per_cycle, or requeued victims) want
        # another cycle soon; those it decided wait for an event.
        self.unexamined = len(self.queue) > len(result.waiting)

    def _evict(self, victim: Launch) -> None:
        """A preempted job: the lifecycle released its capacity and requeued it; its pods
        are gone now (their endings still due in the federation become stale)."""
        self.preemptions += 1
        placement = victim.placement
        for pod in placement.pods:
            key = (placement.cluster, pod.pod)
            if self.pod_job.pop(key, None) is not None:
                self._stale[key] += 1
                self.allocated_milli -= self.running_milli.pop(key, 0)
        self.pods_left.pop(placement.job, None)
        if self.burst is not None:
            self.burst.controller.ended(placement.job)

    def _launch(self, pending: Pending, placement: Placement, now: float) -> None:
        arrival = self.arrivals[placement.job]
        self.lifecycle.placed(pending, placement, now)
        for event in self.fed.launch(placement, arrival.run_seconds):
            self.ledger.apply(event)
        self.lifecycle.all_running(placement.job, now)
        self.waits.setdefault(placement.job, now - arrival.at)
        if self.spans is not None:
            self.spans.record(placement)
        onprem = placement.cluster in self.onprem
        for pod in placement.pods:
            if onprem:
                self.running_milli[(placement.cluster, pod.pod)] = pod.resources.gpu_request_milli
            self.pod_job[(placement.cluster, pod.pod)] = placement.job
        self.pods_left[placement.job] = len(placement.pods)
        if onprem:
            self.allocated_milli += placement.gpu_milli
        self.pods_placed += len(placement.pods)
        if self.burst is not None:
            self.burst.controller.placed(placement, now)
            if placement.cluster == self.burst.spec.cluster:
                self.burst.placements += 1

    def utilisation_pct(self) -> float:
        """Taken share of the on-prem GPUs as the ledger itself reports it."""
        clusters = self.ledger.snapshot().clusters
        views = [v for name, v in clusters.items() if name in self.onprem]
        total = sum(v.gpus_total() for v in views) * MILLI_PER_GPU
        return 0.0 if not total else 100.0 * (1.0 - sum(v.free_milli() for v in views) / total)

    def unstarted(self) -> list[Arrival]:
        """The jobs still waiting that never started (a requeued victim did start)."""
        return [
            self.arrivals[p.job.key] for p in self.queue.pending() if p.job.key not in self.waits
        ]


def _seq_of(pending: Pending) -> int:
    return pending.seq
