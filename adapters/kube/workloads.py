"""A job's embedded workload (``LaunchSpec.workload``) as the launcher creates it (pure).

The kinds are the launcher's (``broker.ports.WorkloadKind``s the composition hands it:
the manifest's registry); ``kind_of`` finds a workload's by its apiVersion and kind, and
everything kind-specific (its resource, its pods' index, its end, its late pod sets) is
read through it: no kind is named here. The object goes into the tenant's namespace
(``GangObjects.namespace``) named after the job, carrying the user's labels and
annotations plus ours (origin, tenant, job). Every pod template at the paths admission
derived (``WorkloadSpec.pod_sets``) carries our labels and ``fedbroker.io/pod-set`` too, so
the pods the workload's controller makes are recognised as the job's, and its GPU names are
this cluster's. Then, by mode:

* ``pin``: the scheduling gate ``fedbroker.io/placement``; the launcher removes it from
  each pod once it has given the pod a slot of the placement (``adapters.kube.slots``);
* ``delegate``: the PodGroup's label (coscheduling) or annotation (Volcano), the
  member's ``schedulerName`` when configured, and the domains a pod set with a topology
  request was placed in as a node selector (``objects.confine``; slices in different
  domains cannot be said on one template: the launch is refused).

No rendezvous Service: each kind's controller makes its own.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any, cast

from adapters.kube.objects import (
    COSCHEDULING_LABEL,
    LABEL_POD_SET,
    VOLCANO_ANNOTATION,
    GangObjects,
    KubeLaunchError,
    confine,
    domain_of,
    pod_group_name,
    pod_name,
    pod_set_of,
)
from broker.model import Placement
from broker.ports import LaunchSpec, TemplatePath, WorkloadKind, WorkloadSpec

GATE = "fedbroker.io/placement"


def api_version(kind: WorkloadKind) -> str:
    return f"{kind.group}/{kind.version}" if kind.group else kind.version


def kind_of(kinds: Iterable[WorkloadKind], workload: WorkloadSpec) -> WorkloadKind:
    """The kind of ``workload`` among ``kinds`` (by its apiVersion and kind), or
    ``KubeLaunchError``."""
    given = str(workload.object.get("apiVersion", ""))
    for kind in kinds:
        if kind.kind == workload.kind and api_version(kind) == given:
            return kind
    raise KubeLaunchError(f"unsupported workload {given} {workload.kind}")


def late_pods(kind: WorkloadKind, placement: Placement, spec: LaunchSpec) -> int:
    """The placement's pods of the kind's late pod sets (made only once the others run)."""
    return sum(
        1 for p in placement.pods if pod_set_of(pod_name(p, spec), spec) in kind.late_pod_sets
    )


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
    confine(pod_spec, domain_of(spec, pod_set, None), f"pod set {pod_set}: template spec")
    if objects.flavor == "coscheduling":
        labels[COSCHEDULING_LABEL] = pod_group_name(spec)
    else:
        _dict_at(meta, "annotations")[VOLCANO_ANNOTATION] = pod_group_name(spec)
    if objects.scheduler_name:
        pod_spec["schedulerName"] = objects.scheduler_name


def workload_body(objects: GangObjects, spec: LaunchSpec, kind: WorkloadKind) -> dict[str, Any]:
    """The workload object of ``kind`` to create for ``spec`` (a ``spec.workload`` job) in
    its tenant's namespace, named after the job, every pod template dressed
    (``dress_template``)."""
    if spec.workload is None:
        raise KubeLaunchError(f"job {spec.key} has no workload")
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
    body["apiVersion"], body["kind"], body["metadata"] = api_version(kind), kind.kind, metadata
    for pod_set, path in spec.workload.pod_sets:
        template = template_at(body, path)
        dress_template(objects, template, spec, pod_set)
        if not kind.templates_name_scheduler:
            template["spec"].pop("schedulerName", None)
    return body
