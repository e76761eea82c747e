"""From a validated manifest to the placement core's Job, and back to its pod templates:
the only bridge between the wire models and ``broker.model``."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from broker.interned import frozen, shared
from broker.manifest import workloads
from broker.manifest.errors import FieldError, ManifestError, field_path
from broker.manifest.fields import cpu_millicores, memory_mebibytes
from broker.manifest.models import DEFAULT_MASTER_PORT, FederatedJob, ResourcesSpec
from broker.manifest.podpolicy import derived_resources
from broker.model import GpuType, Job, PodSet, Resources
from broker.ports import WorkloadSpec


def to_job(manifest: FederatedJob, tenant: str, default_queue: str) -> Job:
    """The placement core's Job for a validated manifest submitted by ``tenant``.

    The namespace defaults to the tenant; a namespace naming another tenant is refused by
    the caller (who knows about tenants), not here. ``backoffLimit`` has no place in Job
    and is read from the manifest by the lifecycle. A ``workload``'s pod sets are derived
    from it (``workloads``), each pod's resources counted from its template; ManifestError
    when they do not add up (admission has refused such a manifest before).
    """
    spec = manifest.spec
    try:
        views = spec.pod_set_views()
    except FieldError as exc:  # a workload whose member runtime was never looked up
        where = f"spec.workload.{field_path(exc.path)}"
        raise ManifestError(f"{where}: {exc.message}", where) from None
    try:
        topologies = spec.topologies(views)
    except FieldError as exc:  # admission refused it before
        where = f"spec.{field_path(exc.path)}"
        raise ManifestError(f"{where}: {exc.message}", where) from None
    pod_sets = []
    for (ps, at), topology in zip(views, topologies, strict=True):
        resources = ps.resources if spec.workload is None else derived_resources(ps.template, at)
        made = PodSet(ps.name, ps.count, shared(_resources(resources)), ps.tolerations(), topology)
        pod_sets.append(shared(made))
    return Job(
        name=manifest.metadata.name,
        pod_sets=shared(tuple(pod_sets)),
        tenant=tenant,
        queue=spec.queue or default_queue,
        priority=spec.priority,
        gpu_types=frozen(GpuType(t) for t in spec.placement.gpu_types),
        cluster_selector=dict(spec.placement.cluster_selector) or NO_LABELS,
        min_member=spec.gang.min_member,
        schedule_timeout_seconds=spec.gang.schedule_timeout_seconds,
        policy=spec.policy,
        allow_burst=spec.placement.allow_burst,
        kind=spec.workload.kind if spec.workload is not None else "",
        **_runtime_clusters(spec.workload.runtime if spec.workload is not None else None),
    )


def _runtime_clusters(runtime: Mapping[str, Any] | None) -> dict[str, Any]:
    """A workload shaped by a member runtime goes only to the members that have it (and
    make the same pods of it): the Job's ``clusters`` and what the others lack."""
    if runtime is None:
        return {}
    clusters = frozen(str(c) for c in runtime.get("clusters") or ())
    return {"clusters": clusters, "clusters_missing": f"{runtime.get('kind')} "
            f"{runtime.get('name')} making the pods admitted"}  # fmt: skip


NO_LABELS: Mapping[str, str] = MappingProxyType({})  # shared, read-only
NO_TEMPLATES: Mapping[str, Mapping[str, Any]] = MappingProxyType({})  # shared, read-only


def pod_templates(wire: Mapping[str, Any]) -> Mapping[str, Mapping[str, Any]]:
    """Pod set name -> its non-empty pod template, from a stored manifest (wire names)."""
    pod_sets = (wire.get("spec") or {}).get("podSets") or []
    found = {ps["name"]: ps["template"] for ps in pod_sets if ps.get("template")}
    return found if found else NO_TEMPLATES


def workload_object(wire: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The embedded workload object (``spec.workload``) of a stored manifest, or None."""
    found = (wire.get("spec") or {}).get("workload")
    return found if isinstance(found, Mapping) else None


def workload_spec(obj: Mapping[str, Any]) -> WorkloadSpec:
    """What the launcher creates for an admitted workload object: the object (as its kind
    creates it: a TrainJob with the broker's runtime patch) and where each pod set's
    template sits in it."""
    created, paths = workloads.launch_object(obj)
    return WorkloadSpec(object=created, pod_sets=paths)


def workload_of(wire: Mapping[str, Any]) -> WorkloadSpec | None:
    """The launcher's WorkloadSpec of a stored manifest, None for a ``podSets`` job."""
    obj = workload_object(wire)
    return None if obj is None else workload_spec(obj)


def master_port(wire: Mapping[str, Any]) -> int:
    """The job's rendezvous port (``spec.rendezvous.masterPort``, default 29500), from a
    stored manifest (wire names)."""
    rendezvous = (wire.get("spec") or {}).get("rendezvous") or {}
    return int(rendezvous.get("masterPort", DEFAULT_MASTER_PORT))


def _resources(spec: ResourcesSpec) -> Resources:
    return Resources(
        gpus=spec.gpus,
        gpu_milli=spec.gpu_milli or 0,
        cpu_milli=cpu_millicores(spec.cpu) if spec.cpu is not None else 0,
        memory_mib=memory_mebibytes(spec.memory) if spec.memory is not None else 0,
    )
