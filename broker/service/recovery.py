"""Recovery: state rebuilt from the store after a start or a takeover, and garbage collection.

``Recovery`` owns what happens when this replica wins or loses the lease. Won: every active
job of the store goes back into the queue as Queued (durability: simulated pods died with
the process), except the Placed/Running jobs whose pods are read back from a Kubernetes
member: their reservations are restored from those pods (a Placed one's launch resumed as
an adoption, a Running one's run watched again; their failures take the one launch-failure
path, ``Binding.failed``). A job that cannot be adopted (its pods or stored placement
unreadable, any exception) and the jobs of a member whose pods cannot be read back are
requeued like the rest, their objects left to the garbage collection that ends the rebuild.
A pinned workload job is restored from its workload object instead (the plan recorded on
it, its pods as they stand: ``restore_workloads``), so one whose first pods finished while
the broker was away, their successors gated, goes on as it was, nothing deleted or rerun.
Jobs finished within the retention go back into the ``FinishedPods`` book: their pods are
no garbage. Lost: stop placing at once and drop the state the next leader rebuilds. It also
connects the Kubernetes members at start, keeps their staleness current, and deletes our
objects that belong to no live job.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import gc
import logging
import time
from collections.abc import AsyncGenerator, Iterator
from typing import TYPE_CHECKING, NamedTuple

import aiohttp

from broker.core.ledger import ConflictError
from broker.core.queue import Pending, gpu_milli_by_type
from broker.model import Placement, PodBound, PodDeleted
from broker.ports import LaunchError, WatchError, WorkloadFound
from broker.service.binding import Binding
from broker.service.cycle import Cycles
from broker.service.failures import Failure, report
from broker.service.finished_pods import MAX_KEPT
from broker.service.members import ClusterLauncher
from broker.service.restore_workloads import pods_adoptable, workload_adoptable
from broker.service.state import Shared, pending_of
from broker.store import FINAL_STATES, JobRecord

if TYPE_CHECKING:
    from kubernetes.aio.client import ApiClient

log = logging.getLogger(__name__)

Found = dict[str, dict[str, list[PodBound]]]  # cluster -> job key -> our pods read back
Workloads = dict[str, dict[str, WorkloadFound]]  # cluster -> job key -> its workload read back
_UNREACHABLE = (LaunchError, aiohttp.ClientError, OSError, TimeoutError)
# Active jobs read, and requeued in one transaction, at a time: larger pages mean fewer
# commits and loop-thread hand-offs, for two pages of records in memory (docs/benchmarks.md).
REBUILD_PAGE = 4000
ENTRIES_PER_TURN = 100  # queue entries built (about 1 ms) between two turns of the loop
RESTART_REASON = "requeued after broker restart"
REBUILT_LOG = "state rebuilt from the store: %d active jobs in %.3f s, %d restored from their pods"


async def _entries(records: list[JobRecord]) -> list[Pending]:
    """The records' queue entries, handing the loop back every ENTRIES_PER_TURN of them so
    a write in flight (the page's batch) goes on meanwhile instead of after them all."""
    entries = []
    for i, record in enumerate(records):
        if i and not i % ENTRIES_PER_TURN:
            await asyncio.sleep(0)
        entries.append(pending_of(record))
    return entries


class Rebuilt(NamedTuple):
    """A rebuild's active jobs read, restored from their pods, and requeued from running."""

    jobs: int
    restored: int
    requeued: int


@dataclasses.dataclass(slots=True)
class _Requeue:
    """A page of the rebuild: jobs to queue, those to move to Queued first, that write."""

    queued: list[JobRecord]
    stale: list[JobRecord]
    write: asyncio.Future[list[JobRecord]]


async def _cancelled(requeues: list[_Requeue]) -> None:
    """The batches still in flight cancelled, and settled (written or not) before the error
    goes on: nothing of the rebuild is left running behind it."""
    writes = [r.write for r in requeues]
    for write in writes:
        write.cancel()
    await asyncio.gather(*writes, return_exceptions=True)


@contextlib.contextmanager
def _collector_paused() -> Iterator[None]:
    """The cyclic collector off while a rebuild loads every live job: its passes would walk
    the growing heap again and again; what the rebuild keeps is frozen out of later passes
    afterwards (``broker.process.settle_heap``), and reference counting frees the rest."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


class Recovery:
    """Takeover and loss of the lease, Kubernetes members' start and upkeep."""

    def __init__(self, shared: Shared, binding: Binding, cycles: Cycles) -> None:
        self.s = shared
        self.binding = binding
        self.cycles = cycles
        self.found: Found | None = None  # read back at start, for the first election
        self._workloads: Workloads = {}  # read back with the pods (pin mode's workloads)
        self._pools: asyncio.Task[None] | None = None
        self.rebuilt: Rebuilt | None = None  # the last rebuild's, for the demo's banner

    async def elected(self) -> None:
        """Won the lease: rebuild the queue and reservations from the store, then place.
        (The first time, the pods read back at start are used, and the agents' read now.)"""
        s = self.s
        found, self.found = self.found, None
        if found is not None:
            await self._read_back_agents(found)
        s.active.clear()  # another replica may have led meanwhile: counts are read again
        async with s.lock:
            started = time.perf_counter()
            with _collector_paused():
                self.rebuilt = rebuilt = await self._rebuild(found)
            s.rebuilt = True
        # The restart benchmark (broker/bench/restart.py) reads this line: keep its shape.
        log.info(REBUILT_LOG, rebuilt.jobs, time.perf_counter() - started, rebuilt.restored)
        if s.pools:
            self._pools = s.tasks.keep("burst-pools", lambda: s.pools.run(s.lock))
        s.wake.set()

    async def deposed(self, why: str) -> None:
        """Lost the lease: stop placing at once and drop what the next leader rebuilds."""
        s = self.s
        s.rebuilt = False
        s.active.clear()
        s.finished_pods.clear()
        for task in (self.cycles.current, self._pools):
            if task is not None and task is not asyncio.current_task():
                task.cancel()
        self._pools = None
        async with s.lock:
            self._drop(why)

    def _drop(self, why: str) -> None:
        s = self.s
        self.binding.drop()
        for launch in s.lifecycle.launches():
            s.lifecycle.finished(launch.placement.job, False, why)  # frees what it held
        for job in list(s.ledger.reservations()):  # a cycle stopped half-way
            s.ledger.forget(job)
            s.queue.release(job)
        for pending in s.queue.pending():
            s.queue.remove(pending.job.key)

    async def _rebuild(self, found: Found | None) -> Rebuilt:
        """Every active job of the store back into the queue (under the lock). The jobs the
        store says are Placed or Running on a Kubernetes member get their reservations back
        from our labelled pods instead of being requeued."""
        s = self.s
        self._drop("rebuilding")
        if found is None:
            found = await self._read_back()
        now = s.clock()
        jobs = restored = requeued = 0
        # Paged by seq, and each page's requeues written as one batch: time to ready grows
        # per job by reading it, not by a commit of its own; memory by three pages at a time.
        # Two batches are in flight: the store writes the next page's while this one's
        # entries are built and pushed, so its writer never waits for the loop.
        in_flight: list[_Requeue] = []  # oldest first; each settled before it leaves
        try:
            async with contextlib.aclosing(self._pages()) as pages:
                async for page in pages:
                    jobs += len(page)
                    in_flight.append(self._requeue(page, found, now))
                    restored += len(page) - len(in_flight[-1].queued)
                    requeued += len(in_flight[-1].stale)
                    if len(in_flight) > 1:
                        await self._settle(in_flight[0])
                        del in_flight[0]
            while in_flight:
                await self._settle(in_flight[0])
                del in_flight[0]
        except BaseException:  # a stored spec the rules refuse now: the batches settled first
            await _cancelled(in_flight)
            raise
        book = s.finished_pods  # the pods of jobs finished within the retention: no garbage
        book.restore(await s.store.finished_since(book.cutoff(), MAX_KEPT))
        if s.kube:
            await self._collect_garbage_locked()  # leftovers of jobs that were requeued
        return Rebuilt(jobs, restored, requeued)

    async def _pages(self) -> AsyncGenerator[list[JobRecord], None]:
        """The active jobs by seq, a page at a time, the next page read while the caller
        works on this one (the store's reads run off the event loop)."""
        store = self.s.store
        page = await store.active_jobs(limit=REBUILD_PAGE)
        while page:
            ahead = asyncio.ensure_future(
                store.active_jobs(after_seq=page[-1].seq, limit=REBUILD_PAGE)
            )
            try:
                yield page
            except BaseException:  # the caller stopped early (an error): not left behind
                ahead.cancel()
                await asyncio.gather(ahead, return_exceptions=True)
                raise
            page = await ahead

    def _requeue(self, page: list[JobRecord], found: Found, now: float) -> _Requeue:
        """One page of active jobs: restored from their pods, or to be requeued; the stale
        ones' move to Queued starts (one batch, on the store's thread or server)."""
        queued = [r for r in page if not self._restored(r, found, now)]
        stale = [r for r in queued if r.state != "Queued"]
        write = asyncio.ensure_future(
            self.s.store.transition_many(stale, "Queued", RESTART_REASON, now)
        )
        return _Requeue(queued, stale, write)

    async def _settle(self, requeue: _Requeue) -> None:
        """A page's queue entries, built while its batch is written (a move to Queued
        changes nothing they are built from), pushed in the page's order once the batch
        is stored."""
        s = self.s
        entries = await _entries(requeue.queued)
        moved = {r.seq for r in await requeue.write}
        s.metrics.requeues.labels("restart").inc(len(moved))
        for record, pending in zip(requeue.queued, entries, strict=True):
            if record.state == "Queued" or record.seq in moved:
                s.queue.push(pending)
        for record in requeue.stale:  # not moved: changed since the page was read
            if record.seq not in moved:
                await self._changed_meanwhile(record.tenant, record.name)

    def _restored(self, record: JobRecord, found: Found, now: float) -> bool:
        """A Placed/Running job given its reservation back from its pods read back. One
        that cannot be (its stored placement or its pods unreadable) is requeued as the
        others are, its objects left to the garbage collection at the end of the rebuild."""
        if record.state not in ("Placed", "Running") or record.cluster not in found:
            return False
        key = f"{record.tenant}/{record.name}"
        pods = found[record.cluster].pop(key, [])
        workload = self._workloads.get(record.cluster, {}).pop(key, None)
        if workload is not None and not workload.delegated:  # from its plan and its pods
            return self._restore_workload(record, workload, now)
        if workload is not None and workload.plan_error:
            return False
        # A delegated workload may have fewer live pods than its placement: some finished.
        partial = workload is not None
        if not pods and not partial:
            return False
        running = record.state == "Running" or (workload is not None and workload.end is not None)
        try:
            adoptable = pods_adoptable(record, pods, self.s.ledger.counted, partial, running)
        except Exception as exc:  # any: the rebuild goes on, the job is requeued
            report(self.s.metrics, key, record.cluster or "", Failure.of(exc, "adopt"), exc)
            return False
        return adoptable is not None and self._restore(record, *adoptable, now, running)

    def _restore_workload(self, record: JobRecord, found: WorkloadFound, now: float) -> bool:
        """A pinned workload job restored as it was (``restore_workloads``): Running when
        it was, or when its workload ended meanwhile (its end is then read at once); a
        running job's slots no live pod holds released until their successors bind."""
        cluster, key = record.cluster or "", f"{record.tenant}/{record.name}"
        try:
            adoptable = workload_adoptable(record, found, cluster)
        except Exception as exc:  # any: the rebuild goes on, the job is requeued
            report(self.s.metrics, key, cluster, Failure.of(exc, "adopt"), exc)
            return False
        if adoptable is None:
            return False
        running = record.state == "Running" or found.end is not None
        bound = list(adoptable.bound)
        if not self._restore(record, adoptable.pending, adoptable.placement, bound, now, running):
            return False
        if running:  # as the watch releases a finished pod's slot
            for pod in adoptable.idle:
                self.s.ledger.apply(PodDeleted(cluster, pod))
        return True

    async def _changed_meanwhile(self, tenant: str, name: str) -> None:
        """A job the batch skipped (another writer moved it after the page was read):
        queued if it is Queued now; anything else is that writer's to settle."""
        record = await self.s.store.get_job(tenant, name)
        if record is not None and record.state == "Queued":
            self.s.queue.push(pending_of(record))
        elif record is not None and record.state not in FINAL_STATES:
            log.warning("job %s/%s became %s during the rebuild", tenant, name, record.state)

    async def start_kube(self, dispatch: ClusterLauncher | None) -> None:
        """Connect every Kubernetes member, list it into the ledger and read our pods back
        (kept for the first election); then start the watchers and their upkeep. An
        unreachable member stays stale (its jobs are requeued) until its watcher lists it.
        Agent-fed members are read back at the election (their agents answer over MQTT,
        which starts after this)."""
        s = self.s
        if dispatch is None:
            return
        if s.kube.configs:
            await s.kube.connect(self.binding.on_capacity, self.binding.launch_spec, dispatch)
        found: Found = {}
        for name, member in s.kube.members.items():
            try:
                self.binding.on_capacity(await member.watcher.list_once())
                pods = await member.launcher.read_back()
                self._workloads[name] = await member.launcher.read_back_workloads()
                found[name] = pods
            except Exception as exc:  # any: the member is left stale, its jobs requeued
                self._unread(name, "unreachable at start", exc)
            s.tasks.keep(f"watch {name}", member.watcher.run)
            s.tasks.keep(f"runtimes {name}", member.runtimes.run)
        s.check_stale()
        self.found = found
        s.tasks.keep("kube-upkeep", self._kube_upkeep)

    async def _read_back(self) -> Found:
        """Our pods (and pinned workloads) on every reachable Kubernetes member."""
        found: Found = {}
        self._workloads = {}
        for name, member in self.s.kube.members.items():
            try:
                pods = await member.launcher.read_back()
                self._workloads[name] = await member.launcher.read_back_workloads()
                found[name] = pods
            except Exception as exc:  # any: as an unreachable member, its jobs requeued
                self._unread(name, "cannot read our pods back", exc)
        await self._read_back_agents(found)
        return found

    async def _read_back_agents(self, found: Found) -> None:
        """Our pods and workloads through each launching agent, all at once (each bounded
        by the agent's read timeout). One that does not answer is down: its jobs are
        requeued, and it takes no placement until a collection through it succeeded."""
        agents = self.s.kube.agents

        async def read(name: str) -> None:
            launcher = agents[name].launcher
            try:
                pods = await launcher.read_back()
                self._workloads[name] = await launcher.read_back_workloads()
                found[name] = pods
            except Exception as exc:  # any: as an unreachable member, its jobs requeued
                self.s.kube.dirty.add(name)
                self._unread(name, "cannot read our pods back", exc)
                return
            # Its agent answered (so it is heard) with what runs there: the jobs restored
            # from it are live, the rest is collected at the end of the rebuild, before any
            # placement (and should that collection fail, it is dirty again).
            self.s.kube.dirty.discard(name)

        await asyncio.gather(*(read(name) for name in agents))
        self.s.check_stale()

    def _unread(self, cluster: str, what: str, exc: Exception) -> None:
        """A member whose pods could not be read back: its jobs are requeued, not adopted
        (said once; an unexpected exception with its traceback, and counted)."""
        if isinstance(exc, (WatchError, *_UNREACHABLE)):
            log.warning("cluster %s %s: %s", cluster, what, type(exc).__name__)
            return
        self.s.metrics.launch_failures.labels(cluster, "adopt", "error").inc()
        log.error("cluster %s %s: %s", cluster, what, type(exc).__name__, exc_info=exc)

    def _restore(
        self,
        record: JobRecord,
        pending: Pending,
        placement: Placement,
        bound: list[PodBound],
        now: float,
        running: bool,
    ) -> bool:
        """Rebuild a Placed/Running job's reservation from its pods read back (assume, and
        confirm a ``running`` one); False (nothing changed) when the ledger cannot take it."""
        s, key, cluster = self.s, placement.job, placement.cluster
        for pod in bound:  # they become the job's reservation instead
            s.ledger.apply(PodDeleted(cluster, pod.pod))
        try:
            s.ledger.assume(placement)
        except ConflictError as exc:
            log.warning("cannot restore %s: %s; requeueing", key, exc)
            for pod in bound:
                s.ledger.apply(pod)
            return False
        for pod in bound:  # bound where it runs: no guess a gang scheduler's choice moves
            s.ledger.apply(pod)
        types = s.ledger.gpu_types(placement)  # no snapshot: see Ledger.gpu_types
        s.queue.charge(key, pending.job.queue, gpu_milli_by_type(placement, types))
        s.lifecycle.placed(pending, placement, now)
        if running:
            s.lifecycle.all_running(key, now)
            self.binding.watch_run(placement)  # its end is still to be seen
        else:  # resume waiting for the gang (creating what is missing is idempotent)
            self.binding.start_launch(placement, "adopt")
        # One line per job at debug: a restart of 100,000 running jobs sums them (REBUILT_LOG).
        log.debug(
            "restored %s %s on %s from %d pods", record.state, key, cluster, len(placement.pods)
        )
        return True

    def workload_client(self, cluster: str) -> ApiClient | None:
        """The API client of a Kubernetes member (a Cluster API pool labels its nodes)."""
        member = self.s.kube.members.get(cluster)
        return member.client if member is not None else None

    async def _collect_garbage(self) -> None:
        """Delete our objects that belong to no placed or running job (under the lock, so a
        launch cannot create pods of a job the live set missed). The leader's job only: a
        follower knows no live set."""
        async with self.s.lock:
            if self.s.rebuilt:
                await self._collect_garbage_locked()

    async def _collect_garbage_locked(self) -> None:
        """Per member: our objects whose job is not live on that member (``Failover``)."""
        await self.cycles.failover.collect()

    async def _kube_upkeep(self) -> None:
        """Staleness every cycle (a member back from staleness garbage-collected at once),
        garbage collection every garbageCollectSeconds."""
        cycle = self.s.config.scheduler.cycle_seconds
        every = self.s.config.scheduler.garbage_collect_seconds
        next_gc = time.monotonic() + every
        while True:
            await asyncio.sleep(cycle)
            self.s.check_stale()
            if self.s.kube.returned() and self.s.leading:
                async with self.s.lock:  # a member back: cleaned, then trusted again
                    if self.s.rebuilt:
                        await self.cycles.failover.clean_returned()
            if time.monotonic() >= next_gc and self.s.leading:
                next_gc = time.monotonic() + every
                try:
                    await self._collect_garbage()
                except Exception:
                    log.exception("garbage collection failed; retrying later")


__all__ = ["Found", "Recovery"]
