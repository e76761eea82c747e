"""kubeflow.org/v1 PyTorchJob: ``spec.pytorchReplicaSpecs`` ``Master`` and ``Worker``
become the pod sets ``master`` and ``worker`` (Kueue's lowercase replica types, Master
first), each of ``replicas`` pods (default 1, as the training operator defaults it). The
pod template is ``spec.pytorchReplicaSpecs.<Type>.template``. Other replica types are
refused: the training operator knows only these two for PyTorch.

``rules``: what the training operator's validating webhook refuses
(kubeflow/training-operator ``pkg/webhooks/pytorch/pytorchjob_webhook.go``,
``pkg/webhooks/utils/utils.go``): a name that is no DNS-1035 label, a Master whose
``replicas`` is not given as 1 (the webhook sees it before any default), a replica type
without a container named ``pytorch`` (the one the operator configures).

``FIELDS``: what a tenant may set, names from the real CRD (kubeflow/training-operator
v1.9, ``manifests/base/crds``). ``INJECTIONS``: the training operator (v1.9,
``pkg/controller.v1/pytorch/initcontainer.go``: ``setInitContainer``, called from
``SetClusterSpec`` for every pod) adds the init container ``init-pytorch`` to every Worker
pod when the job has a Master, whatever its elastic policy, with no ``securityContext``
(image ``alpine:3.10`` unless the operator's ``--pytorch-init-container-image`` says
otherwise; its template file can be replaced, as Kubeflow's manifests do for restricted
namespaces, but the broker cannot see the member's).

A pod's index is its ``training.kubeflow.org/replica-index`` label; the job ends by its
``Succeeded``/``Failed`` condition."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from broker.manifest.apirules import DNS1035_LABEL, name_problem
from broker.manifest.errors import FieldError, show
from broker.manifest.podrequests import Violation
from broker.manifest.workloads.allowlist import (
    MAX_RETRIES,
    MIN_TTL_SECONDS,
    TEMPLATE,
    Table,
    false_only,
    one_of,
    refused,
    string,
    whole,
)
from broker.manifest.workloads.batchjob import MANAGED_BY, RETRIES, SUSPENDED, TTL
from broker.manifest.workloads.injection import Injection
from broker.manifest.workloads.integration import Integration
from broker.manifest.workloads.kubeflow import GANG_IS_THE_BROKERS, GROUP
from broker.manifest.workloads.reading import (
    DerivedPodSet,
    bounded,
    count,
    mapping,
    optional_mapping,
    pod_template,
)
from broker.manifest.workloads.status import condition_end, label_index
from broker.ports import RunEnd

VERSION = "v1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "PyTorchJob"
# The training operator's index of a replica's pod (kubeflow/common, ReplicaIndexLabel).
REPLICA_INDEX = "training.kubeflow.org/replica-index"
REPLICA_TYPES = ("Master", "Worker")
CONTAINER = "pytorch"

_RESTART = one_of("Always", "OnFailure", "Never", "ExitCode")
_REPLICAS = "pytorchReplicaSpecs"
FIELDS: Table = (
    (f"{_REPLICAS}.Master.replicas", whole(1, 1, "the training operator runs one Master")),
    (f"{_REPLICAS}.Master.restartPolicy", _RESTART),
    (f"{_REPLICAS}.Master.template", TEMPLATE),
    (f"{_REPLICAS}.Worker.replicas", whole(1, why="counted")),
    (f"{_REPLICAS}.Worker.restartPolicy", _RESTART),
    (f"{_REPLICAS}.Worker.template", TEMPLATE),
    ("nprocPerNode", string("processes per pod, within the pod's own resources")),
    ("runPolicy.activeDeadlineSeconds", whole(1, why="ends the job sooner, never later")),
    ("runPolicy.backoffLimit", whole(0, MAX_RETRIES, RETRIES)),
    ("runPolicy.cleanPodPolicy", one_of("None", "Running", "All")),
    ("runPolicy.ttlSecondsAfterFinished", whole(MIN_TTL_SECONDS, why=TTL)),
    ("runPolicy.suspend", false_only(SUSPENDED)),
    ("runPolicy.managedBy", refused(MANAGED_BY)),
    (
        "runPolicy.schedulingPolicy.priorityClass",
        refused(
            "a member priority class, around the broker's rule on priorityClassName: the broker "
            "orders jobs"
        ),
    ),
    (
        "runPolicy.schedulingPolicy.queue",
        refused("a queue of the member's gang scheduler: the broker queues and places jobs"),
    ),
    *(
        (f"runPolicy.schedulingPolicy.{key}", refused(GANG_IS_THE_BROKERS))
        for key in ("minAvailable", "minResources", "scheduleTimeoutSeconds")
    ),
    (
        "elasticPolicy",
        refused(
            "grows and shrinks the job (a HorizontalPodAutoscaler) past the pods the broker placed"
        ),
    ),
)
INIT_PYTORCH = {
    "name": "init-pytorch",
    "image": "alpine:3.10",
    "imagePullPolicy": "IfNotPresent",
    "resources": {"limits": {"cpu": "100m", "memory": "20Mi"},
                  "requests": {"cpu": "50m", "memory": "10Mi"}},
    "command": ["sh", "-c", "err=1; for i in $(seq 100); do if nslookup $MASTER; then err=0 "
                "&& break; fi; echo waiting for master; sleep 2; done; exit $err"],
}  # fmt: skip
INJECTIONS = (
    Injection(
        what='the training operator adds the init container "init-pytorch", with no '
        "securityContext, to every Worker pod of a PyTorchJob with a Master",
        templates=f"{_REPLICAS}.Worker.template",
        requires=f"{_REPLICAS}.Master",
        into="initContainers",
        container=INIT_PYTORCH,
        instead="submit it as a JobSet (its headless Service names every pod) or as podSets "
        "(the broker's rendezvous gives every pod MASTER_ADDR and RANK), leave out the Master "
        "(worker 0 leads and nothing is added), or ask for a baseline tenant",
    ),
)


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


def index(workload: Mapping[str, Any], pod: Mapping[str, Any]) -> int | None:
    return label_index(pod, REPLICA_INDEX)


def end(obj: Mapping[str, Any]) -> RunEnd | None:
    return condition_end(obj, "Succeeded", "Failed")


INTEGRATION = Integration(
    GROUP, VERSION, KIND, "pytorchjobs", pod_sets, FIELDS, INJECTIONS, rules=rules,
    index=index, ending=end, pod_sets_doc="`master`, `worker`",
    count_doc="`replicas` (a Master's must be given as 1; a Worker's defaults to 1)",
)  # fmt: skip
