"""A job's embedded workload (``LaunchSpec.workload``) as the launcher creates it (pure).

Supported kinds and their resources (``WORKLOAD_KINDS``): batch/v1 ``Job``,
``jobset.x-k8s.io`` ``JobSet``, ``kubeflow.org`` ``PyTorchJob`` (v1) and ``MPIJob``
(v2beta1), ``ray.io`` ``RayJob`` and ``RayCluster``, ``leaderworkerset.x-k8s.io``
``LeaderWorkerSet``. The object goes into the tenant's namespace (``GangObjects.namespace``)
named after the job, carrying the user's labels and annotations plus ours (origin, tenant,
job). Every pod template at the paths admission derived (``WorkloadSpec.pod_sets``) carries
our labels and ``fedbroker.io/pod-set`` too, so the pods the workload's controller makes are
recognised as the job's, and its GPU names are this cluster's. Then, by mode:

* ``pin``: the scheduling gate ``fedbroker.io/placement``; the launcher removes it from
  each pod once it has given the pod a slot of the placement (``adapters.kube.slots``);
* ``delegate``: the PodGroup's label (coscheduling) or annotation (Volcano) and the
  member's ``schedulerName`` when configured.

No rendezvous Service: each kind's controller makes its own.

``workload_end`` reads a workload's own status: Job conditions ``Complete``/``Failed``,
JobSet ``Completed``/``Failed``, PyTorchJob and MPIJob ``Succeeded``/``Failed``, RayJob
``status.jobStatus`` ``SUCCEEDED``/``FAILED``/``STOPPED`` or ``jobDeploymentStatus``
``Failed``; a RayCluster and a LeaderWorkerSet run until cancelled.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, cast

from adapters.kube.objects import (
    COSCHEDULING_LABEL,
    LABEL_POD_SET,
    VOLCANO_ANNOTATION,
    GangObjects,
    KubeLaunchError,
    pod_group_name,
)
from broker.ports import LaunchSpec, RunEnd, TemplatePath, WorkloadSpec

GATE = "fedbroker.io/placement"


@dataclass(frozen=True, slots=True)
class WorkloadKind:
    """A workload kind's API group, version and resource name."""

    kind: str
    group: str
    version: str
    plural: str

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}"


WORKLOAD_KINDS: Mapping[str, WorkloadKind] = {
    k.kind: k
    for k in (
        WorkloadKind("Job", "batch", "v1", "jobs"),
        WorkloadKind("JobSet", "jobset.x-k8s.io", "v1alpha2", "jobsets"),
        WorkloadKind("PyTorchJob", "kubeflow.org", "v1", "pytorchjobs"),
        WorkloadKind("RayJob", "ray.io", "v1", "rayjobs"),
        WorkloadKind("RayCluster", "ray.io", "v1", "rayclusters"),
        WorkloadKind("MPIJob", "kubeflow.org", "v2beta1", "mpijobs"),
        WorkloadKind("LeaderWorkerSet", "leaderworkerset.x-k8s.io", "v1", "leaderworkersets"),
    )
}

# kind -> (condition type that means succeeded, condition type that means failed)
_CONDITION_ENDS: Mapping[str, tuple[str, str]] = {
    "Job": ("Complete", "Failed"),
    "JobSet": ("Completed", "Failed"),
    "PyTorchJob": ("Succeeded", "Failed"),
    "MPIJob": ("Succeeded", "Failed"),
}
_RAY_JOB_ENDS: Mapping[str, bool] = {"SUCCEEDED": True, "FAILED": False, "STOPPED": False}


def kind_of(workload: WorkloadSpec) -> WorkloadKind:
    """The supported kind of ``workload`` (its ``apiVersion`` must be of that kind's
    group), or ``KubeLaunchError``."""
    kind = WORKLOAD_KINDS.get(workload.kind)
    api_version = str(workload.object.get("apiVersion", ""))
    if kind is None or api_version != kind.api_version:
        raise KubeLaunchError(f"unsupported workload {api_version} {workload.kind}")
    return kind


def template_at(obj: Any, path: TemplatePath) -> dict[str, Any]:
    """The pod template at ``path`` in ``obj`` (the object itself, to edit in place)."""
    node = obj
    for step in path:
        ok = (isinstance(node, list) and isinstance(step, int) and 0 <= step < len(node)) or (
            isinstance(node, dict) and isinstance(step, str) and step in node
        )
        if not ok:
            raise KubeLaunchError(f"workload has no pod template at {list(path)}")
        node = node[step]
    if not isinstance(node, dict):
        raise KubeLaunchError(f"workload has no pod template at {list(path)}")
    return cast(dict[str, Any], node)


def _dict_at(parent: dict[str, Any], key: str) -> dict[str, Any]:
    value = parent.get(key)
    if not isinstance(value, dict):
        value = parent[key] = {}
    return cast(dict[str, Any], value)


def dress_template(
    objects: GangObjects, template: dict[str, Any], spec: LaunchSpec, pod_set: str
) -> None:
    """Our labels, the pod set's label and the mode's gate or PodGroup on one pod
    template, in place; GPU names become the cluster's. A template never places its pods
    itself (``nodeName``) nor names another scheduler than the member's."""
    meta = _dict_at(template, "metadata")
    labels = _dict_at(meta, "labels")
    labels.update(objects.labels(spec))
    labels[LABEL_POD_SET] = pod_set
    pod_spec = _dict_at(template, "spec")
    objects.rename_resources(pod_spec)
    pod_spec.pop("nodeName", None)
    pod_spec.pop("schedulerName", None)
    if objects.mode == "pin":
        gates = [g for g in pod_spec.get("schedulingGates") or () if g != {"name": GATE}]
        pod_spec["schedulingGates"] = [*gates, {"name": GATE}]
        return
    if objects.flavor == "coscheduling":
        labels[COSCHEDULING_LABEL] = pod_group_name(spec)
    else:
        _dict_at(meta, "annotations")[VOLCANO_ANNOTATION] = pod_group_name(spec)
    if objects.scheduler_name:
        pod_spec["schedulerName"] = objects.scheduler_name


def workload_body(objects: GangObjects, spec: LaunchSpec) -> dict[str, Any]:
    """The workload object to create for ``spec`` (a ``spec.workload`` job) in its tenant's
    namespace, named after the job, every pod template dressed (``dress_template``)."""
    if spec.workload is None:
        raise KubeLaunchError(f"job {spec.key} has no workload")
    kind = kind_of(spec.workload)
    body = cast(dict[str, Any], json.loads(json.dumps(spec.workload.object)))
    raw_meta = body.get("metadata")
    given: dict[str, Any] = raw_meta if isinstance(raw_meta, dict) else {}
    metadata: dict[str, Any] = {
        "name": spec.job,
        "namespace": objects.namespace(spec.tenant),
        "labels": {**(given.get("labels") or {}), **objects.labels(spec)},
    }
    if given.get("annotations"):
        metadata["annotations"] = dict(given["annotations"])
    body["apiVersion"], body["kind"], body["metadata"] = kind.api_version, kind.kind, metadata
    for pod_set, path in spec.workload.pod_sets:
        dress_template(objects, template_at(body, path), spec, pod_set)
    return body


def _condition_end(obj: Mapping[str, Any], succeeded: str, failed: str) -> RunEnd | None:
    conditions = (obj.get("status") or {}).get("conditions") or ()
    found: dict[str, Mapping[str, Any]] = {}
    for condition in conditions:
        if isinstance(condition, Mapping) and condition.get("status") == "True":
            found[str(condition.get("type"))] = condition
    for kind, ok in ((failed, False), (succeeded, True)):
        if kind in found:
            reason = str(found[kind].get("reason") or kind)
            return RunEnd(ok, reason, str(found[kind].get("message") or ""))
    return None


def workload_end(kind: str, obj: Mapping[str, Any]) -> RunEnd | None:
    """How the workload ended, by its own status, with its reason and message; None while
    it has not (a RayCluster or a LeaderWorkerSet never ends by itself)."""
    if kind in _CONDITION_ENDS:
        return _condition_end(obj, *_CONDITION_ENDS[kind])
    if kind != "RayJob":
        return None
    status = obj.get("status") or {}
    job_status = str(status.get("jobStatus") or "")
    message = str(status.get("message") or "")
    if status.get("jobDeploymentStatus") == "Failed":
        return RunEnd(False, str(status.get("reason") or "DeploymentFailed"), message)
    if job_status in _RAY_JOB_ENDS:
        return RunEnd(_RAY_JOB_ENDS[job_status], job_status, message)
    return None
