"""Gang placement: all of a job's pods on ONE cluster, node by node, or nothing.

Feasibility comes from the ledger's index, not from a scan: for gangs of whole-GPU pods the
histogram "how many nodes have k whole free GPUs" (per GPU type) tells in O(buckets) how many
pods each cluster could take node by node, and what best-fit packing would leave behind. The
gang goes to the cluster (and GPU type; one type per gang, like one Kueue flavor) that it
fills best: the fewest GPUs left stranded on the nodes it touches, then the fewest free GPUs
left in that type. Only that cluster is then walked node by node to name the nodes (CPU and
memory are checked there; if they fail, the next cluster is tried).

Elastic gangs (minMember below the pod count) place as many pods as fit, at least minMember.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Sequence

from broker.model import (
    CapacitySnapshot,
    ClusterCapacity,
    GpuType,
    Job,
    NodeGroup,
    Placement,
    Resources,
    Unplaceable,
)
from policies.framework import (
    Choice,
    Overlay,
    _in_groups,
    filter_cluster,
    place_in_cluster,
    to_placement,
    unplaceable,
    usable_groups,
)
from policies.scoring import choose_bestfit


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
    groups = set(view.groups())
    for ps in job.pod_sets:
        groups &= set(usable_groups(view, job, ps))
    hist: Counter[int] = Counter()
    for group in groups:
        for k, count in view.whole_histogram(group):
            hist[k] += count
    placed = stranded = 0
    for ps in sorted(job.pod_sets, key=lambda p: -p.resources.gpus):
        g, remaining = ps.resources.gpus, ps.count
        for k in sorted(hist):
            if k < g or not hist[k] or not remaining:
                continue
            per_node = k // g
            full = min(hist[k], remaining // per_node)
            if full:
                hist[k] -= full
                hist[k - per_node * g] += full
                remaining -= full * per_node
                stranded += full * (k - per_node * g)
            if 0 < remaining < per_node and hist[k]:
                hist[k] -= 1
                hist[k - remaining * g] += 1
                stranded += k - remaining * g
                remaining = 0
        placed += ps.count - remaining
    if placed < job.required_pods:
        return None
    free_after = sum(k * n for k, n in hist.items())
    return placed, stranded, free_after


class GangPolicy:
    name = "gang"

    def decide(self, job: Job, snapshot: CapacitySnapshot) -> Placement | Unplaceable:
        reasons = {}
        whole = all(ps.resources.gpus > 0 for ps in job.pod_sets)
        ranked: list[tuple[tuple[int, int, str, str], Job, ClusterCapacity]] = []
        for view in snapshot.clusters.values():
            rejected = filter_cluster(job, view)
            if rejected:
                reasons[view.name] = rejected
                continue
            for gpu_type in _allowed_types(job, view):
                typed = dataclasses.replace(job, gpu_types=frozenset({gpu_type}))
                if not whole:
                    fit = place_in_cluster(typed, view, choose_bestfit)
                    if fit is not None:
                        stranded = sum(s.free_milli for s in fit.nodes_after.values())
                        free_after = view.free_milli() - fit.pods[0].resources.gpu_request_milli
                        ranked.append(((stranded, free_after, view.name, gpu_type), typed, view))
                    continue
                est = estimate(typed, view)
                if est is not None:
                    ranked.append(((-est[0], est[1] * 1000 + est[2], view.name, gpu_type), typed, view))
        for _, typed, view in sorted(ranked, key=lambda r: r[0]):
            fit = place_in_cluster(typed, view, choose_whole if whole else choose_bestfit)
            if fit is not None:
                return to_placement(job, fit, self.name)
        return unplaceable(job, snapshot, reasons)


def _allowed_types(job: Job, view: ClusterCapacity) -> list[GpuType]:
    return sorted(t for t in view.gpu_types() if t is not None and job.allows_gpu_type(t))
