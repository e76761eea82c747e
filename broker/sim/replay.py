"""The trace simulator's replay protocol: jobs arrive, wait, run and leave on a virtual clock.

This module owns the replay's event loop, its configuration and its report. The workload
(trace pods on a compressed clock plus generated gangs, and how they are drawn) is built in
``broker.sim.arrivals``; the core wired to the simulated federation is
``broker.sim.replay_run``; the burst pool is ``broker.sim.replay_burst``. The nodes are
split round-robin into ``clusters`` member clusters (``cluster-0``..) of a
``SimulatedFederation``, whose node events build the ledger. The clock jumps from event to
event.

Scheduling: the service's own core. Arrived jobs wait in a ``JobQueue`` of
``ReplayConfig.queues`` (default: one queue, ``default``, no quota, as every job asks for;
a job's ``queue`` and ``priority`` say where it waits and how it ranks) and every cycle is
``broker.core.scheduler.run_cycle``: priority, queue priority, fair share, then FIFO;
quotas; preemption of lower-priority jobs of reclaimable queues (through the
``Lifecycle``); a cluster held for a gang starving past ``starvation_seconds``; and the
unplaceable-shape memo, which lets a cycle skip, without a decision, every job of a shape
found not to fit while the federation has only lost room since. Every job is decided by
the policy under test (``replay_run.OnePolicy``). A job that does not fit waits and does not
block the jobs behind it (Kueue's BestEffortFIFO). A cycle runs at every arrival, departure
and burst node coming up, and every ``cycle_seconds`` while the last cycle left jobs
unexamined: a cycle decides at most ``scan_misses`` jobs (``max_jobs_per_cycle``; jobs the
memo skips do not count), the rest wait for the next one.

Bursting (``ReplayConfig.burst``; the CLI's default, off with ``--no-burst``). One simulated
Cluster API pool (``adapters.simulated.SimulatedPool``) grows a cloud member cluster
(``burst-0``, kind "cloud", starting with no nodes) under ``broker.core.burst.BurstController``,
exactly as the service drives it, on the virtual clock: each cycle the pool's due node
events are applied to the ledger, jobs are decided without what the controller's
``hiding`` hides from them (nodes held for other gangs; for a job that may not burst, every
node the pool added), then the controller's ``tick`` sees the jobs still waiting that may
burst (``Job.allow_burst``: the generated gangs) and its actions are carried out on the pool
by the core's executor (``broker.core.burst_actions``). While it has requests, burst nodes
exist or jobs that may burst wait, a cycle runs at least every ``cycle_seconds`` and one runs
at the horizon, where the replay stops: node-hours are billed over ``[0, horizon]``.

Report, per policy: GPU utilisation over time (a sampled series, the time-weighted mean over
the window ``[0, horizon]`` and over its second half, when the federation is past filling up
from empty), wait percentiles for gangs (jobs of more than one pod) and for all jobs (to a
job's first start), placements, the jobs still unstarted at the horizon, preemptions and
quota refusals (decisions the queue's quota turned down, counted per cycle). A job still
waiting then counts with its wait so far, a lower bound: leaving it out would reward a
policy for starving big gangs. Times are simulated seconds. GPU utilisation counts the
on-prem GPUs only (the nodes given, not the burst pool's), so it stays comparable with and
without bursting. Bursting adds, per policy: scale-ups, nodes added, jobs started on burst
nodes, billed node-hours, idle node-hours (added nodes up with no pod on them), cost
(node-hours x the pool's price per node-hour) and provisioning failures; all zero without a
pool.

``gpu_util_pct`` counts the GPU-time of pods whose job runs; ``mean_gpu_util_pct`` also
counts the GPUs held by gangs some of whose pods wait (``partial_gang_gpu_hours``), which
only ``kube-default`` has: it is replayed pod by pod, without gang atomicity, by
``broker.sim.replay_kube`` instead of the core, on the same federation and clock.
``jobs_never_started`` is ``unstarted``, under the name the before/after comparison uses.

Topology (``ReplayConfig.topology``, the CLI's ``--racks-of``): racks and blocks laid over
each cluster's nodes and a rack-level request on every gang; the report adds how many
domains each gang spans (``broker.sim.replay_topology``).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields, replace
from pathlib import Path

from adapters.simulated import SimulatedFederation, split_round_robin
from broker.core.burst import BurstController
from broker.core.burst_books import PoolStats
from broker.core.ledger import Ledger
from broker.core.queue import QueueSpec
from broker.core.scheduler import SchedulerSettings
from broker.model import MILLI_PER_GPU, Node
from broker.sim.arrivals import PREEMPTIBLE_QUEUE, Workload, build_workload
from broker.sim.replay_burst import BurstConfig, burst_config, burst_doc, start_bursting
from broker.sim.replay_kube import KubeRun, run_events
from broker.sim.replay_run import ReplayRun
from broker.sim.replay_table import print_table
from broker.sim.replay_topology import (
    Spans,
    TopologyConfig,
    span_fields,
    topology_config,
    with_requests,
)
from broker.sim.replay_topology import cluster as topology_cluster
from broker.sim.replay_topology import print_table as print_topology_table
from broker.sim.traces import TracePod
from policies import make_policy
from policies.kube_default import NAME as KUBE_DEFAULT

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
    burst: BurstConfig | None = None  # None: no burst pool
    # The queues jobs wait in (a job names its own; default "default"): quotas, priorities,
    # reclaimable. A queue's policy is not used: every job is decided by the replayed one.
    queues: tuple[QueueSpec, ...] = (QueueSpec("default"),)
    starvation_seconds: float = SchedulerSettings().starvation_seconds
    # Racks (and blocks) laid over each cluster's nodes, and the gangs' request
    # (``broker.sim.replay_topology``); None: no topology, as before.
    topology: TopologyConfig | None = None
    # The share of generated one-pod jobs in the low-priority reclaimable queue
    # (``arrivals.PREEMPTIBLE_QUEUE``, added to ``queues`` when above 0).
    preemptible_share: float = 0.0


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
    preemptions: int = 0  # running jobs evicted for higher-priority ones (and requeued)
    quota_refusals: int = 0  # placements a queue's quota turned down, per cycle
    peak_queue_gpus: dict[str, float] = field(default_factory=dict, repr=False)
    # With a topology (``replay_topology.span_fields``): gangs started, racks and blocks
    # each spans (mean, p95, max), the gangs' waits (p50, p95); None without one.
    topology_gangs: int | None = None
    racks_spanned_mean: float | None = None
    racks_spanned_p95: float | None = None
    racks_spanned_max: float | None = None
    blocks_spanned_mean: float | None = None
    blocks_spanned_p95: float | None = None
    blocks_spanned_max: float | None = None
    topology_gang_wait_p50_s: float | None = None
    topology_gang_wait_p95_s: float | None = None
    # GPU-time of pods whose gang runs / (on-prem GPUs x window); mean_gpu_util_pct also
    # counts the GPUs held by gangs not all of whose pods are placed (kube-default only).
    gpu_util_pct: float = 0.0
    partial_gang_gpu_hours: float = 0.0
    jobs_never_started: int = 0

    def as_dict(self) -> dict[str, object]:
        """The JSON row: every field but the per-job waits and per-queue peaks."""
        row: dict[str, object] = {f.name: getattr(self, f.name) for f in fields(self)}
        del row["waits"], row["peak_queue_gpus"]
        row["util_series"] = [[t, pct] for t, pct in self.util_series]
        return row


def federation(
    nodes: Sequence[Node], clusters: int, topology: TopologyConfig | None = None
) -> tuple[SimulatedFederation, Ledger]:
    """Round-robin member clusters (with ``topology``, racks laid over each one's nodes);
    the ledger learns its nodes from the adapter's events."""
    fed = SimulatedFederation()
    ledger = Ledger()
    for i, part in enumerate(split_round_robin(nodes, clusters)):
        cluster = topology_cluster(f"cluster-{i}", topology)
        fed.add(cluster, topology.lay(part) if topology is not None else part)
        ledger.add_cluster(cluster)
    for event in fed.node_events():
        ledger.apply(event)
    return fed, ledger


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
    if policy_name == KUBE_DEFAULT:
        return _replay_kube(nodes, workload, config)
    topo = config.topology
    workload = with_requests(workload, topo)
    fed, ledger = federation(nodes, config.clusters, topo)
    run = ReplayRun(
        make_policy(policy_name, seed=config.seed, workload=workload.pod_shapes()),
        fed,
        ledger,
        config.queues,
        SchedulerSettings(
            max_jobs_per_cycle=config.scan_misses, starvation_seconds=config.starvation_seconds
        ),
        late_from=workload.horizon / 2,
        onprem=frozenset(fed.clusters),
    )
    if topo is not None:
        laid = [(name, part) for name, (_, part) in fed.clusters.items()]
        run.spans = Spans.of(topo.levels, laid, topo.burst_labels())
    if config.burst is not None:
        levels, labels = (topo.levels, topo.burst_labels()) if topo else ((), None)
        run.burst = start_bursting(
            config.burst, fed, ledger, config.seed, lambda: run.now, levels, labels
        )
    series = _run_events(run, workload, config, audit)
    run.integrate(max(run.now, workload.horizon))
    total_milli = sum(n.allocatable.gpus for n in nodes) * MILLI_PER_GPU
    return _result(policy_name, workload, run, series, total_milli, workload.horizon)


def _replay_kube(nodes: Sequence[Node], workload: Workload, config: ReplayConfig) -> ReplayResult:
    """kube-default: pod by pod on the same federation and clock (``broker.sim.replay_kube``);
    no burst pool and no racks, whatever the config asks."""
    fed, ledger = federation(nodes, config.clusters)
    total_milli = sum(n.allocatable.gpus for n in nodes) * MILLI_PER_GPU
    run = KubeRun(
        make_policy(KUBE_DEFAULT), ledger, tuple(fed.clusters), total_milli, workload.horizon / 2
    )
    series = run_events(run, workload, config.samples)
    run.integrate(max(run.now, workload.horizon))
    return _result(KUBE_DEFAULT, workload, run, series, total_milli, workload.horizon)


def _run_events(
    run: ReplayRun, workload: Workload, config: ReplayConfig, audit: Audit | None
) -> list[tuple[float, float]]:
    """The event loop: jump to the next arrival, ending, pool event, due cycle or sample;
    run a cycle when something changed or one is due. Returns the utilisation series."""
    arrivals, horizon = workload.arrivals, workload.horizon
    series: list[tuple[float, float]] = []
    samples = max(1, config.samples)
    next_arrival = sample = 0
    next_cycle = math.inf

    def sample_at(k: int) -> float:
        # min(): horizon * k / k can round above the horizon and lose the last sample.
        return min(horizon, horizon * k / samples) if k <= samples else math.inf

    while True:
        ending = run.fed.next_ending()
        due = run.burst.pool.next_due() if run.burst is not None else None
        t = min(
            arrivals[next_arrival].at if next_arrival < len(arrivals) else math.inf,
            ending if ending is not None else math.inf,
            due if due is not None else math.inf,
            next_cycle,
            sample_at(sample),
        )
        if t > horizon:
            return series
        run.integrate(t)
        # Freed capacity, or burst nodes come up: what did not fit may fit now.
        changed = run.depart(t) | run.pool_events(t)
        while next_arrival < len(arrivals) and arrivals[next_arrival].at <= t:
            run.push(arrivals[next_arrival])
            next_arrival += 1
            changed = True
        if changed or t >= next_cycle:
            run.cycle(t)
            run.tick(t)
            next_cycle = t + config.cycle_seconds if run.unexamined else math.inf
            if run.bursting() and t < horizon:
                # Tick on while bursting matters, and once at the horizon to bill up to it.
                next_cycle = min(t + config.cycle_seconds, horizon)
            if audit is not None:
                audit(t, run.ledger, run.burst.controller if run.burst is not None else None)
        while sample_at(sample) <= t:
            series.append((round(t, 3), round(run.utilisation_pct(), 3)))
            sample += 1


def _result(
    policy_name: str,
    workload: Workload,
    run: ReplayRun | KubeRun,
    series: list[tuple[float, float]],
    total_milli: int,
    horizon: float,
) -> ReplayResult:
    waiting = run.unstarted()
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
    partial = run.partial_area if isinstance(run, KubeRun) else 0.0
    running = 100.0 * (run.area - partial) / window if window > 0 else 0.0
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
        preemptions=run.preemptions,
        quota_refusals=run.quota_refusals,
        peak_queue_gpus=dict(run.peak_queue_gpus),
        gpu_util_pct=round(running, 2),
        partial_gang_gpu_hours=round(partial / MILLI_PER_GPU / 3600.0, 4),
        jobs_never_started=len(waiting),
        **span_fields(run.spans, gang_waits, percentile),  # type: ignore[arg-type]
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
        pods, gpus, config.jobs, config.seed, config.time_scale, config.gang_load_pct,
        config.preemptible_share,
    )  # fmt: skip
    if config.preemptible_share > 0 and PREEMPTIBLE_QUEUE not in config.queues:
        config = replace(config, queues=(*config.queues, PREEMPTIBLE_QUEUE))
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
        topology=topology_config(args),
        preemptible_share=getattr(args, "preemptible", 0.0),
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
            "preemptible_share": config.preemptible_share,
            "trace_jobs": workload.trace_jobs,
            "generated_jobs": workload.generated_jobs,
            "horizon_s": round(workload.horizon, 3),
            "burst": burst_doc(config.burst),
            "topology": config.topology.as_doc() if config.topology else None,
            "results": rows,
        }
        print(json.dumps(doc))
    else:
        print_table(rows, workload, len(nodes), gpus, config)
        if config.topology is not None:
            print_topology_table(rows, config.topology)
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
