"""The replay's "before": jobs scheduled pod by pod as kube-scheduler's default profile does.

The core's ``run_cycle`` places whole jobs or nothing, so it cannot show what a scheduler
without gang atomicity does to gangs; this module is the replay's one placement loop of its
own, on the same virtual clock, the same ``Ledger`` (fed ``PodBound``/``PodDeleted`` events
as a cluster would) and the same workload. The model:

- Every pod of an arrived job waits in one FIFO queue, in arrival order and, within a job,
  pod order (kube-scheduler's PrioritySort with equal priorities orders by creation time;
  a job controller creates a job's pods together). No priorities, no preemption, no quota.
- Whenever capacity was freed or a job arrived, every waiting pod is tried once, in queue
  order, by ``policies.kube_default`` (filter by fit, then LeastAllocated +
  BalancedAllocation); a pod that fits is bound at once. A pod that does not fit waits and
  does not block the pods behind it (kube-scheduler sets unschedulable pods aside and moves
  them back on cluster events; its back-off delays are not modelled).
- No gang atomicity: a gang's pods are bound as they are placed. A gang with some but not
  all of its pods bound holds their GPUs and does not run: its workers wait at their
  rendezvous until the last pod is bound, then the gang runs ``run_seconds`` and all its
  pods end together. A gang that never gets its last pod holds its GPUs to the end.
- With several clusters (there is no federation in this picture), a job goes to the
  clusters in turn by arrival order, ``cluster-0`` first, as users spread over
  independent clusters; its pods are placed in that cluster only. No burst pool, no racks:
  those figures stay zero or None in the report.

Tallies for the report: ``area`` (GPU milli-seconds bound, running or held), ``partial_area``
(the part held by gangs not yet running) and ``late_area`` (``area`` from ``late_from``).
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field, replace

from broker.core.ledger import Ledger
from broker.model import (
    GpuType,
    Job,
    Placement,
    PodBound,
    PodDeleted,
    Resources,
)
from broker.sim.arrivals import Arrival, Workload
from broker.taints import Toleration
from policies import Policy


@dataclass(slots=True)
class _Gang:
    """One job in the queue: its pods still waiting, and those bound (cluster, pod, milli)."""

    arrival: Arrival
    cluster: str
    todo: list[tuple[str, Job]]  # pod name, and the one-pod job the policy decides
    bound: list[tuple[str, str, int]] = field(default_factory=list)


@dataclass(slots=True)
class KubeRun:
    """One kube-default replay in progress: the ledger, the pod queue and the tallies."""

    policy: Policy
    ledger: Ledger
    clusters: tuple[str, ...]
    total_milli: int
    late_from: float = 0.0
    now: float = 0.0
    area: float = 0.0
    late_area: float = 0.0
    partial_area: float = 0.0
    waits: dict[str, float] = field(default_factory=dict)  # job -> wait to its start
    pods_placed: int = 0
    running_milli: int = 0
    partial_milli: int = 0
    waiting: dict[str, _Gang] = field(default_factory=dict)  # FIFO: insertion order
    endings: list[tuple[float, int, str]] = field(default_factory=list)
    running: dict[str, _Gang] = field(default_factory=dict)
    _seq: int = 0
    # What the core's run has and this one never does: the report reads them alike.
    conflicts: int = 0
    preemptions: int = 0
    quota_refusals: int = 0
    burst: None = None
    spans: None = None
    peak_queue_gpus: dict[str, float] = field(default_factory=dict)

    def integrate(self, t: float) -> None:
        held = self.running_milli + self.partial_milli
        self.area += held * (t - self.now)
        self.partial_area += self.partial_milli * (t - self.now)
        self.late_area += held * max(0.0, t - max(self.now, self.late_from))
        self.now = t

    def push(self, arrival: Arrival) -> None:
        job = arrival.job
        cluster = self.clusters[self._seq % len(self.clusters)]
        self._seq += 1
        todo = [
            (
                f"{job.name}-{ps.name}-{i}",
                replace(job, pod_sets=(replace(ps, count=1),), clusters=frozenset({cluster})),
            )
            for ps in job.pod_sets
            for i in range(ps.count)
        ]
        self.waiting[job.key] = _Gang(arrival, cluster, todo)

    def depart(self, now: float) -> bool:
        """The gangs whose run is over end: their pods are deleted."""
        changed = False
        while self.endings and self.endings[0][0] <= now:
            _, _, key = heapq.heappop(self.endings)
            gang = self.running.pop(key)
            for cluster, pod, milli in gang.bound:
                self.ledger.apply(PodDeleted(cluster, pod))
                self.running_milli -= milli
            changed = True
        return changed

    def next_ending(self) -> float:
        return self.endings[0][0] if self.endings else math.inf

    def cycle(self, now: float) -> None:
        """Every waiting pod tried once in queue order; a gang whose last pod is bound
        starts. A pod shape found not to fit in a cluster is not tried again in this pass:
        binding only takes capacity away."""
        misfits: set[tuple[str, Resources, frozenset[GpuType], frozenset[Toleration]]] = set()
        for key, gang in list(self.waiting.items()):
            left = []
            for name, pod_job in gang.todo:
                pod_set = pod_job.pod_sets[0]
                shape = (gang.cluster, pod_set.resources, pod_job.gpu_types, pod_set.tolerations)
                decision = None if shape in misfits else self._bind(name, pod_job, gang)
                if decision is None:
                    misfits.add(shape)
                    left.append((name, pod_job))
            gang.todo = left
            if not left:
                self._start(key, gang, now)

    def _bind(self, name: str, pod_job: Job, gang: _Gang) -> Placement | None:
        decision = self.policy.decide(pod_job, self.ledger.snapshot())
        if not isinstance(decision, Placement):
            return None
        pod = decision.pods[0]
        self.ledger.apply(PodBound(decision.cluster, name, pod.node, pod.resources, pod.gpus))
        milli = pod.resources.gpu_request_milli
        gang.bound.append((decision.cluster, name, milli))
        self.partial_milli += milli
        self.pods_placed += 1
        return decision

    def _start(self, key: str, gang: _Gang, now: float) -> None:
        del self.waiting[key]
        milli = sum(m for _, _, m in gang.bound)
        self.partial_milli -= milli
        self.running_milli += milli
        self.running[key] = gang
        self.waits[key] = now - gang.arrival.at
        heapq.heappush(self.endings, (now + gang.arrival.run_seconds, len(self.waits), key))

    def utilisation_pct(self) -> float:
        """Bound GPUs (running or held), as the cluster's allocation shows them."""
        held = self.running_milli + self.partial_milli
        return 100.0 * held / self.total_milli if self.total_milli else 0.0

    def unstarted(self) -> list[Arrival]:
        return [gang.arrival for gang in self.waiting.values()]

    def partially_placed(self) -> list[str]:
        """The jobs holding some but not all of their pods' capacity."""
        return [key for key, gang in self.waiting.items() if gang.bound]


def run_events(run: KubeRun, workload: Workload, samples: int) -> list[tuple[float, float]]:
    """Jump to the next arrival, ending or sample; a pass runs when a job arrived or one
    ended. Returns the utilisation series."""
    arrivals, horizon = workload.arrivals, workload.horizon
    series: list[tuple[float, float]] = []
    samples = max(1, samples)
    next_arrival = sample = 0

    def sample_at(k: int) -> float:
        return min(horizon, horizon * k / samples) if k <= samples else math.inf

    while True:
        t = min(
            arrivals[next_arrival].at if next_arrival < len(arrivals) else math.inf,
            run.next_ending(),
            sample_at(sample),
        )
        if t > horizon:
            return series
        run.integrate(t)
        changed = run.depart(t)
        while next_arrival < len(arrivals) and arrivals[next_arrival].at <= t:
            run.push(arrivals[next_arrival])
            next_arrival += 1
            changed = True
        if changed:
            run.cycle(t)
        while sample_at(sample) <= t:
            series.append((round(t, 3), round(run.utilisation_pct(), 3)))
            sample += 1
