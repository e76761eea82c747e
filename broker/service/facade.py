"""The running broker: store, queue, scheduler cycle and gang lifecycle, composed.

``Service`` is the composition root of the live broker (the API in broker/api.py is a thin
HTTP skin over it). It owns the order of side effects that the invariants rest on:

- submit: the job is committed to the store FIRST, then queued; a resubmit of the same
  tenant/name answers the stored job (idempotency, invariant 4);
- start: every active job of the store goes back into the queue as Queued before anything
  is placed (durability, invariant 3; simulated pods died with the process);
- a scheduling cycle reserves in the ledger, writes Placed, then launches in a supervised
  task; all pods running -> Running; launch failure or gang timeout -> delete the pods,
  release the reservation, requeue with backoff (invariant 2);
- a running job whose launcher reports its pods' end (``RunWatcher``) moves to Succeeded or
  Failed and its capacity is freed.

State changes run under one lock, so a cancel never interleaves with a placement of the
same job. The clock is injected; tests drive ``schedule_once(now)`` directly.

Several replicas on one store elect a leader (broker/leader.py). Only the leader holds a
queue and reservations, runs scheduling cycles, launches, burst pool actions and Kubernetes
garbage collection; a replica that becomes leader first rebuilds its state from the store
(the same path as a restart), and one that loses the lease stops placing at once and drops
that state. Followers serve reads and refuse writes (``NotLeader``, a 503 naming the leader).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import math
import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol, runtime_checkable

import aiohttp
from kubernetes.aio.client import ApiClient
from tenacity import AsyncRetrying, RetryCallState, wait_exponential

from adapters.kube.launch import LaunchSpec
from adapters.kube.watch import WatchError
from adapters.simulated import LaunchError, SimulatedLauncher, generate_nodes
from broker.config import Config, TenantConfig
from broker.core.ledger import ConflictError, Ledger
from broker.core.lifecycle import Lifecycle, LifecycleSettings, Outcome
from broker.core.queue import JobQueue, Pending, QueueSpec, gpu_milli_by_type
from broker.core.scheduler import PolicyBook, SchedulerSettings, run_cycle
from broker.core.shapes import UnplaceableShapes
from broker.manifest import FederatedJob, parse_manifest, pod_templates, to_job
from broker.model import (
    CapacityEvent,
    CapacitySnapshot,
    ClusterCapacity,
    Job,
    Placement,
    PodBound,
    PodDeleted,
    PodPlacement,
    Unplaceable,
)
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
from broker.service.mqtt import MqttEvents
from broker.service.pools import BurstPools
from broker.store import (
    ACTIVE_STATES,
    FINAL_STATES,
    JobRecord,
    JobState,
    LeaseLost,
    StateConflict,
    Store,
    StoreError,
    StoreUnavailable,
    open_store,
)
from policies.framework import Policy, largest_fit
from policies.stranded import stranded_gpus

log = logging.getLogger(__name__)

_QUEUED: tuple[JobState, ...] = ("Queued",)
GANG_GPUS = 8  # clusters() reports the largest gang of pods of this many whole GPUs


class Launcher(Protocol):
    async def launch(self, placement: Placement) -> None: ...
    async def delete(self, placement: Placement) -> None: ...


@runtime_checkable
class RunWatcher(Protocol):
    """A launcher that also reports when a running job's pods have exited."""

    async def finished(self, placement: Placement) -> bool: ...


# How long a woken scheduler lets more submissions arrive before it decides (a latency of a
# few milliseconds traded for far fewer cycles under load).
BATCH_SECONDS = 0.005
# A job change the store could not take (StoreUnavailable) is retried after the first delay,
# doubling up to the second.
STORE_RETRY_SECONDS = (0.2, 2.0)


class Forbidden(Exception):
    """The tenant may not do this (403); the message says why."""


class NotFound(Exception):
    """No such job for this tenant (404; also for other tenants' jobs)."""


class NotLeader(Exception):
    """This replica does not place jobs now (503): the message names the leader."""

    def __init__(self, message: str, holder: str | None, retry_after: int) -> None:
        super().__init__(message)
        self.holder = holder
        self.retry_after = retry_after


def placement_json(placement: Placement) -> dict[str, Any]:
    return {
        "job": placement.job,
        "cluster": placement.cluster,
        "policy": placement.policy,
        "pods": [
            {"pod": p.pod, "node": p.node, "gpus": list(p.gpus),
             "gpuMilli": p.resources.gpu_request_milli}
            for p in placement.pods
        ],
    }  # fmt: skip


class _TenantPods:
    """A policy whose pod names carry the tenant (``team-a.train-worker-0``): the ledger
    keys pods by cluster and name, and two tenants may both call a job ``train``. A dot
    never occurs in a DNS label, so the names cannot collide."""

    def __init__(self, policy: Policy) -> None:
        self._policy = policy
        self.name = policy.name

    def decide(self, job: Job, snapshot: CapacitySnapshot) -> Placement | Unplaceable:
        decision = self._policy.decide(job, snapshot)
        if isinstance(decision, Unplaceable):
            return decision
        pods = tuple(dataclasses.replace(p, pod=f"{job.tenant}.{p.pod}") for p in decision.pods)
        return dataclasses.replace(decision, pods=pods)


class _TenantPolicyBook(PolicyBook):
    def for_job(self, pending: Pending) -> Policy:
        return _TenantPods(super().for_job(pending))


class _Only:
    """A snapshot showing one cluster only (to ask a policy about each cluster alone)."""

    def __init__(self, view: ClusterCapacity, version: int) -> None:
        self._clusters = {view.name: view}
        self._version = version

    @property
    def clusters(self) -> Mapping[str, ClusterCapacity]:
        return self._clusters

    @property
    def version(self) -> int:
        return self._version


class Service:
    def __init__(
        self,
        config: Config,
        *,
        launcher: Launcher | None = None,
        clock: Callable[[], float] = time.time,
        store: Store | None = None,
        run_seconds: Callable[[Placement], float | None] | None = None,
        elector: Elector | None = None,
        identity: str | None = None,
    ) -> None:
        self.config = config
        self._clock = clock
        self.ledger = Ledger()
        per_cluster: dict[str, tuple[float, float]] = {}
        for cc in config.clusters:
            source = cc.source.simulated
            nodes = []
            if source is not None:
                nodes = generate_nodes(source.node_shapes(), cc.name, source.scale)
                per_cluster[cc.name] = (source.launch_delay_seconds, source.failure_rate)
            self.ledger.add_cluster(cc.to_cluster(), nodes)
        default: Launcher = launcher or SimulatedLauncher(
            per_cluster=per_cluster, run_seconds=run_seconds
        )
        sched = config.scheduler
        # Kubernetes members: clients, watchers and launchers are built in start().
        self.kube = KubeMembers(config.clusters, sched.stale_after_seconds, clock)
        # Burst pools: ports are built in start(), once the clusters are known.
        self.pools = BurstPools(config, clock)
        self.metrics = SchedulerMetrics()
        self.metric_sources: list[MetricSource] = []  # adapters' own families (MQTT, ...)
        self.leader = False  # placing now: elected and state rebuilt (fedbroker_leader)
        self._dispatch: ClusterLauncher | None = None
        if self.kube:
            self._dispatch = ClusterLauncher(default)
            default = self._dispatch
        self.launcher: Launcher = default
        self.queue = JobQueue(
            QueueSpec(q.name, q.policy, q.priority, q.weight, dict(q.quota) or None,
                      q.borrow, q.reclaimable)
            for q in config.queues
        )  # fmt: skip
        self.settings = SchedulerSettings(
            sched.max_jobs_per_cycle, sched.starvation_seconds, sched.max_cycle_seconds
        )
        self.lifecycle = Lifecycle(
            self.ledger,
            self.queue,
            LifecycleSettings(
                sched.backoff_base_seconds, sched.backoff_cap_seconds, sched.backoff_limit
            ),
        )
        self.policies: PolicyBook = _TenantPolicyBook(self.queue)
        self.unplaceable = UnplaceableShapes()  # waits without a decision while no room
        self.store = store or open_store(config.store.url)
        election = config.leader_election
        self.leadership = Leadership(
            elector or self._elector(identity),
            Timings(election.lease_seconds, election.renew_seconds, election.stop_after_seconds),
            self._elected,
            self._deposed,
        )
        self._cycle: asyncio.Task[None] | None = None
        self._found: dict[str, dict[str, list[PodBound]]] | None = None
        self._pools_task: asyncio.Task[None] | None = None
        self.ready = False
        self._lock = asyncio.Lock()
        self._wake = asyncio.Event()
        self._tasks: set[asyncio.Task[None]] = set()
        self._launching: dict[str, asyncio.Task[None]] = {}
        self._launch_tasks: set[asyncio.Task[None]] = set()
        self._runs: dict[str, asyncio.Task[None]] = {}
        # MQTT events and agent-fed clusters (broker/mqtt.py); it wraps self.store to see
        # every job change, so it comes after the store.
        self.mqtt: MqttEvents | None = None
        if config.events.mqtt is not None:
            self.mqtt = MqttEvents(self, clock)
            self.metric_sources.append(self.mqtt.metrics)

    # -- start and stop -------------------------------------------------------------------

    def _elector(self, identity: str | None) -> Elector:
        """From the config: a lease row on PostgreSQL, a file lock next to a SQLite file,
        always-leader for an in-memory database or when election is disabled."""
        election = self.config.leader_election
        identity = identity or election.identity or default_identity()
        path = self.config.store.sqlite_path
        if path is not None:
            if str(path) == ":memory:":
                return AlwaysLeader(identity)
            return FileLock(f"{path}.leader", identity)
        if election.enabled is False:
            return AlwaysLeader(identity)
        from broker.store.postgres import PostgresStore

        if not isinstance(self.store, PostgresStore):  # an injected store of another kind
            return AlwaysLeader(identity)
        return PostgresLease(self.store, identity, election.lease_seconds)

    async def start(self, *, elect: bool = True) -> None:
        """Open the store and connect the members; ready only afterwards. With ``elect``
        (the default) the first attempt at the lease is made here, and a replica that wins
        rebuilds its state before readiness; ``fedbroker serve`` passes False and campaigns
        (``lead``) once it listens, so that two processes given one address never both
        lead: the second cannot listen. Kubernetes members are listed first (their capacity
        is known before readiness)."""
        await self.store.open()
        found = await self._start_kube()
        if self.kube:
            self._spawn(self._kube_upkeep())
        if self.pools:
            await self.pools.start(self.ledger, self._workload_client)
        if self.mqtt is not None:
            self.mqtt.start()
        self._found = found
        if elect:
            await self.campaign()

    async def campaign(self) -> None:
        """The first attempt at the lease (the leader rebuilds its state here); ready
        afterwards, as the leader or as a follower."""
        await self.leadership.step()
        self._found = None  # stale by the time a later election could use it
        self.ready = True

    def advertise(self, port: int) -> None:
        """The port this replica listens on, known once bound: it goes into the identity
        (``hostname:port``) unless the config names one. Before the first campaign only."""
        if not self.config.leader_election.identity and not self.leadership.leading:
            self.leadership.elector.identity = default_identity(port)

    async def lead(self) -> None:
        """Campaign for the lease and keep it (a supervised task of ``serve``)."""
        await self.leadership.run()

    @property
    def leading(self) -> bool:
        """Placing now: elected, state rebuilt, and the lease renewed recently enough."""
        return self.leader and self.leadership.valid()

    def not_leader(self) -> NotLeader:
        """The error a write gets on a replica that is not placing now."""
        timings = self.leadership.timings
        retry = max(1, math.ceil(timings.renew_seconds))
        holder = self.leadership.holder
        me = self.leadership.identity
        if self.leadership.leading and not self.leader:
            message = f"leader: this replica ({me}) is taking over; retry after {retry} s"
        elif holder and holder != me:
            message = f"leader: this replica ({me}) is a follower; the leader is {holder}"
        else:
            message = f"leader: no leader elected right now; retry after {retry} s"
        return NotLeader(message, holder, retry)

    async def _elected(self) -> None:
        """Won the lease: rebuild the queue and reservations from the store, then place.
        (The first time, the pods read back at start are used.)"""
        found, self._found = self._found, None
        async with self._lock:
            await self._rebuild(found)
            self.leader = True
        if self.pools:
            self._pools_task = self._spawn(self.pools.run(self._lock))
        self._wake.set()

    async def _deposed(self, why: str) -> None:
        """Lost the lease: stop placing at once and drop what the next leader rebuilds."""
        self.leader = False
        for task in (self._cycle, self._pools_task):
            if task is not None and task is not asyncio.current_task():
                task.cancel()
        self._pools_task = None
        async with self._lock:
            self._drop(why)

    def _drop(self, why: str) -> None:
        for task in [*self._launching.values(), *self._runs.values(), *self._launch_tasks]:
            task.cancel()
        self._launching.clear()
        self._runs.clear()
        for launch in self.lifecycle.launches():
            self.lifecycle.finished(launch.placement.job, False, why)  # frees what it held
        for job in list(self.ledger.reservations()):  # a cycle stopped half-way
            self.ledger.forget(job)
            self.queue.release(job)
        for pending in self.queue.pending():
            self.queue.remove(pending.job.key)

    async def _rebuild(self, found: dict[str, dict[str, list[PodBound]]] | None) -> None:
        """Every active job of the store back into the queue (under the lock). The jobs the
        store says are Placed or Running on a Kubernetes member get their reservations back
        from our labelled pods instead of being requeued."""
        self._drop("rebuilding")
        if found is None:
            found = await self._read_back()
        now = self._clock()
        for record in await self.store.active_jobs():
            if record.state in ("Placed", "Running") and record.cluster in found:
                pods = found[record.cluster].pop(f"{record.tenant}/{record.name}", [])
                if pods and self._restore(record, pods, now):
                    continue
            if record.state != "Queued":
                record = await self.store.transition(
                    record.tenant, record.name, "Queued", "requeued after broker restart", now,
                    expect=(record.state,), attempts=record.attempts,
                )  # fmt: skip
                self.metrics.requeues.labels("restart").inc()
            self.queue.push(self._pending(record))
        if self.kube:
            await self._collect_garbage_locked()  # leftovers of jobs that were requeued

    # -- Kubernetes members ---------------------------------------------------------------

    async def _start_kube(self) -> dict[str, dict[str, list[PodBound]]]:
        """Connect every Kubernetes member, list it into the ledger and read our pods back
        (per reachable cluster: job key -> its pods); then start the watchers. An
        unreachable member stays stale (its jobs are requeued) until its watcher lists it."""
        if self._dispatch is None:
            return {}
        await self.kube.connect(self._on_capacity, self._launch_spec, self._dispatch)
        found: dict[str, dict[str, list[PodBound]]] = {}
        for name, member in self.kube.members.items():
            try:
                self._on_capacity(await member.watcher.list_once())
                found[name] = await member.launcher.read_back()
            except (WatchError, LaunchError, aiohttp.ClientError, OSError, TimeoutError) as exc:
                log.warning("cluster %s unreachable at start: %s", name, type(exc).__name__)
            self._spawn(member.watcher.run())
        self._check_stale()
        return found

    async def _read_back(self) -> dict[str, dict[str, list[PodBound]]]:
        """Our pods on every reachable Kubernetes member (cluster -> job key -> pods)."""
        found: dict[str, dict[str, list[PodBound]]] = {}
        for name, member in self.kube.members.items():
            try:
                found[name] = await member.launcher.read_back()
            except (LaunchError, aiohttp.ClientError, OSError, TimeoutError) as exc:
                log.warning("cluster %s: cannot read our pods back: %s", name, type(exc).__name__)
        return found

    def _restore(self, record: JobRecord, pods: list[PodBound], now: float) -> bool:
        """Rebuild a Placed/Running job's reservation from its pods read back (assume, and
        confirm a Running one); False (nothing changed) when they do not make its gang."""
        key = f"{record.tenant}/{record.name}"
        stored = record.placement or {}
        reserved = {str(p["pod"]): str(p["node"]) for p in stored.get("pods") or ()}
        if len(pods) != len(reserved):
            return False
        bound = [p for p in pods if p.node]  # the watcher counted these as pods of no job
        # A pod the cluster has not bound yet holds the node the broker reserved for it.
        pods = [p if p.node else dataclasses.replace(p, node=reserved.get(p.pod, "")) for p in pods]
        if not all(p.node for p in pods):
            return False
        cluster = pods[0].cluster
        placement = Placement(
            key,
            cluster,
            tuple(PodPlacement(p.pod, p.node, p.gpus or (), p.resources) for p in pods),
            str(stored.get("policy") or ""),
        )
        for pod in bound:  # they become the job's reservation instead
            self.ledger.apply(PodDeleted(cluster, pod.pod))
        try:
            self.ledger.assume(placement)
        except ConflictError as exc:
            log.warning("cannot restore %s: %s; requeueing", key, exc)
            for pod in bound:
                self.ledger.apply(pod)
            return False
        pending = self._pending(record)
        nodes = self.ledger.snapshot().clusters[cluster].nodes
        types = {p.node: nodes[p.node].node.gpu_type for p in placement.pods}
        self.queue.charge(key, pending.job.queue, gpu_milli_by_type(placement, types))
        self.lifecycle.placed(pending, placement, now)
        if record.state == "Running":
            self.lifecycle.all_running(key, now)
        else:  # resume waiting for the gang (creating what is missing is idempotent)
            self._launching[key] = self._spawn_launch(placement)
        log.info("restored %s %s on %s from %d pods", record.state, key, cluster, len(pods))
        return True

    def _workload_client(self, cluster: str) -> ApiClient | None:
        member = self.kube.members.get(cluster)
        return member.client if member is not None else None

    def _on_capacity(self, events: list[CapacityEvent]) -> None:
        """A watcher's events: into the ledger. Reservations a foreign pod took are rolled
        back (their pods deleted, the jobs requeued)."""
        evicted: list[str] = []
        for event in events:
            evicted.extend(self.ledger.apply(event))
        if evicted:
            self._spawn(self._evicted(evicted))
        self._wake.set()

    async def _evicted(self, jobs: list[str]) -> None:
        async with self._lock:
            now = self._clock()
            for job in jobs:
                launch = self.lifecycle.get(job)
                if launch is not None and not launch.running:
                    await self._roll_back(
                        launch.placement, now, "capacity taken by another pod", "evicted"
                    )

    def _launch_spec(self, placement: Placement) -> LaunchSpec:
        tenant, _, name = placement.job.partition("/")
        launch = self.lifecycle.get(placement.job)
        if launch is None:
            return LaunchSpec(tenant=tenant, job=name)
        job = launch.pending.job
        return LaunchSpec(
            tenant=tenant,
            job=name,
            min_member=job.min_member,
            schedule_timeout_seconds=job.schedule_timeout_seconds,
            queue=job.queue,
            pod_templates=launch.pending.pod_templates,
        )

    def _check_stale(self) -> None:
        """Mark Kubernetes members stale (no new placements) or trusted again."""
        for cc in self.kube.configs:
            stale = self.kube.stale(cc.name)
            if self.ledger.snapshot().clusters[cc.name].stale != stale:
                log.warning("cluster %s is %s", cc.name, "stale" if stale else "back")
                self.ledger.set_stale(cc.name, stale)
                self._wake.set()

    async def _collect_garbage(self) -> None:
        """Delete our objects that belong to no placed or running job (under the lock, so a
        launch cannot create pods of a job the live set missed). The leader's job only: a
        follower knows no live set."""
        async with self._lock:
            if self.leader:
                await self._collect_garbage_locked()

    async def _collect_garbage_locked(self) -> None:
        live = {launch.placement.job for launch in self.lifecycle.launches()}
        for name, member in self.kube.members.items():
            if self.kube.stale(name):
                continue
            try:
                await member.launcher.collect_garbage(live)
            except (LaunchError, aiohttp.ClientError, OSError, TimeoutError) as exc:
                log.warning("cluster %s: garbage collection failed: %s", name, exc)

    async def _kube_upkeep(self) -> None:
        """Staleness every cycle, garbage collection every garbageCollectSeconds."""
        cycle = self.config.scheduler.cycle_seconds
        every = self.config.scheduler.garbage_collect_seconds
        next_gc = time.monotonic() + every
        while True:
            await asyncio.sleep(cycle)
            self._check_stale()
            if time.monotonic() >= next_gc and self.leading:
                next_gc = time.monotonic() + every
                try:
                    await self._collect_garbage()
                except Exception:
                    log.exception("garbage collection failed; retrying later")

    def spawn_loop(self) -> None:
        """Run the scheduler loop and the leader election as tasks (cancelled by close)."""
        self._spawn(self.run())
        self._spawn(self.lead())

    async def run(self) -> None:
        """Schedule every cycleSeconds, and soon after a submission: a wake-up waits
        BATCH_SECONDS more so that a burst of submissions is decided in one cycle (one
        snapshot, one group commit of its placements) instead of one cycle each."""
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.config.scheduler.cycle_seconds)
                await asyncio.sleep(BATCH_SECONDS)
            self._wake.clear()
            if not self.leading:
                continue  # a follower (or a leader whose lease is in doubt) places nothing
            self._cycle = asyncio.ensure_future(self.schedule_once())
            try:
                await self._cycle
            except asyncio.CancelledError:
                if self._cycle.cancelled() and not _cancelling():
                    continue  # the cycle was stopped on losing the lease; the loop goes on
                raise
            except Exception:
                log.exception("scheduling cycle failed; retrying next cycle")
            finally:
                self._cycle = None

    async def close(self) -> None:
        self.ready = False
        self.leader = False
        if self.leadership.leading:
            self.leadership.leading = False
            try:
                async with asyncio.timeout(self.leadership.timings.renew_seconds):
                    await self.leadership.elector.release()
            except Exception as exc:  # it expires on its own
                log.warning("could not release the leader lease: %s", type(exc).__name__)
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        # The clients first: closing their connections ends the watch streams, whose reads
        # do not always notice a cancellation on their own.
        await self.kube.close()
        await self.pools.close()
        if self.mqtt is not None:
            await self.mqtt.close()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self.store.close()

    def _spawn_launch(self, placement: Placement) -> asyncio.Task[None]:
        task = self._spawn(self._launch(placement))
        self._launch_tasks.add(task)
        task.add_done_callback(self._launch_tasks.discard)
        return task

    async def launches_done(self, timeout: float | None = None) -> None:
        """Wait until the launches in flight have ended, their outcome recorded (tests,
        benchmarks, draining). ``_launching`` forgets a launch before its Running write,
        so the tasks themselves are waited for."""
        tasks = list(self._launch_tasks)
        if tasks:
            await asyncio.wait(tasks, timeout=timeout)

    async def runs_done(self, timeout: float | None = None) -> None:
        """Wait until the runs being watched have ended (tests)."""
        tasks = list(self._runs.values())
        if tasks:
            await asyncio.wait(tasks, timeout=timeout)

    def _spawn(self, coro: Any) -> asyncio.Task[None]:
        task: asyncio.Task[None] = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    # -- jobs -------------------------------------------------------------------------------

    def tenant(self, name: str) -> TenantConfig:
        tenant = self.config.tenant(name)
        if tenant is None:
            raise Forbidden(f"unknown tenant {name!r}")
        return tenant

    def job_for(self, tenant_name: str, manifest: FederatedJob) -> Job:
        """The Job a tenant's manifest becomes, or Forbidden (namespace, queue)."""
        tenant = self.tenant(tenant_name)
        namespace = manifest.metadata.namespace
        if namespace is not None and namespace != tenant.name:
            raise Forbidden(f"metadata.namespace: {namespace!r} is not your tenant {tenant.name!r}")
        job = to_job(manifest, tenant.name, tenant.default_queue)
        if job.queue not in tenant.allowed_queues:
            allowed = ", ".join(sorted(tenant.allowed_queues))
            raise Forbidden(f"spec.queue: tenant may not use queue {job.queue!r} ({allowed})")
        return job

    async def submit(self, tenant: str, manifest: FederatedJob) -> tuple[JobRecord, bool]:
        job = self.job_for(tenant, manifest)
        if not self.leading:
            raise self.not_leader()
        # The commit runs outside the service lock, so submissions do not wait for a
        # scheduling cycle's store writes; the queue is only touched under the lock. A cancel
        # that lands between the two is harmless: placing a cancelled job fails its
        # compare-and-set in schedule_once and the reservation is given back.
        record, created = await self.store.create_job(
            job.tenant, job.name, job.queue, job.priority, manifest.wire(), self._clock()
        )
        key = job.key
        # A Queued job not created now may be one whose creation committed while its answer
        # was lost (the store failed: 503, and the client retried): nobody queued it then.
        unqueued = record.state == "Queued" and (
            self.queue.get(key) is None
            and self.lifecycle.get(key) is None
            and key not in self.ledger.reservations()
        )
        if unqueued and self.leader:
            # Not leading any more: the job is stored, the next leader queues it.
            # No lock: push is synchronous, so no cycle can be half-way through the queue
            # (its own walk is over a copy), and taking the lock would make every submission
            # wait for the fsync of whatever cycle holds it.
            self.queue.push(self._pending(record, job))
            self._wake.set()
        return record, created

    async def get(self, tenant: str, name: str) -> JobRecord:
        record = await self.store.get_job(tenant, name)
        if record is None:
            raise NotFound(f"job {name!r} not found")
        return record

    async def cancel(self, tenant: str, name: str) -> JobRecord:
        if not self.leading:
            raise self.not_leader()
        async with self._lock:
            if not self.leader:
                raise self.not_leader()
            record = await self.get(tenant, name)
            if record.state in FINAL_STATES:
                return record
            try:
                record = await self.store.transition(
                    tenant, name, "Cancelled", "cancelled by request", self._clock(),
                    expect=ACTIVE_STATES,
                )  # fmt: skip
            except StateConflict:
                return await self.get(tenant, name)
            key = f"{tenant}/{name}"
            task = self._launching.pop(key, None)
            if task is not None:
                task.cancel()
            run = self._runs.pop(key, None)
            if run is not None:
                run.cancel()
            launch = self.lifecycle.get(key)
            self.lifecycle.cancel(key)
            self.pools.ended(key)
        # The cluster's API is called outside the lock: an unreachable cluster delays this
        # answer (bounded by the launcher's timeouts and retries), never the scheduler.
        if launch is not None:
            await self._delete(launch.placement)
        return record

    # -- scheduling -------------------------------------------------------------------------

    async def schedule_once(self, now: float | None = None) -> None:
        """One cycle: roll back expired gangs, place what fits, start the launches. ``now``
        is read inside the lock (tests pass it): a job submitted while the cycle waited for
        the lock must not look placed before it was queued."""
        async with self._lock:
            if not self.leading:
                return  # lost the lease while waiting for the lock
            if now is None:
                now = self._clock()
            self._check_stale()
            if self.pools:
                self._on_capacity(self.pools.due(now))
            for launch in self.lifecycle.expired(now):
                timeout = launch.pending.job.schedule_timeout_seconds
                self.metrics.gang_timeouts.inc()
                await self._roll_back(
                    launch.placement, now, f"gang did not start within {timeout}s", "timeout"
                )
            hiding = self.pools.hiding(self.ledger.snapshot()) if self.pools else None
            began = time.perf_counter()
            result = run_cycle(
                self.queue, self.ledger, self.policies, now, self.settings,
                lifecycle=self.lifecycle, hiding=hiding, memo=self.unplaceable,
            )  # fmt: skip
            self.metrics.cycle.observe(time.perf_counter() - began)
            self.metrics.skipped.inc(result.skipped)
            if result.cut_short:
                self.metrics.cut_short.inc()
            for seconds, policy, placed in result.decisions:
                if seconds is not None:
                    self.metrics.decision.observe(seconds)
                self.metrics.placements.labels(policy, "placed" if placed else "unplaceable").inc()
            for victim, evicted in result.preempted:
                # Already released and requeued by the lifecycle: stop watching it, delete
                # every pod of it, record why.
                self.metrics.preemptions.inc()
                self.metrics.requeues.labels("preempted").inc()
                for tasks in (self._launching, self._runs):
                    task = tasks.pop(victim.placement.job, None)
                    if task is not None:
                        task.cancel()
                await self._delete(victim.placement)
                was: JobState = "Running" if victim.running else "Placed"
                await self._record(evicted, now, expect=was)
            # The cycle's placements are recorded together, so the store can make them
            # durable in one group commit instead of one fsync each.
            written = await asyncio.gather(
                *(
                    self.store.transition(
                        p.job.tenant,
                        p.job.name,
                        "Placed",
                        f"placed on {pl.cluster} by {pl.policy or 'policy'}",
                        now,
                        cluster=pl.cluster,
                        placement=placement_json(pl),
                        expect=_QUEUED,
                        attempts=p.attempts,
                    )
                    for p, pl in result.admitted
                ),
                return_exceptions=True,
            )
            for (pending, placement), outcome in zip(result.admitted, written, strict=True):
                job = pending.job
                if isinstance(outcome, StoreUnavailable):
                    # In doubt: the write may have committed before the connection went. The
                    # reservation is held until the store answers again and says which.
                    log.warning("placement of %s in doubt: %s", job.key, outcome)
                    self._spawn(self._settle_placement(pending, placement))
                    continue
                if isinstance(outcome, BaseException):
                    # Cancelled meanwhile, or the store failed: give the capacity back.
                    self.ledger.forget(job.key)
                    self.queue.release(job.key)
                    log.warning("could not record placement of %s: %s", job.key, outcome)
                    continue
                self.lifecycle.placed(pending, placement, now)
                self.pools.placed(placement, now)
                self._launching[job.key] = self._spawn_launch(placement)
            if self.pools:
                waiting = [p.job for key in result.waiting if (p := self.queue.get(key))]
                self.pools.tick(now, self.ledger, waiting)

    async def _settle_placement(self, pending: Pending, placement: Placement) -> None:
        """A placement whose write failed with StoreUnavailable, its reservation held:
        once the store answers, launch it if the write committed after all (the job is
        Placed there, so); give the capacity back and queue the job again if it is still
        Queued; only give the capacity back otherwise (cancelled meanwhile). A replica that
        stops leading drops it with the rest: the next leader rebuilds from the store."""
        key, job = pending.job.key, pending.job
        await asyncio.sleep(STORE_RETRY_SECONDS[0])
        if not self.leader:
            return
        try:
            async for attempt in self._while_leading(StoreError, f"placement of {key} in doubt"):
                with attempt:
                    record = await self.store.get_job(job.tenant, job.name)
        except StoreError:
            return  # no longer leading: the next leader rebuilds from the store
        stored = json.loads(json.dumps(placement_json(placement)))
        async with self._lock:
            if not self.leader or self.ledger.reservations().get(key) is not placement:
                return  # dropped meanwhile (the lease was lost)
            if record is not None and record.state == "Placed" and record.placement == stored:
                log.info("placement of %s was recorded after all; launching it", key)
                now = self._clock()
                self.lifecycle.placed(pending, placement, now)
                self.pools.placed(placement, now)
                self._launching[key] = self._spawn_launch(placement)
                return
            self.ledger.forget(key)
            self.queue.release(key)
            if record is not None and record.state == "Queued":
                self.queue.push(pending)
                self._wake.set()

    async def _launch(self, placement: Placement) -> None:
        key = placement.job
        try:
            await self.launcher.launch(placement)
        except LaunchError as exc:
            async with self._lock:
                self._launching.pop(key, None)
                await self._roll_back(
                    placement, self._clock(), f"launch failed: {exc}", "launch_failed"
                )
            return
        async with self._lock:
            self._launching.pop(key, None)
            now = self._clock()
            outcome = self.lifecycle.all_running(key, now)
            launch = self.lifecycle.get(key)
        if outcome is None:
            return
        if launch is not None:
            pending = launch.pending
            wait = max(0.0, now - pending.enqueued_at)
            self.metrics.job_wait.labels(pending.job.queue).observe(wait)
        # Recorded outside the lock: many gangs start together, and their Running writes
        # then share one group commit instead of queueing one fsync each behind the lock.
        # A cancel landing meanwhile makes this write a harmless compare-and-set miss.
        await self._record(outcome, now, expect="Placed")
        async with self._lock:
            launch = self.lifecycle.get(key)
            if launch is not None and launch.running and isinstance(self.launcher, RunWatcher):
                self._runs[key] = self._spawn(self._run(self.launcher, placement))

    async def _run(self, watcher: RunWatcher, placement: Placement) -> None:
        """Wait for a running job's pods to exit, then free its capacity and record the end."""
        succeeded = await watcher.finished(placement)
        key = placement.job
        async with self._lock:
            now = self._clock()
            launch = self.lifecycle.get(key)
            ran = f" after {now - launch.placed_at:.0f}s" if launch is not None else ""
            reason = f"all pods completed{ran}" if succeeded else f"pods failed{ran}"
            outcome = self.lifecycle.finished(key, succeeded, reason)
            if outcome is not None:
                await self._record(outcome, now, expect="Running")
            # Only now: runs_done() waits for the end to be recorded, not just noticed.
            if self._runs.get(key) is asyncio.current_task():
                del self._runs[key]

    async def _delete(self, placement: Placement) -> None:
        """Delete a gang's objects; a cluster that cannot be reached now does not stop the
        job's cancel or requeue: what is left has our origin label and no live job, so the
        garbage collector removes it once the cluster answers again."""
        try:
            await self.launcher.delete(placement)
        except (LaunchError, aiohttp.ClientError, OSError, TimeoutError) as exc:
            log.warning(
                "could not delete %s in %s now (%s); garbage collection will",
                placement.job, placement.cluster, exc,
            )  # fmt: skip

    async def _roll_back(self, placement: Placement, now: float, reason: str, kind: str) -> None:
        """Delete every pod, release the reservation, requeue with backoff (or fail).
        ``kind``: the requeue reason counted in metrics (timeout, launch_failed, evicted)."""
        task = self._launching.pop(placement.job, None)
        if task is not None and task is not asyncio.current_task():
            task.cancel()
        await self._delete(placement)
        outcome = self.lifecycle.roll_back(placement.job, now, reason)
        if outcome is not None:
            if outcome.state == "Queued":
                self.metrics.requeues.labels(kind).inc()
            await self._record(outcome, now, expect="Placed")

    async def _record(self, outcome: Outcome, now: float, expect: JobState) -> None:
        tenant, _, name = outcome.job.partition("/")
        if outcome.state != "Running":
            self.pools.ended(outcome.job)
        # The database down or restarting: the write is held and retried while this
        # replica leads; a leader elected later rebuilds the job from the store.
        what = f"{outcome.state} of {outcome.job} not recorded yet"
        try:
            async for attempt in self._while_leading(StoreUnavailable, what):
                with attempt:
                    await self.store.transition(
                        tenant, name, outcome.state, outcome.reason, now, expect=(expect,),
                        attempts=outcome.attempts if outcome.state != "Running" else None,
                        not_before=outcome.not_before,
                    )  # fmt: skip
        except StateConflict:  # also a retried write whose first try committed
            log.info("job %s changed meanwhile; %s not recorded", outcome.job, outcome.state)
        except LeaseLost as exc:  # fenced: another replica leads; it rebuilds the job
            log.warning("%s of %s not recorded: %s", outcome.state, outcome.job, exc)
        except StoreUnavailable as exc:
            log.warning("%s of %s not recorded (%s); no longer leading", outcome.state,
                        outcome.job, exc)  # fmt: skip
        self._wake.set()

    def _while_leading(self, retry_on: type[StoreError], what: str) -> AsyncRetrying:
        """Retries of a store call that failed with ``retry_on``, STORE_RETRY_SECONDS
        apart (doubling), for as long as this replica leads; then the error is raised."""

        def retry(state: RetryCallState) -> bool:
            outcome = state.outcome
            return (
                outcome is not None and outcome.failed and self.leader
                and isinstance(outcome.exception(), retry_on)
            )  # fmt: skip

        def announce(state: RetryCallState) -> None:
            exc = state.outcome.exception() if state.outcome else None
            pause = state.next_action.sleep if state.next_action else 0.0
            log.warning("%s (%s); retrying in %.1f s", what, exc, pause)

        first, cap = STORE_RETRY_SECONDS
        return AsyncRetrying(
            retry=retry, wait=wait_exponential(multiplier=first, max=cap),
            before_sleep=announce, reraise=True,
        )  # fmt: skip

    def _pending(self, record: JobRecord, job: Job | None = None) -> Pending:
        """The queue entry of a stored job; its Job is rebuilt from the stored manifest
        unless the caller (a fresh submission) already has it."""
        if job is None:
            manifest = parse_manifest(json.dumps(record.manifest).encode(), "application/json")
            job = to_job(manifest, record.tenant, record.queue)
        return Pending(
            job,
            record.seq,
            record.created_at,
            record.attempts,
            record.not_before or 0.0,
            pod_templates(record.manifest),
        )

    # -- reads ------------------------------------------------------------------------------

    def explain_job(self, job: Job) -> list[dict[str, Any]]:
        """Per cluster: does the job fit now, why not, and the largest gang it could take."""
        pending = Pending(job, 0, 0.0)
        policy = self.policies.for_job(pending)
        snapshot = self.ledger.snapshot()
        out: list[dict[str, Any]] = []
        for name in sorted(snapshot.clusters):
            view = snapshot.clusters[name]
            decision = policy.decide(job, _Only(view, snapshot.version))
            reasons = decision.for_cluster(name) if isinstance(decision, Unplaceable) else ()
            out.append({
                "cluster": name,
                "fits": isinstance(decision, Placement),
                "reasons": [{"code": str(r.code), "message": r.message} for r in reasons],
                "largestFit": largest_fit(job, view),
            })  # fmt: skip
        return out

    async def explain(self, tenant: str, name: str) -> dict[str, Any]:
        record = await self.get(tenant, name)
        pending = self.queue.get(f"{tenant}/{name}")
        clusters = self.explain_job(pending.job) if pending is not None else []
        return {
            "job": name,
            "state": record.state,
            "cluster": record.cluster,
            "reason": record.reason,
            "clusters": clusters,
        }

    def plan(self, tenant: str, manifest: FederatedJob) -> dict[str, Any]:
        """Dry run: where the manifest would go now. Nothing is stored or reserved."""
        job = self.job_for(tenant, manifest)
        decision = self.policies.for_job(Pending(job, 0, 0.0)).decide(job, self.ledger.snapshot())
        placed = isinstance(decision, Placement)
        return {
            "job": job.name,
            "queue": job.queue,
            "fits": placed,
            "cluster": decision.cluster if isinstance(decision, Placement) else None,
            "pods": len(decision.pods) if isinstance(decision, Placement) else 0,
            "clusters": self.explain_job(job),
        }

    def clusters(self) -> list[dict[str, Any]]:
        snapshot = self.ledger.snapshot()
        reserved: dict[tuple[str, str], int] = {}
        for placement in self.ledger.reservations().values():
            nodes = snapshot.clusters[placement.cluster].nodes
            for pod in placement.pods:
                key = (placement.cluster, str(nodes[pod.node].node.gpu_type or ""))
                reserved[key] = reserved.get(key, 0) + pod.resources.gpu_request_milli
        out: list[dict[str, Any]] = []
        for name in sorted(snapshot.clusters):
            view = snapshot.clusters[name]
            by_type: dict[str, dict[str, float]] = {}
            for group in view.groups():
                gpu_type = str(group[0] or "")
                if not gpu_type:
                    continue
                row = by_type.setdefault(gpu_type, {"total": 0, "free": 0.0, "largestGang": 0})
                row["total"] += view.gpus_total(group)
                row["free"] += view.free_milli(group) / 1000
                row["largestGang"] += sum(
                    count * (whole // GANG_GPUS) for whole, count in view.whole_histogram(group)
                )
            types = []
            for gpu_type, row in sorted(by_type.items()):
                held = reserved.get((name, gpu_type), 0) / 1000
                types.append({
                    "gpuType": gpu_type, "total": int(row["total"]), "free": row["free"],
                    "reserved": held, "allocated": row["total"] - row["free"] - held,
                    "largestGang": int(row["largestGang"]), "gangGpusPerPod": GANG_GPUS,
                })  # fmt: skip
            out.append({
                "cluster": name, "kind": view.cluster.kind, "stale": view.stale,
                "labels": dict(view.cluster.labels), "gpuTypes": types,
                **self.kube.watch_status(name),
                **(self.mqtt.watch_status(name) if self.mqtt is not None else {}),
            })  # fmt: skip
        return out

    def capacity_metrics(self, clusters: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Per cluster and GPU type: total GPUs, GPUs of the largest 8-GPU-pod gang placeable
        now, and stranded GPUs (free, on nodes where no pod of any pending job fits; none
        while nothing waits). ``clusters``: the rows of ``clusters()``."""
        stranded = stranded_gpus(self.ledger.snapshot(), [p.job for p in self.queue.pending()])
        return [
            {"cluster": c["cluster"], "gpuType": t["gpuType"], "total": t["total"],
             "largestGangGpus": t["largestGang"] * t["gangGpusPerPod"],
             "stranded": stranded.get((str(c["cluster"]), str(t["gpuType"])), 0.0)}
            for c in clusters
            for t in c["gpuTypes"]
        ]  # fmt: skip

    def queue_metrics(self) -> list[dict[str, Any]]:
        """Per queue: the GPUs its pending jobs ask for, and how long its oldest pending gang
        has waited (seconds since submission; 0 when none waits)."""
        now = self._clock()
        rows: dict[str, dict[str, Any]] = {
            q.name: {"queue": q.name, "pendingGpus": 0.0, "oldestGangSeconds": 0.0}
            for q in self.queue.queues()
        }
        for pending in self.queue.pending():
            job = pending.job
            row = rows.setdefault(
                job.queue, {"queue": job.queue, "pendingGpus": 0.0, "oldestGangSeconds": 0.0}
            )
            row["pendingGpus"] += job.gpu_request_milli / 1000
            if job.total_pods > 1:
                waited = max(0.0, now - pending.enqueued_at)
                row["oldestGangSeconds"] = max(row["oldestGangSeconds"], waited)
        return list(rows.values())

    def burst(self, tenant: str | None) -> dict[str, Any]:
        """Burst pools, gangs waiting for burst nodes and burst cost per job; ``tenant``
        limits the jobs to one tenant's (None: all, for an admin)."""
        controller = self.pools.controller

        def mine(job: str) -> bool:
            return tenant is None or job.partition("/")[0] == tenant

        return {
            "pools": self.pools.rows(),
            "requests": [r for r in controller.requests() if mine(str(r["job"]))],
            "jobs": [
                {"job": job, "nodeHours": round(seconds / 3600.0, 4),
                 "cost": round(controller.job_cost.get(job, 0.0), 4)}
                for job, seconds in sorted(controller.job_node_seconds.items())
                if mine(job)
            ],
        }  # fmt: skip

    def queues(self) -> list[dict[str, Any]]:
        return [
            {"name": q.name, "policy": q.policy, "priority": q.priority, "weight": q.weight,
             "quota": dict(q.quota or {}), "borrow": q.borrow, "reclaimable": q.reclaimable,
             "pending": len(self.queue.pending(q.name)),
             "usage": {t: m / 1000 for t, m in self.queue.usage(q.name).items()}}
            for q in self.queue.queues()
        ]  # fmt: skip


def _cancelling() -> bool:
    """Whether the current task itself is being cancelled (not just something it awaited)."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


__all__ = [
    "FINAL_STATES",
    "Forbidden",
    "Launcher",
    "NotFound",
    "NotLeader",
    "RunWatcher",
    "Service",
    "placement_json",
]
