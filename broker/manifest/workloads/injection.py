"""What a kind's controller adds to the pods it makes from a tenant's templates, as data the
kind declares (``Injection``), and the check that the tenant's Pod Security level allows
it. The member's Pod Security admission sees the pod as the controller made it: an added
container the level forbids means a pod that is never created and a gang that never starts,
so admission refuses the job instead, saying why and what to use. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from broker.manifest.errors import field_path
from broker.manifest.podrequests import Violation
from broker.manifest.podsecurity import CONTAINER_KINDS, Fields, Level, Pod, check
from broker.manifest.workloads.allowlist import matches, steps
from broker.manifest.workloads.reading import Path


@dataclass(frozen=True, slots=True)
class Injection:
    """A container a kind's controller adds to every pod of some of its templates.

    ``templates`` names them (a table path, relative to the object's ``spec``); ``requires``,
    when given, is a path that must be set for the controller to add it; ``container`` is
    the container as added, to ``into``; ``security_from_first``: the controller copies the
    securityContext of the template's first container into it. ``what`` and ``instead`` make
    the refusal: who adds what, and what the tenant can do instead."""

    what: str
    templates: str
    into: Literal["initContainers", "containers"]
    container: Mapping[str, Any]
    instead: str
    requires: str = ""
    security_from_first: bool = False


def refusals(
    injections: tuple[Injection, ...],
    spec: Mapping[str, Any],
    templates: list[tuple[Path, Mapping[str, Any]]],
    level: Level,
) -> list[Violation]:
    """A violation at each template (path from the object's root) whose pods ``level``
    forbids once a controller has added its containers; ``templates`` are the object's."""
    out: list[Violation] = []
    for injection in injections:
        if injection.requires and not _present(spec, injection.requires):
            continue
        for path, template in templates:
            if matches(injection.templates, path):
                found = _refusal(injection, template, path, level)
                if found is not None:
                    out.append(found)
    return out


def made(injection: Injection, template: Mapping[str, Any]) -> dict[str, Any]:
    """The pod template as the controller makes its pods: ``injection``'s container added."""
    spec = template.get("spec")
    pod_spec = dict(spec) if isinstance(spec, Mapping) else {}
    existing = pod_spec.get(injection.into)
    added = dict(injection.container)
    if injection.security_from_first:
        containers = pod_spec.get("containers")
        first = containers[0] if isinstance(containers, list) and containers else None
        context = first.get("securityContext") if isinstance(first, Mapping) else None
        if context is not None:
            added["securityContext"] = context
    pod_spec[injection.into] = [*(existing if isinstance(existing, list) else ()), added]
    return {**template, "spec": pod_spec}


def _refusal(
    injection: Injection, template: Mapping[str, Any], path: Path, level: Level
) -> Violation | None:
    # The added container alone, with the pod's own fields: the tenant's containers and
    # volumes have passed the level already, and a container's checks read only those.
    pod_spec = made(injection, template)["spec"]
    added = pod_spec[injection.into][-1]
    alone = {k: v for k, v in pod_spec.items() if k not in CONTAINER_KINDS and k != "volumes"}
    pod = {**template, "spec": {**alone, "containers": [], injection.into: [added]}}
    where = (*path, "spec", injection.into, 0)
    f = Fields()
    check(Pod.read(pod, path, f), level, f)
    found = [v for v in f.found if v.path[: len(where)] == where]
    if not found:
        return None
    first = found[0]
    field = field_path(first.path[len(where) :]) or "the container"
    return Violation(
        (*path, "spec", injection.into),
        f"{injection.what}, and this tenant's Pod Security level refuses it "
        f"({field}: {first.message}); {injection.instead}",
    )


def _present(spec: Mapping[str, Any], path: str) -> bool:
    node: Any = spec
    for step in steps(path):
        if not isinstance(node, Mapping) or node.get(step) is None:
            return False
        node = node[step]
    return True


__all__ = ["Injection", "made", "refusals"]
