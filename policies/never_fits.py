"""Whether a job could ever fit the federation as it is made: every node of every cluster it
may go to empty and, for a job that may burst, every burst pool of those clusters grown to
its ``maxNodes``.

``maxima`` reads a snapshot (and the pools) once into each cluster's kinds of node and how
many of each it has at most; ``never_fits`` then costs O(clusters x kinds of node x pod
sets), whatever the number of nodes, so a list can ask it of every row it shows.

Only necessary conditions are checked, so "never" is never said of a job that could fit:
per cluster, each pod set alone fits node by node (whole GPUs of a type the job allows, CPU,
memory, blocking taints tolerated, inside one domain of a required level), and all the
job's GPUs together are no more than the cluster's of those types. Cordoned and not-ready
nodes count (they may come back), and pool nodes count on top of the nodes a pool has
already added. A cluster that is stale or whose nodes have not been read yet makes the
answer unknown (``None``): capacity not read is no proof that a job cannot fit.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass

from broker.model import (
    MILLI_PER_GPU,
    BurstPool,
    CapacitySnapshot,
    Cluster,
    GpuType,
    Job,
    PodSet,
    Resources,
)
from broker.taints import Taint, blocking, tolerated


@dataclass(frozen=True, slots=True)
class Shape:
    """A kind of node: what one node of it offers, the taints that keep pods off it, and
    its ``(level key, value)`` for each topology level its cluster declares."""

    gpu_type: GpuType | None
    allocatable: Resources
    taints: frozenset[Taint]
    domains: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True, slots=True)
class ClusterMaximum:
    """A cluster at its largest: its nodes by kind, its pools' nodes at ``maxNodes`` by
    kind; ``known``: its nodes have been read and are not stale."""

    cluster: Cluster
    nodes: Mapping[Shape, int]
    burst: Mapping[Shape, int]
    launchable: frozenset[str] | None = None
    known: bool = True


@dataclass(frozen=True, slots=True)
class NeverFits:
    """Why a job can never fit: its pod set ``pod_set`` needs ``pods`` pods and no cluster
    could take more than ``largest`` (``cluster``'s figure; "" when no cluster may take the
    job at all). ``pod_set`` "": each pod set fits somewhere alone, never all of them in
    one cluster. ``burst``: the pools at their maximum were counted. ``clusters``: how many
    clusters the job may go to at all (0: its selector or needs match none)."""

    pod_set: str
    pods: int
    largest: int
    cluster: str
    burst: bool
    clusters: int = 1


def maxima(
    snapshot: CapacitySnapshot, pools: Iterable[BurstPool], unread: Collection[str] = ()
) -> dict[str, ClusterMaximum]:
    """Each cluster of ``snapshot`` at its largest (see the module's docstring). ``unread``:
    clusters whose nodes have not been read yet; one with neither nodes nor pools is taken
    for one not read either."""
    by_cluster: dict[str, Counter[Shape]] = {}
    for pool in pools:
        view = snapshot.clusters.get(pool.cluster)
        levels = view.cluster.topology_levels if view is not None else pool.topology_levels
        domains = tuple((k, pool.topology_labels[k]) for k in levels if k in pool.topology_labels)
        shape = Shape(pool.gpu_type, pool.node, frozenset(), domains)
        by_cluster.setdefault(pool.cluster, Counter())[shape] += pool.max_nodes
    out = {}
    for name, view in snapshot.clusters.items():
        levels = view.cluster.topology_levels
        shapes: Counter[Shape] = Counter()
        for state in view.nodes.values():
            node = state.node
            domains = tuple((k, node.labels[k]) for k in levels if k in node.labels)
            shapes[Shape(node.gpu_type, node.allocatable, blocking(node.taints), domains)] += 1
        burst = by_cluster.pop(name, Counter())
        known = not view.stale and name not in unread and bool(shapes or burst)
        out[name] = ClusterMaximum(view.cluster, shapes, burst, view.launchable, known)
    for name, burst in by_cluster.items():  # a pool's cluster not in the snapshot: not read
        out[name] = ClusterMaximum(Cluster(name), {}, burst, None, known=False)
    return out


def never_fits(job: Job, clusters: Mapping[str, ClusterMaximum]) -> NeverFits | None:
    """Why ``job`` can never fit any of ``clusters`` at their largest; None when it may
    fit one of them, or when one it may go to is not known."""
    eligible = [c for c in clusters.values() if _may_go(job, c)]
    if any(not c.known for c in eligible):
        return None
    burst = job.allow_burst and any(c.burst for c in eligible)
    rooms = {c.cluster.name: [_room(job, ps, c) for ps in job.pod_sets] for c in eligible}
    if any(_fits(job, c, rooms[c.cluster.name]) for c in eligible):
        return None
    if not eligible:
        return NeverFits(job.pod_sets[0].name, job.pod_sets[0].count, 0, "", burst, 0)
    if job.elastic:
        total = {name: _elastic_room(job, r) for name, r in rooms.items()}
        best = max(total, key=total.__getitem__, default="")
        largest = total[best] if best else 0
        name = job.pod_sets[0].name if len(job.pod_sets) == 1 else ""
        return NeverFits(name, job.required_pods, largest, best if largest else "", burst)
    for i, ps in enumerate(job.pod_sets):
        best = max(rooms, key=lambda name: rooms[name][i], default="")
        largest = rooms[best][i] if best else 0
        if largest < ps.count:
            return NeverFits(ps.name, ps.count, largest, best if largest else "", burst)
    return NeverFits("", job.required_pods, 0, "", burst)


def _may_go(job: Job, c: ClusterMaximum) -> bool:
    if job.clusters and c.cluster.name not in job.clusters:
        return False
    if c.launchable is not None and job.launch_kind not in c.launchable:
        return False
    labels = c.cluster.labels
    return all(labels.get(k) == v for k, v in job.cluster_selector.items())


def _fits(job: Job, c: ClusterMaximum, rooms: list[int]) -> bool:
    if job.elastic:
        return _elastic_room(job, rooms) >= job.required_pods
    if any(r < ps.count for r, ps in zip(rooms, job.pod_sets, strict=True)):
        return False
    gpus = sum(
        n * s.allocatable.gpus * MILLI_PER_GPU
        for n, s in _counted(job, c)
        if s.gpu_type is not None and job.allows_gpu_type(s.gpu_type)
    )
    return job.gpu_request_milli <= gpus


def _elastic_room(job: Job, rooms: list[int]) -> int:
    """An elastic job's pods (of any pod set, each no more than its count) a cluster takes."""
    return sum(min(r, ps.count) for r, ps in zip(rooms, job.pod_sets, strict=True))


def _counted(job: Job, c: ClusterMaximum) -> list[tuple[int, Shape]]:
    """The cluster's kinds of node with how many of each, its pools' only if the job may
    burst."""
    found = [(n, s) for s, n in c.nodes.items()]
    if job.allow_burst:
        found += [(n, s) for s, n in c.burst.items()]
    return found


def _room(job: Job, ps: PodSet, c: ClusterMaximum) -> int:
    """How many pods of ``ps`` the cluster could take at most, the other pod sets aside:
    inside its roomiest domain when the pod set requires one of a level."""
    level = ps.topology.required if ps.topology is not None else ""
    if level and level not in c.cluster.topology_levels:
        return 0
    per_domain: Counter[str] = Counter()
    for n, shape in _counted(job, c):
        domain = dict(shape.domains).get(level, None) if level else ""
        if domain is not None:
            per_domain[domain] += n * _per_node(job, ps, shape)
    return max(per_domain.values(), default=0)


def _per_node(job: Job, ps: PodSet, shape: Shape) -> int:
    """How many pods of ``ps`` one empty node of ``shape`` takes."""
    r, a = ps.resources, shape.allocatable
    if shape.taints and not tolerated(ps.tolerations, shape.taints):
        return 0
    fits = ps.count
    if r.gpu_request_milli:
        if shape.gpu_type is None or not job.allows_gpu_type(shape.gpu_type):
            return 0
        fits = a.gpus // r.gpus if r.gpus else a.gpus * (MILLI_PER_GPU // r.gpu_milli)
    if r.cpu_milli:
        fits = min(fits, a.cpu_milli // r.cpu_milli)
    if r.memory_mib:
        fits = min(fits, a.memory_mib // r.memory_mib)
    return fits


__all__ = ["ClusterMaximum", "NeverFits", "Shape", "maxima", "never_fits"]
