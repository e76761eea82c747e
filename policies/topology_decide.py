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

import dataclasses
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from broker.model import (
    CapacitySnapshot,
    ClusterCapacity,
    Job,
    NodeState,
    Placement,
    PodPlacement,
    PodSet,
    Reason,
    Unplaceable,
)
from policies.domains import DomainRooms, labelled, memo_of
from policies.framework import (
    Chooser,
    ClusterFit,
    diagnose,
    to_placement,
    unplaceable,
    usable_groups,
)
from policies.topology import (
    Short,
    Step,
    Tentative,
    _chain,
    _reasons,
    _step,
    ignored_preferences,
    place_job,
    walk,
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
    remember: bool = True,
) -> Placement | Unplaceable:
    """The tightest fit among ``candidates`` ((the job as the policy would place it there,
    the cluster)), ties by ``tie`` (of the fit and the candidate's index; by default the
    earliest: candidates come in the policy's usual order); else Unplaceable with ``reasons``
    and each cluster's topology reasons. ``remember``: ``choose`` is a function of what it
    sees alone (it draws no random numbers), so a candidate's outcome can be kept in the
    view's memo (``_outcome``)."""
    listed = list(candidates)
    if len(job.pod_sets) == 1:
        best = _search(listed, choose, reasons, tie, remember)
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


@dataclass(frozen=True, slots=True)
class _Fitted:
    """A candidate's placement as its view's memo keeps it: its pods' nodes and GPUs in
    order, without the job's name."""

    wider: int
    left: int
    slots: tuple[tuple[str, tuple[int, ...]], ...]
    changed: Mapping[str, NodeState]
    score: float

    def fit(self, cluster: str, job: Job, ps: PodSet) -> ClusterFit:
        pods = tuple(
            PodPlacement(f"{job.name}-{ps.name}-{i}", node, gpus, ps.resources)
            for i, (node, gpus) in enumerate(self.slots)
        )
        return ClusterFit(cluster, pods, self.score, dict(self.changed))


# A candidate's whole walk: placed, the shortfall explain names (None: the usual reasons),
# or why the cluster is unfit.
Outcome = _Fitted | Short | list[Reason] | None


class _Key:
    """A memo key hashed once per decision, not once per candidate."""

    __slots__ = ("_hash", "parts")

    def __init__(self, *parts: object) -> None:
        self.parts = parts
        self._hash = hash(parts)

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Key) and self._hash == other._hash and self.parts == other.parts


def _outcome(job: Job, view: ClusterCapacity, choose: Chooser, key: _Key) -> tuple[Outcome] | None:
    """The candidate's whole walk (no step skipped for another candidate's sake), read from
    the memo its view keeps for the pod set's node groups, or made and kept there under
    ``key`` (the pod set, the job's required pods and ``choose``): it depends on those
    nodes and on the key alone, and a write to any of those nodes forgets it
    (``ClusterView.memo_for``). So a queue of alike gangs, or the next decision after a
    placement in one cluster, walks only the candidates whose nodes changed. None: the
    view keeps no memo for it (pods of shared GPUs, wrapped views)."""
    ps = job.pod_sets[0]
    if not ps.resources.gpus:
        return None
    memo = memo_of(view, tuple(usable_groups(view, job, ps)))
    if memo is None:
        return None
    kept = memo.get(key)
    if kept is None:
        rooms = DomainRooms(view, {}, job, ps)
        done = walk(Tentative(view, {}, []), job, ps, choose, rooms)
        out: Outcome
        if isinstance(done, tuple):
            after, wider, left = done
            slots = tuple((p.node, p.gpus) for p in after.pods)
            out = _Fitted(wider, left, slots, after.changed, after.score)
        else:
            out = done
        kept = memo[key] = (out,)
    return kept  # type: ignore[return-value]


def _failed(job: Job, view: ClusterCapacity, out: Outcome) -> list[Reason]:
    """The reasons of an outcome that did not place the pod set."""
    if isinstance(out, list):
        return out
    assert not isinstance(out, _Fitted)
    if out is not None and not out.where:  # whether any node has the label, as it is now
        out = dataclasses.replace(out, labelled=labelled(view, out.level))
    return _reasons(Tentative(view, {}, []), job, job.pod_sets[0], out)


Best = tuple[tuple[object, ...], ClusterFit]


def _remembered(
    candidates: list[tuple[Job, ClusterCapacity]], choose: Chooser, tie: Tie,
    outcomes: dict[int, Outcome],
) -> Best | None:  # fmt: skip
    """The best of the candidates whose outcomes the memo gives (into ``outcomes``)."""
    best: Best | None = None
    fitted: tuple[tuple[object, ...], int, _Fitted] | None = None
    keys: dict[int, tuple[_Key, int]] = {}  # by variant: the variants share their pod sets
    for i, (variant, view) in enumerate(candidates):
        known = keys.get(id(variant))
        if known is None:
            required = variant.required_pods
            known = keys[id(variant)] = (
                _Key("walk", variant.pod_sets[0], required, choose),
                required,
            )
        kept = _outcome(variant, view, choose, known[0])
        if kept is None:
            continue
        out = outcomes[i] = kept[0]
        if not isinstance(out, _Fitted) or len(out.slots) < known[1]:
            continue
        if tie is by_order:  # the fit is made for the best alone
            rank: tuple[object, ...] = (out.wider, out.left, i)
            if fitted is None or rank < fitted[0]:
                fitted = (rank, i, out)
            continue
        fit = out.fit(view.name, variant, variant.pod_sets[0])
        rank = (out.wider, out.left, *tie(fit, i))
        if best is None or rank < best[0]:
            best = (rank, fit)
    if fitted is not None:
        rank, i, out = fitted
        variant, view = candidates[i]
        best = (rank, out.fit(view.name, variant, variant.pod_sets[0]))
    return best


def _search(
    candidates: list[tuple[Job, ClusterCapacity]], choose: Chooser,
    reasons: dict[str, list[Reason]], tie: Tie, remember: bool = True,
) -> ClusterFit | None:  # fmt: skip
    """``_each`` for a job of one pod set (with a request). The candidates whose outcome the
    memo gives (``_outcome``) first; the others level by level across them: a candidate's
    key begins with the levels wider than asked of the first step of its chain that takes
    the pod set, so the steps are tried across candidates in that order, and none wider
    than a fit found is tried. Among whole-cluster fits tied in the candidates' order, the
    first is the best. The same fit as ``_each``, the same reasons when none fits."""
    outcomes: dict[int, Outcome] = {}
    best = _remembered(candidates, choose, tie, outcomes) if remember else None
    walks: list[_Walk] = []
    failed: dict[int, list[Reason]] = {}
    for i, (variant, view) in enumerate(candidates):
        if i in outcomes:
            continue
        t = Tentative(view, {}, [])
        chain = _chain(t, variant.pod_sets[0])
        if chain and isinstance(chain[0], Reason):
            failed[i] = chain
        else:
            walks.append(_Walk(i, variant, t, chain))  # type: ignore[arg-type]
    best = _walk_across(walks, choose, tie, best, failed)
    if best is None:  # each cluster's reasons: its first candidate's that has any
        for i in sorted({*failed, *outcomes}):
            name = candidates[i][1].name
            if name not in reasons:
                said = failed[i] if i in failed else _failed(*candidates[i], outcomes[i])
                if said:
                    reasons[name] = said
    return None if best is None else best[1]


def _walk_across(
    walks: list[_Walk], choose: Chooser, tie: Tie, best: Best | None,
    failed: dict[int, list[Reason]],
) -> Best | None:  # fmt: skip
    """The walks' steps, narrowest first across them, against ``best`` so far; the reasons
    of those that fail into ``failed``."""
    while walks:
        steps = min(w.chain[w.at][0] for w in walks)
        if best is not None and best[0][0] < steps:  # type: ignore[operator]
            break
        for w in [w for w in walks if w.chain[w.at][0] == steps]:
            whole = w.chain[w.at][1] is None and tie is by_order
            if whole and best is not None and best[0][:2] == (steps, 0) and best[0][2] < w.index:  # type: ignore[operator]
                return best  # no whole-cluster fit after it can come before it
            ps = w.job.pod_sets[0]
            # A fit of this step in another cluster: one keeping more loses to it.
            bound = best[0][1] if best is not None and best[0][0] == steps else None
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
    return best
