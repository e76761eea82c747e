"""Topology-aware placement: a pod set's pods inside one domain (a rack, a block, an NVLink
clique), chosen so that domains fill one at a time.

A domain of level L is the set of a cluster's nodes sharing one value of the node label L;
a node without the label is in no domain of L. For a pod set with ``required = L`` every
domain of L is tried with the policy's own node chooser (node by node, exactly as without a
request, but seeing only the domain's nodes) and the *tightest* that takes the whole pod set
wins: the one left with the fewest whole free nodes (schedulable GPU nodes with every GPU
free; for pods of whole GPUs, among the nodes that could take one) in its enclosing domains
of the wider declared levels, widest first, then in itself, then the label value that sorts
first. So a rack is taken in the block already most used, racks and blocks fill one at a
time, and whole ones stay free for the gangs that need them, as binpack keeps whole nodes
free. For pods of whole GPUs only the nodes with room for one are read (off the cluster's
index, as ``domains.DomainRooms``, remembered by the view), a domain without room for the
pod set in total is not tried, nor one that cannot come out tighter than the best so far.
``preferred = L`` tries L, then each wider declared level (those before L in
``Cluster.topology_levels``), then the whole cluster. Slices (``slice_size`` pods each
inside one domain of ``slice_level``) are placed one after the other, each in the tightest
domain of the slice level inside the pod set's chosen scope.

Across clusters (``policies.topology_decide``): the cluster whose placement went the fewest
levels wider than asked wins, then the one whose chosen domains are left with the fewest
whole free nodes, then the calling policy's usual order (``place_job`` gives a cluster's
tightness; ``_chain`` and ``_step`` let the search take one level at a time).

A pod set with a request is placed whole or not at all (an elastic gang's minimum does not
split a domain); a slice level or a required level the cluster does not declare makes it
unfit, with a reason naming the level. A required level no domain of which has room is
explained with the shortfall ("pod set worker: no rack (cloud.provider.com/topology-rack) in
dc has room for 5 pods of 8 GPUs; the largest has room for 4 (b1-r2)"); a preferred level
the cluster does not declare, when the job does not fit there at all, with a note that it
is ignored there beside the usual reasons.

Jobs without a topology request never come here: ``wants_topology`` is the only cost they
pay, so their placements and decision rates stay exactly as they are.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from broker.model import (
    ClusterCapacity,
    Job,
    NodeState,
    PodPlacement,
    PodSet,
    Reason,
    ReasonCode,
)
from policies.domains import DomainRooms, DomainView, Most, labelled
from policies.framework import (
    Chooser,
    ClusterFit,
    Overlay,
    diagnose,
    largest_fit,
    usable_groups,
)

# Steps wider than asked when a pod set ends up on the whole cluster (no domain at all).
WHOLE_CLUSTER = 1000


def wants_topology(job: Job) -> bool:
    return any(ps.topology is not None for ps in job.pod_sets)


def level_name(key: str) -> str:
    """How explain names a level: ``rack (cloud.provider.com/topology-rack)`` from the last
    path segment's part after a dash, else the key itself."""
    last = key.rsplit("/", 1)[-1]
    short = last.rsplit("-", 1)[-1] if "-" in last else ""
    return f"{short} ({key})" if short else f"domain of {key}"


# -- placing one pod set ----------------------------------------------------------------


@dataclass
class Tentative:
    """What this decision has placed so far in one cluster: changed node states and pods."""

    view: ClusterCapacity
    changed: dict[str, NodeState]
    pods: list[PodPlacement]
    score: float = 0.0

    def state(self, name: str) -> NodeState:
        return self.changed.get(name) or self.view.nodes[name]

    def copy(self) -> Tentative:
        return Tentative(self.view, dict(self.changed), list(self.pods), self.score)

    def whole_free_nodes(self, names: Iterable[str]) -> int:
        """Schedulable GPU nodes among ``names`` with every GPU free."""
        count = 0
        for name in names:
            s = self.state(name)
            count += bool(s.node.schedulable and s.gpu_free and s.whole_free == len(s.gpu_free))
        return count


def fill(
    t: Tentative, job: Job, ps: PodSet, names: Sequence[str] | None, first: int, count: int,
    choose: Chooser,
) -> int:  # fmt: skip
    """Place pods ``first .. first+count-1`` of ``ps`` on ``names`` (None: the whole
    cluster) with ``choose``, into ``t``; returns how many were placed (all or fewer)."""
    if names is None:
        overlay = Overlay(t.view)
        overlay.changed = t.changed  # today's path: the cluster's own index
    else:
        overlay = Overlay(DomainView(t.view, [t.state(n) for n in names]))
    groups = usable_groups(overlay.view, job, ps)
    for i in range(first, first + count):
        choice = choose(overlay, groups, ps.resources)
        if choice is None:
            return i - first
        node, gpus, score = choice
        overlay.take(node, ps.resources, gpus)
        t.pods.append(PodPlacement(f"{job.name}-{ps.name}-{i}", node, gpus, ps.resources))
        t.score += score
    t.changed.update(overlay.changed)
    return count


@dataclass(frozen=True, slots=True)
class Short:
    """No domain of ``level`` took the pod set (or a slice): the largest took (or had
    room for) ``best`` pods (slices) of ``need``, in the domain ``where`` ("": none had room
    for any; ``labelled``: whether any node carries the level's label)."""

    level: str
    need: int
    best: int
    where: str
    labelled: bool = True


def place_in_domains(
    t: Tentative, job: Job, ps: PodSet, level: str, within: Sequence[str] | None,
    choose: Chooser, bound: int | None = None, rooms: DomainRooms | None = None,
) -> tuple[Tentative, int] | Short:  # fmt: skip
    """The pod set in the tightest domain of ``level`` inside ``within`` (slices in theirs):
    the tentative state after it and the whole free nodes its domain keeps. With ``bound``
    (another cluster's fit keeps that many), a domain of the widest level that must keep
    more is not tried: this cluster would lose with it."""

    def trial(at: Tentative, names: list[str]) -> int | None:
        return place_scope(at, job, ps, names, choose)

    rooms = rooms or DomainRooms(t.view, t.changed, job, ps)
    best = _tightest(t, level, within, trial, rooms, ps.count, bound)
    if isinstance(best, tuple):
        return best
    size = _slice(ps)[0] or 1
    named = bool(best.where) or labelled(t.view, level)
    return Short(level, ps.count // size, best.best // size, best.where, named)


def _tightest(
    t: Tentative, level: str, within: Sequence[str] | None,
    trial: Callable[[Tentative, list[str]], int | None], rooms: DomainRooms, want: int,
    bound: int | None = None,
) -> tuple[Tentative, int] | Most:  # fmt: skip
    """``trial`` (None: it fitted; else how much did) on a copy of ``t`` in every domain of
    ``level`` inside ``within``; the tightest that fits, with the whole free nodes it keeps.
    Tightest: fewest whole free nodes left in its enclosing domains of the wider declared
    levels, widest first (so a rack is taken in the block already most used, and whole
    blocks stay free), then in itself, then the label value that sorts first. Else the
    domain where the trial went furthest. With room counted (pods of whole GPUs), a domain
    whose nodes together have room for fewer than ``want`` is not tried: most are not, in a
    busy cluster, and a trial costs a domain's worth of node states."""
    declared = t.view.cluster.topology_levels
    wider = declared[: declared.index(level)] if level in declared else ()
    found, most_room = rooms.of(level, within)
    if rooms.room is not None and most_room.best < want:
        return most_room  # no domain has room: none is tried
    enclosing: list[dict[str, list[str]]] | None = None
    best: tuple[tuple[int, ...], str, Tentative, int] | None = None
    most = Most(0, "")
    for value, names, fits in found:
        if fits is not None and fits < want:
            if fits > most.best or not most.where:
                most = Most(fits, value)
            continue
        if enclosing is None:
            enclosing = [{v: n for v, n, _ in rooms.of(key, None)[0]} for key in wider]
        labels = t.view.nodes[names[0]].node.labels
        around = [d.get(labels.get(key, ""), ()) for key, d in zip(wider, enclosing, strict=True)]
        if best is not None or (bound is not None and not wider):
            # Each pod takes from one node, so the trial leaves at least this many whole
            # free nodes; a domain that cannot come out tighter (an equal key loses to the
            # earlier value) is not tried.
            floor = tuple(max(0, t.whole_free_nodes(n) - want) for n in (*around, names))
            if (best is not None and floor >= best[0]) or (
                bound is not None and not wider and floor[-1] > bound
            ):
                continue
        at = t.copy()
        short = trial(at, names)
        if short is not None:
            if short > most.best or not most.where:
                most = Most(short, value)
            continue
        outer = [at.whole_free_nodes(n) for n in around]
        left = at.whole_free_nodes(names)
        key = (*outer, left)
        if best is None or (key, value) < best[:2]:
            best = (key, value, at, left)
    return most if best is None else (best[2], best[3])


def _slice(ps: PodSet) -> tuple[int, str]:
    topo = ps.topology
    return (topo.slice_size, topo.slice_level) if topo is not None else (0, "")


def place_scope(
    t: Tentative, job: Job, ps: PodSet, names: Sequence[str] | None, choose: Chooser
) -> int | None:
    """The whole pod set inside ``names`` (None: the cluster), slice by slice when it has
    slices; None when placed, else how many pods fitted (in whole slices)."""
    size, level = _slice(ps)
    if not size:
        placed = fill(t, job, ps, names, 0, ps.count, choose)
        return None if placed == ps.count else placed
    for k in range(ps.count // size):
        trial = _one_slice(t, job, ps, k * size, size, level, names, choose)
        if trial is None:
            return k * size
        t.changed, t.pods, t.score = trial.changed, trial.pods, trial.score
    return None


def _one_slice(
    t: Tentative, job: Job, ps: PodSet, first: int, size: int, level: str,
    within: Sequence[str] | None, choose: Chooser,
) -> Tentative | None:  # fmt: skip
    def trial(at: Tentative, names: list[str]) -> int | None:
        placed = fill(at, job, ps, names, first, size, choose)
        return None if placed == size else placed

    best = _tightest(t, level, within, trial, DomainRooms(t.view, t.changed, job, ps), size)
    return best[0] if isinstance(best, tuple) else None


# -- one cluster --------------------------------------------------------------------------

# (levels wider than asked, summed over the pod sets; whole free nodes left in the chosen
# domains): lower is tighter.
Tightness = tuple[int, int]


def place_job(
    job: Job, view: ClusterCapacity, choose: Chooser
) -> tuple[ClusterFit, Tightness] | list[Reason]:
    """Every pod set of ``job`` in ``view``, those with a topology request each in its
    domain (all its pods or none), the others node by node as without one (an elastic gang
    may leave some of those out); or the reasons it does not fit."""
    t = Tentative(view, {}, [])
    wider = left = 0
    for ps in job.pod_sets:
        if ps.topology is None:
            fill(t, job, ps, None, 0, ps.count, choose)
            continue
        placed = _place_requested(t, job, ps, choose)
        if isinstance(placed, list):
            return placed
        t, steps, kept = placed
        wider += steps
        left += kept
    if len(t.pods) < job.required_pods:
        return []
    return ClusterFit(view.name, tuple(t.pods), t.score, t.changed), (wider, left)


Step = tuple[int, str | None]  # (levels wider than asked, the level; None: the cluster)


def _chain(t: Tentative, ps: PodSet) -> list[Step] | list[Reason]:
    """The levels a pod set with a request tries in ``t``'s cluster, narrowest first, each
    with how many levels wider than asked it is; or why the cluster is unfit."""
    topo = ps.topology
    assert topo is not None
    declared = t.view.cluster.topology_levels
    name = t.view.name
    for key in (topo.required, topo.slice_level):
        if key and key not in declared:
            said = f"pod set {ps.name}: cluster {name} declares no topology level {key}"
            return [Reason(ReasonCode.TOPOLOGY, said, name)]
    chain: list[str | None]
    if topo.required:
        # with a narrower preferred level too: it first, then wider, never past required
        top = declared.index(topo.required)
        low = declared.index(topo.preferred) if topo.preferred in declared else top
        chain = [*reversed(declared[top : max(top, low) + 1])]
    elif topo.preferred in declared:
        i = declared.index(topo.preferred)
        chain = [*reversed(declared[: i + 1]), None]
    else:  # no level or one the cluster does not declare: the whole cluster
        chain = [None]
    far = WHOLE_CLUSTER if topo.required or topo.preferred else 0
    return [(far if level is None else steps, level) for steps, level in enumerate(chain)]


Placed = tuple[Tentative, int, int]  # the state after, levels wider than asked, whole free


def _step(
    t: Tentative, job: Job, ps: PodSet, step: Step, short: Short | None, choose: Chooser,
    bound: int | None = None, rooms: DomainRooms | None = None,
) -> Placed | Short | None:  # fmt: skip
    """One step of the chain: placed, or the shortfall explain names so far (the first
    level's, or for slices the whole cluster's; None: the usual reasons)."""
    steps, level = step
    if level is None:
        trial = t.copy()
        fitted = place_scope(trial, job, ps, None, choose)
        if fitted is None:
            return trial, steps, 0
        size, slice_level = _slice(ps)
        # Without slices the whole cluster could not take it: say why, as usual.
        return Short(slice_level, ps.count // size, fitted // size, "") if size else None
    placed = place_in_domains(t, job, ps, level, None, choose, bound, rooms)
    if isinstance(placed, Short):
        return short or placed
    return placed[0], steps, placed[1]


def _reasons(t: Tentative, job: Job, ps: PodSet, short: Short | None) -> list[Reason]:
    """Why no step of the chain took the pod set."""
    name = t.view.name
    if short is not None:
        return [Reason(ReasonCode.TOPOLOGY, _shortfall(ps, name, short), name)]
    return [*diagnose(job, t.view), *ignored_preferences(job, t.view, ps)]


def ignored_preferences(
    job: Job, view: ClusterCapacity, only: PodSet | None = None
) -> list[Reason]:
    """Explain's note, for a cluster that cannot take the job at all, that a preferred
    level it does not declare is ignored there (of ``only``, or of every pod set)."""
    declared = view.cluster.topology_levels
    notes = []
    for ps in job.pod_sets if only is None else (only,):
        topo = ps.topology
        if topo is not None and topo.preferred and topo.preferred not in declared:
            said = f"pod set {ps.name}: cluster {view.name} declares no topology level "
            said += f"{topo.preferred}; the preference is ignored here"
            notes.append(Reason(ReasonCode.TOPOLOGY, said, view.name))
    return notes


def walk(
    t: Tentative, job: Job, ps: PodSet, choose: Chooser, rooms: DomainRooms | None = None
) -> Placed | Short | list[Reason] | None:
    """One pod set with a request along its whole chain: placed (the state after it, levels
    wider than asked, whole free nodes left in its domain), the shortfall explain names
    (None: the usual reasons), or why the cluster is unfit."""
    short: Short | None = None
    for step in _chain(t, ps):
        if isinstance(step, Reason):
            return [step]
        done = _step(t, job, ps, step, short, choose, None, rooms)
        if isinstance(done, tuple):
            return done
        short = done
    return short


def _place_requested(t: Tentative, job: Job, ps: PodSet, choose: Chooser) -> Placed | list[Reason]:
    """One pod set with a request: (the state after it, levels wider than asked, whole free
    nodes left in its domain) or the reasons."""
    done = walk(t, job, ps, choose)
    if isinstance(done, tuple | list):
        return done
    return _reasons(t, job, ps, done)


def _shortfall(ps: PodSet, cluster: str, short: Short) -> str:
    """E.g. "pod set w: no rack (cloud.provider.com/topology-rack) in dc has room for 5 pods
    of 8 GPUs; the largest has room for 4 (b1-r2)"."""
    res = ps.resources
    what = (
        f"{res.gpus} GPUs"
        if res.gpus
        else f"{res.gpu_milli}m of a GPU"
        if res.gpu_milli
        else f"{res.cpu_milli}m CPU"
    )
    size, slice_level = _slice(ps)
    unit = f"pods of {what}"
    if size:
        unit = f"slices of {size} pods of {what}, each in one {level_name(slice_level)}"
    if size and short.level == slice_level and not short.where:
        return (
            f"pod set {ps.name}: only {short.best} of {short.need} slices of {size} pods of "
            f"{what} fit in {cluster}, each in one {level_name(slice_level)}"
        )
    said = f"pod set {ps.name}: no {level_name(short.level)} in {cluster} has room for "
    said += f"{short.need} {unit}"
    if not short.labelled:
        return said + f"; no node has the label {short.level}"
    if not short.where:
        return said + "; none has room for one"
    return said + f"; the largest has room for {short.best} ({short.where})"


def largest_fit_in_domains(job: Job, view: ClusterCapacity) -> int:
    """``largest_fit`` as explain shows it: for a job of one pod set of whole GPUs with a
    required level, no more than the domain of that level with the most room takes (its
    shortfall names it; none where the cluster does not declare the level), so the figure
    never says a gang fits whole where it cannot."""
    fits = largest_fit(job, view)
    ps = job.pod_sets[0]
    level = ps.topology.required if ps.topology is not None else ""
    if len(job.pod_sets) != 1 or not level or not ps.resources.gpus or not fits:
        return fits
    if level not in view.cluster.topology_levels:
        return 0
    return min(fits, DomainRooms(view, {}, job, ps).of(level, None)[1].best)
