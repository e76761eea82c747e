"""The live broker's burst pools: the ``BurstController`` and the port behind each pool.

``BurstPools`` is built by ``broker.service.compose`` from the config's ``burstPools``:
a simulated pool (the embedded default; nodes come up on the wall clock after
``provisionSeconds``) or a Cluster API MachineDeployment/MachinePool on a management
cluster (``adapters.capi``; its nodes reach the ledger through the member cluster's own
watch). A Cluster API pool joins the controller once its object has been read
(``broker.service.pool_reading``); one that cannot be read (the management cluster away,
a 5xx, a refused connection) is read again with backoff by its own supervised task and
joins when a read succeeds, with no restart; until then ``availability()`` says why, for
``/readyz``, the ``fedbroker_burst_pool_available`` gauge and explain.

Each scheduling cycle the service asks for the holds (nodes coming up for one gang, hidden
from every other job), then hands the controller what is still waiting and carries out the
actions: a node to remove is cordoned in the ledger at once, under the service lock, so
nothing is placed on it while the pool's API is called; the API calls themselves run in
one task after another, outside the lock, in the order they were decided.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from tenacity import AsyncRetrying, RetryCallState, retry_if_exception_type, stop_never

from adapters.simulated import SimulatedPool
from broker.config import BurstPoolConfig, Config, SimulatedPoolSource
from broker.core.burst import POOL_LABEL, Action, BurstController, BurstSettings, RemoveNode
from broker.core.burst_actions import OnClock, carry_out
from broker.core.burst_rows import PoolRow
from broker.core.ledger import Ledger
from broker.model import (
    BurstPool,
    CapacityEvent,
    CapacitySnapshot,
    GpuType,
    Job,
    NodeUpdated,
    Placement,
)
from broker.ports import ScaleError, ScalePool
from broker.service.pool_reading import (
    Availability,
    CapiReader,
    PoolRetry,
    Shape,
    Unreadable,
    node_of,
)

if TYPE_CHECKING:
    from kubernetes.aio.client import ApiClient

    from adapters.capi import CapiPool
    from broker.service.statelock import StateLock
    from broker.service.tasks import Supervisor

log = logging.getLogger(__name__)


class BurstPools:
    """The controller, one port per pool, and the simulated pools' capacity events."""

    def __init__(
        self, config: Config, clock: Callable[[], float], retry: PoolRetry | None = None
    ) -> None:
        sched = config.scheduler
        self.configs = list(config.burst_pools)
        self.controller = BurstController(
            BurstSettings(burst_after_seconds=sched.burst_after_seconds)
        )
        self.retry = retry or PoolRetry()
        self._clock = clock
        self._clusters = {c.name: c for c in config.clusters}
        self.ports: dict[str, ScalePool] = {}
        self.simulated: list[SimulatedPool] = []
        self._clients: list[ApiClient] = []
        self._queue: asyncio.Queue[Action] = asyncio.Queue()
        self._outages: dict[str, Availability] = {}  # Cluster API pools not joined yet

    def __bool__(self) -> bool:
        return bool(self.configs)

    async def start(
        self,
        ledger: Ledger,
        workload: Callable[[str], ApiClient | None],
        tasks: Supervisor,
        lock: StateLock,
    ) -> None:
        """Register every simulated pool with the controller, and read every Cluster API
        pool in its own supervised task (``burst-pool <name>``) until it can be read: then
        it joins. Returns once each was read once (the reads run side by side), whatever
        they found, or after ``retry.first_read_seconds``: a pool that cannot be read never
        keeps the broker down, and placing on the members goes on without it."""
        loop = asyncio.get_running_loop()
        first: list[tuple[asyncio.Future[None], asyncio.Task[None]]] = []
        for pc in self.configs:
            if pc.source.simulated is not None:
                self._simulated(pc, pc.source.simulated, ledger)
                continue
            member = self._clusters[pc.cluster].source.kube
            reader = CapiReader(pc, member, workload(pc.cluster), self.retry)
            self._outages[pc.name] = Availability(pc.name, False, "not read yet", self._clock())
            tried: asyncio.Future[None] = loop.create_future()
            reading = self._read_until_joined(reader, ledger, lock, tried)
            first.append((tried, tasks.spawn(f"burst-pool {pc.name}", reading)))
        deadline = loop.time() + self.retry.first_read_seconds
        for tried, task in first:
            left = max(0.0, deadline - loop.time())
            await asyncio.wait((tried, task), timeout=left, return_when=asyncio.FIRST_COMPLETED)

    def _simulated(self, pc: BurstPoolConfig, source: SimulatedPoolSource, ledger: Ledger) -> None:
        sim = SimulatedPool(
            pc.cluster, str(pc.gpu_type), node_of(pc), name=pc.name,
            provision_seconds=pc.provision_seconds, failure_rate=source.failure_rate,
            seed=source.seed, labels=pc.topology_labels,
        )  # fmt: skip
        self.simulated.append(sim)
        self.ports[pc.name] = OnClock(sim, self._clock)
        self._add(pc, Shape(node_of(pc), pc.gpu_type, pc.min_nodes, pc.max_nodes, 0), ledger)

    def _add(self, pc: BurstPoolConfig, shape: Shape, ledger: Ledger) -> None:
        """Register the pool with the controller at its current size; the nodes its
        cluster has now are not the broker's to remove."""
        cluster = self._clusters[pc.cluster]
        nodes = ledger.snapshot().clusters[pc.cluster].nodes
        # Nodes labelled with this pool were added by the broker before a restart.
        existing = {n for n, st in nodes.items() if st.node.labels.get(POOL_LABEL) != pc.name}
        spec = BurstPool(
            pc.name, pc.cluster, GpuType(str(shape.gpu_type)), shape.node,
            shape.min_nodes or 0, shape.max_nodes or 0, pc.cost_per_node_hour,
            pc.provision_seconds, dict(cluster.labels), tuple(cluster.topology_levels),
            dict(pc.topology_labels),
        )  # fmt: skip
        self.controller.add_pool(
            spec, shape.replicas, existing, pc.owner, pc.burst_after_seconds,
            pc.scale_down_after_seconds, pc.provision_timeout_seconds,
        )  # fmt: skip

    # -- Cluster API pools: read until they can be, then joined ---------------------------

    async def _read_until_joined(
        self, reader: CapiReader, ledger: Ledger, lock: StateLock, tried: asyncio.Future[None]
    ) -> None:
        """Read the pool, again and again with ``self.retry``'s backoff while it cannot be
        read (any failure: a bug in a read must not leave a pool out for good), then join
        it under ``lock``. ``tried`` is done after the first read."""
        name = reader.pc.name

        def unavailable(state: RetryCallState) -> None:
            self._unavailable(name, state)
            if not tried.done():
                tried.set_result(None)

        retrying = AsyncRetrying(
            stop=stop_never, wait=self.retry.wait, sleep=self.retry.sleep,
            retry=retry_if_exception_type(Exception), before_sleep=unavailable,
        )  # fmt: skip
        found: tuple[CapiPool, ApiClient, Shape] | None = None
        async for attempt in retrying:
            with attempt:
                found = await reader.read()
        assert found is not None
        port, client, shape = found
        try:
            await lock.call(lambda: self._join(reader.pc, port, client, shape, ledger))
        except BaseException:
            await client.close()  # type: ignore[no-untyped-call]
            raise
        if not tried.done():
            tried.set_result(None)

    def _unavailable(self, name: str, state: RetryCallState) -> None:
        """A read failed: say why, since when, and when the next one is (logged with the
        pool's name and the HTTP status or the kind of failure, never the credentials)."""
        exc = state.outcome.exception() if state.outcome is not None else None
        pause = state.next_action.sleep if state.next_action is not None else 0.0
        now, was = self._clock(), self._outages.get(name)
        if isinstance(exc, Unreadable):
            reason = exc.reason
            log.warning("burst pool %s unavailable: %s; reading it again in %.0f s",
                        name, exc, pause, extra={"pool": name})  # fmt: skip
        else:
            reason = type(exc).__name__
            log.error("burst pool %s unavailable: unexpected %s; reading it again in %.0f s",
                      name, reason, pause, exc_info=exc, extra={"pool": name})  # fmt: skip
        since = was.since if was is not None else now
        self._outages[name] = Availability(
            name, False, reason, since, state.attempt_number, now + pause
        )

    def _join(
        self, pc: BurstPoolConfig, port: CapiPool, client: ApiClient, shape: Shape, ledger: Ledger
    ) -> None:
        self._clients.append(client)
        self.ports[pc.name] = port
        self._add(pc, shape, ledger)
        was = self._outages.pop(pc.name, None)
        if was is not None and was.attempts:
            log.info("burst pool %s available after %d failed reads: joined",
                     pc.name, was.attempts, extra={"pool": pc.name})  # fmt: skip

    def availability(self) -> list[Availability]:
        """Every configured pool, in the config's order: joined, or why not yet."""
        joined = self.controller.pools
        return [
            self._outages.get(pc.name) or Availability(pc.name, pc.name in joined)
            for pc in self.configs
        ]

    def unavailable(self) -> list[Availability]:
        """The Cluster API pools that have not been read yet, in the config's order."""
        return [a for a in self.availability() if not a.available]

    async def close(self) -> None:
        for client in self._clients:
            await client.close()  # type: ignore[no-untyped-call]
        self._clients.clear()

    # -- each cycle (under the service lock) ----------------------------------------------

    def due(self, now: float) -> list[CapacityEvent]:
        """What the simulated pools did up to ``now``: nodes that came up or went away."""
        return [event for pool in self.simulated for event in pool.due(now)]

    def hiding(self, snapshot: CapacitySnapshot) -> Callable[[Job], dict[str, set[str]]]:
        return self.controller.hiding(snapshot)

    def tick(self, now: float, ledger: Ledger, waiting: Sequence[Job]) -> int:
        """Decide; cordon the nodes to remove in the ledger now; queue the API calls.
        Returns how many actions were queued."""
        actions = self.controller.tick(now, ledger.snapshot(), waiting)
        for action in actions:
            if isinstance(action, RemoveNode):
                state = ledger.snapshot().clusters[action.cluster].nodes.get(action.node)
                if state is not None:
                    cordoned = dataclasses.replace(state.node, unschedulable=True)
                    ledger.apply(NodeUpdated(action.cluster, cordoned))
            self._queue.put_nowait(action)
        return len(actions)

    def placed(self, placement: Placement, now: float) -> None:
        self.controller.placed(placement, now)

    def ended(self, job: str) -> None:
        self.controller.ended(job)

    # -- the API calls, in order, outside the lock ----------------------------------------

    async def run(self, lock: StateLock) -> None:
        """Carry out queued actions one after another; a failure is reported to the
        controller (under ``lock``) after the port's own bounded retries."""
        while True:
            action = await self._queue.get()
            try:
                await self._carry_out(action, lock)
            finally:
                self._queue.task_done()

    async def _carry_out(self, action: Action, lock: StateLock) -> None:
        port = self.ports.get(action.pool)
        if port is None:
            return
        failure = await carry_out(action, port, (ScaleError, ValueError))
        if failure is not None:
            async with lock:
                self.controller.failed(action, self._clock(), failure)

    async def drain(self) -> None:
        """Wait until every queued action has been carried out (tests, shutdown)."""
        await self._queue.join()

    # -- reads ----------------------------------------------------------------------------

    def rows(self) -> list[PoolRow]:
        return self.controller.pool_rows(self._clock())
