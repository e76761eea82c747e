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

from collections.abc import Collection, Iterable, Mapping

from broker.model import ClusterCapacity, Job
from policies.framework import usable_groups

# cluster -> node -> the gang holding it, for one cycle.
Holds = dict[str, dict[str, str]]


def nodes_to_hold(job: Job, view: ClusterCapacity, taken: Collection[str]) -> list[str]:
    """The nodes of ``view`` (not in ``taken``) to hold for ``job``: most whole free GPUs
    first, until, were they empty, its widest pod set's pods would all fit on them; none if
    the cluster's free nodes could not take the gang even empty, or it asks no whole GPU.
    A gang whose widest pod set requires a topology level is held inside one domain of it
    (the one needing the fewest nodes held, then the label value that sorts first; none in
    a cluster without that level), since nodes held across domains could never take it.
    O(buckets + nodes chosen), O(nodes considered) with a required level."""
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
    ordered = (name for _, names in buckets for name in names if name not in taken)
    level = widest.topology.required if widest.topology is not None else ""
    if not level:
        return _enough(view, ordered, per_pod, job.total_pods)
    if level not in view.cluster.topology_levels:
        return []
    by_domain: dict[str, list[str]] = {}
    for name in ordered:
        value = view.nodes[name].node.labels.get(level)
        if value is not None:
            by_domain.setdefault(value, []).append(name)
    best: list[str] = []
    for _, names in sorted(by_domain.items()):
        chosen = _enough(view, names, per_pod, job.total_pods)
        if chosen and (not best or len(chosen) < len(best)):
            best = chosen
    return best


def _enough(view: ClusterCapacity, names: Iterable[str], per_pod: int, pods: int) -> list[str]:
    """The first of ``names`` that, were they empty, would take ``pods`` pods of ``per_pod``
    GPUs; none if all of them could not."""
    chosen: list[str] = []
    room = 0
    for name in names:
        chosen.append(name)
        room += view.nodes[name].node.allocatable.gpus // per_pod
        if room >= pods:
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
