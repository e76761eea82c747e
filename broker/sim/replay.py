"""The trace simulator's replay protocol: jobs arrive, wait, run and leave on a virtual clock.

This module owns the replay's event loop, its scheduling cycle and its report. The workload
(trace pods on a compressed clock plus generated gangs, and how they are drawn) and the
queue the jobs wait in are documented and built in ``broker.sim.arrivals``. The nodes are split
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

Bursting (``ReplayConfig.burst``; the CLI's default, off with ``--no-burst``). One simulated
Cluster API pool (``adapters.simulated.SimulatedPool``) grows a cloud member cluster
(``burst-0``, kind "cloud", starting with no nodes) under ``broker.core.burst.BurstController``,
exactly as the service drives it, on the virtual clock. Each cycle: the pool's due node
events are applied to the ledger (a node coming up unparks the parked jobs, as a departure
does); every job is decided on ``ledger.snapshot_hiding`` what the controller's
``hiding`` says it may not see: the nodes held for *other* gangs, and for a job that may not
burst every node the pool added (a job holding nodes is examined even past
``scan_misses``, its nodes being hidden from everyone else); then the
controller's ``tick`` sees the jobs still waiting that may burst (``Job.allow_burst``: the
generated gangs, see ``broker.sim.arrivals``) and its ``ScaleTo``/``RemoveNode`` actions are
carried out on the pool. ``placed``/``ended`` tell it which jobs run on its nodes. While it
has requests, burst nodes exist or jobs that may burst wait, a cycle runs at least every
``cycle_seconds`` (so gangs reach ``burstAfterSeconds`` and idle nodes are given back on
time) and one runs at the horizon, where the replay stops: node-hours are billed over the
window ``[0, horizon]``.

Default pool (``DEFAULT_BURST_POOL``; the CLI's flags change some of it): nodes of 8 x A100,
96 cores and 1,152 GiB, the shape of AWS p4d.24xlarge (8 x A100 40 GB, 96 vCPUs, 1,152 GiB;
https://aws.amazon.com/ec2/instance-types/p4/), at its on-demand list price of 32.77 USD
per hour in us-east-1 (https://aws.amazon.com/ec2/pricing/on-demand/; AWS cut its P4 and
P5 on-demand prices in June 2025, so read cost as "that list price x node-hours"); at most
32 nodes; a node is up 300 s after the scale-up (GPU instances take minutes to boot and
join); ``burstAfterSeconds`` 120, ``scaleDownAfterSeconds`` 600, provisioning timeout 900 s.
The generated gangs ask for no GPU type (any type will do), so A100 nodes can take them;
their pods (8 cores and 32 GiB per GPU) fit one p4d node 8 GPUs at a time.

Report, per policy: GPU utilisation over time (a sampled series, the time-weighted mean over
the window ``[0, horizon]`` and over its second half, when the federation is past filling up
from empty), wait percentiles for gangs (jobs of more than one pod) and for all jobs,
placements, and the jobs still unstarted at the horizon. A job still waiting then counts
with its wait so far, a lower bound: leaving it out would reward a policy for starving big
gangs. Times are simulated seconds. GPU utilisation counts the on-prem GPUs only (the nodes
given, not the burst pool's), so it stays comparable with and without bursting. Bursting
adds, per policy: scale-ups, nodes added, jobs started on burst nodes, billed node-hours,
idle node-hours (added nodes up with no pod on them), cost (node-hours x the pool's price
per node-hour) and provisioning failures; all zero without a pool.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import assert_never

from adapters.simulated import SimulatedFederation, SimulatedPool, split_round_robin
from broker.core.burst import (
    POOL_LABEL,
    BurstController,
    BurstSettings,
    LabelNode,
    PoolStats,
    RemoveNode,
    ScaleTo,
)
from broker.core.ledger import ConflictError, Ledger
from broker.model import (
    MILLI_PER_GPU,
    BurstPool,
    Cluster,
    GpuType,
    Node,
    NodeUpdated,
    Placement,
    PodDeleted,
    Resources,
    Unplaceable,
)
from broker.ports import ScaleError
from broker.sim.arrivals import Arrival, ArrivalQueue, Workload, build_workload
from broker.sim.traces import TracePod
from policies import Policy, make_policy
from policies.precheck import may_fit

DEFAULT_GANG_LOAD_PCT = 90.0
DEFAULT_CYCLE_SECONDS = 10.0
DEFAULT_SCAN_MISSES = 32
DEFAULT_SAMPLES = 200

BURST_CLUSTER = "burst-0"
# AWS p4d.24xlarge: 8 x A100 40 GB, 96 vCPUs, 1,152 GiB; on-demand 32.77 USD/h, us-east-1.
DEFAULT_BURST_POOL = BurstPool(
    name="cloud-a100",
    cluster=BURST_CLUSTER,
    gpu_type=GpuType("A100"),
    node=Resources(gpus=8, cpu_milli=96_000, memory_mib=1_152 * 1024),
    min_nodes=0,
    max_nodes=32,
    cost_per_node_hour=32.77,
    provision_seconds=300.0,
)
DEFAULT_BURST_SETTINGS = BurstSettings(
    burst_after_seconds=120.0,
    scale_down_after_seconds=600.0,
    provision_timeout_seconds=900.0,
    failure_backoff_seconds=600.0,
)


@dataclass(frozen=True, slots=True)
class BurstConfig:
    """One simulated burst pool (its cluster is ``pool.cluster``) and the controller's
    settings; ``failure_rate``: the share of new machines that never come up."""

    pool: BurstPool = DEFAULT_BURST_POOL
    settings: BurstSettings = DEFAULT_BURST_SETTINGS
    failure_rate: float = 0.0


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
    precheck: bool = True  # skip deciding jobs that visibly cannot fit (policies.precheck)
    burst: BurstConfig | None = None  # None: no burst pool


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
    burst_scale_ups: int = 0
    burst_nodes_added: int = 0
    burst_placements: int = 0  # jobs started on burst nodes
    burst_node_hours: float = 0.0  # billed: nodes added and not yet removed, over [0, horizon]
    idle_burst_node_hours: float = 0.0  # added nodes up with no pod on them
    burst_cost: float = 0.0  # node-hours x the pool's cost per node-hour
    burst_provision_failures: int = 0

    def as_dict(self) -> dict[str, object]:
        """The JSON row: every field but the per-job waits."""
        row: dict[str, object] = {f.name: getattr(self, f.name) for f in fields(self)}
        del row["waits"]
        row["util_series"] = [[t, pct] for t, pct in self.util_series]
        return row


@dataclass(slots=True)
class _Bursting:
    """The burst pool of one policy's replay: the controller, the simulated pool it drives
    and the jobs started on its nodes."""

    controller: BurstController
    pool: SimulatedPool
    spec: BurstPool
    placements: int = 0


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
    burst: _Bursting | None = None
    onprem: frozenset[str] = frozenset()  # the clusters utilisation counts
    pods_left: dict[str, int] = field(default_factory=dict)  # running job -> pods running
    pod_job: dict[tuple[str, str], str] = field(default_factory=dict)
    waiting_burstable: int = 0  # jobs that may burst, arrived and not started

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
                pod = (event.cluster, event.pod)
                self.allocated_milli -= self.running_milli.pop(pod, 0)
                job = self.pod_job.pop(pod, None)
                if job is not None:
                    self.pods_left[job] -= 1
                    if not self.pods_left[job]:
                        del self.pods_left[job]
                        if self.burst is not None:
                            self.burst.controller.ended(job)
        return bool(events)

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

    def push(self, arrival: Arrival) -> None:
        self.queue.push(arrival)
        if arrival.job.allow_burst:
            self.waiting_burstable += 1

    def bursting(self) -> bool:
        """Whether the controller must be ticked on: it has requests, burst nodes exist (to
        be given back once idle), or jobs that may burst are waiting (for burstAfter)."""
        b = self.burst
        if b is None:
            return False
        return bool(self.waiting_burstable or b.pool.replicas or b.controller.requests())

    def tick(self, now: float) -> None:
        """The controller's turn after a cycle: its actions are carried out on the pool and
        a removed node's NodeDeleted reaches the ledger at once."""
        b = self.burst
        if b is None:
            return
        entries = [e for e in self.queue.active + self.queue.parked if e[1].job.allow_burst]
        waiting = [a.job for _, a in sorted(entries, key=lambda e: e[0])]
        for action in b.controller.tick(now, self.ledger.snapshot(), waiting):
            try:
                if isinstance(action, ScaleTo) and action.delta < 0:
                    b.pool.cancel_coming(-action.delta, now)
                elif isinstance(action, ScaleTo):
                    b.pool.scale_to(action.replicas, now)
                elif isinstance(action, RemoveNode):
                    b.pool.remove_node(action.node, now)
                elif isinstance(action, LabelNode):
                    b.pool.label_node(action.node, {POOL_LABEL: action.pool})
                else:
                    assert_never(action)
            except ScaleError as exc:
                b.controller.failed(action, now, str(exc))
        self.pool_events(now)

    def cycle(self, now: float) -> None:
        """1. take the active heads in order; 2. snapshot (without the burst nodes held for
        other jobs) and decide each; 3. assume and launch what fits; 4. park what does not;
        5. stop after too many misses in a row, except for jobs holding burst nodes."""
        snapshot0 = self.ledger.snapshot()
        hiding = self.burst.controller.hiding(snapshot0) if self.burst else None
        holds = self.burst.controller.holds() if self.burst else {}
        heads, self.queue.active = self.queue.active, []
        rest: list[tuple[tuple[int, int], Arrival]] = []
        misses = 0
        for i, entry in enumerate(heads):
            arrival = entry[1]
            key = arrival.job.key
            over = misses >= self.config.scan_misses
            if over and not holds:
                rest.extend(heads[i:])
                break
            if over and key not in holds:
                rest.append(entry)
                continue
            hidden = hiding(arrival.job) if hiding is not None else None
            snapshot = self.ledger.snapshot_hiding(hidden) if hidden else self.ledger.snapshot()
            if self.config.precheck and not may_fit(arrival.job, snapshot):
                decision: Placement | Unplaceable | None = None
            else:
                decision = self.policy.decide(arrival.job, snapshot)
            if isinstance(decision, Placement) and self._launch(decision, arrival, now):
                self.waits[key] = now - arrival.at
                if not over:
                    misses = 0
            else:
                self.queue.parked.append(entry)
                misses += 1
        self.queue.active = rest

    def _launch(self, placement: Placement, arrival: Arrival, now: float) -> bool:
        try:
            self.ledger.assume(placement)
        except ConflictError:
            # Decided on the snapshot just taken, so this is a policy bug; count, don't crash.
            self.conflicts += 1
            return False
        for event in self.fed.launch(placement, arrival.run_seconds):
            self.ledger.apply(event)
        self.ledger.confirm(placement.job)
        onprem = placement.cluster in self.onprem
        for pod in placement.pods:
            if onprem:
                self.running_milli[(placement.cluster, pod.pod)] = pod.resources.gpu_request_milli
            self.pod_job[(placement.cluster, pod.pod)] = placement.job
        self.pods_left[placement.job] = len(placement.pods)
        if onprem:
            self.allocated_milli += placement.gpu_milli
        self.pods_placed += len(placement.pods)
        if arrival.job.allow_burst:
            self.waiting_burstable -= 1
        if self.burst is not None:
            self.burst.controller.placed(placement, now)
            if placement.cluster == self.burst.spec.cluster:
                self.burst.placements += 1
        return True

    def utilisation_pct(self) -> float:
        """Taken share of the on-prem GPUs as the ledger itself reports it."""
        clusters = self.ledger.snapshot().clusters
        views = [v for name, v in clusters.items() if name in self.onprem]
        total = sum(v.gpus_total() for v in views) * MILLI_PER_GPU
        return 0.0 if not total else 100.0 * (1.0 - sum(v.free_milli() for v in views) / total)


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


def _start_bursting(
    config: BurstConfig, fed: SimulatedFederation, ledger: Ledger, seed: int
) -> _Bursting:
    """The pool's cloud cluster joins empty; the controller starts with the pool at zero."""
    spec = config.pool
    per_gpu = spec.cost_per_node_hour / spec.node.gpus if spec.node.gpus else 0.0
    cluster = Cluster(spec.cluster, dict(spec.cluster_labels), "cloud", per_gpu)
    fed.add(cluster, [])
    ledger.add_cluster(cluster)
    pool = SimulatedPool(
        spec.cluster,
        str(spec.gpu_type),
        spec.node,
        name=spec.name,
        provision_seconds=spec.provision_seconds,
        failure_rate=config.failure_rate,
        seed=seed,
    )
    controller = BurstController(config.settings)
    controller.add_pool(spec, replicas=0)
    return _Bursting(controller, pool, spec)


Audit = Callable[[float, Ledger, BurstController | None], None]


def replay_policy(
    nodes: Sequence[Node],
    workload: Workload,
    policy_name: str,
    config: ReplayConfig,
    audit: Audit | None = None,
) -> ReplayResult:
    """Replay ``workload`` with one policy on a fresh federation. ``audit`` (for tests) is
    called after every scheduling cycle with the clock, the ledger and the controller."""
    fed, ledger = federation(nodes, config.clusters)
    onprem = frozenset(fed.clusters)
    burst = None
    if config.burst is not None:
        burst = _start_bursting(config.burst, fed, ledger, config.seed)
    policy = make_policy(policy_name, seed=config.seed, workload=workload.pod_shapes())
    run = _Run(
        policy, fed, ledger, config, late_from=workload.horizon / 2, burst=burst, onprem=onprem
    )
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
        due = burst.pool.next_due() if burst is not None else None
        t = min(
            arrivals[next_arrival].at if next_arrival < len(arrivals) else math.inf,
            ending if ending is not None else math.inf,
            due if due is not None else math.inf,
            next_cycle,
            sample_at(sample),
        )
        if t > horizon:
            break
        run.integrate(t)
        changed = run.depart(t)
        # Freed capacity, or burst nodes come up: what did not fit may fit now.
        if run.pool_events(t):
            changed = True
        if changed:
            run.queue.unpark_all()
        while next_arrival < len(arrivals) and arrivals[next_arrival].at <= t:
            run.push(arrivals[next_arrival])
            next_arrival += 1
            changed = True
        if changed or t >= next_cycle:
            run.cycle(t)
            run.tick(t)
            next_cycle = t + config.cycle_seconds if run.queue.active else math.inf
            if run.bursting() and t < horizon:
                # Tick on while bursting matters, and once at the horizon to bill up to it.
                next_cycle = min(t + config.cycle_seconds, horizon)
            if audit is not None:
                audit(t, ledger, burst.controller if burst is not None else None)
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
    stats = PoolStats()
    cost_per_node_hour, burst_placements = 0.0, 0
    if run.burst is not None:
        stats = run.burst.controller.stats(run.burst.spec.name)
        cost_per_node_hour = run.burst.spec.cost_per_node_hour
        burst_placements = run.burst.placements
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
        burst_scale_ups=stats.scale_ups,
        burst_nodes_added=stats.nodes_added,
        burst_placements=burst_placements,
        burst_node_hours=round(stats.node_hours(), 4),
        idle_burst_node_hours=round(stats.idle_node_hours(), 4),
        burst_cost=round(stats.node_hours() * cost_per_node_hour, 2),
        burst_provision_failures=stats.provision_failures,
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
        gang_load_pct=args.gang_load or DEFAULT_GANG_LOAD_PCT,
        cycle_seconds=getattr(args, "cycle_seconds", DEFAULT_CYCLE_SECONDS),
        scan_misses=getattr(args, "scan_misses", DEFAULT_SCAN_MISSES),
        burst=burst_config(args),
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
            "burst": _burst_doc(config.burst),
            "results": rows,
        }
        print(json.dumps(doc))
    else:
        _print_table(rows, workload, len(nodes), gpus, config)
    if args.plot:
        from broker.sim.plot import plot_replay

        title = f"Replay: {len(nodes)} nodes, {config.clusters} cluster(s), seed {config.seed}"
        try:
            plot_replay(rows, Path(args.plot), title)
        except OSError as exc:
            sys.stderr.write(f"fedbroker: error: --plot {args.plot}: {exc.strerror}\n")
            return 2
        if not args.json:
            print(f"plot written to {args.plot}")
    return 0


def burst_config(args: argparse.Namespace) -> BurstConfig | None:
    """The CLI's pool: the default one with its flags applied, or None for --no-burst."""
    if getattr(args, "no_burst", False):
        return None
    pool = DEFAULT_BURST_POOL
    max_nodes = getattr(args, "burst_max_nodes", None)
    provision = getattr(args, "burst_provision_seconds", None)
    pool = replace(
        pool,
        max_nodes=pool.max_nodes if max_nodes is None else max_nodes,
        provision_seconds=pool.provision_seconds if provision is None else provision,
    )
    return BurstConfig(pool, DEFAULT_BURST_SETTINGS, getattr(args, "burst_failure_rate", 0.0))


def _burst_doc(config: BurstConfig | None) -> dict[str, object] | None:
    if config is None:
        return None
    pool, settings = config.pool, config.settings
    return {
        "pool": pool.name,
        "cluster": pool.cluster,
        "gpu_type": str(pool.gpu_type),
        "node": {
            "gpus": pool.node.gpus,
            "cpu_milli": pool.node.cpu_milli,
            "memory_mib": pool.node.memory_mib,
        },
        "max_nodes": pool.max_nodes,
        "cost_per_node_hour": pool.cost_per_node_hour,
        "provision_seconds": pool.provision_seconds,
        "failure_rate": config.failure_rate,
        "burst_after_seconds": settings.burst_after_seconds,
        "scale_down_after_seconds": settings.scale_down_after_seconds,
        "provision_timeout_seconds": settings.provision_timeout_seconds,
    }


_COLUMNS = (
    ("placed", "placements"),
    ("util%", "mean_gpu_util_pct"),
    ("late util%", "late_gpu_util_pct"),
    ("gang p50", "gang_wait_p50_s"),
    ("gang p95", "gang_wait_p95_s"),
    ("gang p99", "gang_wait_p99_s"),
    ("job p50", "job_wait_p50_s"),
    ("unstarted", "unstarted"),
    ("bursts", "burst_scale_ups"),
    ("burst h", "burst_node_hours"),
    ("idle h", "idle_burst_node_hours"),
    ("cost $", "burst_cost"),
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
    if config.burst is None:
        print("no burst pool")
    else:
        pool = config.burst.pool
        print(
            f"burst pool {pool.name}: up to {pool.max_nodes} x {pool.node.gpus} {pool.gpu_type}"
            f" nodes at {pool.cost_per_node_hour:g}/h, up {pool.provision_seconds:g} s after"
            " a scale-up; utilisation counts on-prem GPUs only"
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
