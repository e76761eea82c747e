"""A manifest as its member's API server and controllers will take it, or the first reason
they would not (pure): admission's first step, before the template policy.

Every pod template (the ``podSets`` templates, and in ``spec.workload`` every template at
the paths its kind derives) is validated against Kubernetes' own ``PodTemplateSpec``
schema and the API server's rules for pods (``broker.manifest.apirules``); the workload
object against its kind's schema (a CRD's, or batch/v1 ``JobSpec``) and the rules of its
API, webhook and controller (``Integration.rules``). Quantities are first rewritten in
their canonical form (``broker.quantity.canonical``), so what is stored and sent never
holds a number where Kubernetes writes a string: the object a member creates and the one
the broker stored read alike. A refusal is one ``ManifestError`` (400) naming the field.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from typing import Any

from broker.manifest import kubeschema, workloads
from broker.manifest.apirules import pod_template_problems
from broker.manifest.errors import ManifestError, field_path
from broker.manifest.models import FederatedJob, PodSetSpec, WorkloadObject
from broker.manifest.podrequests import Path, Violation
from broker.manifest.workloads.batchjob import API_VERSION as BATCH_API_VERSION

WORKLOAD_AT: Path = ("spec", "workload")


def refusal(found: list[Violation]) -> ManifestError:
    """One line for the first of ``found`` (and how many more there are)."""
    first = found[0]
    more = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
    path = field_path(first.path)
    return ManifestError(f"{path}: {first.message}{more}", path)


_TEMPLATES_REMEMBERED = 2048  # distinct templates whose outcome is kept (jobs repeat them)
# Only templates up to this size are remembered: 2,048 of a body's 256 KiB would hold 0.5 GiB.
_REMEMBERED_TEXT = 16 << 10


def pod_template(template: Mapping[str, Any], base: Path, *, pod_set: bool) -> dict[str, Any]:
    """The template with canonical quantities, or ManifestError naming its first problem
    (``pod_set``: a podSets template, which may leave its containers to the launcher).
    Teams submit the same templates over and over: each distinct one is checked once."""
    text = json.dumps(template, sort_keys=True, separators=(",", ":"))
    check = _checked if len(text) <= _REMEMBERED_TEXT else _checked.__wrapped__
    normal, found = check(text, pod_set)
    if found:
        raise refusal([Violation((*base, *v.path), v.message) for v in found])
    return json.loads(normal)  # type: ignore[no-any-return]


@functools.lru_cache(maxsize=_TEMPLATES_REMEMBERED)
def _checked(text: str, pod_set: bool) -> tuple[str, tuple[Violation, ...]]:
    """A template (its JSON text) with canonical quantities, as JSON text, and its problems
    at paths below the template: schema or quantities first, else the API server's rules."""
    root = kubeschema.POD_SET_TEMPLATE if pod_set else kubeschema.POD_TEMPLATE
    normal, found = kubeschema.normalised(json.loads(text), root, ())
    schema = kubeschema.template_problems(normal, (), pod_set=pod_set)
    if schema or found:
        return text, tuple(schema or found)
    rules = pod_template_problems(normal, (), containers_required=not pod_set)
    return json.dumps(normal, separators=(",", ":")), tuple(rules)


def _workload(workload: WorkloadObject, name: str) -> WorkloadObject:
    """The workload with canonical quantities, its object, rules and every pod template
    checked; ManifestError naming the first problem."""
    found_kind = workloads.integration(workload.api_version, workload.kind)
    base = (*WORKLOAD_AT, "spec")
    if workload.api_version == BATCH_API_VERSION:
        root = kubeschema.JOB_SPEC
    else:
        root = f"crd:{workload.api_version}/{workload.kind}"
    spec, found = kubeschema.normalised(workload.spec, root, base)
    schema = kubeschema.problems(spec, root, base)
    if schema or found:
        raise refusal(schema or found)
    obj = {"apiVersion": workload.api_version, "kind": workload.kind, "spec": spec}
    for path, template in workloads.templates(obj):  # counted or not: all reach the member
        pod_template(template, (*WORKLOAD_AT, *path), pod_set=False)
    rules = found_kind.rules(name, spec)
    if rules:
        # The object is created under the job's name: a name problem is the manifest's.
        raise refusal([v if v.path[:1] == ("metadata",) else
                       Violation((*WORKLOAD_AT, *v.path), v.message) for v in rules])  # fmt: skip
    return workload if spec is workload.spec else workload.model_copy(update={"spec": spec})


def conformed(manifest: FederatedJob) -> FederatedJob:
    """``manifest`` with canonical quantities, every template and object checked as its
    member would check them; ManifestError (400) naming the first problem."""
    spec = manifest.spec
    if spec.workload is not None:
        workload = _workload(spec.workload, manifest.metadata.name)
        if workload is spec.workload:
            return manifest
        new_spec = spec.model_copy(update={"workload": workload})
        return manifest.model_copy(update={"spec": new_spec})
    pod_sets: list[PodSetSpec] = []
    for i, ps in enumerate(spec.pod_sets or ()):
        if not ps.template:
            pod_sets.append(ps)
            continue
        template = pod_template(ps.template, ("spec", "podSets", i, "template"), pod_set=True)
        same = template == ps.template
        pod_sets.append(ps if same else ps.model_copy(update={"template": template}))
    if all(a is b for a, b in zip(pod_sets, spec.pod_sets or (), strict=True)):
        return manifest
    return manifest.model_copy(update={"spec": spec.model_copy(update={"pod_sets": pod_sets})})


__all__ = ["conformed", "pod_template", "refusal"]
