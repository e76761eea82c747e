"""Binding placed jobs to clusters: launch, run watch, delete, roll back, record outcomes.

``Binding`` owns the tasks of each job after it was placed: its launch (all pods running ->
Running; a gang timeout -> delete the pods, release the reservation, requeue with backoff),
the watch of its run (pods ended -> Succeeded or Failed, capacity freed), and the store
writes of those outcomes, retried while this replica leads (``while_leading``). Any
exception while a job is launched, adopted after a restart or followed while it runs goes
down one path, ``failed`` (invariant 9: no stranded capacity): said once in the log and
the metrics (``failures``), then the job is rolled back, its objects deleted, and requeued
with backoff, or failed once its member refused it ``launchRefusalLimit`` times. It also
takes the capacity events of the members (``on_capacity``): reservations a foreign pod
took are rolled back.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

import aiohttp
from tenacity import AsyncRetrying, RetryCallState, wait_exponential

from broker.core.lifecycle import Launch, Outcome
from broker.manifest import workload_spec
from broker.model import CapacityEvent, Job, Placement
from broker.ports import (
    Domains,
    LaunchError,
    LaunchSpec,
    RunEnd,
    RunHandle,
    RunNotifier,
    RunWatcher,
)
from broker.service.failures import Failure, Stage, cut, report
from broker.service.launch_domains import placed_domains
from broker.service.state import Shared
from broker.store import JobState, LeaseLost, StateConflict, StoreError, StoreUnavailable

log = logging.getLogger(__name__)

# A job change the store could not take (StoreUnavailable) is retried after the first delay,
# doubling up to the second.
STORE_RETRY_SECONDS = (0.2, 2.0)
_DELETE_FAILURES = (LaunchError, aiohttp.ClientError, OSError, TimeoutError)


def end_reason(end: RunEnd, ran: str) -> str:
    """The history's reason for a run's end: the member's reason and message when it gave
    them (a workload's status), else what the pods did; ``ran`` says for how long."""
    if not end.reason:
        return f"all pods completed{ran}" if end.succeeded else f"pods failed{ran}"
    said = f"{end.reason}: {end.message}" if end.message else end.reason
    return f"{cut(said)}{ran}"


class _Unwatched:
    """The handle of a run whose watch could not even start (its failure is under way)."""

    __slots__ = ()

    def cancel(self) -> None:
        return None


class _Ended:
    """A watched run's end callback: one small object per running job where a closure kept
    six (its function and cells) for the collector to walk. The end counts only
    while ``handle`` is still the job's watch (not stopped, not replaced meanwhile)."""

    __slots__ = ("binding", "handle", "placement")

    def __init__(self, binding: Binding, placement: Placement) -> None:
        self.binding, self.placement = binding, placement
        self.handle: RunHandle | None = None

    def __call__(self, end: RunEnd) -> None:
        b, key, handle = self.binding, self.placement.job, self.handle
        if handle is not None and b.runs.get(key) is handle:
            b.s.tasks.spawn(f"end {key}", b.end(self.placement, end, handle))


class Binding:
    """The launches and runs in flight, one task each, and their outcomes."""

    def __init__(self, shared: Shared) -> None:
        self.s = shared
        self.launching: dict[str, asyncio.Task[None]] = {}
        self._launch_tasks: set[asyncio.Task[None]] = set()
        # Running jobs being watched: a callback's handle (RunNotifier launchers) or the
        # task awaiting ``finished`` (other RunWatchers); dropped once the end is recorded.
        self.runs: dict[str, RunHandle] = {}
        self._run_ended = asyncio.Event()
        # Launches the lifecycle has already forgotten (cancelled, preempted) whose objects
        # are being deleted: the launcher still needs their spec (a workload job's kind).
        self._deleting: dict[str, Launch] = {}
        # The domains of placed topology gangs (job -> its placement and them), read once:
        # the spec is asked for at every launch, watch and delete.
        self._domains: dict[str, tuple[Placement, dict[str, Domains]]] = {}

    def launch_spec(self, placement: Placement) -> LaunchSpec:
        """What the launcher needs besides the placement; the Pod Security level is the
        tenant's (its member namespace is labelled to enforce it); a ``spec.workload`` job
        carries its object and where each pod set's template sits in it."""
        tenant, _, name = placement.job.partition("/")
        config = self.s.config.tenant(tenant)
        level = config.pod_security if config is not None else "baseline"
        launch = self.s.lifecycle.get(placement.job) or self._deleting.get(placement.job)
        if launch is None:
            return LaunchSpec(tenant=tenant, job=name, pod_security=level)
        job, workload = launch.pending.job, launch.pending.workload
        return LaunchSpec(
            tenant=tenant,
            job=name,
            min_member=job.min_member,
            schedule_timeout_seconds=job.schedule_timeout_seconds,
            queue=job.queue,
            pod_templates=launch.pending.pod_templates,
            pod_security=level,
            pod_sets=tuple(ps.name for ps in job.pod_sets),
            master_port=launch.pending.master_port,
            workload=None if workload is None else workload_spec(workload),
            generation=launch.pending.attempts,
            domains=self._domains_of(job, placement),
        )

    def _domains_of(self, job: Job, placement: Placement) -> dict[str, Domains]:
        """The domains its pod sets with a topology request were placed in
        (``placed_domains``), read once per placement; {} without a request."""
        if all(ps.topology is None for ps in job.pod_sets):
            return {}
        known = self._domains.get(placement.job)
        if known is None or known[0] != placement:
            life, deleting = self.s.lifecycle, self._deleting
            for key in [k for k in self._domains if life.get(k) is None and k not in deleting]:
                del self._domains[key]  # kept only while the job's launch is known
            found = placed_domains(job, placement, self.s.ledger.snapshot())
            known = self._domains[placement.job] = (placement, found)
        return known[1]

    def start_launch(self, placement: Placement, stage: Stage = "launch") -> None:
        """Launch a placed gang in its own task (under the lock); ``adopt``: a gang a
        restarted broker found placed, whose objects the launch adopts or completes."""
        task = self.s.tasks.spawn(f"launch {placement.job}", self._launch(placement, stage))
        self._launch_tasks.add(task)
        task.add_done_callback(self._launch_tasks.discard)
        self.launching[placement.job] = task

    def stop(self, job: str) -> None:
        """Stop launching and watching ``job`` (cancelled, preempted: under the lock)."""
        task = self.launching.pop(job, None)
        if task is not None:
            task.cancel()
        run = self.runs.pop(job, None)
        if run is not None:
            run.cancel()
            self._run_ended.set()

    def drop(self) -> None:
        """Stop every launch and run watch (the lease was lost, or state is rebuilt)."""
        for task in [*self.launching.values(), *self._launch_tasks]:
            task.cancel()
        for run in self.runs.values():
            run.cancel()
        self.launching.clear()
        self.runs.clear()
        self._run_ended.set()

    async def launches_done(self, timeout: float | None = None) -> None:
        """Wait until the launches in flight have ended, their outcome recorded.
        ``launching`` forgets a launch before its Running write, so the tasks themselves
        are waited for."""
        tasks = list(self._launch_tasks)
        if tasks:
            await asyncio.wait(tasks, timeout=timeout)

    async def runs_done(self, timeout: float | None = None) -> None:
        """Wait until no run is watched any more (each end recorded), or ``timeout``."""
        try:
            async with asyncio.timeout(timeout):
                while self.runs:
                    self._run_ended.clear()
                    await self._run_ended.wait()
        except TimeoutError:
            return

    async def _launch(self, placement: Placement, stage: Stage) -> None:
        s, key = self.s, placement.job
        try:
            await s.launcher.launch(placement)
        except Exception as exc:  # any: nothing may leave the gang holding its capacity
            await self.failed(placement, exc, stage)
            return

        def started() -> tuple[float, Outcome | None, Launch | None]:
            self.launching.pop(key, None)
            now = s.clock()
            return now, s.lifecycle.all_running(key, now), s.lifecycle.get(key)

        # Synchronous sections under the lock: see StateLock.call (no loop turn per launch).
        now, outcome, launch = await s.lock.call(started)
        if outcome is None:
            return
        if launch is not None:
            pending = launch.pending
            wait = max(0.0, now - pending.enqueued_at)
            s.metrics.job_wait.labels(pending.job.queue).observe(wait)
        # Recorded outside the lock: many gangs start together, and their Running writes
        # then share one group commit instead of queueing one fsync each behind the lock.
        # A cancel landing meanwhile makes this write a harmless compare-and-set miss.
        await self.record(outcome, now, expect="Placed")

        def watch() -> None:
            launch = s.lifecycle.get(key)
            if launch is not None and launch.running:
                self.watch_run(placement)

        await s.lock.call(watch)

    def watch_run(self, placement: Placement) -> None:
        """Watch a running job for its end (under the lock): a callback where the launcher
        offers one (no task per running job), else a task awaiting ``finished``. A watch
        that cannot start fails the run as one that broke later does."""
        s, key = self.s, placement.job
        launcher = s.launcher
        if isinstance(launcher, RunNotifier):
            ended = _Ended(self, placement)
            try:
                ended.handle = self.runs[key] = launcher.watch(placement, ended)
            except Exception as exc:
                ended.handle = self.runs[key] = _Unwatched()
                ended(RunEnd(False, error=exc))
        elif isinstance(launcher, RunWatcher):
            self.runs[key] = s.tasks.spawn(f"run {key}", self._run(launcher, placement))

    async def _run(self, watcher: RunWatcher, placement: Placement) -> None:
        """Wait for a running job's pods to exit, then record its end."""
        try:
            end = await watcher.finished(placement)
        except Exception as exc:  # following it failed: nothing would ever end it
            end = RunEnd(False, error=exc)
        await self.end(placement, end, asyncio.current_task())

    async def end(self, placement: Placement, end: RunEnd, handle: object) -> None:
        """Free a job's capacity and record its end, if ``handle`` still watches it; a
        ``RunEnd.error`` is no end but a lost run: it goes down the failure path."""
        s, key = self.s, placement.job
        if end.error is not None:
            await self.failed(placement, end.error, "follow", handle)
            return

        def finish() -> tuple[float, Outcome | None] | None:
            if self.runs.get(key) is not handle:
                return None  # stopped meanwhile (cancelled, preempted, failed over)
            now = s.clock()
            launch = s.lifecycle.get(key)
            ran = f" after {now - launch.placed_at:.0f}s" if launch is not None else ""
            if launch is not None:  # its pods stay for their logs (FinishedPods)
                s.finished_pods.add(launch, now)
            return now, s.lifecycle.finished(key, end.succeeded, end_reason(end, ran))

        ended = await s.lock.call(finish)  # see StateLock.call: no loop turn per end
        if ended is None:
            return
        now, outcome = ended
        # Recorded outside the lock, as a launch's Running write is: jobs end as fast as they
        # are submitted, and each end holding the lock through its group commit let one end
        # through per commit, the cycle queued behind them (the soak's collapse: hundreds of
        # ends waiting, the queue growing with GPUs idle). A cancel landing meanwhile makes
        # this write a compare-and-set miss, logged.
        if outcome is not None:
            await self.record(outcome, now, expect="Running")
        # Only now: runs_done() waits for the end to be recorded, not just noticed.
        if self.runs.get(key) is handle:
            del self.runs[key]
            self._run_ended.set()

    async def failed(
        self, placement: Placement, exc: Exception, stage: Stage, handle: object = None
    ) -> None:
        """The one launch-failure path: a job whose launch, adoption or run watch failed
        with ``exc`` is said once (log, metric), rolled back (its objects deleted, its
        reservation or bound usage released) and requeued with backoff, or failed at the
        refusal limit. ``handle``: the run watch that failed (``follow``), which must
        still be the job's, else the job was stopped meanwhile and there is nothing to do."""
        s, key = self.s, placement.job
        failure = Failure.of(exc, stage)
        following = stage == "follow"
        async with s.lock:
            if following and self.runs.get(key) is not handle:
                return  # cancelled, preempted or failed over meanwhile
            if not following:
                self.launching.pop(key, None)
            report(s.metrics, key, placement.cluster, failure, exc)
            await self.roll_back(
                placement, s.clock(), failure.reason(placement.cluster),
                "follow_failed" if following else "launch_failed",
                refused=failure.refused, expect="Running" if following else "Placed",
            )  # fmt: skip
            if following and self.runs.get(key) is handle:  # only now: see runs_done
                del self.runs[key]
                self._run_ended.set()

    async def delete(self, placement: Placement, forgotten: Launch | None = None) -> None:
        """Delete a gang's objects; a cluster that cannot be reached now (or any failure)
        does not stop the job's cancel or requeue: what is left has our origin label and no
        live job, so the garbage collector removes it once the cluster answers again.
        ``forgotten``: the job's launch when the lifecycle no longer holds it (cancel,
        preemption), so that its spec (a ``spec.workload`` job's object to delete) is
        still known."""
        if forgotten is not None:
            self._deleting[placement.job] = forgotten
        try:
            await self.s.launcher.delete(placement)
        except Exception as exc:  # the rollback or cancel goes on whatever failed here
            failure = Failure.of(exc, "delete")
            self.s.metrics.launch_failures.labels(placement.cluster, "delete", failure.cause).inc()
            log.warning(
                "could not delete %s in %s now (%s); garbage collection will",
                placement.job, placement.cluster, failure.said,
                exc_info=None if isinstance(exc, _DELETE_FAILURES) else exc,
            )  # fmt: skip
        finally:
            if forgotten is not None and self._deleting.get(placement.job) is forgotten:
                del self._deleting[placement.job]

    async def roll_back(
        self,
        placement: Placement,
        now: float,
        reason: str,
        kind: str,
        *,
        refused: bool = False,
        expect: JobState = "Placed",
    ) -> None:
        """Delete every pod, release the reservation (or a running job's bound usage),
        requeue with backoff (or fail). ``kind``: the requeue reason counted in metrics
        (timeout, launch_failed, follow_failed, evicted); ``refused``: a permanent refusal
        (counted against the refusal limit); ``expect``: the job's state in the store."""
        task = self.launching.pop(placement.job, None)
        if task is not None and task is not asyncio.current_task():
            task.cancel()
        await self.delete(placement)
        outcome = self.s.lifecycle.roll_back(placement.job, now, reason, refused=refused)
        if outcome is not None:
            if outcome.state == "Queued":
                self.s.metrics.requeues.labels(kind).inc()
            await self.record(outcome, now, expect=expect)

    async def record(
        self, outcome: Outcome, now: float, expect: JobState | tuple[JobState, ...]
    ) -> None:
        """Write a job's outcome; while the store is down, retried as long as we lead (a
        leader elected later rebuilds the job from the store)."""
        tenant, _, name = outcome.job.partition("/")
        if outcome.state != "Running":
            self.s.pools.ended(outcome.job)
        what = f"{outcome.state} of {outcome.job} not recorded yet"

        async def write() -> None:
            await self.s.store.transition(
                tenant, name, outcome.state, outcome.reason, now,
                expect=expect if isinstance(expect, tuple) else (expect,),
                attempts=outcome.attempts if outcome.state != "Running" else None,
                not_before=outcome.not_before,
            )  # fmt: skip

        try:
            await self.retried(write, StoreUnavailable, what)
        except StateConflict:  # also a retried write whose first try committed
            log.info("job %s changed meanwhile; %s not recorded", outcome.job, outcome.state)
        except LeaseLost as exc:  # fenced: another replica leads; it rebuilds the job
            log.warning("%s of %s not recorded: %s", outcome.state, outcome.job, exc)
        except StoreUnavailable as exc:
            log.warning("%s of %s not recorded (%s); no longer leading", outcome.state,
                        outcome.job, exc)  # fmt: skip
        self.s.wake.set()

    async def retried(
        self, call: Callable[[], Awaitable[None]], retry_on: type[StoreError], what: str
    ) -> None:
        """``call()``, retried as ``while_leading`` retries when it fails with ``retry_on``.
        The first try runs bare: tenacity's retry state, built for every write, was about
        5 % of the broker's CPU in ``bench --soak`` (four writes per job), and nearly every
        write succeeds the first time. The waits are the same: the first here, the rest
        tenacity's, continuing the doubling."""
        try:
            await call()
            return
        except retry_on as exc:
            if not self.s.rebuilt:
                raise
            first = STORE_RETRY_SECONDS[0]
            log.warning("%s (%s); retrying in %.1f s", what, exc, first)
            await asyncio.sleep(first)
        async for attempt in self.while_leading(retry_on, what, tried=1):
            with attempt:
                await call()

    def while_leading(self, retry_on: type[StoreError], what: str, tried: int = 0) -> AsyncRetrying:
        """Retries of a store call that failed with ``retry_on``, STORE_RETRY_SECONDS
        apart (doubling), for as long as this replica leads; then the error is raised.
        ``tried``: failed tries already waited out (the doubling goes on from there)."""

        def retry(state: RetryCallState) -> bool:
            outcome = state.outcome
            return (
                outcome is not None and outcome.failed and self.s.rebuilt
                and isinstance(outcome.exception(), retry_on)
            )  # fmt: skip

        def announce(state: RetryCallState) -> None:
            exc = state.outcome.exception() if state.outcome else None
            pause = state.next_action.sleep if state.next_action else 0.0
            log.warning("%s (%s); retrying in %.1f s", what, exc, pause)

        first, cap = STORE_RETRY_SECONDS
        return AsyncRetrying(
            retry=retry, wait=wait_exponential(multiplier=first * 2**tried, max=cap),
            before_sleep=announce, reraise=True,
        )  # fmt: skip

    def on_capacity(self, events: list[CapacityEvent]) -> None:
        """Members' capacity events: into the ledger. Reservations a foreign pod took are
        rolled back (their pods deleted, the jobs requeued)."""
        evicted: list[str] = []
        for event in events:
            evicted.extend(self.s.ledger.apply(event))
        if evicted:
            self.s.tasks.spawn(f"evict {', '.join(evicted)}", self._evicted(evicted))
        self.s.wake.set()

    async def _evicted(self, jobs: list[str]) -> None:
        s = self.s
        async with s.lock:
            now = s.clock()
            for job in jobs:
                launch = s.lifecycle.get(job)
                if launch is not None and not launch.running:
                    await self.roll_back(
                        launch.placement, now, "capacity taken by another pod", "evicted"
                    )


__all__ = ["STORE_RETRY_SECONDS", "Binding"]
