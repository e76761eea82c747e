"""The placement framework: cluster filters, node choosers, and reasons as data.

A policy decides in the kube-scheduler's shape: *filter* clusters (stale, selector, GPU
type, taints), *place* the job's pods inside a candidate cluster with a node chooser that
filters and scores nodes, *pick* among the clusters that fit, and when none does return
``Unplaceable`` with every cluster's reasons (the post-filter point, where burst planning
hooks in). Everything here is pure and synchronous: a function of (job, snapshot, seed).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from broker.model import (
    MILLI_PER_GPU,
    CapacitySnapshot,
    ClusterCapacity,
    Job,
    NodeGroup,
    NodeState,
    Placement,
    PodPlacement,
    PodSet,
    Reason,
    ReasonCode,
    Resources,
    Unplaceable,
)
from broker.taints import blocking, tolerated

STALE_MESSAGE = "capacity data is stale; no new placements"


class Policy(Protocol):
    name: str

    def decide(self, job: Job, snapshot: CapacitySnapshot) -> Placement | Unplaceable: ...


# -- cluster filters --------------------------------------------------------------------


def needs_gpus(job: Job) -> bool:
    return any(ps.resources.gpu_request_milli for ps in job.pod_sets)


def usable_groups(view: ClusterCapacity, job: Job, pod_set: PodSet) -> list[NodeGroup]:
    """Node groups of ``view`` this pod set may use: allowed GPU type, tolerated taints."""
    gpu = pod_set.resources.gpu_request_milli > 0
    tolerations = pod_set.tolerations
    return [
        g
        for g in view.groups()
        if (not g[1] or tolerated(tolerations, g[1]))
        and (not gpu or (g[0] is not None and job.allows_gpu_type(g[0])))
    ]


def filter_cluster(job: Job, view: ClusterCapacity) -> list[Reason]:
    """Reasons this cluster cannot take the job whatever its free capacity; [] if it may."""
    name = view.name
    if view.stale:
        return [Reason(ReasonCode.STALE, STALE_MESSAGE, name)]
    launchable = view.launchable
    if launchable is not None and job.launch_kind not in launchable:
        said = f"cluster {name} is agent-fed; its agent does not launch {job.launch_kind}"
        return [Reason(ReasonCode.MISSING, said, name)]
    if job.clusters and name not in job.clusters:
        return [Reason(ReasonCode.MISSING, f"cluster {name} has no {job.clusters_missing}", name)]
    labels = view.cluster.labels
    missing = {k: v for k, v in job.cluster_selector.items() if labels.get(k) != v}
    if missing:
        want = ",".join(f"{k}={v}" for k, v in sorted(missing.items()))
        return [Reason(ReasonCode.SELECTOR, f"cluster labels do not match {want}", name)]
    for ps in job.pod_sets:
        if usable_groups(view, job, ps):
            continue
        types = view.gpu_types() - {None}
        if (
            ps.resources.gpu_request_milli
            and job.gpu_types
            and types  # with no schedulable GPU node at all, the type is not the reason
            and not any(t in job.gpu_types for t in types)
        ):
            have = ",".join(sorted(str(t) for t in view.gpu_types() if t))
            want = ",".join(sorted(job.gpu_types))
            return [
                Reason(ReasonCode.GPU_TYPE, f"no {want} GPUs here (has {have or 'none'})", name)
            ]
        if any(g[1] for g in view.groups()):
            return [
                Reason(
                    ReasonCode.TAINT,
                    f"pod set {ps.name}: every usable node has a taint it does not tolerate",
                    name,
                )
            ]
        return [
            Reason(
                ReasonCode.INSUFFICIENT_GPUS, f"pod set {ps.name}: no schedulable GPU nodes", name
            )
        ]
    return []


# -- placing pods inside one cluster --------------------------------------------------------


class Overlay:
    """Node states as this decision has tentatively changed them (earlier pods of the job)."""

    __slots__ = ("changed", "view")

    def __init__(self, view: ClusterCapacity) -> None:
        self.view = view
        self.changed: dict[str, NodeState] = {}

    def state(self, name: str) -> NodeState:
        return self.changed.get(name) or self.view.nodes[name]

    def take(self, name: str, resources: Resources, gpus: tuple[int, ...]) -> None:
        self.changed[name] = self.state(name).take(resources, gpus)


# A chooser returns (node, gpus, score) for one pod, or None when no node fits.
Choice = tuple[str, tuple[int, ...], float]
Chooser = Callable[[Overlay, Sequence[NodeGroup], Resources], Choice | None]


@dataclass(frozen=True, slots=True)
class ClusterFit:
    cluster: str
    pods: tuple[PodPlacement, ...]
    score: float
    nodes_after: dict[str, NodeState] = field(hash=False, compare=False)


def place_in_cluster(job: Job, view: ClusterCapacity, choose: Chooser) -> ClusterFit | None:
    """Give every pod of the job a node by ``choose``, each seeing the earlier ones.

    An elastic gang keeps what fits once at least minMember pods are placed. Returns None
    when the job (or its minimum) does not fit.
    """
    overlay = Overlay(view)
    placed: list[PodPlacement] = []
    score = 0.0
    for ps in job.pod_sets:
        groups = usable_groups(view, job, ps)
        for i in range(ps.count):
            choice = choose(overlay, groups, ps.resources)
            if choice is None:
                break  # the pod set's remaining pods are identical: none fits either
            node, gpus, pod_score = choice
            overlay.take(node, ps.resources, gpus)
            placed.append(PodPlacement(f"{job.name}-{ps.name}-{i}", node, gpus, ps.resources))
            score += pod_score
    if len(placed) < job.required_pods:
        return None
    return ClusterFit(view.name, tuple(placed), score, overlay.changed)


def candidate_states(
    overlay: Overlay, groups: Sequence[NodeGroup], need_milli: int
) -> Iterable[NodeState]:
    """Every schedulable node of ``groups`` with at least ``need_milli`` free GPU milli."""
    view = overlay.view
    for state in overlay.changed.values():
        if state.free_milli >= need_milli and _in_groups(state, groups):
            yield state
    for group in groups:
        for _, names in view.by_free_at_least(group, need_milli):
            for name in names:
                if name not in overlay.changed:
                    yield view.nodes[name]


def _in_groups(state: NodeState, groups: Sequence[NodeGroup]) -> bool:
    node = state.node
    return node.schedulable and (node.gpu_type, blocking(node.taints)) in groups


# -- explaining a "no" ---------------------------------------------------------------------


def whole_gpu_capacity(view: ClusterCapacity, groups: Iterable[NodeGroup], per_pod: int) -> int:
    """How many pods of ``per_pod`` whole GPUs the nodes could take, node by node: O(buckets)."""
    return sum(count * (k // per_pod) for g in groups for k, count in view.whole_histogram(g))


def largest_fit(job: Job, view: ClusterCapacity) -> int:
    """The largest number of this job's pods the cluster could take now (an estimate from
    the whole-GPU histogram for GPU pods, exact for single-shape gangs of whole GPUs)."""
    if filter_cluster(job, view):
        return 0
    total = 0
    for ps in job.pod_sets:
        groups = usable_groups(view, job, ps)
        res = ps.resources
        if res.gpus:
            total += min(ps.count, whole_gpu_capacity(view, groups, res.gpus))
        else:
            # Nodes with enough free milli in total: an upper bound, from bucket sizes.
            milli = res.gpu_milli
            nodes = sum(len(n) for g in groups for _, n in view.by_free_at_least(g, milli))
            total += min(ps.count, nodes)
    return total


def diagnose(job: Job, view: ClusterCapacity) -> list[Reason]:
    """Per-cluster reasons for a job that passed the filters but did not fit."""
    name = view.name
    reasons: list[Reason] = []
    for ps in job.pod_sets:
        res = ps.resources
        groups = usable_groups(view, job, ps)
        free = sum(view.free_milli(g) for g in groups)
        need = ps.count * res.gpu_request_milli
        if res.gpu_request_milli and free < min(need, job.required_pods * res.gpu_request_milli):
            reasons.append(
                Reason(
                    ReasonCode.INSUFFICIENT_GPUS,
                    f"pod set {ps.name} needs {need / MILLI_PER_GPU:g} GPUs, "
                    f"{free / MILLI_PER_GPU:g} free in total",
                    name,
                )
            )
            continue
        if res.gpus:
            fits = whole_gpu_capacity(view, groups, res.gpus)
            if fits == 0:
                most = max((k for g in groups for k, _ in view.whole_histogram(g)), default=0)
                reasons.append(
                    Reason(
                        ReasonCode.NODE_FIT,
                        f"pod set {ps.name}: no node has {res.gpus} whole free GPUs "
                        f"(most on one node: {most})",
                        name,
                    )
                )
                continue
            if fits < ps.count:
                reasons.append(
                    Reason(
                        ReasonCode.GANG_TOO_LARGE,
                        f"pod set {ps.name}: {ps.count} pods of {res.gpus} GPUs, "
                        f"but nodes can take only {fits} such pods",
                        name,
                    )
                )
                continue
        reasons.append(
            Reason(
                ReasonCode.CPU_MEMORY
                if res.gpu_request_milli == 0 or res.gpus
                else ReasonCode.NODE_FIT,
                f"pod set {ps.name}: no node has room for {res.cpu_milli}m CPU, "
                f"{res.memory_mib}Mi memory and its GPUs together",
                name,
            )
        )
    return reasons or [Reason(ReasonCode.NODE_FIT, "the pod sets do not fit together", name)]


def unplaceable(
    job: Job, snapshot: CapacitySnapshot, reasons: dict[str, list[Reason]]
) -> Unplaceable:
    if not snapshot.clusters:
        return Unplaceable(
            job.key, (Reason(ReasonCode.NO_CLUSTERS, "the federation has no clusters"),)
        )
    flat: list[Reason] = []
    for name in sorted(snapshot.clusters):
        flat.extend(reasons.get(name) or diagnose(job, snapshot.clusters[name]))
    fits = {name: largest_fit(job, view) for name, view in snapshot.clusters.items()}
    return Unplaceable(job.key, tuple(flat), fits)


def to_placement(job: Job, fit: ClusterFit, policy: str) -> Placement:
    return Placement(job.key, fit.cluster, fit.pods, policy)
