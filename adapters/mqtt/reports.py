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
    "labels": {"cloud.provider.com/topology-rack": "b0-r1", ...},
    "allocatable": {"gpus": 8, "cpuMilli": 96000, "memoryMib": 786432},
    "used": {"gpus": 3, "sharedGpuMilli": [250, 500], "cpuMilli": 24000,
    "memoryMib": 65536, "pods": 4},
    "ours": [{"pod": "acme.train-worker-0", "resources": {"gpus": 1, "gpuMilli": 0,
    "cpuMilli": 8000, "memoryMib": 32768}, "gpus": [0] | null}], "at": <unix time>}`` —
    ``used`` sums the requests of the node's running pods that are not the broker's:
    whole GPUs, and each shared-GPU pod's share. ``ours`` lists the broker's own pods there
    (pull mode: the agent launched them), each under its ledger name
    (``<tenant>.<job>-<pod set>-<index>``: the key the agent's watcher gives them, one
    without "/") with its requests and the GPUs the broker picked (null: none recorded).
    A report without ``ours`` (an older agent) counts every pod in ``used``. ``labels``:
    the node's labels (its topology domains, what node selectors match), at most 64: of a
    node with more, the topology ones first (``reported_labels``); a report without them
    (an older agent) gives a node without labels. An empty retained payload clears a
    deleted node.

The broker turns a node report into ``NodeUpdated`` plus ``PodBound`` events: synthetic
ones for ``used`` (one pod ``agent:<node>`` holding the whole GPUs, CPU and memory; one
``agent:<node>:shared-<i>`` per shared share), replacing the previous report's, and one
per pod of ``ours`` under its own name, so the ledger matches each to its gang's
reservation instead of counting it twice, exactly as if it had watched the pods itself.
"""

from __future__ import annotations

import json
import re
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
MAX_OURS = 4096  # the broker's pods on one node
MAX_GPU_INDEX = 1024
MAX_LABELS = 64  # a node's labels in one report
# A Kubernetes label: key [prefix/]name (a DNS subdomain of at most 253, a name of at
# most 63), value of at most 63 (or empty).
_LABEL_NAME = r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?"
_LABEL_PREFIX = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
_LABEL_KEY = re.compile(f"(?:(?P<prefix>{_LABEL_PREFIX})/)?(?P<name>{_LABEL_NAME})")
_LABEL_VALUE = re.compile(f"({_LABEL_NAME})?")
# Labels that say where a node sits, reported first from a node with too many labels.
_TOPOLOGY_KEYS = ("topology", "hostname", "gpu.clique", "rack", "block", "zone", "region")


@dataclass(frozen=True, slots=True)
class OurPod:
    """One of the broker's own pods on a node, under its ledger name."""

    pod: str
    resources: Resources
    gpus: tuple[int, ...] | None = None


@dataclass(frozen=True, slots=True)
class Usage:
    """A node's usage by pods that are not the broker's, and the broker's own pods."""

    gpus: int = 0
    shared_gpu_milli: tuple[int, ...] = ()
    cpu_milli: int = 0
    memory_mib: int = 0
    pods: int = 0
    ours: tuple[OurPod, ...] = ()


def usage_of(pods: Iterable[Resources], ours: Iterable[OurPod] = ()) -> Usage:
    """The usage of ``pods`` (not the broker's), with the broker's own pods ``ours``."""
    gpus = cpu = mem = count = 0
    shared: list[int] = []
    for r in pods:
        gpus += r.gpus
        cpu += r.cpu_milli
        mem += r.memory_mib
        count += 1
        if r.gpu_milli:
            shared.append(r.gpu_milli)
    return Usage(
        gpus, tuple(sorted(shared)), cpu, mem, count, tuple(sorted(ours, key=lambda p: p.pod))
    )


def is_ours(key: str) -> bool:
    """A pod key of the broker's own pods: its ledger name (another pod's key is
    ``namespace/name``)."""
    return "/" not in key


def _resources_doc(r: Resources) -> dict[str, int]:
    return {"gpus": r.gpus, "gpuMilli": r.gpu_milli, "cpuMilli": r.cpu_milli,
            "memoryMib": r.memory_mib}  # fmt: skip


def is_label(key: object, value: object) -> bool:
    """A label as Kubernetes allows it (so one from the wire can be kept as is)."""
    if not isinstance(key, str) or not isinstance(value, str) or len(value) > 63:
        return False
    found = _LABEL_KEY.fullmatch(key) if len(key) <= 317 else None
    return (
        found is not None
        and len(found["name"]) <= 63
        and len(found["prefix"] or "") <= 253
        and _LABEL_VALUE.fullmatch(value) is not None
    )


def reported_labels(labels: Mapping[str, str]) -> dict[str, str]:
    """The labels a node report carries: all of a node's, up to ``MAX_LABELS``; of a node
    with more (feature discovery labels by the hundred), those naming where it sits first
    (``_TOPOLOGY_KEYS``), then the others by key."""
    valid = sorted(k for k, v in labels.items() if is_label(k, v))
    if len(valid) > MAX_LABELS:
        valid.sort(key=lambda k: not any(word in k for word in _TOPOLOGY_KEYS))
    return {k: labels[k] for k in valid[:MAX_LABELS]}


def node_report(node: Node, usage: Usage, at: float) -> dict[str, Any]:
    alloc = node.allocatable
    return {
        "node": node.name,
        "gpuType": node.gpu_type,
        "ready": node.ready,
        "unschedulable": node.unschedulable,
        "taints": [{"key": t.key, "value": t.value, "effect": t.effect} for t in node.taints],
        "labels": reported_labels(node.labels),
        "allocatable": {
            "gpus": alloc.gpus, "cpuMilli": alloc.cpu_milli, "memoryMib": alloc.memory_mib,
        },
        "used": {
            "gpus": usage.gpus, "sharedGpuMilli": list(usage.shared_gpu_milli),
            "cpuMilli": usage.cpu_milli, "memoryMib": usage.memory_mib, "pods": usage.pods,
        },
        "ours": [
            {"pod": p.pod, "resources": _resources_doc(p.resources),
             "gpus": None if p.gpus is None else list(p.gpus)}
            for p in usage.ours
        ],
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
        labels=_labels(doc.get("labels")),
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
        _ours(doc.get("ours")),
    )
    return node, usage


def _labels(value: object) -> dict[str, str]:
    """The ``labels`` of a report (absent: none)."""
    if value is None:
        return {}
    if not isinstance(value, dict) or len(value) > MAX_LABELS:
        raise ReportError(f"labels: not an object of at most {MAX_LABELS} labels")
    if not all(is_label(k, v) for k, v in value.items()):
        raise ReportError("labels: not Kubernetes labels (key [prefix/]name, value of <= 63)")
    return dict(value)


def _ours(value: object) -> tuple[OurPod, ...]:
    """The ``ours`` list of a report (absent: none)."""
    if value is None:
        return ()
    if not isinstance(value, list) or len(value) > MAX_OURS:
        raise ReportError(f"ours: not a list of at most {MAX_OURS} pods")
    out: dict[str, OurPod] = {}
    for i, item in enumerate(value):
        item = _mapping(item, f"ours[{i}]")
        pod, gpus = item.get("pod"), item.get("gpus")
        if not isinstance(pod, str) or not 0 < len(pod) <= 253 or not is_ours(pod) or pod in out:
            raise ReportError(f"ours[{i}].pod: not a ledger name (once, without '/')")
        if gpus is not None and (
            not isinstance(gpus, list)
            or len(gpus) > MAX_GPU_INDEX
            or not all(
                isinstance(g, int) and not isinstance(g, bool) and 0 <= g < MAX_GPU_INDEX
                for g in gpus
            )
        ):
            raise ReportError(f"ours[{i}].gpus: not a list of GPU indexes")
        r = _mapping(item.get("resources"), f"ours[{i}].resources")
        where = f"ours[{i}].resources."
        resources = Resources(
            _int(r, "gpus", where), _int(r, "gpuMilli", where), _int(r, "cpuMilli", where),
            _int(r, "memoryMib", where),
        )  # fmt: skip
        out[pod] = OurPod(pod, resources, None if gpus is None else tuple(gpus))
    return tuple(out.values())


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
    first, but for the broker's own pods still there: each stays matched to its
    reservation), and the names of the pods now standing for the node's usage."""
    pods = synthetic_pods(cluster, node.name, usage)
    ours = [PodBound(cluster, p.pod, node.name, p.resources, p.gpus) for p in usage.ours]
    kept = {p.pod for p in ours}
    events: list[CapacityEvent] = [PodDeleted(cluster, p) for p in previous if p not in kept]
    events.append(NodeUpdated(cluster, node))
    events.extend(pods)
    events.extend(ours)
    return events, [p.pod for p in (*pods, *ours)]


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
        on_node = [self.pods[p] for p in sorted(self.on_node.get(name, ()))]
        ours = [OurPod(p.pod, p.resources, p.gpus) for p in on_node if is_ours(p.pod)]
        usage = usage_of((p.resources for p in on_node if not is_ours(p.pod)), ours)
        return node_report(node, usage, at)


__all__ = [
    "CapacityState",
    "OurPod",
    "Usage",
    "is_label",
    "is_ours",
    "node_report",
    "parse_inventory",
    "parse_node_report",
    "report_events",
    "reported_labels",
    "synthetic_pods",
    "usage_of",
]
