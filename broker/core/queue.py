"""The queue: the one owner of pending work (Kueue's queue cache, in small).

It holds the jobs waiting for capacity, in the queues of the config, and answers one
question per scheduling cycle: in which order should they be tried? The order is job
priority, then queue priority, then fair share across queues (the weighted dominant resource
share: a queue's largest share of any GPU type's federation capacity, divided by its
weight), then FIFO by submission. A requeued job (gang timeout, launch failure) waits out
its backoff (``not_before``) before it is tried again. Quotas (nominal GPUs per type, with
or without borrowing idle capacity) are checked here against what each queue has admitted.

Pure and synchronous: the clock is passed in.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from broker.model import MILLI_PER_GPU, GpuType, Job, Placement


@dataclass(frozen=True, slots=True)
class QueueSpec:
    name: str
    policy: str = "auto"
    priority: int = 0
    weight: float = 1.0
    # Nominal GPUs per type; None = no quota (the federation is the limit).
    quota: Mapping[str, int] | None = None
    borrow: bool = True
    reclaimable: bool = False


@dataclass(slots=True)
class Pending:
    job: Job
    seq: int
    enqueued_at: float
    attempts: int = 0
    not_before: float = 0.0
    # Pod set name -> the manifest's pod template (API JSON), for launchers that create
    # real pods; the placement core never reads it.
    pod_templates: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    # The manifest's rendezvous port (MASTER_PORT of a launched gang's pods).
    master_port: int = 29500
    # A ``spec.workload`` job's Kubernetes object (API JSON), which the launcher creates
    # instead of pods; plain data here (the service builds the launcher's WorkloadSpec).
    workload: Mapping[str, Any] | None = None


@dataclass(slots=True)
class _QueueState:
    spec: QueueSpec
    # Admitted (placed or running) GPU milli per GPU type.
    usage: dict[str, int] = field(default_factory=dict)


def backoff_seconds(attempts: int, base: float = 60.0, cap: float = 3600.0) -> float:
    """Kueue's requeue backoff: ``base`` after the first failure, doubling, at most ``cap``."""
    if attempts <= 0:
        return 0.0
    return float(min(cap, base * 2 ** (attempts - 1)))


def gpu_milli_by_type(
    placement: Placement, gpu_type_of: Mapping[str, GpuType | None]
) -> dict[str, int]:
    """A placement's GPU milli per GPU type (``gpu_type_of`` maps its nodes to types)."""
    out: dict[str, int] = {}
    for pod in placement.pods:
        milli = pod.resources.gpu_request_milli
        if milli:
            key = str(gpu_type_of.get(pod.node) or "")
            out[key] = out.get(key, 0) + milli
    return out


class JobQueue:
    def __init__(self, queues: Iterable[QueueSpec]) -> None:
        self._queues = {q.name: _QueueState(q) for q in queues}
        self._pending: dict[str, Pending] = {}
        self._charged: dict[str, tuple[str, dict[str, int]]] = {}

    # -- what is waiting --------------------------------------------------------------------

    def spec(self, queue: str) -> QueueSpec:
        state = self._queues.get(queue)
        if state is None:
            raise KeyError(f"unknown queue {queue!r}")
        return state.spec

    def queues(self) -> list[QueueSpec]:
        return [s.spec for s in self._queues.values()]

    def push(self, pending: Pending) -> None:
        if pending.job.queue not in self._queues:
            raise KeyError(f"unknown queue {pending.job.queue!r}")
        self._pending[pending.job.key] = pending

    def remove(self, job: str) -> Pending | None:
        return self._pending.pop(job, None)

    def get(self, job: str) -> Pending | None:
        return self._pending.get(job)

    def __len__(self) -> int:
        return len(self._pending)

    def pending(self, queue: str | None = None) -> list[Pending]:
        return [p for p in self._pending.values() if queue is None or p.job.queue == queue]

    def ordered(self, now: float, capacity: Mapping[str, int]) -> list[Pending]:
        """The jobs eligible now (backoff over), in the order to try them. ``capacity`` is
        the federation's GPU milli per type, the denominator of the dominant shares."""
        shares = {name: self.dominant_share(name, capacity) for name in self._queues}

        def key(p: Pending) -> tuple[int, int, float, int]:
            spec = self._queues[p.job.queue].spec
            return (-p.job.priority, -spec.priority, shares[spec.name], p.seq)

        return sorted((p for p in self._pending.values() if p.not_before <= now), key=key)

    # -- fair share and quota -------------------------------------------------------------------

    def dominant_share(self, queue: str, capacity: Mapping[str, int]) -> float:
        state = self._queues[queue]
        share = max(
            (used / capacity[t] for t, used in state.usage.items() if capacity.get(t)),
            default=0.0,
        )
        return share / state.spec.weight

    def usage(self, queue: str) -> Mapping[str, int]:
        return dict(self._queues[queue].usage)

    def quota_allows(
        self, queue: str, demand: Mapping[str, int], idle: Mapping[str, int]
    ) -> str | None:
        """None when the queue may admit ``demand`` (GPU milli per type), else why not.

        Within nominal quota always; beyond it only when the queue may borrow and the
        capacity it would borrow is idle (not within some other queue's unused quota is
        not tracked yet: idle here means free in the federation)."""
        state = self._queues[queue]
        quota = state.spec.quota
        if quota is None:
            return None
        for gpu_type, milli in demand.items():
            nominal = quota.get(gpu_type, 0) * MILLI_PER_GPU
            after = state.usage.get(gpu_type, 0) + milli
            if after <= nominal:
                continue
            if not state.spec.borrow:
                return (
                    f"queue {queue} quota for {gpu_type or 'GPUs'} is {nominal // MILLI_PER_GPU}, "
                    f"{after / MILLI_PER_GPU:g} would be in use"
                )
            if idle.get(gpu_type, 0) < milli:
                return f"queue {queue} is over its {gpu_type} quota and nothing idle to borrow"
        return None

    def charge(self, job: str, queue: str, demand: Mapping[str, int]) -> None:
        """Count an admitted job against its queue (once; a second charge replaces it)."""
        self.release(job)
        usage = self._queues[queue].usage
        for gpu_type, milli in demand.items():
            usage[gpu_type] = usage.get(gpu_type, 0) + milli
        self._charged[job] = (queue, dict(demand))

    def release(self, job: str) -> None:
        charged = self._charged.pop(job, None)
        if charged is None:
            return
        queue, demand = charged
        usage = self._queues[queue].usage
        for gpu_type, milli in demand.items():
            usage[gpu_type] = usage.get(gpu_type, 0) - milli
            if usage[gpu_type] <= 0:
                del usage[gpu_type]
