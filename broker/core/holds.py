"""Holds: the nodes a starving gang waits on, kept from the jobs behind it.

A gang that has waited past ``starvation_seconds`` would wait forever if small jobs behind
it took every GPU freed in the cluster where it comes closest to fitting. As Slurm's
backfill reserves nodes for the job at the head, the cycle *holds* nodes for it: in that
cluster, the nodes with the most whole free GPUs, just enough that, once empty, they would
take the whole gang. Jobs behind it decide without those nodes; every other node stays open
to them (holding the whole cluster starved everything else: in the openb replay it raised
the p95 gang wait five-fold). Holds are recomputed every cycle, so they end by themselves.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

from broker.model import ClusterCapacity, Job
from policies.framework import usable_groups

# cluster -> node -> the gang holding it, for one cycle.
Holds = dict[str, dict[str, str]]


def nodes_to_hold(job: Job, view: ClusterCapacity, taken: Collection[str]) -> list[str]:
    """The nodes of ``view`` (not in ``taken``) to hold for ``job``: most whole free GPUs
    first, until, were they empty, its widest pod set's pods would all fit on them; none if
    the cluster's free nodes could not take the gang even empty, or it asks no whole GPU.
    O(buckets + nodes chosen)."""
    widest = max(job.pod_sets, key=lambda ps: ps.resources.gpus)
    per_pod = widest.resources.gpus
    if per_pod <= 0:
        return []
    buckets = [
        (whole, names)
        for group in usable_groups(view, job, widest)
        for whole, names in view.by_whole_at_least(group, 0)
    ]
    buckets.sort(key=lambda bucket: -bucket[0])
    chosen: list[str] = []
    room = 0
    for _, names in buckets:
        for name in names:
            if name in taken:
                continue
            chosen.append(name)
            room += view.nodes[name].node.allocatable.gpus // per_pod
            if room >= job.total_pods:
                return chosen
    return []


def hidden_with(holds: Holds, hidden: Mapping[str, Collection[str]] | None) -> dict[str, set[str]]:
    """The nodes a job must decide without: those held this cycle and its own ``hidden``."""
    merged = {cluster: set(nodes) for cluster, nodes in holds.items()}
    for cluster, nodes in (hidden or {}).items():
        merged.setdefault(cluster, set()).update(nodes)
    return merged


def held_keys(holds: Holds) -> frozenset[tuple[str, str]]:
    """The held (cluster, node) pairs, as the shape memo compares them."""
    return frozenset((c, n) for c, nodes in holds.items() for n in nodes)
