"""Node-scoring policies: binpack (MostAllocated / best fit), spread (LeastAllocated),
firstfit and random.

``binpack`` scores nodes exactly as the FGD paper's BestFit baseline (so its trace results
are comparable with the published ones): score = int(100 x (1 - s)) with
s = 0.5 x (CPU left / 128 cores) + 0.5 x (GPU milli left / 8 GPUs); ties go to the node name
that sorts first. It does not scan every node: nodes are bucketed by free GPU milli, buckets
are walked fullest first, and the walk stops when a bucket's best possible score (its GPU
term with no CPU left) cannot beat the best found. Clusters are tried fullest first.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from broker.model import (
    MILLI_PER_GPU,
    CapacitySnapshot,
    ClusterCapacity,
    Job,
    NodeGroup,
    NodeState,
    Placement,
    Reason,
    Resources,
    Unplaceable,
)
from policies.framework import (
    Choice,
    Chooser,
    ClusterFit,
    Overlay,
    _in_groups,
    candidate_states,
    filter_cluster,
    place_in_cluster,
    to_placement,
    unplaceable,
)
from policies.topology import wants_topology
from policies.topology_decide import by_order
from policies.topology_decide import decide as decide_topology

CPU_NORM = 128_000  # the paper's normalisation: 128 cores...
GPU_NORM = 8 * MILLI_PER_GPU  # ...and 8 GPUs per node


def bestfit_score(state: NodeState, res: Resources) -> int:
    left = (
        0.5 * (state.cpu_free - res.cpu_milli) / CPU_NORM
        + 0.5 * (state.free_milli - res.gpu_request_milli) / GPU_NORM
    )
    return int(100 * (1 - left))


def choose_bestfit(overlay: Overlay, groups: Sequence[NodeGroup], res: Resources) -> Choice | None:
    # binpack's hot loop. The winner is the node with the highest score, then the name that
    # sorts first, among the nodes that fit; so a node's score can be checked before its fit
    # (arithmetic before gpus_for), and gpus_for runs only for nodes that would win so far.
    # Inside a bucket every node has the same free milli, so the GPU term is computed once
    # per bucket, with bestfit_score's arithmetic in the same order: ties depend on every bit.
    need = res.gpu_request_milli
    cpu = res.cpu_milli
    best_score = -(10**9)
    best: tuple[str, tuple[int, ...]] | None = None
    changed = overlay.changed
    for state in changed.values():
        if state.free_milli >= need and _in_groups(state, groups):
            score = bestfit_score(state, res)
            if score > best_score or (score == best_score and best and state.name < best[0]):
                gpus = state.gpus_for(res)
                if gpus is not None:
                    best_score, best = score, (state.name, gpus)
    view = overlay.view
    nodes = view.nodes
    for group in groups:
        for free, names in view.by_free_at_least(group, need):
            gpu_left = 0.5 * (free - need) / GPU_NORM
            if best is not None and int(100 * (1 - gpu_left)) < best_score:
                break  # no node here can reach the best score even with no CPU left
            for name in names:
                if name in changed:
                    continue  # seen above, as this decision left it
                state = nodes[name]
                score = int(100 * (1 - (0.5 * (state.cpu_free - cpu) / CPU_NORM + gpu_left)))
                if score > best_score or (score == best_score and best and name < best[0]):
                    gpus = state.gpus_for(res)
                    if gpus is not None:
                        best_score, best = score, (name, gpus)
    return None if best is None else (best[0], best[1], float(best_score))


def choose_spread(overlay: Overlay, groups: Sequence[NodeGroup], res: Resources) -> Choice | None:
    """LeastAllocated: the node left emptiest after the pod (a baseline: scans candidates)."""
    best: Choice | None = None
    for state in candidate_states(overlay, groups, res.gpu_request_milli):
        gpus = state.gpus_for(res)
        if gpus is None:
            continue
        score = float(100 - bestfit_score(state, res))
        if best is None or score > best[2] or (score == best[2] and state.name < best[0]):
            best = (state.name, gpus, score)
    return best


def choose_firstfit(overlay: Overlay, groups: Sequence[NodeGroup], res: Resources) -> Choice | None:
    """The first node in the cluster's own order that fits (a baseline)."""
    for name in overlay.view.nodes:
        state = overlay.state(name)
        if state.free_milli < res.gpu_request_milli or not _in_groups(state, groups):
            continue
        gpus = state.gpus_for(res)
        if gpus is not None:
            return (name, gpus, 0.0)
    return None


def random_chooser(rng: random.Random) -> Chooser:
    def choose(overlay: Overlay, groups: Sequence[NodeGroup], res: Resources) -> Choice | None:
        fits = [
            (s.name, gpus)
            for s in candidate_states(overlay, groups, res.gpu_request_milli)
            if (gpus := s.gpus_for(res)) is not None
        ]
        if not fits:
            return None
        name, gpus = fits[rng.randrange(len(fits))]
        return (name, gpus, 0.0)

    return choose


ClusterOrder = Callable[[Iterable[ClusterCapacity]], list[ClusterCapacity]]


def fullest_first(views: Iterable[ClusterCapacity]) -> list[ClusterCapacity]:
    return sorted(views, key=lambda v: (-v.allocation(), v.name))


def emptiest_first(views: Iterable[ClusterCapacity]) -> list[ClusterCapacity]:
    return sorted(views, key=lambda v: (v.allocation(), v.name))


def by_name(views: Iterable[ClusterCapacity]) -> list[ClusterCapacity]:
    return sorted(views, key=lambda v: v.name)


@dataclass
class NodeScoringPolicy:
    """Try clusters in ``order``; in each, place pod after pod with ``chooser``.

    With ``best_cluster`` False the first cluster that takes the whole job wins; with True
    every cluster is tried and the highest total score wins (ties: the node name that sorts
    first, then the cluster name), which makes a split federation behave like one cluster.

    A job with a topology request is placed by ``policies.topology`` in every cluster that
    passes the filters; the tightest domain wins, ties going to the first cluster in
    ``order`` (with ``best_cluster``: the highest total score, as above).
    """

    name: str
    chooser: Chooser
    order: ClusterOrder
    best_cluster: bool = False
    rng: random.Random | None = field(default=None, repr=False)

    def decide(self, job: Job, snapshot: CapacitySnapshot) -> Placement | Unplaceable:
        reasons = {}
        fits: list[ClusterFit] = []
        views = list(snapshot.clusters.values())
        if self.rng is not None:
            self.rng.shuffle(views)
        else:
            views = self.order(views)
        if wants_topology(job):
            return self._decide_topology(job, snapshot, views)
        for view in views:
            rejected = filter_cluster(job, view)
            if rejected:
                reasons[view.name] = rejected
                continue
            fit = place_in_cluster(job, view, self.chooser)
            if fit is None:
                continue
            if not self.best_cluster:
                return to_placement(job, fit, self.name)
            fits.append(fit)
        if fits:
            best = min(fits, key=lambda f: (-f.score, f.pods[0].node, f.cluster))
            return to_placement(job, best, self.name)
        return unplaceable(job, snapshot, reasons)

    def _decide_topology(
        self, job: Job, snapshot: CapacitySnapshot, views: list[ClusterCapacity]
    ) -> Placement | Unplaceable:
        """``policies.topology``: the tightest domain wins across clusters; among equally
        tight ones the cluster this policy would pick: the first tried in its order, or for
        a best-cluster policy the highest total score."""
        reasons: dict[str, list[Reason]] = {}
        open_views = []
        for view in views:
            rejected = filter_cluster(job, view)
            if rejected:
                reasons[view.name] = rejected
            else:
                open_views.append((job, view))
        tie = _by_score if self.best_cluster else by_order
        # A shuffling policy's chooser draws random numbers: its outcomes are not kept.
        remember = self.rng is None
        return decide_topology(
            job, snapshot, open_views, self.chooser, self.name, reasons, tie, remember
        )


def _by_score(fit: ClusterFit, _: int) -> tuple[object, ...]:
    """A best-cluster policy's own order: the highest total score, the first node, the
    cluster name (as ``NodeScoringPolicy.decide`` picks among whole-cluster fits)."""
    return (-fit.score, fit.pods[0].node, fit.cluster)


def binpack() -> NodeScoringPolicy:
    return NodeScoringPolicy("binpack", choose_bestfit, fullest_first)


def spread() -> NodeScoringPolicy:
    return NodeScoringPolicy("spread", choose_spread, emptiest_first)


def firstfit() -> NodeScoringPolicy:
    return NodeScoringPolicy("firstfit", choose_firstfit, by_name)


def random_policy(seed: int = 0) -> NodeScoringPolicy:
    rng = random.Random(seed)
    return NodeScoringPolicy("random", random_chooser(rng), by_name, rng=rng)
