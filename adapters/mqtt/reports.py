"""What a cluster agent publishes, and how the broker reads it back into capacity events.

Topics, below the prefix (default ``fedbroker``), for member cluster ``<c>``:

``agents/<c>/status``  retained, QoS 1: ``online`` after the agent connects, ``offline`` as
    its last will (or on a clean stop).
``agents/<c>/heartbeat``  QoS 1, every ``--interval`` seconds while the agent's watch of
    its cluster is connected (an agent that cannot see its cluster stays silent, so the
    broker marks the cluster stale): ``{"at": <agent's unix time>, "interval": s,
    "nodes": <count>, "seq": n}``. The broker times heartbeats by its own clock.
``agents/<c>/inventory``  retained, QoS 1: ``{"nodes": [<names>]}``, the node set;
    published before a node's report on an addition and before clearing it on a deletion,
    so the broker ignores the retained reports of nodes that no longer exist.
``agents/<c>/nodes/<node>``  retained, QoS 1, one per node, on every change:
    ``{"node": "n1", "gpuType": "A100" | null, "ready": true, "unschedulable": false,
    "taints": [{"key": k, "value": v, "effect": "NoSchedule"}],
    "allocatable": {"gpus": 8, "cpuMilli": 96000, "memoryMib": 786432},
    "used": {"gpus": 3, "sharedGpuMilli": [250, 500], "cpuMilli": 24000,
    "memoryMib": 65536, "pods": 4}, "at": <unix time>}`` — ``used`` sums the requests of
    the node's running pods: whole GPUs, and each shared-GPU pod's share. An empty retained
    payload clears a deleted node.

The broker turns a node report into ``NodeUpdated`` plus synthetic ``PodBound`` events (one
pod ``agent:<node>`` holding the whole GPUs, CPU and memory; one ``agent:<node>:shared-<i>``
per shared share), replacing the previous report's pods, so the ledger counts the usage
exactly as if it had watched the pods itself.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from broker.model import (
    MILLI_PER_GPU,
    CapacityEvent,
    GpuType,
    Node,
    NodeDeleted,
    NodeUpdated,
    PodBound,
    PodDeleted,
    Resources,
)
from broker.ports import ReportError
from broker.taints import Taint

_EFFECTS: tuple[Literal["NoSchedule", "NoExecute", "PreferNoSchedule"], ...] = (
    "NoSchedule",
    "NoExecute",
    "PreferNoSchedule",
)
MAX_INT = 1 << 53


@dataclass(frozen=True, slots=True)
class Usage:
    gpus: int = 0
    shared_gpu_milli: tuple[int, ...] = ()
    cpu_milli: int = 0
    memory_mib: int = 0
    pods: int = 0


def usage_of(pods: Iterable[Resources]) -> Usage:
    gpus = cpu = mem = count = 0
    shared: list[int] = []
    for r in pods:
        gpus += r.gpus
        cpu += r.cpu_milli
        mem += r.memory_mib
        count += 1
        if r.gpu_milli:
            shared.append(r.gpu_milli)
    return Usage(gpus, tuple(sorted(shared)), cpu, mem, count)


def node_report(node: Node, usage: Usage, at: float) -> dict[str, Any]:
    alloc = node.allocatable
    return {
        "node": node.name,
        "gpuType": node.gpu_type,
        "ready": node.ready,
        "unschedulable": node.unschedulable,
        "taints": [{"key": t.key, "value": t.value, "effect": t.effect} for t in node.taints],
        "allocatable": {
            "gpus": alloc.gpus, "cpuMilli": alloc.cpu_milli, "memoryMib": alloc.memory_mib,
        },
        "used": {
            "gpus": usage.gpus, "sharedGpuMilli": list(usage.shared_gpu_milli),
            "cpuMilli": usage.cpu_milli, "memoryMib": usage.memory_mib, "pods": usage.pods,
        },
        "at": at,
    }  # fmt: skip


def _int(doc: Mapping[str, Any], key: str, where: str) -> int:
    value = doc.get(key, 0)
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < MAX_INT:
        raise ReportError(f"{where}{key}: not a non-negative integer")
    return value


def _mapping(value: object, where: str) -> Mapping[str, Any]:
    if not isinstance(value, dict):
        raise ReportError(f"{where}: not an object")
    return value


def parse_node_report(payload: bytes, expected_node: str) -> tuple[Node, Usage]:
    """The node and its usage; ReportError when the payload breaks the schema."""
    try:
        doc = json.loads(payload)
    except (ValueError, UnicodeDecodeError):
        raise ReportError("not JSON") from None
    doc = _mapping(doc, "report")
    if doc.get("node") != expected_node:
        raise ReportError("node: does not match the topic")
    gpu_type = doc.get("gpuType")
    if gpu_type is not None and (not isinstance(gpu_type, str) or not 0 < len(gpu_type) < 128):
        raise ReportError("gpuType: not a GPU type name")
    taints = []
    for i, t in enumerate(doc.get("taints") or ()):
        t = _mapping(t, f"taints[{i}]")
        key, value, effect = t.get("key"), t.get("value", ""), t.get("effect", "NoSchedule")
        if not isinstance(key, str) or not isinstance(value, str) or effect not in _EFFECTS:
            raise ReportError(f"taints[{i}]: not a taint")
        taints.append(Taint(key, value, effect))
    alloc = _mapping(doc.get("allocatable"), "allocatable")
    used = _mapping(doc.get("used"), "used")
    shared = used.get("sharedGpuMilli") or []
    if not isinstance(shared, list) or not all(
        isinstance(m, int) and not isinstance(m, bool) and 0 < m < MILLI_PER_GPU for m in shared
    ):
        raise ReportError("used.sharedGpuMilli: not a list of milli-GPU shares (1..999)")
    node = Node(
        name=expected_node,
        gpu_type=GpuType(gpu_type) if gpu_type else None,
        allocatable=Resources(
            gpus=_int(alloc, "gpus", "allocatable."),
            cpu_milli=_int(alloc, "cpuMilli", "allocatable."),
            memory_mib=_int(alloc, "memoryMib", "allocatable."),
        ),
        taints=tuple(taints),
        unschedulable=doc.get("unschedulable") is True,
        ready=doc.get("ready", True) is True,
    )
    usage = Usage(
        _int(used, "gpus", "used."),
        tuple(shared),
        _int(used, "cpuMilli", "used."),
        _int(used, "memoryMib", "used."),
        _int(used, "pods", "used."),
    )
    return node, usage


def synthetic_pods(cluster: str, node: str, usage: Usage) -> list[PodBound]:
    """The pods that stand for a node's reported usage in the ledger."""
    pods: list[PodBound] = []
    if usage.gpus or usage.cpu_milli or usage.memory_mib:
        whole = Resources(gpus=usage.gpus, cpu_milli=usage.cpu_milli, memory_mib=usage.memory_mib)
        pods.append(PodBound(cluster, f"agent:{node}", node, whole))
    for i, milli in enumerate(usage.shared_gpu_milli):
        pods.append(PodBound(cluster, f"agent:{node}:shared-{i}", node, Resources(gpu_milli=milli)))
    return pods


def report_events(
    cluster: str, node: Node, usage: Usage, previous: Iterable[str]
) -> tuple[list[CapacityEvent], list[str]]:
    """Events bringing the ledger to this report (the previous report's pods removed
    first), and the names of the pods now standing for the node's usage."""
    pods = synthetic_pods(cluster, node.name, usage)
    events: list[CapacityEvent] = [PodDeleted(cluster, p) for p in previous]
    events.append(NodeUpdated(cluster, node))
    events.extend(pods)
    return events, [p.pod for p in pods]


def parse_inventory(payload: bytes) -> frozenset[str]:
    try:
        doc = json.loads(payload)
    except (ValueError, UnicodeDecodeError):
        raise ReportError("not JSON") from None
    nodes = _mapping(doc, "inventory").get("nodes")
    if not isinstance(nodes, list) or not all(isinstance(n, str) and n for n in nodes):
        raise ReportError("nodes: not a list of node names")
    return frozenset(nodes)


class CapacityState:
    """What an agent reports: its cluster's nodes and running pods from capacity events,
    and which nodes changed since the last reports were taken."""

    def __init__(self) -> None:
        self.nodes: dict[str, Node] = {}
        self.pods: dict[str, PodBound] = {}
        self.on_node: dict[str, set[str]] = {}
        self.dirty: set[str] = set()
        self.deleted: set[str] = set()
        self.inventory_changed = False

    def apply(self, events: list[CapacityEvent]) -> None:
        for ev in events:
            match ev:
                case NodeUpdated(_, node):
                    self.deleted.discard(node.name)
                    if node.name not in self.nodes:
                        self.inventory_changed = True
                    self.nodes[node.name] = node
                    self.dirty.add(node.name)
                case NodeDeleted(_, name):
                    if self.nodes.pop(name, None) is not None:
                        self.inventory_changed = True
                    self.dirty.add(name)
                    self.deleted.add(name)
                case PodBound(_, pod, node):
                    self._unbind(pod)
                    self.pods[pod] = ev
                    self.on_node.setdefault(node, set()).add(pod)
                    self.dirty.add(node)
                case PodDeleted(_, pod):
                    self._unbind(pod)

    def _unbind(self, pod: str) -> None:
        old = self.pods.pop(pod, None)
        if old is not None:
            self.on_node.get(old.node, set()).discard(pod)
            self.dirty.add(old.node)

    def report(self, name: str, at: float) -> dict[str, Any] | None:
        node = self.nodes.get(name)
        if node is None:
            return None
        usage = usage_of(self.pods[p].resources for p in self.on_node.get(name, ()))
        return node_report(node, usage, at)


__all__ = [
    "CapacityState",
    "Usage",
    "node_report",
    "parse_inventory",
    "parse_node_report",
    "report_events",
    "synthetic_pods",
    "usage_of",
]
