"""The replay's workload: trace pods on a compressed clock, mixed with generated gangs.

This module owns turning inputs into a time-ordered list of job arrivals, each with its run
time, on the simulated clock. Nothing here places anything; ``broker.sim.replay`` does that.
An arrival's job carries its queue and priority (defaults: ``default``, 0).

Trace pods. Each pod of an openb pod list becomes a one-pod job that arrives at
``creation_time / time_scale`` and runs for ``(deletion_time - creation_time) / time_scale``
simulated seconds once it starts (a delayed pod keeps its run time, as a real one would).
Pods lacking ``creation_time`` arrive uniformly at random over the trace span; pods lacking
a run time get one drawn from the run times of the pods that have them, or, when none does
(the generated default workload), an exponential one with a mean of one trace hour. The
trace span is the latest time in the list (one day when the list has no times).

Generated gangs (no public trace has multi-pod gangs; see ../shared/traces/README.md).
``jobs`` jobs, drawn with ``random.Random(seed)``:

- shape from ``adapters.simulated.GANG_MIX`` (pods x GPUs per pod, weight):
  1x1 40 %, 1x2 10 %, 1x4 8 %, 2x4 10 %, 2x8 10 %, 4x8 12 %, 8x8 7 %, 16x8 3 %;
  mean 2.5 pods and 15.5 GPUs per job. Every pod asks 8 cores and 32 GiB per GPU
  (``GangShape.pod_resources``), any GPU type.
- arrivals: a Poisson process over the trace span conditioned on exactly ``jobs`` arrivals,
  i.e. sorted uniform times, so every gang arrives inside the replayed window.
- run times: log-normal (sigma 1.0, heavy-tailed like published training-job durations),
  scaled so that the gangs together offer ``gang_load_pct`` % of the federation's GPUs over
  the span: sum(GPUs x run time) = gang_load_pct/100 x federation GPUs x span. Calibrating to
  a load, not to fixed seconds, keeps the experiment meaningful for any trace, time scale,
  job count or federation size. (openb's own pods offer little: at most 66 GPUs of 6,212 are
  requested at once over its 149 days, so the gangs set the load.)
- bursting: every generated job of more than one pod (a gang, as the replay's report counts
  gangs) has ``allow_burst=True``, so a burst pool may be grown for it when it has waited
  long enough (``broker.core.burst``). One-pod jobs, generated or from the trace, never burst: a
  whole cloud node of 8 GPUs bought for one pod of 1-4 GPUs would mostly be paid for idle,
  and such pods find room in the federation's fragments soon enough.
- a low-priority queue (``preemptible_share``, default 0): that share of the generated
  one-pod jobs, drawn with their own seeded stream (the other draws do not move), go to
  the queue ``preemptible`` at priority -1, which the replay declares reclaimable
  (``PREEMPTIBLE_QUEUE``): they soak up idle GPUs and are evicted, and requeued, when a
  job of the default queue needs them.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, replace

from adapters.simulated import GangShape, draw_gang
from broker.core.queue import QueueSpec
from broker.model import Job, PodSet
from broker.sim.traces import TracePod
from policies.fgd import PodShape, popular_shapes

DEFAULT_TRACE_SPAN_S = 86_400.0  # trace seconds, for pod lists without any times
DEFAULT_POD_RUN_S = 3_600.0  # trace seconds, mean run of a pod when no pod has times
GANG_RUN_SIGMA = 1.0
PREEMPTIBLE_QUEUE = QueueSpec("preemptible", priority=-1, reclaimable=True)


@dataclass(frozen=True, slots=True)
class Arrival:
    """A job arriving at ``at`` (simulated seconds) that runs ``run_seconds`` once started."""

    at: float
    job: Job
    run_seconds: float

    @property
    def gang(self) -> bool:
        return self.job.total_pods > 1


@dataclass(frozen=True, slots=True)
class Workload:
    arrivals: tuple[Arrival, ...]
    horizon: float  # simulated seconds: the trace span, compressed
    trace_jobs: int
    generated_jobs: int

    def pod_shapes(self) -> tuple[tuple[PodShape, float], ...]:
        """The popular pod shapes of this workload, pod by pod (what FGD weighs)."""
        return popular_shapes(
            PodShape.of(ps.resources, a.job.gpu_types)
            for a in self.arrivals
            for ps in a.job.pod_sets
            for _ in range(ps.count)
        )


def build_workload(
    pods: Sequence[TracePod],
    federation_gpus: int,
    jobs: int,
    seed: int,
    time_scale: float,
    gang_load_pct: float,
    preemptible_share: float = 0.0,
) -> Workload:
    """Trace pods plus ``jobs`` generated gangs, sorted by arrival (ties: trace first)."""
    if time_scale <= 0:
        raise ValueError("time_scale must be positive")
    times = [t for p in pods for t in (p.creation_time, p.deletion_time) if t is not None]
    span = float(max(times)) if times and max(times) > 0 else DEFAULT_TRACE_SPAN_S
    horizon = span / time_scale
    trace = _trace_arrivals(pods, span, time_scale, random.Random(f"trace-times-{seed}"))
    gangs = _gang_arrivals(jobs, horizon, federation_gpus, gang_load_pct, random.Random(seed))
    if preemptible_share > 0:
        gangs = _preemptible(gangs, preemptible_share, random.Random(f"preemptible-{seed}"))
    # A stable sort keeps each source's own order among equal times, so the FIFO is defined.
    arrivals = sorted(trace + gangs, key=lambda a: a.at)
    return Workload(tuple(arrivals), horizon, len(trace), len(gangs))


def _trace_arrivals(
    pods: Sequence[TracePod], span: float, time_scale: float, rng: random.Random
) -> list[Arrival]:
    runs = sorted(
        max(0, p.deletion_time - p.creation_time)
        for p in pods
        if p.creation_time is not None and p.deletion_time is not None
    )
    taken: dict[str, int] = {}
    arrivals = []
    for pod in pods:
        created = (
            float(pod.creation_time) if pod.creation_time is not None else rng.uniform(0, span)
        )
        if pod.creation_time is not None and pod.deletion_time is not None:
            run = float(max(0, pod.deletion_time - pod.creation_time))
        elif runs:
            run = float(runs[rng.randrange(len(runs))])
        else:
            run = rng.expovariate(1.0 / DEFAULT_POD_RUN_S)
        # Pod names become pod and job names in the ledger, which must be unique.
        seen = taken.get(pod.name, 0)
        taken[pod.name] = seen + 1
        name = pod.name if not seen else f"{pod.name}-dup{seen}"
        job = Job(name, (PodSet("pod", 1, pod.resources),), gpu_types=pod.gpu_types)
        arrivals.append(Arrival(created / time_scale, job, run / time_scale))
    return arrivals


def _gang_arrivals(
    count: int, horizon: float, federation_gpus: int, load_pct: float, rng: random.Random
) -> list[Arrival]:
    if count <= 0:
        return []
    drawn: list[tuple[GangShape, float, float]] = []
    for _ in range(count):
        shape = draw_gang(rng)
        drawn.append((shape, rng.uniform(0.0, horizon), rng.lognormvariate(0.0, GANG_RUN_SIGMA)))
    gpu_seconds = sum(s.pods * s.gpus_per_pod * raw for s, _, raw in drawn)
    scale = load_pct / 100.0 * federation_gpus * horizon / gpu_seconds if gpu_seconds else 0.0
    drawn.sort(key=lambda d: d[1])
    width = max(5, len(str(count)))
    return [
        Arrival(
            at,
            Job(
                f"gang-{i:0{width}d}",
                (PodSet("worker", s.pods, s.pod_resources()),),
                allow_burst=s.pods > 1,
            ),
            raw * scale,
        )
        for i, (s, at, raw) in enumerate(drawn)
    ]


def _preemptible(arrivals: list[Arrival], share: float, rng: random.Random) -> list[Arrival]:
    """``share`` of the one-pod jobs moved to the low-priority reclaimable queue."""
    moved = []
    for a in arrivals:
        if a.job.total_pods == 1 and rng.random() < share:
            job = replace(a.job, queue=PREEMPTIBLE_QUEUE.name, priority=-1)
            a = Arrival(a.at, job, a.run_seconds)
        moved.append(a)
    return moved
