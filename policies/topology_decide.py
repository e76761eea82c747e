"""Topology-aware placement across clusters: the cluster (and GPU type) whose placement of
a job with a topology request is tightest wins.

Tightest (``policies.topology.place_job``'s tightness): the fewest levels wider than asked
(summed over the pod sets; the whole cluster counts as ``WHOLE_CLUSTER`` levels, and a
cluster that does not declare a preferred level is placed on as a whole, so it counts so
too), then the fewest whole free nodes left in the chosen domains (summed), then the
calling policy's usual order among the clusters that fit: gang's rank (most pods, fewest
GPUs stranded, fewest left free, name, GPU type), the first cluster in a node-scoring
policy's order (binpack fullest first, spread emptiest first, firstfit by name, random
shuffled), for a best-cluster policy (fgd) the highest total score.

A job of one pod set (the common case) is not placed whole in every candidate: the steps
of the candidates' chains are taken across candidates, narrowest first, and none wider
than a fit already found is tried; inside a step a domain that must keep more whole free
nodes than another cluster's fit keeps is not tried either. The result is the one of
placing every candidate whole (``_each``, which jobs of several pod sets take).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from broker.model import (
    CapacitySnapshot,
    ClusterCapacity,
    Job,
    Placement,
    Reason,
    Unplaceable,
)
from policies.domains import DomainRooms
from policies.framework import Chooser, ClusterFit, diagnose, to_placement, unplaceable
from policies.topology import (
    Short,
    Step,
    Tentative,
    _chain,
    _reasons,
    _step,
    ignored_preferences,
    place_job,
)


def by_order(_: ClusterFit, index: int) -> tuple[object, ...]:
    """Ties to the candidate that comes first (the policy's usual order)."""
    return (index,)


def decide(
    job: Job,
    snapshot: CapacitySnapshot,
    candidates: Iterable[tuple[Job, ClusterCapacity]],
    choose: Chooser,
    policy: str,
    reasons: dict[str, list[Reason]],
    tie: Callable[[ClusterFit, int], tuple[object, ...]] = by_order,
) -> Placement | Unplaceable:
    """The tightest fit among ``candidates`` ((the job as the policy would place it there,
    the cluster)), ties by ``tie`` (of the fit and the candidate's index; by default the
    earliest: candidates come in the policy's usual order); else Unplaceable with ``reasons``
    and each cluster's topology reasons."""
    listed = list(candidates)
    if len(job.pod_sets) == 1:
        best = _search(listed, choose, reasons, tie)
    else:
        best = _each(listed, choose, reasons, tie)
    if best is not None:
        return to_placement(job, best, policy)
    for name, view in snapshot.clusters.items():
        if name not in reasons:  # ruled out before any placement: say so as usual, and why
            reasons[name] = [*diagnose(job, view), *ignored_preferences(job, view)]
    return unplaceable(job, snapshot, reasons)


Tie = Callable[[ClusterFit, int], tuple[object, ...]]


def _each(
    candidates: list[tuple[Job, ClusterCapacity]], choose: Chooser,
    reasons: dict[str, list[Reason]], tie: Tie,
) -> ClusterFit | None:  # fmt: skip
    """Every candidate placed whole, the lowest (tightness, tie) kept."""
    best: tuple[tuple[object, ...], ClusterFit] | None = None
    for i, (variant, view) in enumerate(candidates):
        result = place_job(variant, view, choose)
        if isinstance(result, list):
            if result and view.name not in reasons:
                reasons[view.name] = result
            continue
        fit, tight = result
        key = (*tight, *tie(fit, i))
        if best is None or key < best[0]:
            best = (key, fit)
    return None if best is None else best[1]


@dataclass(eq=False)  # walks are removed by identity: comparing their fields costs
class _Walk:
    """One candidate's way along its chain of levels."""

    index: int
    job: Job
    t: Tentative
    chain: list[Step]
    at: int = 0
    short: Short | None = None
    rooms: DomainRooms | None = None  # its pod set's domains, the same at every step


def _search(
    candidates: list[tuple[Job, ClusterCapacity]], choose: Chooser,
    reasons: dict[str, list[Reason]], tie: Tie,
) -> ClusterFit | None:  # fmt: skip
    """``_each`` for a job of one pod set (with a request), level by level across the
    candidates: a candidate's key begins with the levels wider than asked of the first
    step of its chain that takes the pod set, so the steps are tried across candidates in
    that order, and none wider than a fit found is tried. Among whole-cluster fits tied in
    the candidates' order, the first is the best. The same fit as ``_each``, the same
    reasons when none fits."""
    walks: list[_Walk] = []
    failed: dict[int, list[Reason]] = {}
    for i, (variant, view) in enumerate(candidates):
        t = Tentative(view, {}, [])
        chain = _chain(t, variant.pod_sets[0])
        if chain and isinstance(chain[0], Reason):
            failed[i] = chain
        else:
            walks.append(_Walk(i, variant, t, chain))  # type: ignore[arg-type]
    best: tuple[tuple[object, ...], ClusterFit] | None = None
    while walks:
        steps = min(w.chain[w.at][0] for w in walks)
        if best is not None and best[0][0] < steps:  # type: ignore[operator]
            break
        for w in [w for w in walks if w.chain[w.at][0] == steps]:
            whole = w.chain[w.at][1] is None and tie is by_order
            if whole and best is not None and best[0][:2] == (steps, 0):
                return best[1]  # no whole-cluster fit after it can come before it
            ps = w.job.pod_sets[0]
            # A fit of this step in another cluster: one keeping more loses to it.
            bound = best[0][1] if best is not None else None
            if w.rooms is None:  # the walk's state stays as it is until a step fits
                w.rooms = DomainRooms(w.t.view, w.t.changed, w.job, ps)
            step = w.chain[w.at]
            done = _step(w.t, w.job, ps, step, w.short, choose, bound, w.rooms)  # type: ignore[arg-type]
            if isinstance(done, tuple):
                walks.remove(w)
                t, wider, left = done
                if len(t.pods) < w.job.required_pods:
                    continue
                fit = ClusterFit(t.view.name, tuple(t.pods), t.score, t.changed)
                key = (wider, left, *tie(fit, w.index))
                if best is None or key < best[0]:
                    best = (key, fit)
                continue
            w.short, w.at = done, w.at + 1
            if w.at == len(w.chain):
                walks.remove(w)
                failed[w.index] = _reasons(w.t, w.job, ps, w.short)
    if best is None:
        for i in sorted(failed):
            name = candidates[i][1].name
            if failed[i] and name not in reasons:
                reasons[name] = failed[i]
    return None if best is None else best[1]
