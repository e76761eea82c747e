"""A cheap "can it fit anywhere at all?" before a policy is asked.

Necessary conditions read off a snapshot's index in O(clusters x GPU types x buckets): in
some cluster that is not stale, enough free GPUs of the types the job allows, and for each
pod set of whole-GPU pods enough nodes with that many whole free GPUs (CPU, memory, taints
and selectors are left to the policy). It only skips decisions that would say "no" anyway,
and a policy's "why not" is its costliest answer: with a long backlog on a full federation
most of a scheduling cycle would otherwise go into reasons nobody reads (``explain``
computes them when asked).
"""

from __future__ import annotations

from broker.model import CapacitySnapshot, ClusterCapacity, Job, NodeGroup


def may_fit(job: Job, snapshot: CapacitySnapshot) -> bool:
    if job.elastic:
        return True
    return any(not v.stale and may_fit_cluster(job, v) for v in snapshot.clusters.values())


def may_fit_cluster(job: Job, view: ClusterCapacity) -> bool:
    groups = [g for g in view.groups() if g[0] is not None and job.allows_gpu_type(g[0])]
    if sum(view.free_milli(g) for g in groups) < job.gpu_request_milli:
        return False
    for ps in job.pod_sets:
        per_pod = ps.resources.gpus
        if per_pod and not _whole_nodes_for(view, groups, per_pod, ps.count):
            return False
    return True


def _whole_nodes_for(
    view: ClusterCapacity, groups: list[NodeGroup], per_pod: int, count: int
) -> bool:
    """Whether nodes of ``groups`` have room for ``count`` pods of ``per_pod`` whole GPUs:
    only buckets of at least ``per_pod`` free GPUs are read, and only until enough."""
    fits = 0
    for group in groups:
        for whole, names in view.by_whole_at_least(group, per_pod):
            fits += len(names) * (whole // per_pod)
            if fits >= count:
                return True
    return False
