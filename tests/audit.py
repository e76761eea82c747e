"""An independent audit of the placement core, for tests.

``Books`` is what a test itself knows is on every node: the node descriptions it fed the
ledger, the placements it had assumed or confirmed, and the foreign pods it bound. From them
the audit recounts each node's usage and checks it against allocatable, and it recounts the
ledger's indexes by brute force over the nodes. It never takes the ledger's counters as the
truth: it reads them only to compare them with its own recount.

Foreign pods here ask for whole GPUs only, and the ledger (not the test) picks their GPU
indices; so they are counted per node, and they can only sit on GPUs none of the broker's
own pods use.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field

from broker.core.views import ClusterView, Snapshot
from broker.model import (
    MILLI_PER_GPU,
    Cluster,
    GpuType,
    Job,
    Node,
    NodeState,
    Placement,
    PodPlacement,
    PodSet,
    Resources,
)
from broker.taints import Taint

NodeKey = tuple[str, str]
Group = tuple[GpuType | None, frozenset[Taint]]


@dataclass
class Usage:
    cpu: int = 0
    mem: int = 0
    per_gpu: dict[int, int] = field(default_factory=dict)  # our pods' milli on each GPU
    foreign_whole: int = 0


@dataclass
class Books:
    clusters: dict[str, Cluster]
    nodes: dict[str, dict[str, Node]]
    stale: set[str] = field(default_factory=set)
    assumed: dict[str, Placement] = field(default_factory=dict)
    confirmed: dict[str, Placement] = field(default_factory=dict)
    # Our confirmed pods still running, and foreign pods: (cluster, pod) -> where and what.
    bound: dict[tuple[str, str], PodPlacement] = field(default_factory=dict)
    foreign: dict[tuple[str, str], tuple[str, Resources]] = field(default_factory=dict)

    def our_pods(self, assumed: bool = True) -> list[tuple[str, PodPlacement]]:
        held = [(p.cluster, pod) for p in self.assumed.values() for pod in p.pods]
        running = [(cluster, pod) for (cluster, _), pod in self.bound.items()]
        return held + running if assumed else running

    def confirm(self, job: str) -> None:
        placement = self.assumed.pop(job)
        self.confirmed[job] = placement
        for pod in placement.pods:
            self.bound[(placement.cluster, pod.pod)] = pod

    def release(self, job: str) -> Placement:
        placement = self.confirmed.pop(job)
        for pod in placement.pods:
            self.bound.pop((placement.cluster, pod.pod), None)
        return placement

    def drop_node(self, cluster: str, name: str) -> None:
        """The node is gone and every pod on it with it (reservations are the ledger's to
        evict; the caller checks that it did)."""
        del self.nodes[cluster][name]
        for key in [k for k, pod in self.bound.items() if k[0] == cluster and pod.node == name]:
            del self.bound[key]
        for key in [k for k, (n, _) in self.foreign.items() if k[0] == cluster and n == name]:
            del self.foreign[key]

    def recount(self, assumed: bool = True) -> tuple[dict[NodeKey, Usage], list[str]]:
        """Per-node usage from everything held (``assumed``: reservations too, not only
        running pods), and the problems met on the way."""
        usage: dict[NodeKey, Usage] = {
            (c, n): Usage() for c, names in self.nodes.items() for n in names
        }
        problems: list[str] = []
        for cluster, pod in self.our_pods(assumed):
            node = self.nodes.get(cluster, {}).get(pod.node)
            if node is None:
                problems.append(f"{pod.pod} is held on {cluster}/{pod.node}, which does not exist")
                continue
            problems += gpu_index_problems(pod, node)
            use = usage[(cluster, pod.node)]
            use.cpu += pod.resources.cpu_milli
            use.mem += pod.resources.memory_mib
            for i in pod.gpus:
                use.per_gpu[i] = use.per_gpu.get(i, 0) + pod.resources.per_gpu_milli
        for (cluster, _), (node_name, res) in self.foreign.items():
            use = usage[(cluster, node_name)]
            use.cpu += res.cpu_milli
            use.mem += res.memory_mib
            use.foreign_whole += res.gpus
        return usage, problems

    def oversubscription(self) -> list[str]:
        """Every node and resource where held requests exceed allocatable."""
        usage, problems = self.recount()
        for (cluster, name), use in usage.items():
            alloc = self.nodes[cluster][name].allocatable
            where = f"{cluster}/{name}"
            if use.cpu > alloc.cpu_milli:
                problems.append(f"{where}: cpu {use.cpu} > {alloc.cpu_milli}")
            if use.mem > alloc.memory_mib:
                problems.append(f"{where}: memory {use.mem} > {alloc.memory_mib}")
            for i, milli in use.per_gpu.items():
                if milli > MILLI_PER_GPU:
                    problems.append(f"{where}: GPU {i} holds {milli} milli")
            untouched = alloc.gpus - len(use.per_gpu)
            if use.foreign_whole > untouched:
                problems.append(f"{where}: {use.foreign_whole} foreign GPUs, {untouched} left")
        return problems

    def disagreements(self, snapshot: Snapshot) -> list[str]:
        """Where the ledger's node states differ from alloc minus the recount."""
        usage, problems = self.recount()
        for cluster, names in self.nodes.items():
            view = snapshot.clusters[cluster]
            if set(view.nodes) != set(names):
                problems.append(f"{cluster}: ledger has {sorted(view.nodes)}, not {sorted(names)}")
            if view.stale != (cluster in self.stale):
                problems.append(f"{cluster}: ledger says stale={view.stale}")
            for name, node in names.items():
                state = view.nodes.get(name)
                if state is None:
                    continue
                problems += _state_problems(
                    f"{cluster}/{name}", node, state, usage[(cluster, name)]
                )
        return problems


def _state_problems(where: str, node: Node, state: NodeState, use: Usage) -> list[str]:
    alloc = node.allocatable
    problems = []
    if state.node != node:
        problems.append(f"{where}: ledger holds an old description of the node")
    if state.cpu_free != alloc.cpu_milli - use.cpu:
        problems.append(f"{where}: cpu free {state.cpu_free}, recount {alloc.cpu_milli - use.cpu}")
    if state.memory_free != alloc.memory_mib - use.mem:
        problems.append(
            f"{where}: memory free {state.memory_free}, recount {alloc.memory_mib - use.mem}"
        )
    if len(state.gpu_free) != alloc.gpus:
        return [*problems, f"{where}: ledger has {len(state.gpu_free)} GPUs, not {alloc.gpus}"]
    ours = sum(use.per_gpu.values())
    free = alloc.gpus * MILLI_PER_GPU - ours - use.foreign_whole * MILLI_PER_GPU
    if state.free_milli != free or sum(state.gpu_free) != free:
        problems.append(f"{where}: free milli {state.free_milli}, recount {free}")
    for i, milli in use.per_gpu.items():
        if 0 <= i < alloc.gpus and state.gpu_free[i] > MILLI_PER_GPU - milli:
            problems.append(f"{where}: GPU {i} shows {state.gpu_free[i]} free, we hold {milli}")
    whole = alloc.gpus - len(use.per_gpu) - use.foreign_whole
    if state.whole_free != whole:
        problems.append(f"{where}: {state.whole_free} whole free GPUs, recount {whole}")
    return problems


def gpu_index_problems(pod: PodPlacement, node: Node) -> list[str]:
    res = pod.resources
    problems = []
    if len(pod.gpus) != res.gpu_count:
        problems.append(f"{pod.pod}: takes {len(pod.gpus)} GPUs, asks for {res.gpu_count}")
    if len(set(pod.gpus)) != len(pod.gpus):
        problems.append(f"{pod.pod}: GPU listed twice in {pod.gpus}")
    if any(not 0 <= i < node.allocatable.gpus for i in pod.gpus):
        problems.append(f"{pod.pod}: GPUs {pod.gpus} on a node of {node.allocatable.gpus}")
    return problems


def placement_problems(books: Books, job: Job, placement: Placement) -> list[str]:
    """Every rule a placement of ``job`` breaks, judged from the books alone."""
    problems = []
    cluster = placement.cluster
    if placement.job != job.key:
        problems.append(f"placement names job {placement.job}, not {job.key}")
    if cluster not in books.nodes:
        return [*problems, f"cluster {cluster} is not a member"]
    if cluster in books.stale:
        problems.append(f"placed on stale cluster {cluster}")
    labels = books.clusters[cluster].labels
    if any(labels.get(k) != v for k, v in job.cluster_selector.items()):
        problems.append(f"cluster {cluster} does not match selector {job.cluster_selector}")
    count = len(placement.pods)
    if not job.required_pods <= count <= job.total_pods or (
        not job.elastic and count != job.total_pods
    ):
        problems.append(f"{count} pods placed; job needs {job.required_pods}..{job.total_pods}")
    pod_sets = dict(job.pods())
    seen: set[str] = set()
    for pod in placement.pods:
        ps = pod_sets.get(pod.pod)
        if ps is None or pod.pod in seen:
            problems.append(f"pod {pod.pod} is unknown or placed twice")
            continue
        seen.add(pod.pod)
        if pod.resources != ps.resources:
            problems.append(f"pod {pod.pod} carries {pod.resources}, not {ps.resources}")
        node = books.nodes[cluster].get(pod.node)
        if node is None:
            problems.append(f"pod {pod.pod} on {cluster}/{pod.node}, which does not exist")
            continue
        if not node.schedulable:
            problems.append(f"pod {pod.pod} on unschedulable node {pod.node}")
        untolerated = untolerated_by(ps, node)
        if untolerated:
            problems.append(f"pod {pod.pod} on {pod.node} does not tolerate {untolerated}")
        if ps.resources.gpu_request_milli and (
            node.gpu_type is None or not job.allows_gpu_type(node.gpu_type)
        ):
            problems.append(f"pod {pod.pod} on {node.gpu_type} GPUs, job allows {job.gpu_types}")
        problems += gpu_index_problems(pod, node)
    return problems


def index_problems(snapshot: Snapshot) -> list[str]:
    """Where a cluster view's indexes disagree with a brute-force recount of its nodes."""
    problems = []
    for cluster, view in snapshot.clusters.items():
        groups: dict[Group, list[NodeState]] = {}
        for state in view.nodes.values():
            n = state.node
            if state.free_milli != sum(state.gpu_free) or state.whole_free != sum(
                1 for f in state.gpu_free if f == MILLI_PER_GPU
            ):
                problems.append(f"{cluster}/{state.name}: derived fields disagree with gpu_free")
            if n.schedulable:
                blocking = frozenset(t for t in n.taints if t.effect != "PreferNoSchedule")
                group = (n.gpu_type, blocking)
                groups.setdefault(group, []).append(state)
        for group in set(groups) | set(view.groups()):
            problems += _group_problems(f"{cluster} {group}", view, group, groups.get(group, []))
        if view.gpu_types() != {g[0] for g in groups}:
            problems.append(
                f"{cluster}: gpu types {view.gpu_types()} != { ({g[0] for g in groups}) }"
            )
        every = [s for states in groups.values() for s in states]
        if view.gpus_total() != sum(len(s.gpu_free) for s in every):
            problems.append(f"{cluster}: gpus_total {view.gpus_total()}")
        if view.free_milli() != sum(s.free_milli for s in every):
            problems.append(f"{cluster}: free_milli {view.free_milli()}")
    return problems


def _group_problems(
    where: str, view: ClusterView, group: Group, states: list[NodeState]
) -> list[str]:
    problems = []
    hist = sorted(Counter(s.whole_free for s in states).items())
    if view.whole_histogram(group) != hist:
        problems.append(f"{where}: histogram {view.whole_histogram(group)} != {hist}")
    if view.gpus_total(group) != sum(len(s.gpu_free) for s in states):
        problems.append(f"{where}: gpus_total {view.gpus_total(group)}")
    if view.free_milli(group) != sum(s.free_milli for s in states):
        problems.append(f"{where}: free_milli {view.free_milli(group)}")
    frees = {s.free_milli for s in states}
    for least in sorted(frees | {0, 1} | {f + 1 for f in frees}):
        got = [(k, sorted(names)) for k, names in view.by_free_at_least(group, least)]
        want = _buckets([(s.free_milli, s.name) for s in states if s.free_milli >= least])
        if got != want:
            problems.append(f"{where}: by_free_at_least({least}) = {got}, recount {want}")
    wholes = {s.whole_free for s in states}
    for least in sorted(wholes | {0, 1} | {w + 1 for w in wholes}):
        got = [(k, sorted(names)) for k, names in view.by_whole_at_least(group, least)]
        want = _buckets([(s.whole_free, s.name) for s in states if s.whole_free >= least])
        if got != want:
            problems.append(f"{where}: by_whole_at_least({least}) = {got}, recount {want}")
    return problems


def _buckets(pairs: list[tuple[int, str]]) -> list[tuple[int, list[str]]]:
    by_key: dict[int, list[str]] = {}
    for key, name in pairs:
        by_key.setdefault(key, []).append(name)
    return [(k, sorted(by_key[k])) for k in sorted(by_key)]


def books_for(clusters: Mapping[str, tuple[Cluster, list[Node]]], stale: set[str]) -> Books:
    return Books(
        {name: c for name, (c, _) in clusters.items()},
        {name: {n.name: n for n in ns} for name, (_, ns) in clusters.items()},
        set(stale),
    )


def whole_free(node: Node, use: Usage) -> int:
    """GPUs no pod touches: neither ours (by index) nor a foreign one (by count)."""
    return node.allocatable.gpus - len(use.per_gpu) - use.foreign_whole


def untolerated_by(pod_set: PodSet, node: Node) -> list[str]:
    """The node's blocking taints none of the pod set's tolerations tolerates, each matched
    by itself (not through the placement's node groups)."""
    return [
        t.key
        for t in node.taints
        if t.effect != "PreferNoSchedule" and not any(x.tolerates(t) for x in pod_set.tolerations)
    ]


def could_host(node: Node, use: Usage, job: Job, pod_set: PodSet) -> bool:
    """Whether one pod of ``pod_set`` fits on the node now, judged from the recount."""
    res = pod_set.resources
    if not node.schedulable or untolerated_by(pod_set, node):
        return False
    if res.gpu_request_milli and (node.gpu_type is None or not job.allows_gpu_type(node.gpu_type)):
        return False
    alloc = node.allocatable
    if alloc.cpu_milli - use.cpu < res.cpu_milli or alloc.memory_mib - use.mem < res.memory_mib:
        return False
    if res.gpus:
        return whole_free(node, use) >= res.gpus
    if res.gpu_milli:
        shared = any(MILLI_PER_GPU - m >= res.gpu_milli for m in use.per_gpu.values())
        return shared or whole_free(node, use) >= 1
    return True
