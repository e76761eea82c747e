"""The composition root of the live broker: every part built once, in one fixed order.

``build`` makes, from the config: the ledger with the simulated clusters' nodes and the
default launcher (for the simulated clusters only); the Kubernetes members (their clients
and watchers connect in ``Service.start``) and the launcher that dispatches to them and to
the agent-fed members' agents; the burst pools; the queue,
the lifecycle and the policies; the store and the leader election; the rooms (binding,
cycles, recovery, admission) and the read model; MQTT when configured, with the agents
that launch into agent-fed members; and last the
event-publishing store: the store wrapped ONCE in a ``PublishingStore`` whose bus feeds
``/v1/events`` and, with MQTT, tees every job event to MQTT as well.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypedDict, Unpack

from adapters.mqtt.remote import Timeouts
from adapters.simulated import SimulatedLauncher
from broker.config import Config
from broker.core.ledger import Ledger
from broker.core.lifecycle import Lifecycle, LifecycleSettings
from broker.core.queue import JobQueue, QueueSpec
from broker.core.scheduler import SchedulerSettings
from broker.model import Placement
from broker.ports import Launcher
from broker.service.admission import Admission
from broker.service.agents import AgentLaunchers
from broker.service.binding import Binding
from broker.service.cycle import Cycles
from broker.service.events import EventBus, PublishingStore
from broker.service.leader import (
    AlwaysLeader,
    Elector,
    FileLock,
    Leadership,
    PostgresLease,
    Timings,
    default_identity,
)
from broker.service.members import ClusterLauncher, KubeMembers
from broker.service.metrics import MetricSource, SchedulerMetrics
from broker.service.mqtt import MqttEvents, TeeBus
from broker.service.pool_reading import PoolRetry
from broker.service.pools import BurstPools
from broker.service.readmodel import ReadModel
from broker.service.recovery import Recovery
from broker.service.state import Shared, TenantPolicyBook
from broker.store import Store, open_store

if TYPE_CHECKING:
    from tenacity.wait import wait_base


@dataclass(eq=False)
class Parts:
    """What ``build`` made: the shared state, the rooms over it, and the outside links."""

    shared: Shared
    binding: Binding
    cycles: Cycles
    recovery: Recovery
    admission: Admission
    view: ReadModel
    bus: EventBus
    dispatch: ClusterLauncher | None
    mqtt: MqttEvents | None
    metric_sources: list[MetricSource] = field(default_factory=list)


def elector_for(config: Config, store: Store, identity: str | None) -> Elector:
    """From the config: a lease row on PostgreSQL, a file lock next to a SQLite file,
    always-leader for an in-memory database or when election is disabled."""
    election = config.leader_election
    identity = identity or election.identity or default_identity()
    path = config.store.sqlite_path
    if path is not None:
        if str(path) == ":memory:":
            return AlwaysLeader(identity)
        return FileLock(f"{path}.leader", identity)
    if election.enabled is False:
        return AlwaysLeader(identity)
    from broker.store.postgres import PostgresStore

    if not isinstance(store, PostgresStore):  # an injected store of another kind
        return AlwaysLeader(identity)
    return PostgresLease(store, identity, election.lease_seconds)


def _launching(
    config: Config,
    ledger: Ledger,
    launcher: Launcher | None,
    run_seconds: Callable[[Placement], float | None] | None,
    kube: KubeMembers,
) -> tuple[Launcher, ClusterLauncher | None]:
    """The simulated clusters' nodes into ``ledger``; the launcher: the simulated one (or
    ``launcher``, injected) when every cluster is simulated, else one dispatching to each
    member's own that keeps the simulated one for the simulated clusters."""
    per_cluster: dict[str, tuple[float, float]] = {}
    for cc in config.clusters:
        source = cc.source.simulated
        nodes = []
        if source is not None:
            nodes = source.nodes(cc.name)
            per_cluster[cc.name] = (source.launch_delay_seconds, source.failure_rate)
        ledger.add_cluster(cc.to_cluster(), nodes)
    default = launcher or SimulatedLauncher(per_cluster=per_cluster, run_seconds=run_seconds)
    simulated = frozenset(cc.name for cc in config.clusters if cc.source.simulated is not None)
    if not kube and len(simulated) == len(config.clusters):
        return default, None
    dispatch = ClusterLauncher(default, simulated)
    return dispatch, dispatch


def _shared(
    config: Config,
    clock: Callable[[], float],
    ledger: Ledger,
    store: Store,
    launcher: Launcher,
    kube: KubeMembers,
    leadership: Leadership,
    pool_retry: PoolRetry | None,
) -> Shared:
    sched = config.scheduler
    queue = JobQueue(
        QueueSpec(q.name, q.policy, q.priority, q.weight, dict(q.quota) or None,
                  q.borrow, q.reclaimable)
        for q in config.queues
    )  # fmt: skip
    backoff = LifecycleSettings(
        sched.backoff_base_seconds, sched.backoff_cap_seconds, sched.backoff_limit,
        sched.launch_refusal_limit,
    )  # fmt: skip
    return Shared(
        config=config, clock=clock, ledger=ledger, queue=queue,
        lifecycle=Lifecycle(ledger, queue, backoff), policies=TenantPolicyBook(queue),
        settings=SchedulerSettings(
            sched.max_jobs_per_cycle, sched.starvation_seconds, sched.max_cycle_seconds
        ),
        store=store, launcher=launcher, kube=kube, pools=BurstPools(config, clock, pool_retry),
        metrics=SchedulerMetrics(), leadership=leadership,
    )  # fmt: skip


def _agents(
    config: Config,
    mqtt: MqttEvents,
    shared: Shared,
    binding: Binding,
    dispatch: ClusterLauncher | None,
    timeouts: Timeouts | None,
) -> None:
    """The agent-fed clusters' agents: launchers and pod readers of their clusters."""
    if not mqtt.members:
        return
    publisher = mqtt.publisher

    def publish(suffix: str, payload: bytes) -> bool:
        return publisher.publish_nowait(suffix, payload, qos=1)

    agents = AgentLaunchers(
        config, publish, binding.launch_spec, shared.ledger, shared.kube, shared.wake.set,
        shared.check_stale, timeouts,
    )  # fmt: skip
    mqtt.attach(agents)
    assert dispatch is not None  # agent-fed clusters are not simulated
    dispatch.by_cluster.update(agents.remotes)
    dispatch.readers.update(agents.remotes)
    dispatch.refusals.update(agents.refusals())


class Options(TypedDict, total=False):
    """What a caller (a test, the demo) may put in place of the config's defaults."""

    launcher: Launcher | None  # default: the simulated clusters' launcher
    clock: Callable[[], float]  # default: time.time
    store: Store | None  # default: the config's store.url
    run_seconds: Callable[[Placement], float | None] | None  # simulated run times
    elector: Elector | None  # default: from the config (elector_for)
    identity: str | None  # this replica's name in the election
    pool_retry: PoolRetry | None  # default: PoolRetry() (reading unreadable Cluster API pools)
    member_retry_wait: wait_base | None  # between Kubernetes members' request retries
    plan_clock: Callable[[], float]  # the dry runs' budgets (default: time.monotonic)
    agent_timeouts: Timeouts  # how long the broker waits for an agent's replies


def build(config: Config, **options: Unpack[Options]) -> Parts:
    clock = options.get("clock", time.time)
    store = options.get("store") or open_store(config.store.url)
    identity = options.get("identity")
    election = config.leader_election

    async def elected() -> None:  # recovery is built below, over the shared state
        await recovery.elected()

    async def deposed(why: str) -> None:
        await recovery.deposed(why)

    leadership = Leadership(
        options.get("elector") or elector_for(config, store, identity),
        Timings(election.lease_seconds, election.renew_seconds, election.stop_after_seconds),
        elected,
        deposed,
    )
    kube = KubeMembers(
        config.clusters, config.scheduler.stale_after_seconds, clock,
        options.get("member_retry_wait"),
    )  # fmt: skip
    ledger = Ledger()
    default, dispatch = _launching(
        config, ledger, options.get("launcher"), options.get("run_seconds"), kube
    )
    shared = _shared(
        config, clock, ledger, store, default, kube, leadership, options.get("pool_retry")
    )
    binding = Binding(shared)
    cycles = Cycles(shared, binding)
    recovery = Recovery(shared, binding, cycles)
    view = ReadModel(shared.ledger, shared.queue, shared.pools, kube, clock)
    bus = EventBus()
    mqtt = None
    sources: list[MetricSource] = []
    if config.events.mqtt is not None:
        mqtt = MqttEvents(config, clock, shared.ledger, binding.on_capacity, view.clusters)
        _agents(config, mqtt, shared, binding, dispatch, options.get("agent_timeouts"))
        view.agents.append(mqtt.members.connected)
        bus = TeeBus(tee=mqtt.on_job, capacity_changed=mqtt.capacity_changed)
        sources.append(mqtt.metrics)
    # Last: every job change reaches the bus (and the tenants' active counts).
    shared.store = PublishingStore(store, bus, shared.active)
    return Parts(
        shared, binding, cycles, recovery, Admission(shared, binding), view, bus, dispatch,
        mqtt, sources,
    )  # fmt: skip


__all__ = ["Options", "Parts", "build", "elector_for"]
