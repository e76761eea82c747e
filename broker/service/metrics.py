"""The broker's Prometheus metrics (prometheus-client, in an injected registry, never the
global one). Names carry the prefix ``fedbroker_``, base units (seconds, GPUs), ``_total``
on counters, and never a job or user ID as a label.

* ``SchedulerMetrics``: counters and histograms the service updates as things happen
  (placements by policy and result, gang timeouts, requeues by reason, launch failures by
  cluster, stage and cause, preemptions, the wait from submission to running per queue,
  the placement decision's latency);
* ``ServiceCollector``: gauges (and counters the service keeps itself) computed at scrape
  time from the read model: GPUs per cluster, GPU type and state, the largest gang placeable
  (in the cluster, and inside one domain of each topology level), stranded GPUs, pending
  jobs and GPU demand and the oldest pending gang per queue, cluster staleness and watches,
  burst pools (and whether each could be read), the event bus, leadership.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from broker.figures import GPU_STATES, LARGEST_GANG, STRANDED, TOTAL
from broker.service.events import EventBus
from broker.service.readmodel import (
    GANG_GPUS,
    Availability,
    CapacityRow,
    ClusterRow,
    PoolRow,
    QueueRow,
    ReadModel,
)

MetricSource = Callable[[], Iterable[Metric]]

WAIT_BUCKETS = (1, 5, 15, 30, 60, 120, 300, 600, 1800, 3600, 7200, 14400, 43200, 86400)
DECISION_BUCKETS = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0,
)  # fmt: skip
CYCLE_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


class SchedulerMetrics:
    """What the service counts as it happens, registered in ``registry``."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.placements = Counter(
            "fedbroker_placements", "Placement decisions by policy and result (placed, "
            "unplaceable)", ["policy", "result"], registry=r,
        )  # fmt: skip
        self.gang_timeouts = Counter(
            "fedbroker_gang_timeouts", "Gangs not fully running within their timeout",
            registry=r,
        )  # fmt: skip
        self.requeues = Counter(
            "fedbroker_requeues", "Jobs put back in their queue, by reason (timeout, "
            "launch_failed, follow_failed, evicted, preempted, restart, failover)",
            ["reason"], registry=r,
        )  # fmt: skip
        self.launch_failures = Counter(
            "fedbroker_launch_failures", "Failures launching, adopting, following or "
            "deleting a job's objects in a member, by cluster, stage (launch, adopt, "
            "follow, delete) and cause (refused: a permanent refusal; transient; error: an "
            "unexpected exception, logged with its traceback)", ["cluster", "stage", "cause"],
            registry=r,
        )  # fmt: skip
        self.failovers = Counter(
            "fedbroker_failovers", "Jobs taken off a lost member (stale past their queue's "
            "failoverAfterSeconds) and requeued, by lost cluster", ["cluster"], registry=r,
        )  # fmt: skip
        self.preemptions = Counter(
            "fedbroker_preemptions", "Jobs preempted for a higher-priority gang", registry=r
        )
        self.job_wait = Histogram(
            "fedbroker_job_wait_seconds", "Seconds from submission to all pods running",
            ["queue"], buckets=WAIT_BUCKETS, registry=r,
        )  # fmt: skip
        self.decision = Histogram(
            "fedbroker_placement_decision_seconds",
            "Seconds one placement decision (policy.decide) took", buckets=DECISION_BUCKETS,
            registry=r,
        )  # fmt: skip
        self.cycle = Histogram(
            "fedbroker_scheduling_cycle_seconds", "Seconds one scheduling cycle took (it "
            "runs on the event loop: the API waits that long behind it)",
            buckets=CYCLE_BUCKETS, registry=r,
        )  # fmt: skip
        self.cut_short = Counter(
            "fedbroker_scheduling_cycles_cut_short", "Cycles that stopped deciding at "
            "scheduler.maxCycleSeconds with jobs left to decide", registry=r,
        )  # fmt: skip
        self.skipped = Counter(
            "fedbroker_placements_skipped", "Waiting jobs a cycle did not decide: a job of "
            "the same shape was found unplaceable and no room was freed since", registry=r,
        )  # fmt: skip


class Forward(Collector):
    """Everything of another registry, collected as part of this one (the service keeps
    its own registry; the API's, injected, serves both)."""

    def __init__(self, source: CollectorRegistry) -> None:
        self._source = source

    def collect(self) -> Iterator[Metric]:
        yield from self._source.collect()


class ServiceCollector(Collector):
    """Gauges computed at scrape time from the read model: capacity per cluster and GPU
    type, queues, clusters' watches, burst pools, the event bus, leadership, and the extra
    sources adapters register (``Service.metric_sources``)."""

    def __init__(
        self,
        model: ReadModel,
        leading: Callable[[], bool],
        sources: list[MetricSource],
        bus: EventBus,
    ) -> None:
        self._model = model
        self._leading = leading
        self._sources = sources
        self._bus = bus

    def collect(self) -> Iterator[Metric]:
        queues = self._model.queues()
        pending = GaugeMetricFamily(
            "fedbroker_pending_jobs", "Jobs waiting in each queue", labels=["queue"]
        )
        for q in queues:
            pending.add_metric([q.name], float(q.pending))
        yield pending
        clusters = self._model.clusters(stranded_gpus_too=True)
        yield from _cluster_metrics(clusters)
        yield _topology_metric(clusters)
        yield from _capacity_metrics(self._model.capacity(clusters))
        yield from _queue_metrics(queues)
        yield from _pool_metrics(self._model.pools())
        yield _availability(self._model.availability())
        leader = GaugeMetricFamily(
            "fedbroker_leader", "1 while this replica is the one placing jobs"
        )
        leader.add_metric([], 1.0 if self._leading() else 0.0)
        yield leader
        for source in self._sources:
            yield from source()
        dropped = CounterMetricFamily(
            "fedbroker_events_dropped", "Events dropped for slow /v1/events subscribers"
        )
        dropped.add_metric([], float(self._bus.dropped))
        yield dropped
        subscribers = GaugeMetricFamily("fedbroker_event_subscribers", "Open /v1/events streams")
        subscribers.add_metric([], float(self._bus.subscribers))
        yield subscribers


def _cluster_metrics(clusters: list[ClusterRow]) -> Iterator[Metric]:
    """GPUs by state, staleness, the watch's connection and relists, per cluster."""
    states = "; ".join(f"{f.state}: {f.meaning}" for f in GPU_STATES)
    gpus = GaugeMetricFamily(
        "fedbroker_gpus", f"GPUs per cluster, GPU type and state ({states})",
        labels=["cluster", "gpu_type", "state"],
    )  # fmt: skip
    for cluster in clusters:
        for row in cluster.gpu_types:
            for figure in GPU_STATES:
                labels = [cluster.cluster, row.gpu_type, str(figure.state)]
                gpus.add_metric(labels, float(getattr(row, figure.state or "")))
    yield gpus
    stale = GaugeMetricFamily(
        "fedbroker_cluster_stale",
        "1 while a cluster takes no new placements because its capacity data is stale",
        labels=["cluster"],
    )
    connected = GaugeMetricFamily(
        "fedbroker_cluster_connected",
        "1 while the broker hears from a cluster (its watch or agent is connected; "
        "simulated clusters always)",
        labels=["cluster"],
    )
    relists = CounterMetricFamily(
        "fedbroker_cluster_relists",
        "Full relists of a Kubernetes member cluster (start, 410 Gone, reconnects)",
        labels=["cluster"],
    )
    for cluster in clusters:
        stale.add_metric([cluster.cluster], float(cluster.stale))
        connected.add_metric([cluster.cluster], float(cluster.connected))
        relists.add_metric([cluster.cluster], float(cluster.relists))
    yield stale
    yield connected
    yield relists


def _topology_metric(clusters: list[ClusterRow]) -> Metric:
    """Per cluster, declared level and GPU type: GPUs of the largest gang of 8-GPU pods that
    fits inside one domain of the level (the read model's rows: nothing per decision)."""
    largest = GaugeMetricFamily(
        "fedbroker_topology_largest_gang_gpus",
        "GPUs of the largest gang of 8-GPU pods that could be placed now inside one domain "
        "of a topology level (a node label key the cluster declares)",
        labels=["cluster", "level", "gpu_type"],
    )  # fmt: skip
    for cluster in clusters:
        for level in cluster.topology:
            for gang in level.largest_gangs:
                labels = [cluster.cluster, level.level, gang.gpu_type]
                largest.add_metric(labels, float(gang.largest_gang * GANG_GPUS))
    return largest


def _pool_metrics(rows: list[PoolRow]) -> Iterator[Metric]:
    """Burst pools: scale-ups/downs, nodes by state, node-seconds (billed, idle) and cost."""
    counters: list[tuple[str, str, Callable[[PoolRow], float]]] = [
        ("fedbroker_burst_scale_ups", "Scale-ups of a burst pool", lambda r: r.scale_ups),
        ("fedbroker_burst_scale_downs", "Nodes removed from a burst pool",
         lambda r: r.scale_downs),
        ("fedbroker_burst_provision_failures",
         "Scale-ups whose nodes did not all come up in time", lambda r: r.provision_failures),
        ("fedbroker_burst_node_seconds",
         "Node-seconds billed for nodes the broker added (from the scale-up on)",
         lambda r: r.node_hours * 3600.0),
        ("fedbroker_burst_idle_node_seconds",
         "Node-seconds of added nodes that were up with no pod on them (the cost leak)",
         lambda r: r.idle_node_hours * 3600.0),
        ("fedbroker_burst_cost", "Cost of the nodes the broker added", lambda r: r.cost),
    ]  # fmt: skip
    for name, doc, value in counters:
        family = CounterMetricFamily(name, doc, labels=["pool"])
        for row in rows:
            family.add_metric([row.pool], float(value(row)))
        yield family
    nodes = GaugeMetricFamily(
        "fedbroker_burst_nodes", "Nodes the broker added to a pool: up, or coming up",
        labels=["pool", "state"],
    )  # fmt: skip
    failing = GaugeMetricFamily(
        "fedbroker_burst_pool_failing", "1 while a pool backs off after a failure",
        labels=["pool"],
    )  # fmt: skip
    for row in rows:
        nodes.add_metric([row.pool, "ready"], float(row.ready))
        nodes.add_metric([row.pool, "coming"], float(row.coming))
        failing.add_metric([row.pool], float(row.failing))
    yield nodes
    yield failing


def _availability(rows: list[Availability]) -> Metric:
    """Every configured pool: 1 once read and joined, 0 while it cannot be read."""
    available = GaugeMetricFamily(
        "fedbroker_burst_pool_available", "1 once a burst pool has been read and takes part "
        "in bursting; 0 while it cannot be read (read again with backoff)", labels=["pool"],
    )  # fmt: skip
    for row in rows:
        available.add_metric([row.pool], float(row.available))
    return available


def _capacity_metrics(rows: list[CapacityRow]) -> Iterator[Metric]:
    """Total GPUs, the largest gang placeable now and stranded GPUs per cluster and type."""
    total, largest, stranded = (
        GaugeMetricFamily(f.metric, f.meaning, labels=["cluster", "gpu_type"])
        for f in (TOTAL, LARGEST_GANG, STRANDED)
    )
    for row in rows:
        labels = [row.cluster, row.gpu_type]
        total.add_metric(labels, float(row.total))
        largest.add_metric(labels, float(row.largest_gang_gpus))
        stranded.add_metric(labels, float(row.stranded))
    yield total
    yield largest
    yield stranded


def _queue_metrics(queues: list[QueueRow]) -> Iterator[Metric]:
    demand = GaugeMetricFamily(
        "fedbroker_pending_gpus", "GPUs the pending jobs of a queue ask for", labels=["queue"]
    )
    oldest = GaugeMetricFamily(
        "fedbroker_oldest_pending_gang_seconds",
        "Seconds the oldest pending gang (job of more than one pod) of a queue has waited",
        labels=["queue"],
    )
    for row in queues:
        demand.add_metric([row.name], float(row.pending_gpus))
        oldest.add_metric([row.name], float(row.oldest_gang_seconds))
    yield demand
    yield oldest
