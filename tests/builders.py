"""Small builders for placement-core test objects: nodes, jobs, placements and federations.

Defaults are chosen so GPUs decide: a node has plenty of CPU and memory, a pod asks for one
core and 1 GiB unless told otherwise. Every builder returns the model's own frozen values,
so a test reads as data (``gang("train", pods=4, gpus=2)``) and nothing here has behaviour
of its own to get wrong.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from broker.core.ledger import Ledger
from broker.model import (
    Cluster,
    ClusterKind,
    Decision,
    GpuType,
    Job,
    Node,
    Placement,
    PodBound,
    PodPlacement,
    PodSet,
    Resources,
    Unplaceable,
)
from broker.taints import Taint, Toleration

POD_CPU = 1_000
POD_MEM = 1_024

_foreign_names = itertools.count()


def node(
    name: str,
    gpus: int = 8,
    gpu_type: str | None = "A100",
    cpu: int = 64_000,
    mem: int = 512_000,
    *,
    labels: Mapping[str, str] | None = None,
    taints: Iterable[str | Taint] = (),
    unschedulable: bool = False,
    ready: bool = True,
) -> Node:
    """A node; ``taints`` are keys (NoSchedule) or Taint values. gpus=0 means a CPU node."""
    return Node(
        name,
        GpuType(gpu_type) if gpu_type is not None and gpus else None,
        Resources(gpus=gpus, cpu_milli=cpu, memory_mib=mem),
        labels=dict(labels or {}),
        taints=tuple(t if isinstance(t, Taint) else Taint(t) for t in taints),
        unschedulable=unschedulable,
        ready=ready,
    )


def nodes(
    prefix: str,
    count: int,
    gpus: int = 8,
    gpu_type: str | None = "A100",
    *,
    cpu: int = 64_000,
    mem: int = 512_000,
) -> list[Node]:
    """``count`` identical nodes named ``<prefix>-0``, ``<prefix>-1`` ..."""
    return [node(f"{prefix}-{i}", gpus, gpu_type, cpu, mem) for i in range(count)]


def resources(gpus: int = 0, milli: int = 0, cpu: int = POD_CPU, mem: int = POD_MEM) -> Resources:
    return Resources(gpus=gpus, gpu_milli=milli, cpu_milli=cpu, memory_mib=mem)


def pod_set(
    name: str,
    count: int,
    *,
    gpus: int = 0,
    milli: int = 0,
    cpu: int = POD_CPU,
    mem: int = POD_MEM,
    tolerations: Iterable[str | Toleration] = (),
) -> PodSet:
    """``tolerations``: Toleration values, or taint keys each tolerated whatever its value
    and effect (``Exists``)."""
    return PodSet(name, count, resources(gpus, milli, cpu, mem), tolerating(tolerations))


def tolerating(tolerations: Iterable[str | Toleration]) -> frozenset[Toleration]:
    return frozenset(
        t if isinstance(t, Toleration) else Toleration(t, "Exists") for t in tolerations
    )


def job(
    name: str,
    *pod_sets: PodSet,
    min_member: int = 0,
    gpu_types: Iterable[str] = (),
    selector: Mapping[str, str] | None = None,
    tenant: str = "default",
    queue: str = "default",
) -> Job:
    return Job(
        name,
        tuple(pod_sets),
        tenant=tenant,
        queue=queue,
        gpu_types=frozenset(GpuType(t) for t in gpu_types),
        cluster_selector=dict(selector or {}),
        min_member=min_member,
    )


def gang(
    name: str,
    pods: int = 4,
    gpus: int = 1,
    *,
    cpu: int = POD_CPU,
    mem: int = POD_MEM,
    min_member: int = 0,
    gpu_types: Iterable[str] = (),
    selector: Mapping[str, str] | None = None,
    tolerations: Iterable[str | Toleration] = (),
) -> Job:
    """``pods`` identical pods of ``gpus`` whole GPUs each (one pod set called worker)."""
    ps = pod_set("worker", pods, gpus=gpus, cpu=cpu, mem=mem, tolerations=tolerations)
    return job(name, ps, min_member=min_member, gpu_types=gpu_types, selector=selector)


def single(
    name: str,
    gpus: int = 1,
    *,
    cpu: int = POD_CPU,
    mem: int = POD_MEM,
    gpu_types: Iterable[str] = (),
    selector: Mapping[str, str] | None = None,
    tolerations: Iterable[str | Toleration] = (),
) -> Job:
    return gang(
        name,
        1,
        gpus,
        cpu=cpu,
        mem=mem,
        gpu_types=gpu_types,
        selector=selector,
        tolerations=tolerations,
    )


def shared(
    name: str,
    milli: int = 500,
    *,
    cpu: int = POD_CPU,
    mem: int = POD_MEM,
    gpu_types: Iterable[str] = (),
    tolerations: Iterable[str | Toleration] = (),
) -> Job:
    """One pod asking ``milli`` thousandths of one GPU."""
    ps = pod_set("pod", 1, milli=milli, cpu=cpu, mem=mem, tolerations=tolerations)
    return job(name, ps, gpu_types=gpu_types)


@dataclass(frozen=True)
class ClusterSpec:
    nodes: Sequence[Node]
    labels: Mapping[str, str] = field(default_factory=dict)
    stale: bool = False
    kind: ClusterKind = "onprem"


def federation(clusters: Mapping[str, Sequence[Node] | ClusterSpec]) -> Ledger:
    """A ledger holding each cluster (a node list, or a ClusterSpec for labels/staleness)."""
    ledger = Ledger()
    for name, spec in clusters.items():
        if not isinstance(spec, ClusterSpec):
            spec = ClusterSpec(spec)
        ledger.add_cluster(Cluster(name, dict(spec.labels), spec.kind), spec.nodes)
        if spec.stale:
            ledger.set_stale(name, True)
    return ledger


def pod(
    name: str, node_name: str, gpus: Sequence[int] = (), res: Resources | None = None
) -> PodPlacement:
    """One pod of a placement; the request defaults to len(gpus) whole GPUs."""
    return PodPlacement(name, node_name, tuple(gpus), res or resources(gpus=len(gpus)))


def placement(job_key: str, cluster: str, *pods: PodPlacement) -> Placement:
    return Placement(job_key, cluster, tuple(pods), "test")


def occupy(
    ledger: Ledger,
    cluster: str,
    node_name: str,
    gpus: Sequence[int] = (),
    *,
    milli: int = 0,
    cpu: int = 0,
    mem: int = 0,
    name: str | None = None,
) -> None:
    """Bind a foreign pod (not the broker's) on given GPUs: whole GPUs, or ``milli`` of the
    single GPU listed. Used to make a node or cluster partly full."""
    res = Resources(gpus=0 if milli else len(gpus), gpu_milli=milli, cpu_milli=cpu, memory_mib=mem)
    pod_name = name or f"foreign-{next(_foreign_names)}"
    evicted = ledger.apply(PodBound(cluster, pod_name, node_name, res, tuple(gpus)))
    assert evicted == [], f"occupying {node_name} evicted {evicted}"


def as_placement(decision: Decision) -> Placement:
    assert isinstance(decision, Placement), f"expected a placement, got {decision}"
    return decision


def as_unplaceable(decision: Decision) -> Unplaceable:
    assert isinstance(decision, Unplaceable), f"expected unplaceable, got {decision}"
    return decision


class Clock:
    """An injected clock: seconds, moved by hand (``clock.now += s``)."""

    def __init__(self, now: float = 1_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


async def until(predicate: Callable[[], bool], timeout: float = 10.0) -> None:
    """Poll (yielding to the event loop) until ``predicate`` holds or the deadline passes."""
    async with asyncio.timeout(timeout):
        while not predicate():
            await asyncio.sleep(0.01)
