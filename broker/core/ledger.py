"""The ledger: the one owner of capacity state in the federation, and of reservations.

It applies node and pod events from the clusters, records the broker's own decisions as
*assumed* reservations (kube-scheduler's assume: the decision counts at once, before the
launch is written), turns them into bound usage on ``confirm`` and drops them on
``forget``. ``snapshot()`` hands the policies an immutable, indexed view in O(clusters)
(``broker.core.views``): each cluster's view is frozen when a snapshot takes it and copied
on the ledger's next write to that cluster only, so a decision never sees a half-applied
change.

Invariant kept here (and property-tested): for every node, bound + assumed requests never
exceed allocatable in any resource. ``assume`` checks a whole placement before it applies
any of it, so a gang is reserved wholly or not at all.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from broker.core.views import ClusterView, Snapshot
from broker.model import (
    CapacityEvent,
    Cluster,
    GpuType,
    Node,
    NodeDeleted,
    NodeState,
    NodeUpdated,
    Placement,
    PodBound,
    PodDeleted,
    Resources,
)


class ConflictError(Exception):
    """A placement no longer fits the ledger (it was decided on an older snapshot)."""


@dataclass(slots=True)
class _Pod:
    cluster: str
    node: str
    resources: Resources
    gpus: tuple[int, ...]
    job: str | None
    assumed: bool
    seen: bool = True  # reported by its cluster; False: only the broker's guess of where


class Ledger:
    """Capacity of every member cluster: bound usage from the clusters plus assumptions."""

    def __init__(self) -> None:
        self._views: dict[str, ClusterView] = {}
        self._pods: dict[tuple[str, str], _Pod] = {}
        self._pods_on_node: dict[tuple[str, str], set[str]] = {}
        self._assumed: dict[str, Placement] = {}
        self._version = 0
        # Bumped by every change except an assumption: while it stays put, the federation
        # has only lost room (the scheduler's memo of unplaceable job shapes relies on it).
        self._growth = 0
        self.overcommitted_pods = 0
        self._overcommitted: set[tuple[str, str]] = set()  # nodes reality overfills

    # -- clusters and events --------------------------------------------------------------

    def add_cluster(self, cluster: Cluster, nodes: Iterable[Node] = ()) -> None:
        if cluster.name in self._views:
            raise ValueError(f"cluster {cluster.name!r} is already a member")
        view = ClusterView(cluster)
        self._views[cluster.name] = view
        for node in nodes:
            view._put(NodeState.empty(node))
        self._version += 1
        self._growth += 1

    def set_stale(self, cluster: str, stale: bool) -> None:
        self._writable(cluster).stale = stale

    def set_launchable(self, cluster: str, kinds: frozenset[str] | None) -> None:
        """The job kinds ``cluster``'s launcher creates (None: any; an agent-fed member
        takes only those its agent launches)."""
        if self._views[cluster].launchable != kinds:
            self._writable(cluster).launchable = kinds

    def apply(self, event: CapacityEvent) -> list[str]:
        """Apply one capacity event. Returns the jobs whose assumptions it evicted (a
        foreign pod took capacity we had reserved; those jobs must be requeued)."""
        match event:
            case NodeUpdated(cluster, node):
                return self._upsert_node(cluster, node)
            case NodeDeleted(cluster, name):
                return self._delete_node(cluster, name)
            case PodBound(cluster, pod, node, resources, gpus):
                return self._bind(cluster, pod, node, resources, gpus)
            case PodDeleted(cluster, pod):
                self._unbind(cluster, pod)
                return []

    def _upsert_node(self, cluster: str, node: Node) -> list[str]:
        view = self._writable(cluster)
        view._put(NodeState.empty(node))
        return self._replay_node(cluster, node.name)

    def _delete_node(self, cluster: str, name: str) -> list[str]:
        view = self._writable(cluster)
        if name not in view.nodes:
            return []
        view._drop(name)
        self._overcommitted.discard((cluster, name))
        evicted = set()
        for pod in self._pods_on_node.pop((cluster, name), set()):
            record = self._pods.pop((cluster, pod))
            if record.assumed and record.job:
                evicted.add(record.job)
        for job in evicted:
            self.forget(job)
        return sorted(evicted)

    def _replay_node(self, cluster: str, name: str) -> list[str]:
        """Recompute a node's usage from its pods after the node or reality changed: bound
        pods first (reality wins, clamped at zero), then our assumptions, which give way
        (are forgotten, and returned for requeueing) where they no longer fit."""
        view = self._views[cluster]
        state = NodeState.empty(view.nodes[name].node)
        on_node = self._pods_on_node.get((cluster, name), set())
        # Bound pods whose GPUs are known go before those the ledger picks GPUs for, so a
        # picked GPU never pushes a running pod off its own; the pod name breaks ties.
        order = sorted(
            on_node, key=lambda pod: (*_replay_rank(state, self._pods[(cluster, pod)]), pod)
        )
        evicted: set[str] = set()
        over = False
        for pod in order:
            record = self._pods[(cluster, pod)]
            if not _fits_on(state, record.resources, record.gpus):
                if record.assumed and record.job:
                    # Never taken in this recount, so forgetting the job must not give it
                    # back here: drop the record now, and forget() releases the rest.
                    evicted.add(record.job)
                    del self._pods[(cluster, pod)]
                    on_node.discard(pod)
                    continue
                record.gpus = state.gpus_for(record.resources) or _any_gpus(state, record)
                if not _fits_on(state, record.resources, record.gpus):
                    self.overcommitted_pods += 1
                    over = True
            state = _take_clamped(state, record.resources, record.gpus)
        view._put(state)
        if over:
            self._overcommitted.add((cluster, name))
        else:
            self._overcommitted.discard((cluster, name))
        for job in sorted(evicted):
            self.forget(job)
        return sorted(evicted)

    def _bind(
        self,
        cluster: str,
        pod: str,
        node: str,
        resources: Resources,
        gpus: tuple[int, ...] | None,
    ) -> list[str]:
        view = self._writable(cluster)
        known = self._pods.get((cluster, pod))
        if known is not None and known.node == node:
            known.assumed = False  # our own pod reported running where we put it
            known.seen = True
            return []
        job = None
        if known is not None:  # a reserved pod bound elsewhere: the reservation follows it
            job = known.job
            self._unbind(cluster, pod)
        state = view.nodes.get(node)
        if state is None:
            return []  # pods on nodes we do not track (no GPU node, or not yet listed)
        if known is not None and job is not None and state.gpus_for(resources) is None:
            self._make_room(cluster, node, known.node, job, resources)
            state = view.nodes[node]
        if gpus is None or not _fits_on(state, resources, gpus):
            gpus = state.gpus_for(resources)
        self._pods[(cluster, pod)] = _Pod(cluster, node, resources, gpus or (), job, False)
        self._pods_on_node.setdefault((cluster, node), set()).add(pod)
        if gpus is not None:
            view._put(state.take(resources, gpus))
            return []
        # Reality disagrees with our books: a pod runs where our reservations said there
        # was no room. Reality wins; the reservations on that node give way.
        return self._replay_node(cluster, node)

    def _make_room(
        self, cluster: str, node: str, vacated: str, job: str, resources: Resources
    ) -> None:
        """A gang scheduler (delegate mode) bound a reserved pod to ``node`` instead of
        ``vacated``, and it does not fit there beside reservations of pods not bound yet:
        those guesses move to the room it left (its own job's first; a gang scheduler
        swaps a gang's pods between the nodes it was given, and may take a node another
        gang was given before that gang's pods are bound), while it does not fit and they
        fit there. Each move is checked, so bound + assumed never exceeds a node."""
        view = self._views[cluster]
        on_node = self._pods_on_node.get((cluster, node), set())
        guesses = [
            p for p in on_node if not self._pods[(cluster, p)].seen and self._pods[(cluster, p)].job
        ]
        for other in sorted(guesses, key=lambda p: (self._pods[(cluster, p)].job != job, p)):
            target = view.nodes.get(vacated)
            if view.nodes[node].gpus_for(resources) is not None or target is None:
                return
            record = self._pods[(cluster, other)]
            gpus = target.gpus_for(record.resources)
            if gpus is None:
                continue
            self._unbind(cluster, other)
            record.node, record.gpus = vacated, gpus
            self._pods[(cluster, other)] = record
            self._pods_on_node.setdefault((cluster, vacated), set()).add(other)
            view._put(view.nodes[vacated].take(record.resources, gpus))

    def _unbind(self, cluster: str, pod: str) -> None:
        record = self._pods.pop((cluster, pod), None)
        if record is None:
            return
        self._pods_on_node.get((cluster, record.node), set()).discard(pod)
        view = self._writable(cluster)
        state = view.nodes.get(record.node)
        if state is None:
            return
        if (cluster, record.node) in self._overcommitted:
            # Usage there was clamped at allocatable, so giving back the whole request
            # would free more than reality has: recount the node from its pods instead.
            # (Removing a pod only frees capacity, so the recount evicts nothing.)
            self._replay_node(cluster, record.node)
        else:
            view._put(state.give_back(record.resources, record.gpus))

    # -- the broker's own decisions ---------------------------------------------------------

    def assume(self, placement: Placement) -> None:
        """Reserve a whole placement atomically, or raise ConflictError and change nothing."""
        if placement.job in self._assumed:
            raise ConflictError(f"job {placement.job} already holds a reservation")
        view = self._views.get(placement.cluster)
        if view is None:
            raise ConflictError(f"cluster {placement.cluster!r} is not a member")
        if view.stale:
            raise ConflictError(f"cluster {placement.cluster!r} is stale")
        trial: dict[str, NodeState] = {}
        for pod in placement.pods:
            if (placement.cluster, pod.pod) in self._pods:
                raise ConflictError(f"pod {pod.pod} already exists in {placement.cluster}")
            state = trial.get(pod.node) or view.nodes.get(pod.node)
            if state is None or not state.node.schedulable:
                raise ConflictError(f"node {pod.node} is gone or unschedulable")
            if not _fits_on(state, pod.resources, pod.gpus):
                raise ConflictError(f"pod {pod.pod} no longer fits node {pod.node}")
            trial[pod.node] = state.take(pod.resources, pod.gpus)
        view = self._writable(placement.cluster, grows=False)
        for state in trial.values():
            view._put(state)
        for pod in placement.pods:
            self._pods[(placement.cluster, pod.pod)] = _Pod(
                placement.cluster, pod.node, pod.resources, pod.gpus, placement.job, True, False
            )
            self._pods_on_node.setdefault((placement.cluster, pod.node), set()).add(pod.pod)
        self._assumed[placement.job] = placement

    def forget(self, job: str) -> None:
        """Release a job's reservation (launch failed, gang timed out, job cancelled)."""
        placement = self._assumed.pop(job, None)
        if placement is None:
            return
        for pod in placement.pods:
            record = self._pods.get((placement.cluster, pod.pod))
            if record is not None and record.job == job:
                self._unbind(placement.cluster, pod.pod)

    def confirm(self, job: str) -> None:
        """The gang is running: its reservation becomes bound usage."""
        placement = self._assumed.pop(job, None)
        if placement is None:
            raise KeyError(f"job {job} holds no reservation")
        for pod in placement.pods:
            record = self._pods.get((placement.cluster, pod.pod))
            if record is not None:
                record.assumed = False

    def release(self, job: str, placement: Placement) -> None:
        """A confirmed job ended: its pods are gone."""
        for pod in placement.pods:
            self._unbind(placement.cluster, pod.pod)

    def counted(self, cluster: str, pod: str) -> tuple[str, tuple[int, ...]] | None:
        """The node and GPUs ``pod`` is counted on (None: it is not): where a restore finds
        a pod the ledger chose the GPUs of (a delegated pod carries none of the broker's)."""
        record = self._pods.get((cluster, pod))
        return None if record is None else (record.node, record.gpus)

    def reservations(self) -> Mapping[str, Placement]:
        return MappingProxyType(self._assumed)

    def gpu_types(self, placement: Placement) -> dict[str, GpuType | None]:
        """Each node of ``placement`` -> its GPU type (None: gone, or it has none), read from
        the live views: no snapshot is taken for it, so no view is frozen and copied at its
        next change (a restart restoring every running job from its pods took one per job,
        a copy of the cluster's nodes each)."""
        view = self._views.get(placement.cluster)
        nodes = view.nodes if view is not None else {}
        types: dict[str, GpuType | None] = {}
        for pod in placement.pods:
            state = nodes.get(pod.node)
            types[pod.node] = state.node.gpu_type if state is not None else None
        return types

    @property
    def growth(self) -> int:
        """Changes so far that may have made room (every change but ``assume``, which only
        takes room; conservatively also those that take it, such as a foreign pod bound)."""
        return self._growth

    # -- snapshots ------------------------------------------------------------------------

    def snapshot(self) -> Snapshot:
        for view in self._views.values():
            view._frozen = True
        return Snapshot(MappingProxyType(dict(self._views)), self._version)

    def snapshot_without(self, placements: Iterable[Placement]) -> Snapshot:
        """What-if: a snapshot in which ``placements`` (held jobs) have given their capacity
        back. The live state is untouched (the changed views are copies), so preemption can
        try victims on it (Kueue simulates removal on its snapshot the same way)."""
        base = self.snapshot()
        views = dict(base.clusters)
        for placement in placements:
            view = views.get(placement.cluster)
            if view is None:
                continue
            if view is base.clusters[placement.cluster]:
                view = views[placement.cluster] = view._copy()
            for pod in placement.pods:
                # Where the pod is counted now: a delegated pod may run elsewhere.
                record = self._pods.get((placement.cluster, pod.pod))
                node, gpus = (record.node, record.gpus) if record else (pod.node, pod.gpus)
                state = view.nodes.get(node)
                if state is not None:
                    view._put(state.give_back(pod.resources, gpus))
        return Snapshot(MappingProxyType(views), base.version)

    def snapshot_hiding(self, nodes: Mapping[str, Iterable[str]]) -> Snapshot:
        """A snapshot without ``nodes`` (cluster -> node names): nodes held for one job
        (burst nodes coming up for a gang) as every other job must see the federation.
        Only the clusters named are copied; the live state is untouched."""
        base = self.snapshot()
        views = dict(base.clusters)
        for cluster, names in nodes.items():
            view = views.get(cluster)
            if view is None:
                continue
            copy: ClusterView | None = None
            for name in names:
                if name in view.nodes:
                    if copy is None:
                        copy = views[cluster] = view._copy()
                    copy._drop(name)
        return Snapshot(MappingProxyType(views), base.version)

    def _writable(self, cluster: str, grows: bool = True) -> ClusterView:
        view = self._views.get(cluster)
        if view is None:
            raise KeyError(f"cluster {cluster!r} is not a member")
        if view._frozen:
            view = view._copy()
            self._views[cluster] = view
        self._version += 1
        self._growth += grows
        return view


def _fits_on(state: NodeState, resources: Resources, gpus: tuple[int, ...]) -> bool:
    if resources.cpu_milli > state.cpu_free or resources.memory_mib > state.memory_free:
        return False
    if len(gpus) != resources.gpu_count or len(set(gpus)) != len(gpus):
        return False
    per_gpu = resources.per_gpu_milli
    return all(0 <= i < len(state.gpu_free) and state.gpu_free[i] >= per_gpu for i in gpus)


def _replay_rank(state: NodeState, record: _Pod) -> tuple[bool, bool]:
    known = len(record.gpus) == record.resources.gpu_count and all(
        0 <= i < len(state.gpu_free) for i in record.gpus
    )
    return (record.assumed, not known)


def _any_gpus(state: NodeState, record: _Pod) -> tuple[int, ...]:
    """GPUs for a pod that does not fit: the emptiest ones, so the overcommit shows."""
    order = sorted(range(len(state.gpu_free)), key=lambda i: -state.gpu_free[i])
    return tuple(order[: record.resources.gpu_count])


def _take_clamped(state: NodeState, resources: Resources, gpus: tuple[int, ...]) -> NodeState:
    frees = list(state.gpu_free)
    for i in gpus:
        if i < len(frees):
            frees[i] = max(0, frees[i] - resources.per_gpu_milli)
    return NodeState.of(
        state.node,
        max(0, state.cpu_free - resources.cpu_milli),
        max(0, state.memory_free - resources.memory_mib),
        tuple(frees),
    )
