"""The workload kinds a FederatedJob may embed in ``spec.workload``: the registry
``INTEGRATIONS``, one ``Integration`` (``integration``) per kind, each from its own module
(as Kueue has one per ``pkg/controller/jobs/<kind>``), registered here one line each.
Admission reads it (the pod sets the kind's controller will make, its allowlist, what it
injects), the composition hands it to the launcher (``broker.ports.WorkloadKind``), and the
RBAC, example and docs checks read it too.

| kind | module | pod sets |
|---|---|---|
| batch/v1 Job | ``batchjob`` | ``main`` |
| jobset.x-k8s.io/v1alpha2 JobSet | ``jobset`` | one per replicated job, by its name |
| kubeflow.org/v1 PyTorchJob | ``pytorchjob`` | ``master``, ``worker`` |
| ray.io/v1 RayJob | ``rayjob`` (+ ``raycommon``) | ``head``, one per worker group, ``submitter`` |
| ray.io/v1 RayCluster | ``raycluster`` (+ ``raycommon``) | ``head``, one per worker group |
| trainer.kubeflow.org/v1alpha1 TrainJob | ``trainjob`` | one per replicated job of its runtime |
| kubeflow.org/v2beta1 MPIJob | ``mpijob`` | ``launcher``, ``worker`` |
| leaderworkerset.x-k8s.io/v1 LeaderWorkerSet | ``leaderworkerset`` | ``leader``, ``worker`` |

Each kind also declares, as data in its module, the fields of its ``spec`` a tenant may set
(``FIELDS``: an allowlist, checked by ``allowlist``; a pod template is one of its leaves,
so ``templates`` finds every template of an object, counted or not) and what its
controller adds to the pods it makes (``injection``).

A kind whose pods' shape lives in the member (a TrainJob's runtime) derives its pod sets
from the runtime it is given as data (``runtime_pod_sets``): the service looks it up in the
members and stores it with the job (``spec.workload.runtime``); ``launch_form`` turns the
stored object into the one created. Anything else is refused. Pure: no I/O; errors are
``FieldError``s with paths from the object's root.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from broker.manifest.errors import FieldError, show
from broker.manifest.fields import MAX_POD_SETS, MAX_PODS
from broker.manifest.podrequests import Violation
from broker.manifest.podsecurity import Level
from broker.manifest.workloads import (
    allowlist,
    batchjob,
    injection,
    jobset,
    leaderworkerset,
    mpijob,
    pytorchjob,
    raycluster,
    rayjob,
    trainjob,
)
from broker.manifest.workloads.integration import Integration
from broker.manifest.workloads.reading import DerivedPodSet, Path

INTEGRATIONS: tuple[Integration, ...] = (
    batchjob.INTEGRATION,
    jobset.INTEGRATION,
    pytorchjob.INTEGRATION,
    rayjob.INTEGRATION,
    raycluster.INTEGRATION,
    trainjob.INTEGRATION,
    mpijob.INTEGRATION,
    leaderworkerset.INTEGRATION,
)
_BY_KIND = {(i.api_version, i.kind): i for i in INTEGRATIONS}
SUPPORTED = ", ".join(i.name for i in INTEGRATIONS)
KINDS = frozenset(i.kind for i in INTEGRATIONS)


def integration(api_version: str, kind: str) -> Integration:
    """The integration of a kind, or a FieldError at ``kind`` listing the supported ones."""
    found = _BY_KIND.get((api_version, kind))
    if found is None:
        raise FieldError(
            ("kind",),
            f"{show(api_version)} {show(kind)} is not a supported workload ({SUPPORTED})",
        )
    return found


def _read(obj: Mapping[str, Any]) -> tuple[Integration, Mapping[str, Any]]:
    """The integration of a workload object and its ``spec``; FieldError otherwise."""
    api_version, kind, spec = obj.get("apiVersion"), obj.get("kind"), obj.get("spec")
    if not isinstance(api_version, str) or not isinstance(kind, str):
        raise FieldError(("kind",), "apiVersion and kind must be strings")
    found = integration(api_version, kind)
    if not isinstance(spec, Mapping):
        raise FieldError(("spec",), "must be a mapping")
    return found, spec


def derive(obj: Mapping[str, Any]) -> list[DerivedPodSet]:
    """The pod sets of a workload object (``apiVersion``, ``kind``, ``spec``), in order,
    within the bounds of any job's pod sets; FieldError naming the field otherwise."""
    found, spec = _read(obj)
    runtime = obj.get("runtime")
    if found.runtime_pod_sets is not None and isinstance(runtime, Mapping):
        runtime_spec = runtime.get("spec")
        if not isinstance(runtime_spec, Mapping):
            raise FieldError(("runtime", "spec"), "must be a mapping")
        pod_sets = found.runtime_pod_sets(spec, runtime_spec)
    else:
        pod_sets = found.pod_sets(spec)
    if len(pod_sets) > MAX_POD_SETS:
        raise FieldError(("spec",), f"makes {len(pod_sets)} pod sets, at most {MAX_POD_SETS} "
                         "allowed")  # fmt: skip
    total = sum(ps.count for ps in pod_sets)
    if total > MAX_PODS:
        raise FieldError(("spec",), f"makes {total} pods in all, at most {MAX_PODS} allowed")
    return pod_sets


def pod_set_paths(obj: Mapping[str, Any]) -> tuple[tuple[str, Path], ...]:
    """Pod set name -> its template's path in the object, in the job's order."""
    return tuple((ps.name, ps.path) for ps in derive(obj))


def templates(obj: Mapping[str, Any]) -> list[tuple[Path, Mapping[str, Any]]]:
    """Every pod template of a workload object with its path from the object's root, in the
    object's order: the counted pod sets' and the others (a Ray worker group of no pods, a
    RayJob's submitter template in any mode), all of which reach the member."""
    found, spec = _read(obj)
    if found.runtime_pod_sets is not None:  # the runtime's, as its pods will be made
        return [(ps.path, ps.template) for ps in derive(obj)] if obj.get("runtime") else []
    return allowlist.templates(found.fields, spec)


def runtime_named(obj: Mapping[str, Any]) -> tuple[str, str] | None:
    """The (kind, name) of the member runtime a workload object's pods are shaped by, or
    None for a kind whose object says its pods itself."""
    found, spec = _read(obj)
    return found.runtime_ref(spec) if found.runtime_ref is not None else None


def launch_object(obj: Mapping[str, Any]) -> tuple[Mapping[str, Any], tuple[tuple[str, Path], ...]]:
    """The object the launcher creates for an admitted workload object, and where each
    pod set's template sits in it."""
    found, _ = _read(obj)
    if found.launch_form is not None:
        return found.launch_form(obj)
    return obj, pod_set_paths(obj)


def field_violations(obj: Mapping[str, Any]) -> list[Violation]:
    """Every field of a workload object's ``spec`` its kind does not let a tenant set (or
    set so), and every annotation of the object its kind refuses, with its path from the
    object's root."""
    found, spec = _read(obj)
    annotations = (obj.get("metadata") or {}).get("annotations") or {}
    refused = [
        Violation(("metadata", "annotations", key), why)
        for key, why in found.refused_annotations.items()
        if key in annotations
    ]
    return [*refused, *allowlist.violations(found.fields, spec, found.kind)]


def injection_refusals(obj: Mapping[str, Any], level: Level) -> list[Violation]:
    """A violation at each pod template of the object whose pods ``level`` forbids once
    the kind's controller has added its containers (paths from the object's root)."""
    found, spec = _read(obj)
    return injection.refusals(found.injections, spec, templates(obj), level)


def kinds_doc() -> str:
    """docs/workloads.md's kinds table, generated from the registry (a test checks the page
    against it): each kind's resource, pod sets and how they are counted."""
    rows = [
        "| kind | resource | pod sets | count |",
        "|---|---|---|---|",
        *(
            f"| `{i.api_version}` {i.kind} | `{i.plural}` | {i.pod_sets_doc} | {i.count_doc} |"
            for i in INTEGRATIONS
        ),
    ]
    return "\n".join(rows)


def allowlist_doc() -> str:
    """docs/security.md's allowlist, generated: each kind's table and what its controller
    adds to its pods (a test checks the page against it)."""
    parts: list[str] = []
    for found in INTEGRATIONS:
        parts.append(f"#### {found.name}\n\n{allowlist.markdown(found.fields)}")
        parts.extend(
            f"What its controller adds: {i.what} (`{i.templates}`, `{i.into}`)."
            for i in found.injections
        )
        parts.extend(
            f"Refused on the object: annotation `{key}` ({why})."
            for key, why in found.refused_annotations.items()
        )
    return "\n\n".join(parts)


__all__ = ["INTEGRATIONS", "KINDS", "SUPPORTED", "DerivedPodSet", "Integration", "Path",
           "allowlist_doc", "derive", "field_violations", "injection_refusals", "integration",
           "kinds_doc", "launch_object", "pod_set_paths", "runtime_named", "templates"]  # fmt: skip
