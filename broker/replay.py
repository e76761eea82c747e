"""The trace simulator's replay protocol: jobs arrive, wait, run and leave on a virtual clock.

This module owns the replay's event loop, its scheduling cycle and its report. The workload
(trace pods on a compressed clock plus generated gangs, and how they are drawn) and the
queue the jobs wait in are documented and built in ``broker.arrivals``. The nodes are split
round-robin into ``clusters`` member clusters (``cluster-0``..) of a ``SimulatedFederation``,
whose node events build the ledger; every placement goes through the service's core path,
``ledger.snapshot() -> policy.decide() -> ledger.assume()``, then launch (the federation
binds the pods, the ledger applies the ``PodBound`` events) and ``confirm``. At the end of
its run a job's ``PodDeleted`` events free its capacity. The clock jumps from event to event.

Scheduling cycle. A cycle runs at every arrival and departure, and every ``cycle_seconds``
while jobs are left unexamined. It walks the queue in order (priority, then FIFO) and places
every job that fits; a job that does not fit waits and does not block the jobs behind it
(Kueue's BestEffortFIFO). Three things keep a replay of thousands of queued jobs cheap:

- a job found not to fit is *parked* until capacity is freed (a departure), because
  arrivals only ever take capacity away (Kueue requeues inadmissible workloads on events);
- a cycle stops after ``scan_misses`` consecutive jobs that do not fit; the jobs behind stay
  in the queue for the next cycle (kube-scheduler and Kueue likewise take only heads);
- a job that visibly cannot fit (too few free GPUs, or too few nodes with enough whole free
  GPUs, in every cluster) counts as a miss without asking the policy. Outcomes are the same
  as with the policy asked (tested), except that the random policy then draws differently.

Report, per policy: GPU utilisation over time (a sampled series, the time-weighted mean over
the window ``[0, horizon]`` and over its second half, when the federation is past filling up
from empty), wait percentiles for gangs (jobs of more than one pod) and for all jobs,
placements, and the jobs still unstarted at the horizon. A job still waiting then counts
with its wait so far, a lower bound: leaving it out would reward a policy for starving big
gangs. Times are simulated seconds.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path

from adapters.simulated import SimulatedFederation, split_round_robin
from broker.arrivals import Arrival, ArrivalQueue, Workload, build_workload
from broker.ledger import ClusterView, ConflictError, Ledger, Snapshot
from broker.model import MILLI_PER_GPU, Cluster, Job, Node, Placement, PodDeleted, Unplaceable
from broker.traces import TracePod
from policies import Policy, make_policy

DEFAULT_GANG_LOAD_PCT = 90.0
DEFAULT_CYCLE_SECONDS = 10.0
DEFAULT_SCAN_MISSES = 32
DEFAULT_SAMPLES = 200


@dataclass(frozen=True, slots=True)
class ReplayConfig:
    clusters: int = 1
    seed: int = 0
    jobs: int = 2000
    time_scale: float = 60.0
    gang_load_pct: float = DEFAULT_GANG_LOAD_PCT
    cycle_seconds: float = DEFAULT_CYCLE_SECONDS
    scan_misses: int = DEFAULT_SCAN_MISSES
    samples: int = DEFAULT_SAMPLES
    precheck: bool = True  # skip deciding jobs that visibly cannot fit (see _may_fit)


@dataclass(frozen=True, slots=True)
class ReplayResult:
    policy: str
    jobs: int
    gangs: int
    placements: int
    pods_placed: int
    mean_gpu_util_pct: float
    late_gpu_util_pct: float  # the mean over the window's second half, past the warm-up
    gang_wait_p50_s: float | None
    gang_wait_p95_s: float | None
    gang_wait_p99_s: float | None
    job_wait_p50_s: float | None
    job_wait_p95_s: float | None
    unstarted: int
    unstarted_gangs: int
    conflicts: int  # placements the ledger refused: a policy bug if ever above zero
    util_series: tuple[tuple[float, float], ...]
    waits: dict[str, float] = field(repr=False)  # per started job

    def as_dict(self) -> dict[str, object]:
        """The JSON row: every field but the per-job waits."""
        row: dict[str, object] = {f.name: getattr(self, f.name) for f in fields(self)}
        del row["waits"]
        row["util_series"] = [[t, pct] for t, pct in self.util_series]
        return row


@dataclass(slots=True)
class _Run:
    """One policy's replay in progress: the federation, the ledger and the tallies."""

    policy: Policy
    fed: SimulatedFederation
    ledger: Ledger
    config: ReplayConfig
    queue: ArrivalQueue = field(default_factory=ArrivalQueue)
    waits: dict[str, float] = field(default_factory=dict)
    running_milli: dict[tuple[str, str], int] = field(default_factory=dict)
    allocated_milli: int = 0
    pods_placed: int = 0
    conflicts: int = 0
    now: float = 0.0
    area: float = 0.0  # allocated milli-GPU seconds over the window
    late_area: float = 0.0  # the same from late_from on
    late_from: float = 0.0

    def integrate(self, t: float) -> None:
        """Allocation is constant between events, so the time-weighted means are exact."""
        self.area += self.allocated_milli * (t - self.now)
        self.late_area += self.allocated_milli * max(0.0, t - max(self.now, self.late_from))
        self.now = t

    def depart(self, now: float) -> bool:
        events = self.fed.advance(now)
        for event in events:
            self.ledger.apply(event)
            if isinstance(event, PodDeleted):
                self.allocated_milli -= self.running_milli.pop((event.cluster, event.pod), 0)
        return bool(events)

    def cycle(self, now: float) -> None:
        """1. take the active heads in order; 2. snapshot and decide each; 3. assume and
        launch what fits; 4. park what does not; 5. stop after too many misses in a row."""
        heads, self.queue.active = self.queue.active, []
        misses = 0
        for i, entry in enumerate(heads):
            if misses >= self.config.scan_misses:
                self.queue.active = heads[i:]
                return
            arrival = entry[1]
            snapshot = self.ledger.snapshot()
            if self.config.precheck and not _may_fit(arrival.job, snapshot):
                decision: Placement | Unplaceable | None = None
            else:
                decision = self.policy.decide(arrival.job, snapshot)
            if isinstance(decision, Placement) and self._launch(decision, arrival):
                self.waits[arrival.job.key] = now - arrival.at
                misses = 0
            else:
                self.queue.parked.append(entry)
                misses += 1

    def _launch(self, placement: Placement, arrival: Arrival) -> bool:
        try:
            self.ledger.assume(placement)
        except ConflictError:
            # Decided on the snapshot just taken, so this is a policy bug; count, don't crash.
            self.conflicts += 1
            return False
        for event in self.fed.launch(placement, arrival.run_seconds):
            self.ledger.apply(event)
        self.ledger.confirm(placement.job)
        for pod in placement.pods:
            self.running_milli[(placement.cluster, pod.pod)] = pod.resources.gpu_request_milli
        self.allocated_milli += placement.gpu_milli
        self.pods_placed += len(placement.pods)
        return True

    def utilisation_pct(self) -> float:
        """Taken GPU share of the federation as the ledger itself reports it."""
        views = self.ledger.snapshot().clusters.values()
        total = sum(v.gpus_total() for v in views) * MILLI_PER_GPU
        return 0.0 if not total else 100.0 * (1.0 - sum(v.free_milli() for v in views) / total)


def _may_fit(job: Job, snapshot: Snapshot) -> bool:
    """Necessary conditions read off the ledger's index in O(clusters x GPU types x buckets).

    It only skips decisions that would say "no" anyway, so results are the same with it off
    (tested), and it saves the policy's costly "why not" on jobs waiting for room.
    """
    if job.elastic:
        return True
    return any(not v.stale and _may_fit_cluster(job, v) for v in snapshot.clusters.values())


def _may_fit_cluster(job: Job, view: ClusterView) -> bool:
    """Enough free GPUs of the allowed types in all, and, for each pod set of whole-GPU pods,
    enough nodes with enough whole free GPUs (CPU, memory and taints are left to the policy)."""
    groups = [g for g in view.groups() if g[0] is not None and job.allows_gpu_type(g[0])]
    if sum(view.free_milli(g) for g in groups) < job.gpu_request_milli:
        return False
    for ps in job.pod_sets:
        per_pod = ps.resources.gpus
        if per_pod:
            fits = sum(n * (k // per_pod) for g in groups for k, n in view.whole_histogram(g))
            if fits < ps.count:
                return False
    return True


def federation(nodes: Sequence[Node], clusters: int) -> tuple[SimulatedFederation, Ledger]:
    """Round-robin member clusters; the ledger learns its nodes from the adapter's events."""
    fed = SimulatedFederation()
    ledger = Ledger()
    for i, part in enumerate(split_round_robin(nodes, clusters)):
        cluster = Cluster(f"cluster-{i}")
        fed.add(cluster, part)
        ledger.add_cluster(cluster)
    for event in fed.node_events():
        ledger.apply(event)
    return fed, ledger


def replay_policy(
    nodes: Sequence[Node], workload: Workload, policy_name: str, config: ReplayConfig
) -> ReplayResult:
    """Replay ``workload`` with one policy on a fresh federation."""
    fed, ledger = federation(nodes, config.clusters)
    policy = make_policy(policy_name, seed=config.seed, workload=workload.pod_shapes())
    run = _Run(policy, fed, ledger, config, late_from=workload.horizon / 2)
    total_milli = sum(n.allocatable.gpus for n in nodes) * MILLI_PER_GPU
    arrivals, horizon = workload.arrivals, workload.horizon
    series: list[tuple[float, float]] = []
    samples = max(1, config.samples)
    next_arrival = sample = 0
    next_cycle = math.inf

    def sample_at(k: int) -> float:
        # min(): horizon * k / k can round above the horizon and lose the last sample.
        return min(horizon, horizon * k / samples) if k <= samples else math.inf

    while True:
        ending = fed.next_ending()
        t = min(
            arrivals[next_arrival].at if next_arrival < len(arrivals) else math.inf,
            ending if ending is not None else math.inf,
            next_cycle,
            sample_at(sample),
        )
        if t > horizon:
            break
        run.integrate(t)
        changed = run.depart(t)
        if changed:
            run.queue.unpark_all()
        while next_arrival < len(arrivals) and arrivals[next_arrival].at <= t:
            run.queue.push(arrivals[next_arrival])
            next_arrival += 1
            changed = True
        if changed or t >= next_cycle:
            run.cycle(t)
            next_cycle = t + config.cycle_seconds if run.queue.active else math.inf
        while sample_at(sample) <= t:
            series.append((round(t, 3), round(run.utilisation_pct(), 3)))
            sample += 1
    run.integrate(max(run.now, horizon))
    return _result(policy_name, workload, run, series, total_milli, horizon)


def _result(
    policy_name: str,
    workload: Workload,
    run: _Run,
    series: list[tuple[float, float]],
    total_milli: int,
    horizon: float,
) -> ReplayResult:
    waiting = run.queue.waiting()
    gang_waits = [
        w for a in workload.arrivals if a.gang and (w := run.waits.get(a.job.key)) is not None
    ]
    job_waits = list(run.waits.values())
    censored = [max(0.0, horizon - a.at) for a in waiting]
    gang_waits += [max(0.0, horizon - a.at) for a in waiting if a.gang]
    job_waits += censored
    window = total_milli * horizon
    mean = 100.0 * run.area / window if window > 0 else 0.0
    late = 200.0 * run.late_area / window if window > 0 else 0.0
    return ReplayResult(
        policy=policy_name,
        jobs=len(workload.arrivals),
        gangs=sum(1 for a in workload.arrivals if a.gang),
        placements=len(run.waits),
        pods_placed=run.pods_placed,
        mean_gpu_util_pct=round(mean, 2),
        late_gpu_util_pct=round(late, 2),
        gang_wait_p50_s=percentile(gang_waits, 50),
        gang_wait_p95_s=percentile(gang_waits, 95),
        gang_wait_p99_s=percentile(gang_waits, 99),
        job_wait_p50_s=percentile(job_waits, 50),
        job_wait_p95_s=percentile(job_waits, 95),
        unstarted=len(waiting),
        unstarted_gangs=sum(1 for a in waiting if a.gang),
        conflicts=run.conflicts,
        util_series=tuple(series),
        waits=dict(run.waits),
    )


def percentile(values: Sequence[float], pct: float) -> float | None:
    """Nearest-rank percentile (a value that occurred), rounded to 0.1 s; None if empty."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(pct / 100.0 * len(ordered)))
    return round(ordered[rank - 1], 1)


def replay(
    nodes: Sequence[Node], pods: Sequence[TracePod], policies: Sequence[str], config: ReplayConfig
) -> tuple[Workload, list[ReplayResult]]:
    """The same workload replayed once per policy."""
    gpus = sum(n.allocatable.gpus for n in nodes)
    workload = build_workload(
        pods, gpus, config.jobs, config.seed, config.time_scale, config.gang_load_pct
    )
    return workload, [replay_policy(nodes, workload, name, config) for name in policies]


def run_replay(
    args: argparse.Namespace,
    nodes: Sequence[Node],
    pods: Sequence[TracePod],
    policies: Sequence[str],
) -> int:
    """The ``simulate --protocol replay`` command: run, then print JSON or a table."""
    config = ReplayConfig(
        clusters=args.clusters,
        seed=args.seed,
        jobs=args.jobs,
        time_scale=args.time_scale,
        gang_load_pct=getattr(args, "gang_load", DEFAULT_GANG_LOAD_PCT),
        cycle_seconds=getattr(args, "cycle_seconds", DEFAULT_CYCLE_SECONDS),
        scan_misses=getattr(args, "scan_misses", DEFAULT_SCAN_MISSES),
    )
    workload, results = replay(nodes, pods, policies, config)
    gpus = sum(n.allocatable.gpus for n in nodes)
    rows = [r.as_dict() for r in results]
    if args.json:
        doc = {
            "protocol": "replay",
            "nodes": len(nodes),
            "gpus": gpus,
            "clusters": config.clusters,
            "seed": config.seed,
            "time_scale": config.time_scale,
            "gang_load_pct": config.gang_load_pct,
            "trace_jobs": workload.trace_jobs,
            "generated_jobs": workload.generated_jobs,
            "horizon_s": round(workload.horizon, 3),
            "results": rows,
        }
        print(json.dumps(doc))
    else:
        _print_table(rows, workload, len(nodes), gpus, config)
    if args.plot:
        from broker.plot import plot_replay

        title = f"Replay: {len(nodes)} nodes, {config.clusters} cluster(s), seed {config.seed}"
        try:
            plot_replay(rows, Path(args.plot), title)
        except OSError as exc:
            sys.stderr.write(f"fedbroker: error: --plot {args.plot}: {exc.strerror}\n")
            return 2
        if not args.json:
            print(f"plot written to {args.plot}")
    return 0


_COLUMNS = (
    ("placed", "placements"),
    ("util%", "mean_gpu_util_pct"),
    ("late util%", "late_gpu_util_pct"),
    ("gang p50", "gang_wait_p50_s"),
    ("gang p95", "gang_wait_p95_s"),
    ("gang p99", "gang_wait_p99_s"),
    ("job p50", "job_wait_p50_s"),
    ("unstarted", "unstarted"),
)


def _print_table(
    rows: Sequence[dict[str, object]],
    workload: Workload,
    nodes: int,
    gpus: int,
    config: ReplayConfig,
) -> None:
    print(
        f"replay protocol: {nodes} nodes, {gpus} GPUs, {config.clusters} cluster(s), "
        f"seed {config.seed}; {workload.trace_jobs} trace pods + {workload.generated_jobs} "
        f"generated jobs over {workload.horizon / 3600:.1f} simulated hours "
        f"(time scale {config.time_scale:g}, gang load {config.gang_load_pct:g} %)"
    )
    print("waits in simulated seconds; unstarted jobs count with their wait so far")
    print(f"{'policy':<10}" + "".join(f"{head:>11}" for head, _ in _COLUMNS))
    for row in rows:
        cells = "".join(f"{_cell(row[key]):>11}" for _, key in _COLUMNS)
        print(f"{row['policy']!s:<10}{cells}")


def _cell(value: object) -> str:
    if isinstance(value, float):
        return f"{value:.1f}"
    return "-" if value is None else str(value)
