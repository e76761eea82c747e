"""What KubeRay's two kinds (``rayjob``, ``raycluster``) share: a Ray cluster's pod sets,
a ``head`` pod set of one pod (``headGroupSpec.template``) and one per
``workerGroupSpecs[i]``, named by its ``groupName`` in lowercase (Kueue's names), its
template ``workerGroupSpecs[i].template``; the table of a cluster spec's fields a tenant may
set; what KubeRay adds to the pods; the names KubeRay takes.

A worker group's count is the pods KubeRay keeps for it without its autoscaler:
``replicas`` (defaulting to ``minReplicas``) clamped to ``[minReplicas, maxReplicas]``,
times ``numOfHosts`` (default 1) — Kueue counts ``replicas`` the same way once the API
server has defaulted it. A group of 0 pods is no pod set (it makes no pod).

Autoscaling: refused. ``enableInTreeAutoscaling: true`` is a 4xx naming that field: the
broker admits and places a fixed gang, and an autoscaler would grow the cluster beyond
what was placed (Kueue, too, requires autoscaling off for a RayJob).

``CLUSTER``: what a tenant may set, names from the real CRDs (ray-project/kuberay,
``helm-chart/kuberay-operator/crds``). A group's ``labels`` are a label map: KubeRay merges
them into its pods' labels (``ray-operator/controllers/ray/common/pod.go``,
``DefaultWorkerPodTemplate``). ``injections``: KubeRay adds the init container
``wait-gcs-ready`` to every worker pod (same file; on unless the operator sets
``ENABLE_INIT_CONTAINER_INJECTION=false``), with the Ray container's securityContext,
image, env and volume mounts and 200m CPU / 256Mi. KubeRay's pods carry no index label:
each takes the lowest free slot of its pod set."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from broker.manifest.apirules import DNS1035_LABEL, name_problem
from broker.manifest.errors import FieldError, show
from broker.manifest.podrequests import Violation
from broker.manifest.workloads.allowlist import (
    LABELS,
    TEMPLATE,
    Table,
    false_only,
    one_of,
    refused,
    string,
    whole,
)
from broker.manifest.workloads.batchjob import MANAGED_BY, SUSPENDED
from broker.manifest.workloads.injection import Injection
from broker.manifest.workloads.reading import (
    DerivedPodSet,
    Path,
    bounded,
    count,
    flag,
    items,
    mapping,
    pod_set_name,
    pod_template,
    text,
)

GROUP, VERSION = "ray.io", "v1"
HEAD = "head"
_INT32_MAX = 2**31 - 1
# KubeRay's longest names (ray-operator/controllers/ray/utils/constant.go): a RayCluster's
# services append to its name; a RayJob's cluster is its name and 6 more characters.
MAX_RAY_CLUSTER_NAME = 53
POD_SETS_DOC = "`head` (1), one per worker group (`groupName` in lowercase)"
COUNT_DOC = (
    "`replicas` (default `minReplicas`) clamped to `[minReplicas, maxReplicas]`, "
    "x `numOfHosts`; a group of 0 pods is no pod set"
)


def name_rules(name: str, most: int, kind: str) -> list[Violation]:
    """KubeRay's ``ValidateRayClusterMetadata``/``ValidateRayJobMetadata``."""
    problem = name_problem(name, DNS1035_LABEL, most, "a DNS-1035 label (a letter first)")
    return (
        [] if problem is None else [Violation(("metadata", "name"), f"a {kind}'s name: {problem}")]
    )


AUTOSCALING_OFF = "autoscaling is off: the broker places a fixed gang"
OUTSIDE = "reaches the head from outside the cluster"
START_PARAMS = "arguments of ray start, in the tenant's own container"
RAY_RESOURCES = "Ray's logical resources; the pod's own requests are what is counted"
_HEAD = "headGroupSpec"
_WORKERS = "workerGroupSpecs[*]"
CLUSTER: Table = (
    ("rayVersion", string()),
    ("enableInTreeAutoscaling", false_only(AUTOSCALING_OFF)),
    (f"{_HEAD}.template", TEMPLATE),
    (f"{_HEAD}.rayStartParams.*", string(START_PARAMS)),
    (f"{_HEAD}.labels", LABELS),
    (f"{_HEAD}.resources.*", string(RAY_RESOURCES)),
    (f"{_HEAD}.serviceType", one_of("ClusterIP", why=f"NodePort or LoadBalancer {OUTSIDE}")),
    (f"{_HEAD}.enableIngress", false_only(f"an Ingress {OUTSIDE}")),
    (
        f"{_HEAD}.headService",
        refused(
            f"a Service of the tenant's design (externalIPs, NodePort, LoadBalancer) {OUTSIDE}"
        ),
    ),
    (f"{_HEAD}.ingressOptions", refused(f"an Ingress {OUTSIDE}")),
    (f"{_WORKERS}.groupName", string("names its pod set")),
    (f"{_WORKERS}.replicas", whole(0, why="counted")),
    (f"{_WORKERS}.minReplicas", whole(0, why="counted")),
    (f"{_WORKERS}.maxReplicas", whole(0, why="counted")),
    (f"{_WORKERS}.numOfHosts", whole(1, why="counted")),
    (f"{_WORKERS}.template", TEMPLATE),
    (f"{_WORKERS}.rayStartParams.*", string(START_PARAMS)),
    (f"{_WORKERS}.labels", LABELS),
    (f"{_WORKERS}.resources.*", string(RAY_RESOURCES)),
    (f"{_WORKERS}.suspend", false_only(SUSPENDED)),
    (f"{_WORKERS}.scaleStrategy", refused(f"deletes chosen workers; {AUTOSCALING_OFF}")),
    (f"{_WORKERS}.idleTimeoutSeconds", refused(AUTOSCALING_OFF)),
    (
        "autoscalerOptions",
        refused(
            "the autoscaler's container on the head pod (image, env, securityContext), outside "
            f"the template policy; {AUTOSCALING_OFF}"
        ),
    ),
    (
        "headServiceAnnotations",
        refused("annotations on the head's Service drive cloud load balancers and meshes"),
    ),
    (
        "gcsFaultToleranceOptions",
        refused("an external Redis, or a volume claim the broker neither counts nor deletes"),
    ),
    (
        "historyServerOptions",
        refused("adds a collector container to every pod, outside the template policy"),
    ),
    ("networkPolicy", refused("NetworkPolicies in the tenant's namespace are the member's")),
    ("suspend", false_only(SUSPENDED)),
    ("managedBy", refused(MANAGED_BY)),
)
# KubeRay's wait-gcs-ready init container as far as Pod Security sees it (its image, env
# and volume mounts are the Ray container's too).
WAIT_GCS_READY = {
    "name": "wait-gcs-ready",
    "command": ["/bin/bash", "-lc", "--"],
    "args": ["until ray health-check --address $RAY_IP:$RAY_PORT; do sleep 5; done"],
    "resources": {"limits": {"cpu": "200m", "memory": "256Mi"},
                  "requests": {"cpu": "200m", "memory": "256Mi"}},
}  # fmt: skip


def injections(cluster: str) -> tuple[Injection, ...]:
    """What KubeRay adds to the pods of a Ray cluster whose spec is at ``cluster`` ("" for a
    RayCluster's own spec, a table path)."""
    workers = f"{cluster}.{_WORKERS}.template" if cluster else f"{_WORKERS}.template"
    return (
        Injection(
            what='KubeRay adds the init container "wait-gcs-ready", with the securityContext '
            "of the first container, to every worker pod",
            templates=workers,
            into="initContainers",
            container=WAIT_GCS_READY,
            instead="give the worker's first container a securityContext this tenant's level "
            "allows",
            security_from_first=True,
        ),
    )


def cluster_pod_sets(
    cluster: Mapping[str, Any], at: Path, reserved: tuple[str, ...]
) -> list[DerivedPodSet]:
    """The pod sets of the Ray cluster spec ``cluster`` (at ``at``), no worker group taking
    a name of ``reserved``."""
    if flag(cluster, "enableInTreeAutoscaling", at):
        raise FieldError(
            (*at, "enableInTreeAutoscaling"),
            "autoscaling must be off: the broker places a fixed gang of pods",
        )
    head = mapping(cluster, "headGroupSpec", at)
    template, path = pod_template(head, "template", (*at, "headGroupSpec"))
    out = [DerivedPodSet(HEAD, 1, template, path)]
    for group, where in items(cluster, "workerGroupSpecs", at):
        raw = text(group, "groupName", where)
        name = pod_set_name(raw.lower(), (*where, "groupName"))
        if name in reserved or any(ps.name == name for ps in out):
            raise FieldError((*where, "groupName"), f"pod set name {show(name)} is taken")
        template, path = pod_template(group, "template", where)
        pods = _worker_pods(group, where)
        if pods:
            out.append(bounded(DerivedPodSet(name, pods, template, path), where))
    return out


def _worker_pods(group: Mapping[str, Any], at: Path) -> int:
    """KubeRay's desired pods of a worker group (without its autoscaler)."""
    least = count(group, "minReplicas", at, default=0)
    most = count(group, "maxReplicas", at, default=_INT32_MAX)
    replicas = count(group, "replicas", at, default=least)
    hosts = count(group, "numOfHosts", at, default=1, least=1)
    if least > most:
        return most * hosts
    return min(max(replicas, least), most) * hosts
