"""kubeflow.org/v1 PyTorchJob: ``spec.pytorchReplicaSpecs`` ``Master`` and ``Worker``
become the pod sets ``master`` and ``worker`` (Kueue's lowercase replica types, Master
first), each of ``replicas`` pods (default 1, as the training operator defaults it). The
pod template is ``spec.pytorchReplicaSpecs.<Type>.template``. Other replica types are
refused: the training operator knows only these two for PyTorch.

``rules``: what the training operator's validating webhook refuses
(kubeflow/training-operator ``pkg/webhooks/pytorch/pytorchjob_webhook.go``,
``pkg/webhooks/utils/utils.go``): a name that is no DNS-1035 label, a Master whose
``replicas`` is not given as 1 (the webhook sees it before any default), a replica type
without a container named ``pytorch`` (the one the operator configures)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from broker.manifest.apirules import DNS1035_LABEL, name_problem
from broker.manifest.errors import FieldError, show
from broker.manifest.podrequests import Violation
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
CONTAINER = "pytorch"


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


def rules(name: str, spec: Mapping[str, Any]) -> list[Violation]:
    found: list[Violation] = []
    problem = name_problem(name, DNS1035_LABEL, 63, "a DNS-1035 label (a letter first)")
    if problem is not None:
        found.append(Violation(("metadata", "name"), f"a PyTorchJob's name: {problem}"))
    replica_specs = spec.get("pytorchReplicaSpecs") or {}
    at = ("spec", "pytorchReplicaSpecs")
    for kind, replica in replica_specs.items():
        if not isinstance(replica, Mapping):
            continue
        if kind == "Master" and replica.get("replicas") != 1:
            found.append(Violation((*at, kind, "replicas"), "must be given as 1 (the training "
                                   "operator refuses any other Master)"))  # fmt: skip
        containers = ((replica.get("template") or {}).get("spec") or {}).get("containers") or ()
        if not any(isinstance(c, Mapping) and c.get("name") == CONTAINER for c in containers):
            found.append(Violation((*at, kind, "template", "spec", "containers"),
                                   f"needs a container named {CONTAINER!r} (the training "
                                   "operator refuses the job without one)"))  # fmt: skip
    return found
