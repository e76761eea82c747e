"""kubeflow.org/v2beta1 MPIJob (the standalone MPI Operator, kubeflow/mpi-operator v2):
``spec.mpiReplicaSpecs`` ``Launcher`` and ``Worker`` become the pod sets ``launcher`` (one
pod) and ``worker`` (``replicas`` pods), Launcher first, as Kueue derives them. The pod
template is ``spec.mpiReplicaSpecs.<Type>.template``. Other replica types are refused: the
operator knows only these two. ``runLauncherAsWorker`` puts the launcher in the hostfile
too (it runs ranks beside ``mpirun``); the pods are the same either way, so are the pod
sets (the launcher's pod is counted in both). ``slotsPerWorker`` is the ranks per worker in
the hostfile, run inside each pod's own resources.

How the operator makes its pods (``pkg/controller/mpi_job_controller.go``): each worker is
a pod ``<name>-worker-<i>`` it creates itself, labelled ``training.kubeflow.org/job-role:
worker`` and ``training.kubeflow.org/replica-index: <i>`` (with ``operator-name`` and
``job-name``); the launcher is a batch Job ``<name>-launcher`` (its ``runPolicy``'s
``backoffLimit``, ``activeDeadlineSeconds`` and TTL), whose one pod at a time is labelled
``job-role: launcher``. ``launcherCreationPolicy: WaitForWorkersReady`` makes that Job only
once every worker is Ready, so the launcher is a late pod set (``LATE_POD_SETS``: out of a
delegated gang's minMember and of what "started" waits for; with ``AtStartup`` it comes at
once, which the same rule allows). What it adds to the tenant's templates is no container:
to the first container, env (``K_MPI_JOB_ROLE``, the MPI implementation's hostfile
variables) and mounts of two volumes it adds, a Secret of SSH keys ``<name>-ssh`` at
``sshAuthMountPath`` and (launcher) the ConfigMap ``<name>-config`` with the hostfile; a
worker with no command runs ``/usr/sbin/sshd -De``. Secret and ConfigMap volumes pass every
Pod Security level, so ``INJECTIONS`` is empty.

Status (``end``): conditions ``Created``, ``Running``, ``Succeeded`` (the launcher Job
Complete) and ``Failed`` (the launcher Job Failed, its reason such as
``BackoffLimitExceeded/<pod reason>``, or workers evicted: ``MPIJobEvicted``).

``rules``: what the operator's validation refuses after its defaults
(``pkg/apis/kubeflow/validation``, ``v2beta1/default.go``): a Launcher ``replicas`` other than
1 and a Worker with no ``replicas`` (defaulted to 0, then refused) already make no pod sets;
``rules`` checks the names it makes: its
Services are named after the job (a DNS-1035 label) and its last worker's hostname
``<name>-worker-<replicas-1>`` must be a DNS-1123 label. A member's MPI Operator must run
without ``--gang-scheduling``: it would make a PodGroup of the job's name, the broker's.

``FIELDS``: names from the real CRD (kubeflow/mpi-operator v0.8.2, ``manifests/base``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from broker.manifest.apirules import DNS1035_LABEL, DNS1123_LABEL, name_problem
from broker.manifest.errors import FieldError, show
from broker.manifest.podrequests import Violation
from broker.manifest.workloads.allowlist import (
    MAX_RETRIES,
    MIN_TTL_SECONDS,
    TEMPLATE,
    Table,
    boolean,
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

VERSION = "v2beta1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "MPIJob"
PLURAL = "mpijobs"
REPLICA_TYPES = ("Launcher", "Worker")
LAUNCHER, WORKER = "launcher", "worker"
LATE_POD_SETS = frozenset({LAUNCHER})
INJECTIONS: tuple[Injection, ...] = ()  # no container added (see above)
ROLE_LABEL = "training.kubeflow.org/job-role"
INDEX_LABEL = "training.kubeflow.org/replica-index"

_RESTART = one_of("Never", "OnFailure", why="the MPI Operator's validation takes only these")
_REPLICAS = "mpiReplicaSpecs"
FIELDS: Table = (
    (f"{_REPLICAS}.Launcher.replicas", whole(1, 1, "the MPI Operator runs one launcher")),
    (f"{_REPLICAS}.Launcher.restartPolicy", _RESTART),
    (f"{_REPLICAS}.Launcher.template", TEMPLATE),
    (f"{_REPLICAS}.Worker.replicas", whole(1, why="counted")),
    (f"{_REPLICAS}.Worker.restartPolicy", _RESTART),
    (f"{_REPLICAS}.Worker.template", TEMPLATE),
    ("slotsPerWorker", whole(0, why="ranks per worker in the hostfile, within its own resources")),
    ("runLauncherAsWorker", boolean("the launcher's pod is counted either way")),
    (
        "launcherCreationPolicy",
        one_of("AtStartup", "WaitForWorkersReady", why="the launcher may start late"),
    ),
    ("mpiImplementation", one_of("OpenMPI", "Intel", "MPICH")),
    ("sshAuthMountPath", string("where the operator mounts the job's SSH keys")),
    ("runPolicy.cleanPodPolicy", one_of("None", "Running", "All")),
    ("runPolicy.activeDeadlineSeconds", whole(1, why="ends the job sooner, never later")),
    ("runPolicy.backoffLimit", whole(0, MAX_RETRIES, RETRIES)),
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
)


def pod_sets(spec: Mapping[str, Any]) -> list[DerivedPodSet]:
    at = ("spec", _REPLICAS)
    replica_specs = mapping(spec, _REPLICAS, ("spec",))
    for key in replica_specs:
        if key not in REPLICA_TYPES:
            raise FieldError((*at, key), f"replica type {show(key)} is not Launcher or Worker")
    launcher = optional_mapping(replica_specs, "Launcher", at)
    if launcher is None:
        raise FieldError((*at, "Launcher"), "required: the MPI Operator runs one launcher")
    where = (*at, "Launcher")
    if count(launcher, "replicas", where, default=1, least=1) != 1:
        raise FieldError((*where, "replicas"), "must be 1: the MPI Operator runs one launcher")
    template, path = pod_template(launcher, "template", where)
    out = [DerivedPodSet(LAUNCHER, 1, template, path)]
    worker = optional_mapping(replica_specs, "Worker", at)
    if worker is not None:
        where = (*at, "Worker")
        if worker.get("replicas") is None:
            raise FieldError((*where, "replicas"), "required: the MPI Operator defaults it to 0 "
                             "and refuses that")  # fmt: skip
        replicas = count(worker, "replicas", where, default=1, least=1)
        template, path = pod_template(worker, "template", where)
        out.append(bounded(DerivedPodSet(WORKER, replicas, template, path), where))
    return out


def rules(name: str, spec: Mapping[str, Any]) -> list[Violation]:
    found: list[Violation] = []
    problem = name_problem(name, DNS1035_LABEL, 63, "a DNS-1035 label (a letter first)")
    if problem is not None:
        found.append(Violation(("metadata", "name"), f"an MPIJob's name names its Services: "
                               f"{problem}"))  # fmt: skip
        return found
    replica_specs = spec.get(_REPLICAS) or {}
    worker = replica_specs.get("Worker") if isinstance(replica_specs, Mapping) else None
    given = worker.get("replicas") if isinstance(worker, Mapping) else None
    last = (given if isinstance(given, int) and given > 0 else 1) - 1
    hostname = f"{name}-worker-{last}"
    problem = name_problem(hostname, DNS1123_LABEL, 63, "a DNS-1123 label")
    if problem is not None:
        found.append(Violation(("metadata", "name"), f"the MPI Operator names its last worker "
                               f"{hostname!r}: {problem}"))  # fmt: skip
    return found


# -- the runtime half: how the operator's pods and status read ----------------------------


def pod_index(workload: Mapping[str, Any], pod: Mapping[str, Any]) -> int | None:
    """A worker's ``replica-index``; the launcher (one pod at a time, a Job's): 0."""
    labels = (pod.get("metadata") or {}).get("labels") or {}
    return 0 if labels.get(ROLE_LABEL) == LAUNCHER else label_index(pod, INDEX_LABEL)


def end(obj: Mapping[str, Any]) -> RunEnd | None:
    """``Failed`` or ``Succeeded`` true, with the operator's reason and message."""
    return condition_end(obj, "Succeeded", "Failed")


INTEGRATION = Integration(
    GROUP, VERSION, KIND, PLURAL, pod_sets, FIELDS, INJECTIONS, rules=rules,
    index=pod_index, ending=end, late_pod_sets=LATE_POD_SETS,
    pod_sets_doc="`launcher`, `worker`; the launcher made late "
    "(`launcherCreationPolicy: WaitForWorkersReady`): out of a delegated gang's minMember",
    count_doc="`launcher` 1; `worker` its `replicas` (required)",
)  # fmt: skip
