"""ray.io/v1 RayJob: the pod sets of its Ray cluster (``spec.rayClusterSpec``, required:
running on an existing cluster through ``clusterSelector`` leaves nothing to place; see
``raycommon``) and, in ``K8sJobMode`` (the default ``submissionMode``), where KubeRay runs a
submitter Job, a ``submitter`` pod set of one pod from ``spec.submitterPodTemplate``, as in
Kueue. When that is left out, ``completed`` writes KubeRay's default submitter template
into the object (the head's image; requests 500m CPU and 200Mi, limits 1 CPU and 1Gi) so
that the pod is counted, checked by the template policy and launched from one template;
the default also sets ``automountServiceAccountToken: false`` and a restricted security
context (non-root, no privilege escalation, every capability dropped, RuntimeDefault
seccomp) so it passes every Pod Security level: the submitter only talks to the Ray
dashboard, never to the API.

KubeRay makes the submitter only once the Ray cluster is ready (``LATE_POD_SETS``): a
delegated gang's minMember leaves it out, and so does what "started" waits for.

How it ends (``end``), as KubeRay's own terminal test (``IsJobDeploymentTerminal``) reads
``status.jobDeploymentStatus``: ``Complete`` (succeeded when ``jobStatus`` is
``SUCCEEDED``; ``STOPPED`` is a failure) or ``Failed`` (with KubeRay's reason and message).
``Retrying`` — a failed attempt with ``spec.backoffLimit`` left, ``jobStatus: FAILED`` — is
no end: KubeRay makes a new Ray cluster and submits again. ``ValidationFailed``: KubeRay
will never run the spec, so it fails the job at once, with its reason and message.

``FIELDS``: what a tenant may set, names from the real CRD (ray-project/kuberay)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from broker.manifest.errors import FieldError
from broker.manifest.podrequests import Violation
from broker.manifest.workloads.allowlist import (
    MAX_RETRIES,
    TEMPLATE,
    Table,
    boolean,
    false_only,
    number,
    one_of,
    refused,
    string,
    under,
    whole,
)
from broker.manifest.workloads.batchjob import MANAGED_BY, RETRIES, SUSPENDED
from broker.manifest.workloads.integration import Integration
from broker.manifest.workloads.raycommon import (
    CLUSTER,
    GROUP,
    HEAD,
    MAX_RAY_CLUSTER_NAME,
    VERSION,
    cluster_pod_sets,
    injections,
    name_rules,
)
from broker.manifest.workloads.reading import DerivedPodSet, mapping, pod_template, text
from broker.ports import RunEnd

KIND = "RayJob"
SUBMITTER = "submitter"
K8S_JOB_MODE = "K8sJobMode"
LATE_POD_SETS = frozenset({SUBMITTER})
MAX_RAY_JOB_NAME = MAX_RAY_CLUSTER_NAME - 6


def rules(name: str, spec: Mapping[str, Any]) -> list[Violation]:
    return name_rules(name, MAX_RAY_JOB_NAME, KIND)


FIELDS: Table = (
    ("entrypoint", string()),
    ("entrypointNumCpus", number(0)),
    ("entrypointNumGpus", number(0)),
    ("entrypointResources", string()),
    ("jobId", string()),
    ("metadata.*", string()),
    ("runtimeEnvYAML", string()),
    ("shutdownAfterJobFinishes", boolean()),
    (
        "ttlSecondsAfterFinished",
        whole(0, why="deletes the Ray cluster once the job ended; the RayJob and its status stay"),
    ),
    ("activeDeadlineSeconds", whole(1, why="ends the job sooner, never later")),
    ("preRunningDeadlineSeconds", whole(1, why="ends the job sooner, never later")),
    (
        "backoffLimit",
        whole(0, MAX_RETRIES, "each retry makes a new Ray cluster, inside the placement"),
    ),
    (
        "submissionMode",
        one_of(
            K8S_JOB_MODE,
            "HTTPMode",
            why=(
                "InteractiveMode waits for a person while the gang holds its GPUs; "
                "SidecarMode adds a container to the head pod, outside the template policy"
            ),
        ),
    ),
    *under("rayClusterSpec", CLUSTER),
    ("submitterConfig.backoffLimit", whole(0, MAX_RETRIES, RETRIES)),
    ("submitterPodTemplate", TEMPLATE),
    (
        "clusterSelector",
        refused(
            "KubeRay would submit to an existing Ray cluster, maybe another tenant's, while the "
            "broker holds a gang that never gets pods"
        ),
    ),
    (
        "deletionStrategy",
        refused(
            "the broker deletes the workload when its job ends; a RayJob deleted sooner reads as "
            "deleted behind its back"
        ),
    ),
    ("suspend", false_only(SUSPENDED)),
    ("managedBy", refused(MANAGED_BY)),
)


def pod_sets(spec: Mapping[str, Any]) -> list[DerivedPodSet]:
    at = ("spec",)
    if spec.get("rayClusterSpec") is None:
        raise FieldError(
            (*at, "rayClusterSpec"),
            "required: the broker places the Ray cluster (clusterSelector is not supported)",
        )
    cluster = mapping(spec, "rayClusterSpec", at)
    out = cluster_pod_sets(cluster, (*at, "rayClusterSpec"), reserved=(HEAD, SUBMITTER))
    if text(spec, "submissionMode", at, default=K8S_JOB_MODE) == K8S_JOB_MODE:
        template, path = pod_template(spec, "submitterPodTemplate", at)
        out.append(DerivedPodSet(SUBMITTER, 1, template, path))
    return out


def completed(spec: dict[str, Any]) -> dict[str, Any]:
    """The RayJob spec with KubeRay's default submitter template written in when it runs a
    submitter Job (``K8sJobMode``) and names no template of its own."""
    mode = spec.get("submissionMode", K8S_JOB_MODE)
    if mode != K8S_JOB_MODE or spec.get("submitterPodTemplate") is not None:
        return spec
    head = _dig(spec, "rayClusterSpec", "headGroupSpec", "template", "spec")
    containers = head.get("containers") if head is not None else None
    if not isinstance(containers, list) or not containers or not isinstance(containers[0], Mapping):
        return spec  # pod_sets names what is missing
    image = containers[0].get("image")
    if not isinstance(image, str):
        path = ("spec", "rayClusterSpec", "headGroupSpec", "template", "spec", "containers", 0)
        raise FieldError((*path, "image"), "required: the default submitter runs the head's image")
    return {**spec, "submitterPodTemplate": default_submitter(image)}


def _dig(obj: Mapping[str, Any], *keys: str) -> Mapping[str, Any] | None:
    for key in keys:
        value = obj.get(key)
        if not isinstance(value, Mapping):
            return None
        obj = value
    return obj


def default_submitter(image: str) -> dict[str, Any]:
    """KubeRay's default submitter pod template (as Kueue counts it), made to pass every Pod
    Security level."""
    security = {
        "runAsNonRoot": True,
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    container = {
        "name": "ray-job-submitter",
        "image": image,
        "resources": {
            "requests": {"cpu": "500m", "memory": "200Mi"},
            "limits": {"cpu": "1", "memory": "1Gi"},
        },
        "securityContext": security,
    }
    return {"spec": {"restartPolicy": "Never", "automountServiceAccountToken": False,
                     "containers": [container]}}  # fmt: skip


def end(obj: Mapping[str, Any]) -> RunEnd | None:
    """How the RayJob ended (see the module's docstring), or None while it runs or retries."""
    status = obj.get("status") or {}
    deployment = status.get("jobDeploymentStatus")
    job_status = str(status.get("jobStatus") or "")
    message = str(status.get("message") or "")
    if deployment == "Complete":
        return RunEnd(job_status == "SUCCEEDED", job_status or "Complete", message)
    if deployment == "Failed":
        return RunEnd(False, str(status.get("reason") or "DeploymentFailed"), message)
    if deployment == "ValidationFailed":  # KubeRay will never run this spec
        return RunEnd(False, str(status.get("reason") or deployment), message, refused=True)
    return None


INTEGRATION = Integration(
    GROUP, VERSION, KIND, "rayjobs", pod_sets, FIELDS, injections("rayClusterSpec"),
    completed, rules, ending=end, late_pod_sets=LATE_POD_SETS,
    pod_sets_doc=f"as RayCluster (`spec.rayClusterSpec`, required), plus `{SUBMITTER}` (1) in "
    f"`{K8S_JOB_MODE}` (the default), made late: out of a delegated gang's minMember",
    count_doc="as RayCluster",
)  # fmt: skip
