"""The workload kinds a FederatedJob may embed in ``spec.workload``, one integration
module per kind (as Kueue has one per ``pkg/controller/jobs/<kind>``), each deriving the
pod sets the kind's controller will make: their names, counts and pod templates.

| kind | module | pod sets |
|---|---|---|
| batch/v1 Job | ``batchjob`` | ``main`` |
| jobset.x-k8s.io/v1alpha2 JobSet | ``jobset`` | one per replicated job, by its name |
| kubeflow.org/v1 PyTorchJob | ``pytorchjob`` | ``master``, ``worker`` |
| ray.io/v1 RayJob, RayCluster | ``ray`` | ``head``, one per worker group, ``submitter`` |
| kubeflow.org/v2beta1 MPIJob | ``mpijob`` | ``launcher``, ``worker`` |
| leaderworkerset.x-k8s.io/v1 LeaderWorkerSet | ``leaderworkerset`` | ``leader``, ``worker`` |

Each kind also declares, as data in its module, the fields of its ``spec`` a tenant may set
(``FIELDS``: an allowlist, checked by ``allowlist``; a pod template is one of its leaves,
so ``templates`` finds every template of an object, counted or not) and what its
controller adds to the pods it makes (``injection``).

Not supported, refused like any other kind: trainer.kubeflow.org/v1alpha1 TrainJob (its
pods' shape lives in a ClusterTrainingRuntime in the member cluster, which the broker
cannot read when it admits the job, so it could not count what it places), and anything
else. Pure: no I/O; errors are ``FieldError``s with paths from the object's root.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
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
    ray,
)
from broker.manifest.workloads.allowlist import Table
from broker.manifest.workloads.injection import Injection
from broker.manifest.workloads.reading import DerivedPodSet, Path


def _unchanged(spec: dict[str, Any]) -> dict[str, Any]:
    return spec


def _no_rules(name: str, spec: Mapping[str, Any]) -> list[Violation]:
    return []


@dataclass(frozen=True, slots=True)
class Integration:
    """One kind: its pod sets from its ``spec``, the fields of its ``spec`` a tenant may set
    (``fields``), what its controller adds to the pods (``injections``), its ``spec`` as
    admitted (defaults the broker must write in to count what the controller will make),
    and ``rules``: what the API server, the kind's webhook or its controller refuse beyond
    the CRD's schema, given the name the object is created under (the job's)."""

    api_version: str
    kind: str
    pod_sets: Callable[[Mapping[str, Any]], list[DerivedPodSet]]
    fields: Table
    injections: tuple[Injection, ...] = ()
    completed: Callable[[dict[str, Any]], dict[str, Any]] = _unchanged
    rules: Callable[[str, Mapping[str, Any]], list[Violation]] = _no_rules

    @property
    def name(self) -> str:
        return f"{self.api_version} {self.kind}"


INTEGRATIONS = (
    Integration(batchjob.API_VERSION, batchjob.KIND, batchjob.pod_sets, batchjob.FIELDS,
                rules=batchjob.rules),
    Integration(jobset.API_VERSION, jobset.KIND, jobset.pod_sets, jobset.FIELDS,
                rules=jobset.rules),
    Integration(pytorchjob.API_VERSION, pytorchjob.KIND, pytorchjob.pod_sets,
                pytorchjob.FIELDS, pytorchjob.INJECTIONS, rules=pytorchjob.rules),
    Integration(ray.API_VERSION, ray.RAY_JOB, ray.ray_job_pod_sets, ray.RAY_JOB_FIELDS,
                ray.injections("rayClusterSpec"), ray.completed_ray_job, ray.ray_job_rules),
    Integration(ray.API_VERSION, ray.RAY_CLUSTER, ray.ray_cluster_pod_sets,
                ray.RAY_CLUSTER_FIELDS, ray.injections(""), rules=ray.ray_cluster_rules),
    Integration(mpijob.API_VERSION, mpijob.KIND, mpijob.pod_sets, mpijob.FIELDS,
                mpijob.INJECTIONS, rules=mpijob.rules),
    Integration(leaderworkerset.API_VERSION, leaderworkerset.KIND, leaderworkerset.pod_sets,
                leaderworkerset.FIELDS, leaderworkerset.INJECTIONS, rules=leaderworkerset.rules),
)  # fmt: skip
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
    return allowlist.templates(found.fields, spec)


def field_violations(obj: Mapping[str, Any]) -> list[Violation]:
    """Every field of a workload object's ``spec`` its kind does not let a tenant set (or
    set so), with its path from the object's root."""
    found, spec = _read(obj)
    return allowlist.violations(found.fields, spec, found.kind)


def injection_refusals(obj: Mapping[str, Any], level: Level) -> list[Violation]:
    """A violation at each pod template of the object whose pods ``level`` forbids once
    the kind's controller has added its containers (paths from the object's root)."""
    found, spec = _read(obj)
    return injection.refusals(found.injections, spec, templates(obj), level)


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
    return "\n\n".join(parts)


__all__ = ["INTEGRATIONS", "KINDS", "SUPPORTED", "DerivedPodSet", "Integration", "Path",
           "allowlist_doc", "derive", "field_violations", "injection_refusals", "integration",
           "pod_set_paths", "templates"]  # fmt: skip
