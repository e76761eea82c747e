"""The live broker's burst pools: the ``BurstController`` and the port behind each pool.

``BurstPools`` is built by ``broker.service.compose`` from the config's ``burstPools``:
a simulated pool (the embedded default; nodes come up on the wall clock after
``provisionSeconds``) or a Cluster API MachineDeployment/MachinePool on a management
cluster (``adapters.capi``; its nodes reach the ledger through the member cluster's own
watch). Each scheduling cycle the service asks for the holds (nodes coming up for one gang,
hidden from every other job), then hands the controller what is still waiting and carries
out the actions: a node to remove is cordoned in the ledger at once, under the service lock,
so nothing is placed on it while the pool's API is called; the API calls themselves run in
one task after another, outside the lock, in the order they were decided.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from adapters.simulated import SimulatedPool
from broker.config import BurstPoolConfig, Config
from broker.core.burst import POOL_LABEL, Action, BurstController, BurstSettings, RemoveNode
from broker.core.burst_actions import OnClock, carry_out
from broker.core.burst_rows import PoolRow
from broker.core.ledger import Ledger
from broker.manifest import cpu_millicores, memory_mebibytes
from broker.model import (
    BurstPool,
    CapacityEvent,
    CapacitySnapshot,
    GpuType,
    Job,
    NodeUpdated,
    Placement,
    Resources,
)
from broker.ports import KubeconfigError, ScaleError, ScalePool

if TYPE_CHECKING:
    from kubernetes.aio.client import ApiClient

    from adapters.capi import CapiPool
    from broker.service.statelock import StateLock

log = logging.getLogger(__name__)


def _node_of(pc: BurstPoolConfig) -> Resources:
    return Resources(
        gpus=pc.gpus or 0,
        cpu_milli=cpu_millicores(pc.cpu) if pc.cpu is not None else 0,
        memory_mib=memory_mebibytes(pc.memory) if pc.memory is not None else 0,
    )


@dataclass(frozen=True, slots=True)
class _Shape:
    """A pool's node shape, GPU type, bounds and current size, as configured or read."""

    node: Resources
    gpu_type: str | None
    min_nodes: int | None
    max_nodes: int | None
    replicas: int


class BurstPools:
    """The controller, one port per pool, and the simulated pools' capacity events."""

    def __init__(self, config: Config, clock: Callable[[], float]) -> None:
        sched = config.scheduler
        self.configs = list(config.burst_pools)
        self.controller = BurstController(
            BurstSettings(burst_after_seconds=sched.burst_after_seconds)
        )
        self._clock = clock
        self._clusters = {c.name: c for c in config.clusters}
        self.ports: dict[str, ScalePool] = {}
        self.simulated: list[SimulatedPool] = []
        self._clients: list[ApiClient] = []
        self._queue: asyncio.Queue[Action] = asyncio.Queue()

    def __bool__(self) -> bool:
        return bool(self.configs)

    async def start(self, ledger: Ledger, workload: Callable[[str], ApiClient | None]) -> None:
        """Build every pool's port and register the pool with the controller at its current
        size; the nodes its cluster has now are not the broker's to remove. A Cluster API
        pool is read first (its size, and its shape where the config leaves it out); one
        that cannot be read is left out, with a warning, rather than keeping the broker down."""
        for pc in self.configs:
            cluster = self._clusters[pc.cluster]
            nodes = ledger.snapshot().clusters[pc.cluster].nodes
            # Nodes labelled with this pool were added by the broker before a restart.
            existing = {n for n, st in nodes.items() if st.node.labels.get(POOL_LABEL) != pc.name}
            if pc.source.simulated is not None:
                sim = SimulatedPool(
                    pc.cluster, str(pc.gpu_type), _node_of(pc), name=pc.name,
                    provision_seconds=pc.provision_seconds,
                    failure_rate=pc.source.simulated.failure_rate, seed=pc.source.simulated.seed,
                )  # fmt: skip
                self.simulated.append(sim)
                self.ports[pc.name] = OnClock(sim, self._clock)
                shape = _Shape(_node_of(pc), pc.gpu_type, pc.min_nodes, pc.max_nodes, 0)
            else:
                found = await self._capi(pc, workload)
                if found is None:
                    continue
                self.ports[pc.name], shape = found
            spec = BurstPool(
                pc.name, pc.cluster, GpuType(str(shape.gpu_type)), shape.node,
                shape.min_nodes or 0, shape.max_nodes or 0, pc.cost_per_node_hour,
                pc.provision_seconds, dict(cluster.labels),
            )  # fmt: skip
            self.controller.add_pool(
                spec, shape.replicas, existing, pc.owner, pc.burst_after_seconds,
                pc.scale_down_after_seconds, pc.provision_timeout_seconds,
            )  # fmt: skip

    async def _capi(
        self, pc: BurstPoolConfig, workload: Callable[[str], ApiClient | None]
    ) -> tuple[CapiPool, _Shape] | None:
        """A Cluster API pool's port and shape (the config's, else its annotations); None
        (with a warning) when it cannot be read or its shape is not known."""
        # Imported here, with the first Cluster API pool: kubernetes.aio is most of a
        # start's imports, and simulated pools never need it.
        from adapters.capi import CapiPool
        from adapters.capi.objects import DEFAULT_GPU_TYPE_LABEL
        from adapters.kubeapi.kubeconfig import load_clients

        source = pc.source.capi
        assert source is not None
        try:
            clients, _ = await load_clients(source.kubeconfig_source(), [source.context])
            self._clients.extend(clients.values())
            member = self._clusters[pc.cluster].source.kube
            port = CapiPool(
                clients[source.context], source.namespace, source.name,
                kind=source.kind, workload=workload(pc.cluster),
                gpu_type_label=member.gpu_type_label if member else DEFAULT_GPU_TYPE_LABEL,
            )  # fmt: skip
            status = await port.status()
        except (KubeconfigError, ScaleError) as exc:
            log.warning("burst pool %s left out: %s", pc.name, exc)
            return None
        node, read = _node_of(pc), status.shape
        shape = _Shape(
            Resources(
                gpus=node.gpus or read.gpus or 0,
                cpu_milli=node.cpu_milli or read.cpu_milli or 0,
                memory_mib=node.memory_mib or read.memory_mib or 0,
            ),
            pc.gpu_type or read.gpu_type,
            read.min_size if pc.min_nodes is None else pc.min_nodes,
            read.max_size if pc.max_nodes is None else pc.max_nodes,
            status.replicas,
        )
        if not (shape.node.gpus and shape.gpu_type and shape.max_nodes is not None):
            log.warning(
                "burst pool %s left out: GPU count, GPU type and maximum size are "
                "neither configured nor annotated on %s", pc.name, port.key,
            )  # fmt: skip
            return None
        return port, shape

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
