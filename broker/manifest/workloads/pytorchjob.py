"""kubeflow.org/v1 PyTorchJob: ``spec.pytorchReplicaSpecs`` ``Master`` and ``Worker``
become the pod sets ``master`` and ``worker`` (Kueue's lowercase replica types, Master
first), each of ``replicas`` pods (default 1, as the training operator defaults it). The
pod template is ``spec.pytorchReplicaSpecs.<Type>.template``. Other replica types are
refused: the training operator knows only these two for PyTorch."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from broker.manifest.errors import FieldError, show
from broker.manifest.workloads.reading import (
    DerivedPodSet,
    bounded,
    count,
    mapping,
    optional_mapping,
    pod_template,
)

API_VERSION = "kubeflow.org/v1"
KIND = "PyTorchJob"
REPLICA_TYPES = ("Master", "Worker")


def pod_sets(spec: Mapping[str, Any]) -> list[DerivedPodSet]:
    at = ("spec", "pytorchReplicaSpecs")
    replica_specs = mapping(spec, "pytorchReplicaSpecs", ("spec",))
    for key in replica_specs:
        if key not in REPLICA_TYPES:
            raise FieldError((*at, key), f"replica type {show(key)} is not Master or Worker")
    out: list[DerivedPodSet] = []
    for kind in REPLICA_TYPES:
        replica = optional_mapping(replica_specs, kind, at)
        if replica is None:
            continue
        where = (*at, kind)
        replicas = count(replica, "replicas", where, default=1, least=1)
        template, path = pod_template(replica, "template", where)
        out.append(bounded(DerivedPodSet(kind.lower(), replicas, template, path), where))
    if not out:
        raise FieldError(at, "required: a Master or a Worker replica spec")
    return out
