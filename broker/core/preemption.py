"""Preemption: the running jobs a job that fits nowhere may evict to fit, if any.

As kube-scheduler's PostFilter and Kueue's preemption by simulated removal: a job that
fits nowhere may evict whole jobs of *reclaimable* queues with a lower priority
than its own, never part of a gang. Per cluster, victims are tried smallest first (then
lowest priority, then newest) on a what-if snapshot until the job fits, then any victim not
needed is dropped again; the cluster whose victims free the fewest GPUs wins. Clusters with
nodes held for a starving gang are not considered. Evicting the victims (the lifecycle
requeues them) and placing the job are the cycle's (``broker.core.scheduler``).
"""

from __future__ import annotations

from collections.abc import Mapping

from broker.core import views
from broker.core.ledger import Ledger
from broker.core.lifecycle import Launch, Lifecycle
from broker.core.queue import JobQueue
from broker.model import Job, Placement
from policies import Policy


def choose_victims(
    job: Job,
    policy: Policy,
    ledger: Ledger,
    queue: JobQueue,
    lifecycle: Lifecycle,
    held: Mapping[str, object],
) -> list[Launch] | None:
    """The fewest GPUs of whole lower-priority reclaimable jobs whose eviction lets the job
    fit, or None when no such set exists."""
    by_cluster: dict[str, list[Launch]] = {}
    for launch in lifecycle.reclaimable():
        other = launch.pending.job
        if other.priority < job.priority:
            by_cluster.setdefault(launch.placement.cluster, []).append(launch)
    best: tuple[int, str, list[Launch]] | None = None
    for cluster, candidates in sorted(by_cluster.items()):
        if cluster in held:
            continue
        chosen = _victims_in(job, policy, ledger, cluster, candidates)
        if chosen is None:
            continue
        freed = sum(v.placement.gpu_milli for v in chosen)
        if best is None or (freed, cluster) < (best[0], best[1]):
            best = (freed, cluster, chosen)
    return None if best is None else best[2]


def _victims_in(
    job: Job, policy: Policy, ledger: Ledger, cluster: str, candidates: list[Launch]
) -> list[Launch] | None:
    """The victims in one cluster: the smallest first until the job fits, then without
    those it does not need; None when evicting every candidate is not enough."""
    candidates.sort(
        key=lambda la: (la.placement.gpu_milli, la.pending.job.priority, -la.pending.seq)
    )

    def fits(victims: list[Launch]) -> bool:
        what_if = ledger.snapshot_without(v.placement for v in victims)
        return isinstance(policy.decide(job, views.only(what_if, cluster)), Placement)

    if not fits(candidates):
        return None  # evicting them all is not enough: no need to try them one by one
    chosen: list[Launch] = []
    for launch in candidates:
        chosen.append(launch)
        if fits(chosen):
            break
    else:
        return None
    for launch in sorted(chosen, key=lambda la: -la.placement.gpu_milli):
        trial = [v for v in chosen if v is not launch]
        if trial and fits(trial):
            chosen = trial
    return chosen
