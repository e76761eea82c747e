"""Pure translation of Kubernetes Node and Pod objects into capacity events.

Objects are plain dicts exactly as the API server sends them (JSON decoded; the watcher
reads responses with the client's ``*_without_preload_content`` methods, so no client models
are built). Quantities are parsed by ``adapters.kubeapi.quantity``.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Literal

from adapters.kubeapi.quantity import parse_quantity
from broker.model import (
    MILLI_PER_GPU,
    GpuType,
    Node,
    PodBound,
    PodDeleted,
    Resources,
)
from broker.taints import Taint

Obj = Mapping[str, Any]

_MIB = 2**20


def _ceil(q: Fraction) -> int:
    return max(0, math.ceil(q))


def _floor(q: Fraction) -> int:
    return max(0, math.floor(q))


@dataclass(frozen=True, slots=True)
class GpuConfig:
    """How one cluster names its GPUs."""

    resources: tuple[str, ...] = ("nvidia.com/gpu", "amd.com/gpu")
    type_label: str = "nvidia.com/gpu.product"
    shared_resource: str | None = None  # milli of one GPU, e.g. "gpu-milli"


DEFAULT_GPU = GpuConfig()
_EFFECTS: dict[str, Literal["NoSchedule", "NoExecute", "PreferNoSchedule"]] = {
    "NoSchedule": "NoSchedule",
    "NoExecute": "NoExecute",
    "PreferNoSchedule": "PreferNoSchedule",
}


def _meta(obj: Obj) -> Obj:
    meta = obj.get("metadata")
    return meta if isinstance(meta, Mapping) else {}


def node_name(obj: Obj) -> str:
    return str(_meta(obj).get("name", ""))


ANNOTATION_POD = "fedbroker.io/pod"  # on the broker's own pods: the ledger's pod name
ANNOTATION_GPUS = "fedbroker.io/gpus"  # on them too: GPU indexes the broker picked, "0,1"
# Our labels (``adapters.kube.objects`` builds objects with them): a workload's pod
# templates carry them, so its controller's pods do too.
LABEL_ORIGIN = "fedbroker.io/origin"
LABEL_TENANT = "fedbroker.io/tenant"
LABEL_JOB = "fedbroker.io/job"
LABEL_POD_SET = "fedbroker.io/pod-set"


def ledger_name(obj: Obj) -> str | None:
    """The ledger's name of a pod the broker made, or gave a slot (``ANNOTATION_POD``:
    ``<tenant>.<job>-<podset>-<index>``, as a placement names it); None for any other,
    among them a delegated workload's pod, which ``PodKeys`` names."""
    annotations = _meta(obj).get("annotations")
    if isinstance(annotations, Mapping):
        own = annotations.get(ANNOTATION_POD)
        if isinstance(own, str) and own:
            return own
    return None


def pod_set_prefix(obj: Obj) -> str | None:
    """``<tenant>.<job>-<podset>-``: the ledger's names of the pod set a pod of ours is of
    (from our labels), None for a pod without them."""
    labels = _meta(obj).get("labels")
    if not isinstance(labels, Mapping) or not labels.get(LABEL_ORIGIN):
        return None
    tenant, job, pod_set = (
        labels.get(LABEL_TENANT),
        labels.get(LABEL_JOB),
        labels.get(LABEL_POD_SET),
    )
    return f"{tenant}.{job}-{pod_set}-" if tenant and job and pod_set else None


class PodKeys:
    """The keys the bound pods of one cluster are counted under, as a watcher (or a read
    back) meets them: ``pod_key``; a pod of ours without the ledger's name (a delegated
    workload's pod, placed by the member's gang scheduler) takes the lowest index of its pod
    set no live pod holds, and keeps it while it lives: in delegate mode a slot is only a
    share of the reservation, which follows its pod to the node it runs on, so any
    one-to-one naming counts each pod once, and no kind's labels need reading. A pod whose
    key another live pod holds is counted under its own ``namespace/name``: no pod is ever
    lost to a clash, and two readers meeting the same pods in the same order key them
    alike."""

    def __init__(self) -> None:
        self._holders: dict[str, str] = {}  # key -> namespace/name of the pod holding it
        self._keys: dict[str, str] = {}  # namespace/name -> its key

    def hold(self, obj: Obj) -> str:
        """The key ``obj`` is counted under (given it, or kept)."""
        name = own_name(obj)
        key = ledger_name(obj)
        prefix = pod_set_prefix(obj) if key is None else None
        old = self._keys.get(name)
        if prefix is not None and old is not None and old.startswith(prefix):
            return old  # an index given to a pod without one is kept while it lives
        self.release(name)
        if prefix is not None:
            key = next(
                f"{prefix}{i}" for i in itertools.count() if f"{prefix}{i}" not in self._holders
            )
        if key is None or self._holders.get(key, name) != name:
            key = name
        self._holders[key] = name
        self._keys[name] = key
        return key

    def release(self, name: str) -> None:
        """Pod ``name`` (``namespace/name``) no longer counts: its key is free again."""
        key = self._keys.pop(name, None)
        if key is not None and self._holders.get(key) == name:
            del self._holders[key]


def own_name(obj: Obj) -> str:
    """``namespace/name``: a pod's own key (names are only unique per namespace)."""
    meta = _meta(obj)
    return f"{meta.get('namespace') or 'default'}/{meta.get('name', '')}"


def pod_key(obj: Obj) -> str:
    """The ledger's key of a pod: its ledger name for the broker's pods (``ledger_name``),
    so a pod of a placed job is recognised as its reservation, not counted a second time;
    ``namespace/name`` for any other."""
    return ledger_name(obj) or own_name(obj)


def own_gpus(obj: Obj) -> tuple[int, ...] | None:
    """The GPU indexes the broker picked for one of its own pods (``ANNOTATION_GPUS``), so
    the ledger books the pod on those GPUs and not on whichever are free when it is listed:
    a restarted broker then restores each gang's reservation onto the same GPUs, whatever
    order the pods are listed in. None for another's pod or an unreadable annotation."""
    annotations = _meta(obj).get("annotations")
    if not isinstance(annotations, Mapping) or not annotations.get(ANNOTATION_POD):
        return None
    text = annotations.get(ANNOTATION_GPUS)
    if not isinstance(text, str):
        return None
    try:
        return tuple(int(g) for g in text.split(",") if g)
    except ValueError:
        return None


def translate_node(obj: Obj, gpu: GpuConfig = DEFAULT_GPU) -> Node:
    meta = _meta(obj)
    spec: Obj = obj.get("spec") or {}
    status: Obj = obj.get("status") or {}
    alloc: Obj = status.get("allocatable") or {}
    labels = {str(k): str(v) for k, v in (meta.get("labels") or {}).items()}
    gpus = sum(_floor(parse_quantity(alloc[r])) for r in gpu.resources if r in alloc)
    taints = tuple(
        Taint(
            str(t.get("key", "")),
            str(t.get("value") or ""),
            _EFFECTS.get(t.get("effect", ""), "NoSchedule"),
        )
        for t in spec.get("taints") or ()
    )
    ready = any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in status.get("conditions") or ()
    )
    gpu_type = labels.get(gpu.type_label)
    return Node(
        name=str(meta.get("name", "")),
        gpu_type=GpuType(gpu_type) if gpu_type else None,
        allocatable=Resources(
            gpus=gpus,
            cpu_milli=_floor(parse_quantity(alloc.get("cpu", 0)) * 1000),
            memory_mib=_floor(parse_quantity(alloc.get("memory", 0)) / _MIB),
        ),
        labels=labels,
        taints=taints,
        unschedulable=bool(spec.get("unschedulable", False)),
        ready=ready,
    )


_Req = dict[str, Fraction]


def _requests(container: Obj) -> _Req:
    res: Obj = container.get("resources") or {}
    # Extended resources (GPUs) may be given as limits only: requests default to limits.
    merged = {**(res.get("limits") or {}), **(res.get("requests") or {})}
    return {str(k): parse_quantity(v) for k, v in merged.items()}


def _add(a: _Req, b: Mapping[str, Fraction]) -> _Req:
    out = dict(a)
    for k, v in b.items():
        out[k] = out.get(k, Fraction(0)) + v
    return out


def _max(a: _Req, b: _Req) -> _Req:
    out = dict(a)
    for k, v in b.items():
        out[k] = max(out.get(k, Fraction(0)), v)
    return out


def effective_requests(spec: Obj) -> dict[str, Fraction]:
    """A pod's effective requests as kube-scheduler computes them (``PodRequests``):
    max(sum of containers + sidecars, each init container + the sidecars started before
    it), then the pod's own ``spec.resources`` for cpu and memory (``_pod_level``), then
    the overhead added."""
    containers: _Req = {}
    for c in spec.get("containers") or ():
        containers = _add(containers, _requests(c))
    sidecars: _Req = {}
    init_peak: _Req = {}
    for c in spec.get("initContainers") or ():
        req = _requests(c)
        if c.get("restartPolicy") == "Always":  # a sidecar keeps running
            sidecars = _add(sidecars, req)
            init_peak = _max(init_peak, sidecars)
        else:
            init_peak = _max(init_peak, _add(sidecars, req))
    total = _pod_level(spec, _max(_add(containers, sidecars), init_peak))
    overhead = spec.get("overhead") or {}
    return _add(total, {str(k): parse_quantity(v) for k, v in overhead.items()})


_POD_LEVEL = ("cpu", "memory")  # of what the scheduler takes for the whole pod, what we count


def _pod_level(spec: Obj, containers: _Req) -> _Req:
    """``containers`` with the pod-level request of cpu and memory in place of theirs where
    one counts (KEP-2837): the pod's request, else its limit when no container requests
    that resource (the API server's default for it; on a pod it stored, already written).
    Admission counts a template alike (``broker.manifest.podrequests``), so a pod the
    broker placed is counted here as it was placed."""
    resources = spec.get("resources")
    if not isinstance(resources, Mapping):
        return containers
    requests: Obj = resources.get("requests") or {}
    limits: Obj = resources.get("limits") or {}
    out = dict(containers)
    for name in _POD_LEVEL:
        if name in requests:
            out[name] = parse_quantity(requests[name])
        elif name in limits and name not in containers:
            out[name] = parse_quantity(limits[name])
    return out


def pod_resources(spec: Obj, gpu: GpuConfig = DEFAULT_GPU) -> Resources:
    req = effective_requests(spec)
    gpus = sum(_ceil(req.get(r, Fraction(0))) for r in gpu.resources)
    milli = 0
    if gpu.shared_resource and not gpus:
        milli = min(MILLI_PER_GPU - 1, _ceil(req.get(gpu.shared_resource, Fraction(0))))
    return Resources(
        gpus=gpus,
        gpu_milli=milli,
        cpu_milli=_ceil(req.get("cpu", Fraction(0)) * 1000),
        memory_mib=_ceil(req.get("memory", Fraction(0)) / _MIB),
    )


TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})


def translate_pod(
    cluster: str, obj: Obj, gpu: GpuConfig = DEFAULT_GPU, *, deleted: bool = False
) -> PodBound | PodDeleted:
    """PodBound for a non-terminal pod bound to a node, PodDeleted otherwise."""
    spec: Obj = obj.get("spec") or {}
    phase = (obj.get("status") or {}).get("phase")
    node = spec.get("nodeName")
    if deleted or not node or phase in TERMINAL_PHASES:
        return PodDeleted(cluster, pod_key(obj))
    return PodBound(cluster, pod_key(obj), str(node), pod_resources(spec, gpu), own_gpus(obj))
