"""Cluster API objects as the pool reads them: names, annotations, and a pool's node shape.

A pool's node shape and size bounds come from the cluster-autoscaler scale-from-zero
annotations (``capacity.cluster-autoscaler.kubernetes.io/gpu-count``, ``cpu``, ``memory``,
``labels``; ``cluster.x-k8s.io/cluster-api-autoscaler-node-group-min-size`` / ``-max-size``)
on the MachineDeployment or MachinePool. As the autoscaler documents them, ``gpu-type`` is
the GPU *resource name* (``nvidia.com/gpu``), not the model: the model is the value of the
cluster's GPU type label (``gpuTypeLabel``) in ``labels`` (``key1=value1,key2=value2``).

Objects are read and scaled at ``v1beta2`` (Cluster API's storage version), or at
``v1beta1`` where the management cluster serves only that (see ``adapters.capi.versions``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Literal, cast

from adapters.kubeapi.quantity import parse_quantity
from broker.ports import ScaleError

PoolKind = Literal["MachineDeployment", "MachinePool"]

GROUP = "cluster.x-k8s.io"
VERSIONS = ("v1beta2", "v1beta1")  # preferred first
PLURALS: Mapping[PoolKind, str] = {
    "MachineDeployment": "machinedeployments",
    "MachinePool": "machinepools",
}
MACHINES = "machines"

CAPACITY = "capacity.cluster-autoscaler.kubernetes.io/"
ANNOTATION_GPU_COUNT = CAPACITY + "gpu-count"
ANNOTATION_GPU_TYPE = CAPACITY + "gpu-type"  # the GPU resource name (read for nothing)
ANNOTATION_LABELS = CAPACITY + "labels"  # the new nodes' labels: "k1=v1,k2=v2"
DEFAULT_GPU_TYPE_LABEL = "nvidia.com/gpu.product"
ANNOTATION_CPU = CAPACITY + "cpu"
ANNOTATION_MEMORY = CAPACITY + "memory"
ANNOTATION_MIN_SIZE = "cluster.x-k8s.io/cluster-api-autoscaler-node-group-min-size"
ANNOTATION_MAX_SIZE = "cluster.x-k8s.io/cluster-api-autoscaler-node-group-max-size"
ANNOTATION_MACHINE = "cluster.x-k8s.io/machine"  # on a workload Node: its Machine's name
ANNOTATION_DELETE_MACHINE = "cluster.x-k8s.io/delete-machine"  # on a Machine: delete it first
LABEL_DEPLOYMENT = "cluster.x-k8s.io/deployment-name"  # on a Machine: its MachineDeployment

MERGE_PATCH = "application/merge-patch+json"
_MIB = 2**20


class CapiPoolError(ScaleError):
    """A pool operation failed: a one-line message naming the pool or node and the HTTP
    status; never the client configuration. (A ``broker.ports.ScaleError``.) ``status``:
    the HTTP status of an answer that is not the chained cause (a 404 read as "none")."""

    def __init__(self, message: str, *, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True, slots=True)
class PoolShape:
    """One node of the pool, from the scale-from-zero annotations; None = not annotated."""

    gpus: int | None = None
    gpu_type: str | None = None  # the model: the gpuTypeLabel's value in the labels annotation
    cpu_milli: int | None = None
    memory_mib: int | None = None
    min_size: int | None = None
    max_size: int | None = None


@dataclass(frozen=True, slots=True)
class PoolStatus:
    replicas: int  # spec.replicas (desired)
    ready_replicas: int  # status.readyReplicas (0 when absent)
    shape: PoolShape


def meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return cast(Mapping[str, Any], obj.get("metadata") or {})


def as_int(value: Any) -> int:
    """A replica count as the API gives it (absent or empty: 0)."""
    return int(value) if isinstance(value, int | str) and str(value).strip() else 0


def _amount(text: str) -> Fraction:
    """A non-negative quantity ("96", "500m", "1152Gi", "1.5k")."""
    value = parse_quantity(text)
    if value < 0:
        raise ValueError(f"not a non-negative quantity: {text!r}")
    return value


def _whole(value: Fraction, text: str) -> int:
    if value.denominator != 1:
        raise ValueError(f"not a whole number: {text!r}")
    return int(value)


def _count(text: str) -> int:
    if not text.strip().isdigit():
        raise ValueError(f"not a non-negative integer: {text!r}")
    return int(text)


def _gpus(text: str) -> int:
    return _whole(_amount(text), text)


def _cpu_milli(text: str) -> int:
    return _whole(_amount(text) * 1000, text)


def _memory_mib(text: str) -> int:
    return int(_amount(text) / _MIB)  # whole MiB, rounded down: never promise more memory


def node_labels(text: str) -> dict[str, str]:
    """The ``labels`` annotation: comma-separated ``key=value`` pairs (blanks around them
    ignored); ValueError for a pair without ``=`` or with an empty key."""
    labels: dict[str, str] = {}
    for pair in text.split(","):
        if not pair.strip():
            continue
        key, eq, value = pair.partition("=")
        if not eq or not key.strip():
            raise ValueError(f"not key=value: {pair.strip()!r}")
        labels[key.strip()] = value.strip()
    return labels


def shape_of(
    annotations: Mapping[str, Any], pool: str, gpu_type_label: str = DEFAULT_GPU_TYPE_LABEL
) -> PoolShape:
    """The node shape and size bounds annotated on ``pool`` (the GPU model: the value of
    ``gpu_type_label`` in the labels annotation); ``CapiPoolError`` naming the annotation
    when one does not parse."""

    def parsed(key: str, convert: Callable[[str], int]) -> int | None:
        raw = annotations.get(key)
        if raw is None:
            return None
        try:
            return convert(str(raw))
        except ValueError as exc:
            raise CapiPoolError(f"{pool}: invalid annotation {key}: {exc}") from None

    try:
        labels = node_labels(str(annotations.get(ANNOTATION_LABELS) or ""))
    except ValueError as exc:
        raise CapiPoolError(f"{pool}: invalid annotation {ANNOTATION_LABELS}: {exc}") from None
    return PoolShape(
        gpus=parsed(ANNOTATION_GPU_COUNT, _gpus),
        gpu_type=labels.get(gpu_type_label) or None,
        cpu_milli=parsed(ANNOTATION_CPU, _cpu_milli),
        memory_mib=parsed(ANNOTATION_MEMORY, _memory_mib),
        min_size=parsed(ANNOTATION_MIN_SIZE, _count),
        max_size=parsed(ANNOTATION_MAX_SIZE, _count),
    )
