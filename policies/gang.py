"""Gang placement: all of a job's pods on ONE cluster, node by node, or nothing.

Feasibility comes from the ledger's index, not from a scan: for gangs of whole-GPU pods the
histogram "how many nodes have k whole free GPUs" (per GPU type) tells in O(buckets) how many
pods each cluster could take node by node, and what best-fit packing would leave behind. The
gang goes to the cluster (and GPU type; one type per gang, like one Kueue flavor) that it
fills best: the fewest GPUs left stranded on the nodes it touches, then the fewest free GPUs
left in that type. Only that cluster is then walked node by node to name the nodes (CPU and
memory are checked there; if they fail, the next cluster is tried).

Elastic gangs (minMember below the pod count) place as many pods as fit, at least minMember.

A gang with a topology request goes through ``policies.topology`` instead: every (cluster,
GPU type) the estimate admits is tried, and the one whose chosen domain is tightest wins
(fewest levels wider than asked, then fewest whole free nodes left in the domains), ties
going to this policy's rank above.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from broker.model import (
    CapacitySnapshot,
    ClusterCapacity,
    GpuType,
    Job,
    NodeGroup,
    Placement,
    PodSet,
    Reason,
    Resources,
    Unplaceable,
)
from policies.framework import (
    Choice,
    Overlay,
    _in_groups,
    filter_cluster,
    needs_gpus,
    place_in_cluster,
    to_placement,
    unplaceable,
    usable_groups,
)
from policies.scoring import choose_bestfit
from policies.topology import wants_topology
from policies.topology_decide import decide as decide_topology


def choose_whole(overlay: Overlay, groups: Sequence[NodeGroup], res: Resources) -> Choice | None:
    """Best fit by whole free GPUs: the node with the fewest that still fit the pod, the
    nodes this gang already uses first (so a gang packs onto few nodes)."""
    need = res.gpus
    best: tuple[int, str, tuple[int, ...]] | None = None
    for state in overlay.changed.values():
        if state.whole_free >= need and _in_groups(state, groups):
            gpus = state.gpus_for(res)
            if gpus is not None and (best is None or state.whole_free < best[0]):
                best = (state.whole_free, state.name, gpus)
    view = overlay.view
    for group in groups:
        for whole, names in view.by_whole_at_least(group, need):
            if best is not None and whole >= best[0]:
                break
            for name in names:
                if name in overlay.changed:
                    continue
                gpus = view.nodes[name].gpus_for(res)
                if gpus is not None:
                    best = (whole, name, gpus)
                    break
    return None if best is None else (best[1], best[2], float(-best[0]))


def estimate(job: Job, view: ClusterCapacity) -> tuple[int, int, int] | None:
    """Best-fit packing of a whole-GPU gang on the histogram alone, O(buckets).

    Returns (pods placed, GPUs left on the nodes it touches, GPUs left free in the groups),
    or None when fewer than the required pods fit node by node.
    """
    hist: dict[int, int] = {}
    for group in _common_groups(job, view):
        _add_histogram(hist, view, group)
    return _pack(_largest_first(job), job.required_pods, hist)


def _common_groups(job: Job, view: ClusterCapacity) -> set[NodeGroup]:
    """The node groups every pod set of the job may use."""
    groups = set(view.groups())
    for ps in job.pod_sets:
        groups &= set(usable_groups(view, job, ps))
    return groups


def _add_histogram(hist: dict[int, int], view: ClusterCapacity, group: NodeGroup) -> None:
    for k, count in view.whole_histogram(group):
        hist[k] = hist.get(k, 0) + count


def _largest_first(job: Job) -> list[PodSet]:
    return sorted(job.pod_sets, key=lambda p: -p.resources.gpus)


def _pack(
    pod_sets: Sequence[PodSet], required: int, hist: dict[int, int]
) -> tuple[int, int, int] | None:
    """Best-fit packing of the pod sets, largest pods first, onto ``hist`` (which it uses
    up): the body of estimate()."""
    placed = stranded = 0
    for ps in pod_sets:
        g, remaining = ps.resources.gpus, ps.count
        for k in sorted(hist):
            if k < g or not hist[k] or not remaining:
                continue
            per_node = k // g
            full = min(hist[k], remaining // per_node)
            if full:
                hist[k] -= full
                left = k - per_node * g
                hist[left] = hist.get(left, 0) + full
                remaining -= full * per_node
                stranded += full * left
            if 0 < remaining < per_node and hist[k]:
                hist[k] -= 1
                left = k - remaining * g
                hist[left] = hist.get(left, 0) + 1
                stranded += left
                remaining = 0
        placed += ps.count - remaining
    if placed < required:
        return None
    free_after = sum(k * n for k, n in hist.items())
    return placed, stranded, free_after


# Lower is better: most pods placed (elastic gangs), fewest GPUs (milli for shared gangs)
# stranded on the nodes touched, least left free, then cluster name. The last item is the
# one GPU type the gang keeps to; None for a gang without GPUs.
Rank = tuple[int, int, int, str, GpuType | None]


class GangPolicy:
    name = "gang"

    def decide(self, job: Job, snapshot: CapacitySnapshot) -> Placement | Unplaceable:
        reasons: dict[str, list[Reason]] = {}
        whole = all(ps.resources.gpus > 0 for ps in job.pod_sets)
        ranked: list[tuple[Rank, ClusterCapacity]] = []
        for view in snapshot.clusters.values():
            rejected = filter_cluster(job, view)
            if rejected:
                reasons[view.name] = rejected
            elif whole:
                ranked.extend(_rank_whole(job, view))
            else:
                ranked.extend(_rank_shared(job, view))
        if wants_topology(job):
            return self._decide_topology(job, snapshot, ranked, reasons, whole)
        typed: dict[GpuType | None, Job] = {}  # the job restricted to one type, made once
        for rank, view in sorted(ranked, key=lambda r: r[0]):
            gpu_type = rank[4]
            fit = place_in_cluster(
                _typed(job, gpu_type, typed), view, choose_whole if whole else choose_bestfit
            )
            if fit is not None:
                return to_placement(job, fit, self.name)
        return unplaceable(job, snapshot, reasons)

    def _decide_topology(
        self, job: Job, snapshot: CapacitySnapshot, ranked: list[tuple[Rank, ClusterCapacity]],
        reasons: dict[str, list[Reason]], whole: bool,
    ) -> Placement | Unplaceable:  # fmt: skip
        """``policies.topology``: the tightest domain wins; among equally tight ones the
        (cluster, GPU type) this policy ranks first. A cluster (type) that the whole-cluster
        estimate rules out cannot take the job in a domain either."""
        typed: dict[GpuType | None, Job] = {}
        candidates = [
            (_typed(job, rank[4], typed), view) for rank, view in sorted(ranked, key=lambda r: r[0])
        ]
        choose = choose_whole if whole else choose_bestfit
        return decide_topology(job, snapshot, candidates, choose, self.name, reasons)


def _rank_whole(job: Job, view: ClusterCapacity) -> list[tuple[Rank, ClusterCapacity]]:
    """estimate() of the job restricted to each allowed GPU type of the cluster. Restricting
    the job to a type restricts its usable groups to that type's, so the histograms are made
    in one pass over the groups and split by type."""
    hists: dict[GpuType | None, dict[int, int]] = {}
    for group in _common_groups(job, view):
        _add_histogram(hists.setdefault(group[0], {}), view, group)
    pod_sets, required = _largest_first(job), job.required_pods
    ranked: list[tuple[Rank, ClusterCapacity]] = []
    for gpu_type in _allowed_types(job, view):
        est = _pack(pod_sets, required, hists.get(gpu_type, {}))
        if est is not None:
            placed, stranded, free_after = est
            ranked.append(((-placed, stranded, free_after, view.name, gpu_type), view))
    return ranked


def _rank_shared(job: Job, view: ClusterCapacity) -> list[tuple[Rank, ClusterCapacity]]:
    """Gangs with shared-GPU pods have no histogram estimate: place them for real, per type."""
    ranked: list[tuple[Rank, ClusterCapacity]] = []
    # A gang without GPUs (CPU-only pods) has no type to keep to, and may use CPU nodes.
    types: list[GpuType | None] = [*_allowed_types(job, view)] if needs_gpus(job) else [None]
    for gpu_type in types:
        fit = place_in_cluster(_typed(job, gpu_type, {}), view, choose_bestfit)
        if fit is not None:
            stranded = sum(s.free_milli for s in fit.nodes_after.values())
            taken = sum(p.resources.gpu_request_milli for p in fit.pods)
            rank = (-len(fit.pods), stranded, view.free_milli() - taken, view.name, gpu_type)
            ranked.append((rank, view))
    return ranked


def _typed(job: Job, gpu_type: GpuType | None, cache: dict[GpuType | None, Job]) -> Job:
    if gpu_type is None:
        return job
    typed = cache.get(gpu_type)
    if typed is None:
        typed = cache[gpu_type] = dataclasses.replace(job, gpu_types=frozenset({gpu_type}))
    return typed


def _allowed_types(job: Job, view: ClusterCapacity) -> list[GpuType]:
    return sorted(t for t in view.gpu_types() if t is not None and job.allows_gpu_type(t))
