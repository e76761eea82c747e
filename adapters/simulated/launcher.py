"""The live broker's simulated launcher (``SimulatedLauncher``): placed gangs start after a
delay (or fail at a rate), run for their run time and end; a running job's pods and a few
deterministic log lines per pod are shown as a member would. Ends are reported from one heap of
deadlines with one loop timer (``broker.ports.RunNotifier``): no task, timer or closure per
running job."""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
import math
import random
import time
from collections import OrderedDict, deque
from collections.abc import AsyncGenerator, Awaitable, Callable, Iterable, Mapping
from datetime import UTC, datetime

from broker.model import Placement
from broker.ports import (
    ContainerNotFound,
    Launcher,
    LaunchError,
    LaunchSpec,
    LogRequest,
    LogStream,
    PodNotFound,
    PodReader,
    PodRow,
    RunEnd,
    RunHandle,
    RunNotifier,
    RunWatcher,
)

log = logging.getLogger(__name__)

SIMULATED_CONTAINER = "main"  # every simulated pod's one container
DELETED_KEPT = 1000  # SimulatedLauncher.deleted: the latest deletions only
ENDED_KEPT = 10_000  # SimulatedLauncher.ended: the pods of the latest ended runs only


def simulated_log_line(pod: str, step: int) -> bytes:
    """The ``step``-th line of a simulated pod's log (the same on every run)."""
    return f"{pod}: step {step} loss {4.0 / (step + 1):.4f}\n".encode()


def _dated(request: LogRequest, at: float, line: bytes) -> bytes:
    """``line`` after its time, as the kubelet's ``timestamps`` writes it (when asked)."""
    if not request.timestamps:
        return line
    stamp = datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")
    return f"{stamp}000Z ".encode() + line


class _NoEnd:
    """The watch of a job that runs until cancelled: nothing to stop."""

    def cancel(self) -> None:
        return None


_NO_END = _NoEnd()
# A deadline this close is due: loop timers may fire up to a millisecond early.
_DUE_SLACK_SECONDS = 0.001


class _Run:
    """One watched run: its job and the callback its end is owed to, dropped by ``cancel``
    (its heap entry is then skipped when it comes up)."""

    __slots__ = ("job", "on_end")

    def __init__(self, job: str, on_end: Callable[[RunEnd], None]) -> None:
        self.job: str = job
        self.on_end: Callable[[RunEnd], None] | None = on_end

    def cancel(self) -> None:
        self.on_end = None


class _Ends:
    """Every watched run's end in one heap by deadline, with one loop timer armed for the
    earliest. A watch is O(log n), an end O(log n); what it keeps per running job is its
    ``_Run`` and one heap entry (a call_later per job kept a timer handle, its context and
    two closures: about 13 objects for the collector to walk per live job). A
    cancelled run stays in the heap until its deadline passes, so the heap holds at most the
    watches of the last longest run time."""

    def __init__(self, ended: Callable[[str], None]) -> None:
        self._ended = ended
        self._heap: list[tuple[float, int, _Run]] = []
        self._seq = itertools.count()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._armed_for = math.inf

    def add(self, seconds: float, run: _Run) -> None:
        loop = asyncio.get_running_loop()
        if loop is not self._loop:  # a new loop (tests): the old one's timer is gone
            self._loop, self._heap, self._timer, self._armed_for = loop, [], None, math.inf
        due = loop.time() + seconds
        heapq.heappush(self._heap, (due, next(self._seq), run))
        self._arm(loop)

    def _arm(self, loop: asyncio.AbstractEventLoop) -> None:
        if not self._heap or self._heap[0][0] >= self._armed_for:
            return
        if self._timer is not None:
            self._timer.cancel()
        self._armed_for = self._heap[0][0]
        self._timer = loop.call_at(self._armed_for, self._fire)

    def _fire(self) -> None:
        loop = asyncio.get_running_loop()
        self._timer, self._armed_for = None, math.inf
        now = loop.time() + _DUE_SLACK_SECONDS
        while self._heap and self._heap[0][0] <= now:
            run = heapq.heappop(self._heap)[2]
            on_end, run.on_end = run.on_end, None
            if on_end is None:
                continue  # cancelled
            self._ended(run.job)
            try:
                on_end(RunEnd(True))
            except Exception:  # one failing callback must not keep the others' ends
                log.exception("the end of %s was not delivered", run.job)
        self._arm(loop)


class SimulatedLauncher(Launcher, RunWatcher, RunNotifier, PodReader):
    """Launches placed gangs in simulated clusters: every pod "runs" after a delay.

    ``sleep`` is injected (default ``asyncio.sleep``) so tests pass a zero delay or a fake.
    Failures are injected by ``failure_rate`` (seeded, so runs repeat) or by naming jobs in
    ``never_start`` (a job key ``tenant/name`` or a bare name): their pods never all start,
    so ``launch`` waits until it is cancelled, as a gang stuck in a real cluster would, and
    the lifecycle's gang timeout must clean it up. ``per_cluster`` overrides
    ``(launch_delay_seconds, failure_rate)`` for named clusters.

    ``run_seconds`` gives a running job its run time (None: it runs until cancelled);
    ``finished`` returns when the run is over, so jobs end and capacity churns. The demo
    passes ``seeded_run_seconds``; without it every job runs until cancelled.

    A running job's pods are shown Running on their nodes; each has ``log_lines`` lines of
    log at once and, followed, one more every ``log_every_seconds`` (on ``sleep``) until the
    job is no longer running. With timestamps, a line is dated as if written every
    ``log_every_seconds`` up to now (wall clock); a simulated container never restarts, so
    it has no previous instance to read (as the kubelet says for such a container). A job
    that ended keeps its pods, shown Succeeded, until ``delete`` (the broker's
    ``retention.finishedPodsSeconds``), as a member does; at most ``ENDED_KEPT`` of them,
    the oldest forgotten first.
    """

    log_lines = 5
    log_every_seconds = 5.0

    def __init__(
        self,
        launch_delay_seconds: float = 0.0,
        failure_rate: float = 0.0,
        *,
        seed: int = 0,
        never_start: Iterable[str] = (),
        per_cluster: Mapping[str, tuple[float, float]] | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        run_seconds: Callable[[Placement], float | None] | None = None,
    ) -> None:
        self._run_seconds = run_seconds
        self._delay = launch_delay_seconds
        self._failure_rate = failure_rate
        self._rng = random.Random(seed)
        self.never_start = set(never_start)
        self._per_cluster = dict(per_cluster or {})
        self._sleep = sleep
        self.running: dict[str, Placement] = {}
        self.ended: OrderedDict[str, Placement] = OrderedDict()  # pods kept: see the docstring
        # The latest deletions, for tests and debugging: bounded, as a broker runs for months.
        self.deleted: deque[str] = deque(maxlen=DELETED_KEPT)
        self._ends = _Ends(self._end)

    async def launch(self, placement: Placement) -> None:
        """Return once every pod of the placement runs; raise LaunchError if it fails."""
        delay, failure_rate = self._per_cluster.get(
            placement.cluster, (self._delay, self._failure_rate)
        )
        if placement.job in self.never_start or placement.job.split("/")[-1] in self.never_start:
            await asyncio.get_running_loop().create_future()  # until cancelled
        if delay > 0:
            await self._sleep(delay)
        if failure_rate > 0 and self._rng.random() < failure_rate:
            raise LaunchError(f"simulated launch failure in {placement.cluster}")
        self.running[placement.job] = placement

    def _end(self, job: str) -> None:
        """The job's run is over: its pods stay, ended, until deleted."""
        placement = self.running.pop(job, None)
        if placement is not None:
            self.ended[job] = placement
            while len(self.ended) > ENDED_KEPT:
                self.ended.popitem(last=False)

    async def delete(self, placement: Placement) -> None:
        """Delete every pod of the placement (idempotent)."""
        self.running.pop(placement.job, None)
        self.ended.pop(placement.job, None)
        self.deleted.append(placement.job)

    def watch(self, placement: Placement, on_end: Callable[[RunEnd], None]) -> RunHandle:
        """``on_end`` once the job's run time is over (``_Ends``: no task or timer per job,
        see ``broker.ports.RunNotifier``); a job without a run time runs until cancelled."""
        seconds = self._run_seconds(placement) if self._run_seconds is not None else None
        if seconds is None:
            return _NO_END

        run = _Run(placement.job, on_end)
        if self._sleep is asyncio.sleep:
            self._ends.add(seconds, run)
            return run

        async def later() -> None:  # an injected sleep (tests): its own clock
            await self._sleep(seconds)
            if run.on_end is not None:
                self._end(placement.job)
                run.on_end(RunEnd(True))

        return asyncio.ensure_future(later())

    async def finished(self, placement: Placement) -> RunEnd:
        """Wait until the running job's pods exit (they always succeed). A job without a
        run time runs until cancelled (this waits until the caller is cancelled)."""
        seconds = self._run_seconds(placement) if self._run_seconds is not None else None
        if seconds is None:
            await asyncio.get_running_loop().create_future()  # until cancelled
        else:
            await self._sleep(seconds)
        self._end(placement.job)
        return RunEnd(True)

    async def pods(self, cluster: str, spec: LaunchSpec) -> list[PodRow]:
        placement, phase = self.running.get(spec.key), "Running"
        if placement is None:
            placement, phase = self.ended.get(spec.key), "Succeeded"
        if placement is None or placement.cluster != cluster:
            return []
        rows = []
        for pod in placement.pods:
            name = pod.pod.removeprefix(f"{spec.tenant}.")
            pod_set, _, index = name.removeprefix(f"{spec.job}-").rpartition("-")
            rows.append(PodRow(name, pod_set, cluster, pod.node, phase, 0, f"{pod_set}-{index}"))
        return rows

    async def logs(self, cluster: str, spec: LaunchSpec, request: LogRequest) -> LogStream:
        names = [row.name for row in await self.pods(cluster, spec)]
        if request.pod not in names:
            raise PodNotFound(f"no pod {request.pod!r} in job {spec.job!r}")
        if request.container not in (None, SIMULATED_CONTAINER):
            raise ContainerNotFound.of(request.container, request.pod, [SIMULATED_CONTAINER])
        if request.previous:
            raise PodNotFound(
                f"no previous instance of container {SIMULATED_CONTAINER!r} in pod "
                f"{request.pod!r} (it has not restarted)"
            )
        return self._log(spec.key, request)

    async def _log(self, job: str, request: LogRequest) -> AsyncGenerator[bytes, None]:
        first = max(0, self.log_lines - (request.tail_lines or self.log_lines))
        now = time.time()
        for step in range(first, self.log_lines):
            ago = (self.log_lines - 1 - step) * self.log_every_seconds
            yield _dated(request, now - ago, simulated_log_line(request.pod, step))
        step = self.log_lines
        while request.follow and job in self.running:
            await self._sleep(self.log_every_seconds)
            if job not in self.running:
                break
            yield _dated(request, time.time(), simulated_log_line(request.pod, step))
            step += 1


def seeded_run_seconds(
    seed: int, low: float = 30.0, high: float = 300.0
) -> Callable[[Placement], float]:
    """Run times drawn uniformly from [low, high], the same for a job name and seed on
    every run (a restarted demo gives a requeued job the same run time again)."""

    def run_seconds(placement: Placement) -> float:
        return random.Random(f"{seed}:{placement.job}").uniform(low, high)

    return run_seconds
