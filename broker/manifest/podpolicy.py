"""The template policy: what a tenant's pod templates may hold, checked before a job is
stored (pure, no I/O; DESIGN.md invariant 8).

``admit_templates`` runs, for every pod set, the tenant's Pod Security Standards level
(``podsecurity``) and the broker's own rules, which hold on every level, ``privileged`` too:

* the broker places and schedules: no ``nodeName``, ``schedulerName``, ``priorityClassName``
  or ``priority`` (a member's priority classes could preempt other tenants' pods), no DRA
  ``resourceClaims`` (devices the placement never counted); a member runtime's templates
  (a TrainJob's, stored from the member) may name their scheduler, as delegate mode needs;
* service accounts: ``serviceAccountName``/``serviceAccount`` only from the tenant's list; a
  pod naming none runs as its namespace's ``default``, so when ``default`` is not listed it
  must name a listed one or set ``automountServiceAccountToken: false``;
* nothing reaches the node or the broker: no ``hostPath`` volume, no projected service
  account token for a foreign audience (only the member's API server), no reference to a
  Secret named ``fedbroker-*`` (the broker's own names) from a volume, an env var or an
  image pull secret;
* no label or annotation of the broker's (``fedbroker.io/...``, ``*.fedbroker.io/...``);
* what reaches the node's devices and scheduling (``noderules``): no device-selecting env
  var, ephemeral container or scheduling gate of its own, a runtime class and tolerations
  only as the tenant's ``NodeAccess`` allows.

For a ``spec.workload`` job, first the object's own fields pass its kind's allowlist
(``workloads.field_violations``); the policy then runs on every pod template of the job,
counted or not (``workloads.templates``), each carrying only labels and annotations as
metadata, none of the broker's (``workloads.allowlist.template_metadata``); and what the
kind's controller adds to its pods must pass the tenant's level too
(``workloads.injection_refusals``).

A refusal is a ``PolicyViolation`` naming the full field path from the manifest root. Then
every container's requests are counted (``podrequests``) and must equal the pod set's
``resources``; a resource the pod set leaves out is derived from the template. A mismatch is
a ``ManifestError`` naming the field that makes the total wrong.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from fractions import Fraction
from typing import Any

from pydantic import ValidationError

from broker.manifest import workloads
from broker.manifest.conformance import conformed
from broker.manifest.errors import ManifestError, field_path, first_error, show
from broker.manifest.models import FederatedJob, JobSpec, PodSetSpec, ResourcesSpec
from broker.manifest.noderules import DEFAULT_ACCESS, NodeAccess, node_rules
from broker.manifest.podrequests import (
    AMD_GPU,
    CPU,
    GPU,
    GPU_MILLI,
    MEMORY,
    Path,
    Violation,
    pod_requests,
)
from broker.manifest.podsecurity import Fields, Level, Pod, check
from broker.manifest.workloads.allowlist import BROKER_DOMAIN, reserved_key, template_metadata
from broker.quantity import parse_quantity

BROKER_SECRET_PREFIX = "fedbroker"
_FIELDS = {GPU: "nvidia_gpu", AMD_GPU: "amd_gpu", GPU_MILLI: "gpu_milli", CPU: "cpu",
           MEMORY: "memory"}  # fmt: skip
_PLACED_BY_BROKER = {
    "nodeName": "the broker places pods: nodeName is not allowed",
    "schedulerName": "the broker sets the scheduler: schedulerName is not allowed",
    "priorityClassName": "the broker orders jobs: member priority classes are not allowed",
    "priority": "the broker orders jobs: member priorities are not allowed",
    "resourceClaims": "resource claims (DRA) are not counted by the broker",
}


class PolicyViolation(ManifestError):
    """A template the tenant may not run (its level or the broker's rules); ``str()`` is the
    first violation's path and problem, ``violations`` all of them."""

    def __init__(self, violations: list[Violation]) -> None:
        first = violations[0]
        more = f" (and {len(violations) - 1} more)" if len(violations) > 1 else ""
        path = field_path(first.path)
        super().__init__(f"{path}: {first.message}{more}", path)
        self.violations = violations


def template_violations(
    template: Mapping[str, Any],
    level: Level,
    service_accounts: frozenset[str],
    base: Path,
    *,
    access: NodeAccess = DEFAULT_ACCESS,
) -> list[Violation]:
    """Every violation of a pod template at ``base`` (its path from the manifest root), the
    first per field path, in the order found."""
    f = Fields()
    pod = Pod.read(template, base, f)
    check(pod, level, f)
    _broker_rules(pod, f, service_accounts, access)
    first: dict[Path, Violation] = {}
    for v in f.found:
        first.setdefault(v.path, v)
    return list(first.values())


def admit_templates(
    manifest: FederatedJob,
    level: Level,
    service_accounts: Iterable[str],
    *,
    access: NodeAccess = DEFAULT_ACCESS,
) -> FederatedJob:
    """The manifest as it is stored: every template and workload object as its member will
    take it (``conformance``: schemas, the API server's rules, canonical quantities), then
    every pod set's resources checked against (or derived from) its template; raises
    ``ManifestError`` or ``PolicyViolation`` naming the field. ``access``: the runtime
    classes the tenant may name and the taints it may not tolerate."""
    manifest = conformed(manifest)
    accounts = frozenset(service_accounts)
    spec = manifest.spec
    views = spec.pod_set_views()
    if spec.workload is not None and spec.workload.metadata is not None:
        _workload_metadata(spec.workload.metadata.labels, spec.workload.metadata.annotations)
    # The workload's own fields, every pod template of the job (counted or not: a Ray group
    # of no pods reaches the member too), then what the workload's controller adds.
    workload = spec.workload.wire() if spec.workload is not None else None
    if workload is not None:
        _refuse(workloads.field_violations(workload), _WORKLOAD)
    for at, template in _every_template(spec, workload, views).items():
        metadata = template_metadata(template, at)
        found = template_violations(template, level, accounts, at, access=access)
        if at[: len(_RUNTIME)] == _RUNTIME:  # the member's own, as delegate mode needs
            found = [v for v in found if v.path[-1] != "schedulerName"]
        _refuse([*metadata, *found])
    if workload is not None:
        _refuse(workloads.injection_refusals(workload, level), _WORKLOAD)
    pod_sets: list[PodSetSpec] = []
    for pod_set, at in views:
        stated = (*at[:-1], "resources") if spec.workload is None else None
        pod_sets.append(_reconciled(pod_set, at, stated))
    if spec.workload is not None or pod_sets == list(spec.pod_sets or ()):
        return manifest  # a workload's pod sets are derived again from it (to_job)
    return manifest.model_copy(update={"spec": spec.model_copy(update={"pod_sets": pod_sets})})


def derived_resources(template: Mapping[str, Any], at: Path) -> ResourcesSpec:
    """The resources of one pod from its template at ``at`` (a workload's pod set states
    none); ManifestError naming the field when they do not add up."""
    pod_set = PodSetSpec.model_construct(
        name="derived", count=1, resources=ResourcesSpec(), template=dict(template)
    )
    return _reconciled(pod_set, at, None).resources


_WORKLOAD: Path = ("spec", "workload")
# A workload's member runtime (``workloads.derive``): stored from the member, never the
# tenant's. Its templates run in the tenant's namespace, so the policy holds for them, but a
# runtime patch cannot name a scheduler: in delegate mode the runtime names the member's gang
# scheduler itself, and that is the member's choice to make.
_RUNTIME: Path = (*_WORKLOAD, "runtime")


def _every_template(
    spec: JobSpec, workload: Mapping[str, Any] | None, views: list[tuple[PodSetSpec, Path]]
) -> dict[Path, Mapping[str, Any]]:
    """Path from the manifest root -> pod template, for every template of the job: the
    given pod sets', or all of the workload's (and, whatever the kind's table says, every
    counted one)."""
    found: dict[Path, Mapping[str, Any]] = {}
    if workload is not None:
        found = {(*_WORKLOAD, *path): t for path, t in workloads.templates(workload)}
    for pod_set, at in views:
        found.setdefault(at, pod_set.template)
    return found


def _refuse(violations: list[Violation], prefix: Path = ()) -> None:
    """PolicyViolation for ``violations`` (paths below ``prefix``; the first per path), if
    there are any."""
    first: dict[Path, Violation] = {}
    for v in violations:
        first.setdefault((*prefix, *v.path), Violation((*prefix, *v.path), v.message))
    if first:
        raise PolicyViolation(list(first.values()))


def _workload_metadata(labels: Mapping[str, str], annotations: Mapping[str, str]) -> None:
    at: Path = ("spec", "workload", "metadata")
    found = [
        Violation((*at, kind, key), f"{BROKER_DOMAIN} {kind} are the broker's")
        for kind, keys in (("labels", labels), ("annotations", annotations))
        for key in keys
        if reserved_key(key)
    ]
    if found:
        raise PolicyViolation(found)


# -- the broker's rules ------------------------------------------------------------------


def _broker_secret(f: Fields, obj: object, key: str, path: Path) -> None:
    name = f.string(obj, key, path)
    if name is not None and name.startswith(BROKER_SECRET_PREFIX):
        f.refuse((*path, key), f"Secret {show(name)} is reserved for the broker")


def _broker_rules(pod: Pod, f: Fields, accounts: frozenset[str], access: NodeAccess) -> None:
    spec, at = pod.spec, pod.spec_path
    for key, message in _PLACED_BY_BROKER.items():
        if spec.get(key) is not None:
            f.refuse((*at, key), message)
    _service_accounts(pod, f, accounts)
    for kind in ("labels", "annotations"):
        for key in f.mapping(pod.meta, kind, pod.meta_path) or {}:
            if reserved_key(key):
                f.refuse((*pod.meta_path, kind, key), f"{BROKER_DOMAIN} {kind} are the broker's")
    for volume, path in f.mappings(spec, "volumes", at):
        _volume(volume, path, f)
    for secret, path in f.mappings(spec, "imagePullSecrets", at):
        _broker_secret(f, secret, "name", path)
    for c in pod.containers:
        for env, path in f.mappings(c.body, "env", c.path):
            source = f.mapping(env, "valueFrom", path)
            ref = f.mapping(source, "secretKeyRef", (*path, "valueFrom"))
            _broker_secret(f, ref, "name", (*path, "valueFrom", "secretKeyRef"))
        for env, path in f.mappings(c.body, "envFrom", c.path):
            _broker_secret(f, f.mapping(env, "secretRef", path), "name", (*path, "secretRef"))
    node_rules(pod, f, access)


def _service_accounts(pod: Pod, f: Fields, accounts: frozenset[str]) -> None:
    spec, at = pod.spec, pod.spec_path
    listed = ", ".join(sorted(accounts)) or "none"
    named = False
    for key in ("serviceAccountName", "serviceAccount"):
        account = f.string(spec, key, at)
        if account is not None:
            named = True
            if account not in accounts:
                f.refuse((*at, key), f"service account {show(account)} is not one of the "
                         f"tenant's ({listed})")  # fmt: skip
    automount = f.boolean(spec, "automountServiceAccountToken", at)
    if not named and "default" not in accounts and automount is not False:
        f.refuse(
            (*at, "serviceAccountName"),
            f"name one of the tenant's service accounts ({listed}) "
            "or set automountServiceAccountToken: false",
        )


def _volume(volume: Mapping[str, Any], path: Path, f: Fields) -> None:
    if volume.get("hostPath") is not None:
        f.refuse((*path, "hostPath"), "hostPath volumes reach the node: not allowed")
    _broker_secret(f, f.mapping(volume, "secret", path), "secretName", (*path, "secret"))
    projected = f.mapping(volume, "projected", path)
    for source, at in f.mappings(projected, "sources", (*path, "projected")):
        _broker_secret(f, f.mapping(source, "secret", at), "name", (*at, "secret"))
        token = f.mapping(source, "serviceAccountToken", at)
        if f.string(token, "audience", (*at, "serviceAccountToken")):
            f.refuse(
                (*at, "serviceAccountToken", "audience"),
                "service account tokens for other audiences than the member's API server "
                "are not allowed",
            )


# -- every container's requests ------------------------------------------------------------


def _stated(resources: ResourcesSpec, name: str) -> Fraction | None:
    value = getattr(resources, _FIELDS[name])
    return None if value is None else parse_quantity(value)


def _amount(q: Fraction) -> str:
    return str(q.numerator) if q.denominator == 1 else f"{float(q):g}"


def _quantity(name: str, q: Fraction) -> str | int:
    """A derived amount in the pod set's terms (whole GPUs, millicores, binary units)."""
    if name in (GPU, AMD_GPU, GPU_MILLI):
        return q.numerator
    if name == CPU:
        return _amount(q) if q.denominator == 1 else f"{math.ceil(q * 1000)}m"
    size = math.ceil(q)
    for suffix, unit in (("Gi", 2**30), ("Mi", 2**20), ("Ki", 2**10)):
        if size % unit == 0:
            return f"{size // unit}{suffix}"
    return str(size)


def _reconciled(pod_set: PodSetSpec, at: Path, stated_at: Path | None) -> PodSetSpec:
    """The pod set with resources the template (at ``at``) agrees with, derived where it
    gave none; ``stated_at`` is where its resources are written (None: nowhere, all are
    derived)."""
    spec = pod_set.template.get("spec")
    if not isinstance(spec, Mapping):
        return pod_set
    req, found = pod_requests(spec, (*at, "spec"))
    if found:
        first, path = found[0], field_path(found[0].path)
        more = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
        raise ManifestError(f"{path}: {first.message}{more}", path)
    derived: dict[str, str | int] = {}
    for name, amount in sorted(req.effective.items()):
        stated = _stated(pod_set.resources, name)
        if stated is None:
            derived[name] = _quantity(name, amount)
        elif amount > stated:
            path = field_path(req.blame(name, stated))
            raise ManifestError(
                f"{path}: makes the pod's {name} request {_amount(amount)}, but the pod set's "
                f"resources say {_amount(stated)} (every container counts)",
                path,
            )
        elif amount < stated:
            path = field_path((*(stated_at or (*at, "resources")), name))
            raise ManifestError(
                f"{path}: is {_amount(stated)}, but the template's containers request "
                f"{_amount(amount)} in all",
                path,
            )
    if not derived:
        return pod_set
    values = {**pod_set.resources.model_dump(by_alias=True, exclude_none=True), **derived}
    try:
        resources = ResourcesSpec.model_validate(values)
    except ValidationError as exc:
        path, message = first_error(exc)
        if stated_at is None:
            where = field_path((*at, "spec"))
            raise ManifestError(
                f"{where}: the pod's {path} {message} (counted from its containers)", where
            ) from None
        where = field_path((*stated_at, path))
        raise ManifestError(f"{where}: {message} (derived from the template)", where) from None
    return pod_set.model_copy(update={"resources": resources})


__all__ = ["PolicyViolation", "admit_templates", "derived_resources", "template_violations"]
