"""The Kubernetes objects of a gang: names, namespaces, labels, PodGroup and Pod bodies (pure).

A gang's objects go into its tenant's namespace: the launcher's namespace pattern with
``{tenant}`` replaced by the tenant's name (``fedbroker-{tenant}`` by default), so jobs of
one name in two tenants never share object names. Every object carries the labels
``fedbroker.io/origin``, ``fedbroker.io/tenant`` and ``fedbroker.io/job``; only objects
carrying our origin (in their tenant's namespace) are ever adopted or deleted. A pod is
named ``<job>-<podset>-<index>`` (the placement's pod name without the service's
``<tenant>.`` prefix) and annotated with the ledger's pod name and the GPU indexes the
broker picked, so a restarted broker reads its reservations back.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, cast

from adapters.kube import translate
from adapters.kube.rendezvous import Rendezvous
from adapters.kube.translate import (
    ANNOTATION_GPUS,
    ANNOTATION_POD,
    GpuConfig,
    own_gpus,
    pod_resources,
)
from broker.model import Placement, PodBound, PodPlacement, Resources
from broker.ports import LaunchError, LaunchSpec

Mode = Literal["delegate", "pin"]
Flavor = Literal["coscheduling", "volcano"]

# Our labels, named where pods are keyed by them (``translate.ledger_name``).
LABEL_ORIGIN = translate.LABEL_ORIGIN
LABEL_TENANT = translate.LABEL_TENANT
LABEL_JOB = translate.LABEL_JOB
LABEL_POD_SET = translate.LABEL_POD_SET

TENANT_PLACEHOLDER = "{tenant}"
COSCHEDULING_LABEL = "scheduling.x-k8s.io/pod-group"
VOLCANO_ANNOTATION = "scheduling.k8s.io/group-name"
DEFAULT_VOLCANO_QUEUE = "default"  # the Queue every Volcano install creates
# GPU names a template may use (the manifest's), translated to each cluster's own names.
WHOLE_GPU_NAMES = frozenset({"nvidia.com/gpu", "amd.com/gpu"})
SHARED_GPU_NAME = "fedbroker.io/gpu-milli"


class KubeLaunchError(LaunchError):
    """A gang could not be created or did not start in a Kubernetes cluster (a
    ``broker.ports.LaunchError``, so the service's rollback catches it)."""


@dataclass(frozen=True, slots=True)
class PodGroupKind:
    group: str
    version: str
    plural: str = "podgroups"

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}"


POD_GROUP_KINDS: Mapping[Flavor, PodGroupKind] = {
    "coscheduling": PodGroupKind("scheduling.x-k8s.io", "v1alpha1"),
    "volcano": PodGroupKind("scheduling.volcano.sh", "v1beta1"),
}


def labels_of(obj: Mapping[str, Any]) -> Mapping[str, str]:
    meta = obj.get("metadata") or {}
    return cast(Mapping[str, str], meta.get("labels") or {})


def namespace_of(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("namespace") or "")


def controlled(obj: Mapping[str, Any]) -> bool:
    """The object has a controller (an ownerReference with ``controller: true``): another
    controller made it, maybe copying our labels onto it (KubeRay's RayCluster of a RayJob
    carries the RayJob's), so it is never adopted or deleted as one the broker created."""
    owners = (obj.get("metadata") or {}).get("ownerReferences") or ()
    return any(isinstance(o, Mapping) and o.get("controller") is True for o in owners)


def job_key(obj: Mapping[str, Any]) -> str:
    """The ``tenant/name`` of the job an object of ours belongs to."""
    labels = labels_of(obj)
    return f"{labels.get(LABEL_TENANT, '')}/{labels.get(LABEL_JOB, '')}"


def pod_name(pod: PodPlacement, spec: LaunchSpec) -> str:
    """``<job>-<podset>-<index>``: the placement's pod name without the ``<tenant>.`` prefix."""
    prefix = f"{spec.tenant}."
    return pod.pod[len(prefix) :] if pod.pod.startswith(prefix) else pod.pod


def pod_set_of(name: str, spec: LaunchSpec) -> str:
    head = f"{spec.job}-"
    rest = name[len(head) :] if name.startswith(head) else name
    return rest.rpartition("-")[0] or rest


def pod_group_name(spec: LaunchSpec) -> str:
    return spec.job


# The default container (no template given) passes every Pod Security level, restricted
# included, so a restricted tenant's namespace admits it.
RESTRICTED_CONTAINER: Mapping[str, Any] = {
    "runAsNonRoot": True,
    "runAsUser": 65534,
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
    "seccompProfile": {"type": "RuntimeDefault"},
}


def pinned_to(node: str, affinity: object = None) -> dict[str, Any]:
    """The user's affinity ANDed with required node affinity to one node by name (``pin``
    mode): node selector terms are ORed and a term's requirements ANDed, so the pin joins
    EVERY user term (an empty user term matches nothing and stays so); the user's preferred
    node affinity and pod (anti-)affinity are kept as given."""
    pin = {"key": "metadata.name", "operator": "In", "values": [node]}
    out = dict(affinity) if isinstance(affinity, Mapping) else {}
    node_affinity = out.get("nodeAffinity")
    node_affinity = dict(node_affinity) if isinstance(node_affinity, Mapping) else {}
    required = node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution")
    required = dict(required) if isinstance(required, Mapping) else {}
    terms = required.get("nodeSelectorTerms")
    terms = [t for t in terms if isinstance(t, Mapping)] if isinstance(terms, list) else []
    required["nodeSelectorTerms"] = [
        {**t, "matchFields": [*(t.get("matchFields") or []), pin]} if t else t for t in terms
    ] or [{"matchFields": [pin]}]
    node_affinity["requiredDuringSchedulingIgnoredDuringExecution"] = required
    out["nodeAffinity"] = node_affinity
    return out


def domain_of(spec: LaunchSpec, pod_set: str, index: int | None) -> dict[str, str]:
    """The ``{level key: value}`` a delegated pod of ``pod_set`` must stay in (its
    placement's domains, ``LaunchSpec.domains``); ``index`` None: every pod of the pod set
    alike (a workload's one template). What the member's gang scheduler cannot be told is
    refused rather than run spread: slices in different domains from one template
    (permanent), or a required level the placed nodes no longer show (transient)."""
    found = spec.domains.get(pod_set)
    if found is None:
        return {}
    if found.unresolved:
        raise KubeLaunchError(
            f"pod set {pod_set}: its placed nodes show no one domain of {found.unresolved} "
            "now; not launched spread"
        )
    if index is None and found.slices:
        level = next(iter(found.slices[0]))
        raise KubeLaunchError(
            f"pod set {pod_set}: its slices were placed in different domains of {level}, "
            "and its pods share one template: a delegate-mode member cannot keep each slice "
            "in its own",
            permanent=True,
        )
    return found.of_pod(index or 0)


def confine(pod_spec: dict[str, Any], selector: Mapping[str, str], where: str) -> None:
    """``selector`` (a domain's labels) ANDed into the pod spec's own ``nodeSelector``, in
    place: the member's gang scheduler then keeps the pods in the domain the broker placed
    them in. A ``nodeSelector`` of the tenant's naming another value of one of its keys
    means the pods could never run there: KubeLaunchError, permanent, naming the field
    (``where``: the template's spec)."""
    if not selector:
        return
    given = pod_spec.get("nodeSelector")
    own = dict(given) if isinstance(given, Mapping) else {}
    for key, value in selector.items():
        if key in own and own[key] != value:
            raise KubeLaunchError(
                f"{where}.nodeSelector[{key}] is {str(own[key])[:63]!r}, but the gang was "
                f"placed in {key}={value}: its pods could never run there",
                permanent=True,
            )
    pod_spec["nodeSelector"] = {**own, **selector}


class GangObjects:
    """Builds and recognises one launcher's objects (its namespace pattern, mode, PodGroup
    flavour, origin and GPU resource names)."""

    def __init__(
        self,
        namespace_pattern: str,
        mode: Mode,
        flavor: Flavor,
        origin: str,
        *,
        cluster: str,
        gpu_resource: str,
        shared_gpu_resource: str | None,
        scheduler_name: str | None,
        default_image: str,
        volcano_queues: Mapping[str, str] | None = None,
    ) -> None:
        if mode not in ("delegate", "pin"):
            raise ValueError(f"unknown launch mode {mode!r}")
        if flavor not in POD_GROUP_KINDS:
            raise ValueError(f"unknown PodGroup flavour {flavor!r}")
        self.namespace_pattern = namespace_pattern
        self.mode: Mode = mode
        self.flavor: Flavor = flavor
        self.kind = POD_GROUP_KINDS[flavor]
        self.origin = origin
        self.cluster = cluster
        self.gpu_resource = gpu_resource
        self.shared_gpu_resource = shared_gpu_resource
        self.scheduler_name = scheduler_name or ("volcano" if flavor == "volcano" else None)
        self.default_image = default_image
        # fedbroker queue -> Volcano Queue; unmapped -> DEFAULT_VOLCANO_QUEUE
        self.volcano_queues = dict(volcano_queues or {})
        self._gpu = GpuConfig((gpu_resource,), shared_resource=shared_gpu_resource)

    def namespace(self, tenant: str) -> str:
        """The tenant's namespace: the pattern with ``{tenant}`` replaced (a pattern without
        it is one namespace for every tenant)."""
        return self.namespace_pattern.replace(TENANT_PLACEHOLDER, tenant)

    # -- recognising ours --------------------------------------------------------------------

    @property
    def selector(self) -> str:
        return f"{LABEL_ORIGIN}={self.origin}"

    def has_origin(self, obj: Mapping[str, Any]) -> bool:
        return labels_of(obj).get(LABEL_ORIGIN) == self.origin

    def in_its_namespace(self, obj: Mapping[str, Any]) -> bool:
        """Ours, and in the namespace of the tenant it is labelled with: what a listing
        across namespaces keeps (an object elsewhere is never read back, nor deleted)."""
        tenant = labels_of(obj).get(LABEL_TENANT)
        return (
            self.has_origin(obj)
            and bool(tenant)
            and namespace_of(obj) == self.namespace(str(tenant))
        )

    def ours(self, obj: Mapping[str, Any], spec: LaunchSpec) -> bool:
        """Carries our origin and this job's labels."""
        labels = labels_of(obj)
        return (
            self.has_origin(obj)
            and labels.get(LABEL_TENANT) == spec.tenant
            and labels.get(LABEL_JOB) == spec.job
        )

    def labels(self, spec: LaunchSpec) -> dict[str, str]:
        return {LABEL_ORIGIN: self.origin, LABEL_TENANT: spec.tenant, LABEL_JOB: spec.job}

    # -- bodies ------------------------------------------------------------------------------

    def rendezvous(self, placement: Placement, spec: LaunchSpec) -> Rendezvous:
        """The gang's rendezvous (Service, ranks, hostnames) in its tenant's namespace."""
        names = [pod_name(p, spec) for p in placement.pods]
        return Rendezvous.of(names, spec, self.namespace(spec.tenant))

    def service_body(self, rendezvous: Rendezvous, spec: LaunchSpec) -> dict[str, Any]:
        """The gang's headless Service, selecting (and labelled with) its job's labels."""
        return rendezvous.service_body(self.labels(spec))

    def pod_group_body(
        self, placement: Placement, spec: LaunchSpec, late: int = 0
    ) -> dict[str, Any]:
        """The gang's PodGroup; ``late`` of the placement's pods are made by a workload's
        controller only once the others run (a RayJob's submitter), so the gang scheduler
        must not wait for them: they are left out of minMember."""
        early = len(placement.pods) - late
        pg_spec: dict[str, Any] = {"minMember": min(spec.min_member or early, early)}
        if self.flavor == "coscheduling":
            pg_spec["scheduleTimeoutSeconds"] = spec.schedule_timeout_seconds
        else:
            pg_spec["queue"] = self.volcano_queues.get(spec.queue, DEFAULT_VOLCANO_QUEUE)
        return {
            "apiVersion": self.kind.api_version,
            "kind": "PodGroup",
            "metadata": {
                "name": pod_group_name(spec),
                "namespace": self.namespace(spec.tenant),
                "labels": self.labels(spec),
            },
            "spec": pg_spec,
        }

    def resource_list(self, resources: Resources) -> dict[str, str]:
        out: dict[str, str] = {}
        if resources.cpu_milli:
            out["cpu"] = f"{resources.cpu_milli}m"
        if resources.memory_mib:
            out["memory"] = f"{resources.memory_mib}Mi"
        if resources.gpus:
            out[self.gpu_resource] = str(resources.gpus)
        if resources.gpu_milli:
            if self.shared_gpu_resource is None:
                raise KubeLaunchError(
                    f"a shared-GPU pod needs a shared GPU resource name in cluster {self.cluster}"
                )
            out[self.shared_gpu_resource] = str(resources.gpu_milli)
        return out

    def _cluster_name(self, name: str) -> str:
        """A template's resource name in this cluster's terms (its GPU resource names)."""
        if name in WHOLE_GPU_NAMES:
            return self.gpu_resource
        if name == SHARED_GPU_NAME:
            if self.shared_gpu_resource is None:
                raise KubeLaunchError(
                    f"a shared-GPU pod needs a shared GPU resource name in cluster {self.cluster}"
                )
            return self.shared_gpu_resource
        return name

    def rename_resources(self, pod_spec: dict[str, Any]) -> set[str]:
        """Every container's requests and limits (and the pod's overhead and own resources)
        with the GPU names translated to this cluster's, in place; returns the resource
        names given."""
        declared: set[str] = set()
        maps: list[dict[str, Any]] = []
        for kind in ("containers", "initContainers"):
            for container in pod_spec.get(kind) or ():
                res = container.get("resources") if isinstance(container, dict) else None
                if isinstance(res, dict):
                    maps += [res[p] for p in ("requests", "limits") if isinstance(res.get(p), dict)]
        if isinstance(pod_spec.get("overhead"), dict):
            maps.append(pod_spec["overhead"])
        pod_level = pod_spec.get("resources")  # the pod's own (KEP-2837): cpu, memory given
        if isinstance(pod_level, dict):
            maps += [
                pod_level[p] for p in ("requests", "limits") if isinstance(pod_level.get(p), dict)
            ]
        for amounts in maps:
            renamed = {self._cluster_name(k): v for k, v in amounts.items()}
            amounts.clear()
            amounts.update(renamed)
            declared.update(renamed)
        return declared

    def _place_resources(self, pod_spec: dict[str, Any], resources: Resources) -> None:
        """Every container keeps the requests and limits its template gave (admission made
        them add up to the pod set's, GPU names translated to this cluster's); a resource
        the template gives nowhere goes to the first container, requests = limits."""
        declared = self.rename_resources(pod_spec)
        ours = {k: v for k, v in self.resource_list(resources).items() if k not in declared}
        if ours:
            first = pod_spec["containers"][0]
            res = first["resources"] = dict(first.get("resources") or {})
            for part in ("requests", "limits"):
                res[part] = {**(res.get(part) or {}), **ours}

    def pod_body(
        self, pod: PodPlacement, spec: LaunchSpec, rendezvous: Rendezvous | None = None
    ) -> dict[str, Any]:
        """The pod from its pod set's template, with our labels, the broker's resources
        (see ``_place_resources``), its gang's rendezvous (hostname, subdomain, env: see
        ``adapters.kube.rendezvous``) when given, and its gang's PodGroup and the domains its
        pod set was placed in as a node selector (delegate: ``confine``) or its node (pin,
        ANDed with the user's affinity). The user's nodeSelector and tolerations stay as
        given: in pin mode the broker adds none of its own, and a nodeSelector contradicting
        the pin only keeps the pod pending, it never moves it."""
        name = pod_name(pod, spec)
        template = spec.pod_templates.get(pod_set_of(name, spec), {})
        template_meta = cast(Mapping[str, Any], template.get("metadata") or {})
        pod_spec: dict[str, Any] = json.loads(json.dumps(template.get("spec") or {}))
        labels = {**cast(Mapping[str, str], template_meta.get("labels") or {})}
        labels.update(self.labels(spec))
        labels[LABEL_POD_SET] = pod_set_of(name, spec)
        annotations = {**cast(Mapping[str, str], template_meta.get("annotations") or {})}
        annotations[ANNOTATION_POD] = pod.pod
        annotations[ANNOTATION_GPUS] = ",".join(str(g) for g in pod.gpus)

        pod_spec["containers"] = pod_spec.get("containers") or [
            {"name": "main", "image": self.default_image, "securityContext": RESTRICTED_CONTAINER}
        ]
        self._place_resources(pod_spec, pod.resources)
        if rendezvous is not None:
            rendezvous.apply(pod_spec, name, spec.job)
        pod_spec.setdefault("restartPolicy", "Never")
        # The template policy refuses both; never let a stored template place a pod itself.
        pod_spec.pop("nodeName", None)
        pod_spec.pop("schedulerName", None)

        if self.mode == "pin":
            pod_spec["affinity"] = pinned_to(pod.node, pod_spec.get("affinity"))
        else:
            pod_set, index = pod_set_of(name, spec), name.rpartition("-")[2]
            where = f"pod set {pod_set}: template spec"
            confine(pod_spec, domain_of(spec, pod_set, int(index) if index.isdigit() else 0), where)
            group = pod_group_name(spec)
            if self.flavor == "coscheduling":
                labels[COSCHEDULING_LABEL] = group
            else:
                annotations[VOLCANO_ANNOTATION] = group
            if self.scheduler_name:
                pod_spec["schedulerName"] = self.scheduler_name
        metadata = {"name": name, "namespace": self.namespace(spec.tenant), "labels": labels,
                    "annotations": annotations}  # fmt: skip
        return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": pod_spec}

    # -- reading back ------------------------------------------------------------------------

    def bound_of(self, pod: Mapping[str, Any], key: str) -> PodBound:
        """A pod of ours as the ledger's ``PodBound`` under ``key`` (node ``""`` while it
        is unbound)."""
        spec = pod.get("spec") or {}
        return PodBound(
            self.cluster,
            key,
            str(spec.get("nodeName") or ""),
            pod_resources(spec, self._gpu),
            own_gpus(pod),
        )
