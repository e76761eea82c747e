"""The domains a placed gang's pod sets must stay in, for a launcher whose member's gang
scheduler picks the nodes (delegate mode): read from the labels of the nodes the placement
chose (pure; ``Binding.launch_spec`` passes the ledger's labels).

The placement already keeps each pod set with a topology request inside one domain of its
level, so the domain is the label value its placed nodes share. Which levels are passed:
the request's own (a required level; a preferred one and the wider declared levels it may
fall back to; KAI's both: the preferred one up to the required one), each only where all
the pod set's placed nodes share one value (a preference resolved to the whole cluster
passes none: the gang scheduler is as free as the broker was). A slice level all slices
share goes with the others; slices in different domains each get theirs.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from broker.core.views import Snapshot
from broker.model import Job, Placement, PodSet, TopologyRequest
from broker.ports import Domains

Labels = Callable[[str], Mapping[str, str] | None]


def launch_domains(
    job: Job, placement: Placement, declared: Sequence[str], labels: Labels
) -> dict[str, Domains]:
    """Pod set name -> its ``Domains`` for each pod set of ``job`` with a topology request
    placed in ``placement`` (``declared``: the cluster's levels, widest first; ``labels``:
    a node's labels, None when the node is not known)."""
    out: dict[str, Domains] = {}
    for ps in job.pod_sets:
        topo = ps.topology
        if topo is None:
            continue
        pods = _placed(job, ps, placement)
        if pods:
            out[ps.name] = _domains(topo, pods, declared, labels)
    return out


def placed_domains(job: Job, placement: Placement, snapshot: Snapshot) -> dict[str, Domains]:
    """``launch_domains`` with the cluster's levels and its nodes' labels from ``snapshot``
    (the ledger's)."""
    view = snapshot.clusters.get(placement.cluster)
    if view is None:
        return launch_domains(job, placement, (), lambda _: None)
    nodes = view.nodes

    def labels(node: str) -> Mapping[str, str] | None:
        state = nodes.get(node)
        return None if state is None else state.node.labels

    return launch_domains(job, placement, view.cluster.topology_levels, labels)


def _placed(job: Job, ps: PodSet, placement: Placement) -> list[tuple[int, str]]:
    """(index, node) of the pod set's placed pods, by index. A pod is named
    ``[<tenant>.]<job>-<podset>-<index>``."""
    head = f"{job.name}-{ps.name}"
    found: list[tuple[int, str]] = []
    for pod in placement.pods:
        stem, _, index = pod.pod.rpartition("-")
        if index.isdigit() and (stem == head or stem.endswith(f".{head}")):
            found.append((int(index), pod.node))
    return sorted(found)


def _chain(topo: TopologyRequest, declared: Sequence[str]) -> list[str]:
    """The levels the request names, narrowest first: those a gang may end up in."""
    if topo.required:
        if topo.preferred in declared and topo.required in declared:
            top, low = declared.index(topo.required), declared.index(topo.preferred)
            return [*reversed(declared[top : max(top, low) + 1])]
        return [topo.required]
    if topo.preferred in declared:
        return [*reversed(declared[: declared.index(topo.preferred) + 1])]
    return []


def _shared(key: str, nodes: Sequence[Mapping[str, str] | None]) -> str | None:
    values = {(n or {}).get(key) for n in nodes}
    value = values.pop() if len(values) == 1 else None
    return value


def _domains(
    topo: TopologyRequest, pods: list[tuple[int, str]], declared: Sequence[str], labels: Labels
) -> Domains:
    nodes = [labels(node) for _, node in pods]
    shared: dict[str, str] = {}
    for key in _chain(topo, declared):
        value = _shared(key, nodes)
        if value is not None:
            shared[key] = value
    unresolved = topo.required if topo.required and topo.required not in shared else ""
    size, level = topo.slice_size, topo.slice_level
    if not size or not level:
        return Domains(shared, unresolved=unresolved)
    whole = _shared(level, nodes)
    if whole is not None:
        return Domains({**shared, level: whole}, unresolved=unresolved)
    slices: list[dict[str, str]] = []
    for first in range(0, len(nodes), size):
        value = _shared(level, nodes[first : first + size])
        if value is None:
            return Domains(shared, unresolved=unresolved or level)
        slices.append({level: value})
    return Domains(shared, size, tuple(slices), unresolved)


__all__ = ["launch_domains", "placed_domains"]
