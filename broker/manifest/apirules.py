"""The rules a member's API server applies to a pod template and a batch Job beyond their
schema (pure): what decides whether the create the launcher will send can succeed.

Read from kubernetes/kubernetes ``pkg/apis/core/validation/validation.go``
(``ValidatePodTemplateSpec``, ``validateContainers``, ``validateEnv``,
``ValidateResourceRequirements``, ``validateTolerations``, ``validateVolumes``), its
RuntimeClass admission (``plugin/pkg/admission/runtimeclass``: a pod's ``overhead`` comes
from its RuntimeClass, one set otherwise is refused), and
``pkg/apis/batch/validation/validation.go`` (``validateJobSpec``) for the Kubernetes version
the schemas are generated for (``broker.manifest.schemas``), and the label and name rules
of apimachinery's ``util/validation``. A template reaching these checks has passed its
schema: types are right, so a value of another type is read as absent. Each problem is a
``Violation`` at its full path from the manifest root; none repeats more than 40 characters
of what was sent.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from fractions import Fraction
from typing import Any

from broker.manifest.errors import show
from broker.manifest.podrequests import Path, Violation
from broker.quantity import QuantityError, parse_quantity

DNS1123_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
DNS1035_LABEL = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
DNS1123_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_NAME_PART = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")
_LABEL_VALUE = re.compile(r"([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?")
_IANA_SVC_NAME = re.compile(r"[a-z0-9]([a-z0-9-]*[a-z0-9])?")
MAX_ANNOTATIONS_BYTES = 256 * 1024
MAX_INDEXED_COMPLETIONS = 100_000
CONTAINER_KINDS = ("initContainers", "containers", "ephemeralContainers")
_STANDARD_RESOURCES = frozenset({"cpu", "memory", "ephemeral-storage"})
_RESTART_POLICIES = ("Always", "OnFailure", "Never")
_JOB_RESTART_POLICIES = ("OnFailure", "Never")
_DNS_POLICIES = ("ClusterFirstWithHostNet", "ClusterFirst", "Default", "None")
_PULL_POLICIES = ("Always", "Never", "IfNotPresent")
_PROTOCOLS = ("TCP", "UDP", "SCTP")
_TAINT_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")
_HANDLERS = ("exec", "httpGet", "tcpSocket", "grpc", "sleep")
_ENV_SOURCES = ("fieldRef", "resourceFieldRef", "configMapKeyRef", "secretKeyRef", "fileKeyRef")


def _map(obj: object, key: str) -> Mapping[str, Any]:
    value = obj.get(key) if isinstance(obj, Mapping) else None
    return value if isinstance(value, Mapping) else {}


def _list(obj: object, key: str) -> list[Any]:
    value = obj.get(key) if isinstance(obj, Mapping) else None
    return value if isinstance(value, list) else []


def _text(obj: object, key: str) -> str | None:
    value = obj.get(key) if isinstance(obj, Mapping) else None
    return value if isinstance(value, str) else None


def _int(obj: object, key: str) -> int | None:
    value = obj.get(key) if isinstance(obj, Mapping) else None
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _items(obj: object, key: str, at: Path) -> Iterator[tuple[Mapping[str, Any], Path]]:
    for i, item in enumerate(_list(obj, key)):
        if isinstance(item, Mapping):
            yield item, (*at, key, i)


# -- names ---------------------------------------------------------------------------------


def name_problem(value: str, pattern: re.Pattern[str], most: int, what: str) -> str | None:
    """Why ``value`` is no ``what`` (None when it is one)."""
    if len(value) > most:
        return f"{show(value)} is longer than {most} characters"
    if not pattern.fullmatch(value):
        return f"{show(value)} is not {what}"
    return None


def qualified_name_problem(key: str) -> str | None:
    """Why ``key`` is no qualified name (``[prefix/]name``: a label or annotation key)."""
    prefix, slash, name = key.rpartition("/")
    if slash and (
        not prefix or name_problem(prefix, DNS1123_SUBDOMAIN, 253, "a DNS subdomain") is not None
    ):
        return f"{show(key)}: its prefix must be a DNS subdomain (lowercase, at most 253)"
    if len(name) > 63 or not _NAME_PART.fullmatch(name):
        return (
            f"{show(key)} is not a qualified name (at most 63 letters, digits, '-', '_' or "
            "'.', starting and ending with a letter or digit, after an optional prefix/)"
        )
    return None


def label_problems(labels: Mapping[str, Any], at: Path) -> list[Violation]:
    found = []
    for key, value in labels.items():
        problem = qualified_name_problem(key)
        if problem is not None:
            found.append(Violation((*at, key), problem))
        elif isinstance(value, str) and (len(value) > 63 or not _LABEL_VALUE.fullmatch(value)):
            found.append(Violation((*at, key), f"{show(value)} is not a label value (at most "
                                   "63 letters, digits, '-', '_' or '.')"))  # fmt: skip
    return found


def annotation_problems(annotations: Mapping[str, Any], at: Path) -> list[Violation]:
    found = []
    size = 0
    for key, value in annotations.items():
        problem = qualified_name_problem(key)
        if problem is not None:
            found.append(Violation((*at, key), problem))
        size += len(key.encode()) + (len(value.encode()) if isinstance(value, str) else 0)
    if size > MAX_ANNOTATIONS_BYTES:
        found.append(Violation(at, f"may not be more than {MAX_ANNOTATIONS_BYTES} bytes in all"))
    return found


# -- pods ----------------------------------------------------------------------------------


def pod_template_problems(
    template: Mapping[str, Any], base: Path, *, containers_required: bool
) -> list[Violation]:
    """What the API server refuses in a pod template at ``base`` (``containers_required``:
    False for a podSets template, whose pod gets the launcher's container when it has
    none)."""
    found: list[Violation] = []
    meta, meta_at = _map(template, "metadata"), (*base, "metadata")
    found += label_problems(_map(meta, "labels"), (*meta_at, "labels"))
    found += annotation_problems(_map(meta, "annotations"), (*meta_at, "annotations"))
    spec, at = _map(template, "spec"), (*base, "spec")
    if containers_required and not _list(spec, "containers"):
        found.append(Violation((*at, "containers"), "required: at least one container"))
    found += _pod_fields(spec, at)
    volumes = _volumes(spec, at, found)
    names: set[str] = set()
    for kind in CONTAINER_KINDS:
        for container, where in _items(spec, kind, at):
            found += _container(container, where, kind, names, volumes)
    found += _tolerations(spec, at)
    return found


def _enum(obj: Mapping[str, Any], key: str, at: Path, allowed: tuple[str, ...]) -> list[Violation]:
    value = _text(obj, key)
    if value is None or value in allowed:
        return []
    return [Violation((*at, key), f"{show(value)} is not one of {', '.join(allowed)}")]


def _pod_fields(spec: Mapping[str, Any], at: Path) -> list[Violation]:
    found = _enum(spec, "restartPolicy", at, _RESTART_POLICIES)
    found += _enum(spec, "dnsPolicy", at, _DNS_POLICIES)
    if _text(spec, "dnsPolicy") == "None" and not _map(spec, "dnsConfig"):
        found.append(Violation((*at, "dnsConfig"), "required when dnsPolicy is None"))
    for key in ("hostname", "subdomain"):
        value = _text(spec, key)
        problem = value and name_problem(value, DNS1123_LABEL, 63, "a DNS-1123 label")
        if problem:
            found.append(Violation((*at, key), problem))
    found += label_problems(_map(spec, "nodeSelector"), (*at, "nodeSelector"))
    deadline = _int(spec, "activeDeadlineSeconds")
    if deadline is not None and deadline < 1:
        found.append(Violation((*at, "activeDeadlineSeconds"), "must be >= 1"))
    if spec.get("overhead"):
        found.append(Violation((*at, "overhead"), "set by the member's RuntimeClass admission "
                               "from the pod's RuntimeClass: a pod that sets it itself is "
                               "refused"))  # fmt: skip
    grace = _int(spec, "terminationGracePeriodSeconds")
    if grace is not None and grace < 0:
        found.append(Violation((*at, "terminationGracePeriodSeconds"), "must be >= 0"))
    return found


def _unique_label(
    obj: Mapping[str, Any], at: Path, names: set[str], what: str, found: list[Violation]
) -> None:
    """``obj.name``: required, a DNS-1123 label, and not one of ``names`` (it joins them)."""
    name = _text(obj, "name")
    problem = name_problem(name, DNS1123_LABEL, 63, "a DNS-1123 label") if name else "required"
    if problem is not None:
        found.append(Violation((*at, "name"), problem))
    elif name in names:
        found.append(Violation((*at, "name"), f"{what} name {show(name)} is used twice"))
    if name:
        names.add(name)


def _volumes(spec: Mapping[str, Any], at: Path, found: list[Violation]) -> set[str]:
    names: set[str] = set()
    for volume, where in _items(spec, "volumes", at):
        _unique_label(volume, where, names, "volume", found)
        sources = [k for k in volume if k != "name" and volume[k] is not None]
        if len(sources) > 1:
            found.append(Violation(where, "may not specify more than one volume type "
                                   f"({', '.join(sorted(sources))})"))  # fmt: skip
    return names


def _container(
    c: Mapping[str, Any], at: Path, kind: str, names: set[str], volumes: set[str]
) -> list[Violation]:
    found: list[Violation] = []
    _unique_label(c, at, names, "container", found)
    if kind != "ephemeralContainers" and not _text(c, "image"):
        found.append(Violation((*at, "image"), "required"))
    found += _enum(c, "imagePullPolicy", at, _PULL_POLICIES)
    policy = _text(c, "restartPolicy")
    if policy is not None and (kind != "initContainers" or policy != "Always"):
        found.append(Violation((*at, "restartPolicy"), "only an init container may set it, "
                               "and only to Always (a sidecar)"))  # fmt: skip
    found += _ports(c, at)
    found += _env(c, at)
    found += _resources(_map(c, "resources"), (*at, "resources"))
    found += _mounts(c, at, volumes)
    found += _handlers(c, at)
    return found


def _ports(c: Mapping[str, Any], at: Path) -> list[Violation]:
    found: list[Violation] = []
    named: set[str] = set()
    for port, where in _items(c, "ports", at):
        number = _int(port, "containerPort")
        if number is None or not 1 <= number <= 65535:
            found.append(Violation((*where, "containerPort"), "required: 1 to 65535"))
        host = _int(port, "hostPort")
        if host is not None and not 0 <= host <= 65535:
            found.append(Violation((*where, "hostPort"), "must be 0 to 65535"))
        found += _enum(port, "protocol", where, _PROTOCOLS)
        name = _text(port, "name")
        if name is None:
            continue
        if len(name) > 15 or "--" in name or not _IANA_SVC_NAME.fullmatch(name) or name.isdigit():
            found.append(Violation((*where, "name"), f"{show(name)} is not a port name "
                                   "(at most 15 of a-z, 0-9 and '-', with a letter)"))  # fmt: skip
        elif name in named:
            found.append(Violation((*where, "name"), f"port name {show(name)} is used twice"))
        named.add(name)
    return found


def _env(c: Mapping[str, Any], at: Path) -> list[Violation]:
    found: list[Violation] = []
    for env, where in _items(c, "env", at):
        name = _text(env, "name")
        if not name:
            found.append(Violation((*where, "name"), "required"))
        elif "=" in name or not all(" " <= ch <= "~" for ch in name):
            found.append(Violation((*where, "name"), f"{show(name)} is not an environment "
                                   "variable name (printable ASCII without '=')"))  # fmt: skip
        source = _map(env, "valueFrom")
        if source and env.get("value"):
            found.append(Violation((*where, "valueFrom"), "may not be given with value"))
        given = [k for k in _ENV_SOURCES if source.get(k) is not None]
        if "valueFrom" in env and len(given) != 1:
            found.append(Violation((*where, "valueFrom"), "must name exactly one source "
                                   f"({', '.join(_ENV_SOURCES)})"))  # fmt: skip
    return found


def _amounts(raw: Mapping[str, Any], at: Path, found: list[Violation]) -> dict[str, Fraction]:
    out: dict[str, Fraction] = {}
    for name, value in raw.items():
        where = (*at, name)
        slash = "/" in name
        standard = name in _STANDARD_RESOURCES or name.startswith("hugepages-")
        if not standard and not slash:
            found.append(Violation(where, f"{show(name)} is not a standard resource nor a "
                                   "domain-qualified one (example.com/name)"))  # fmt: skip
            continue
        if slash and qualified_name_problem(name) is not None:
            found.append(Violation(where, f"{show(name)} is not a qualified resource name"))
            continue
        try:
            amount = parse_quantity(value)
        except QuantityError:
            continue  # the quantity's own check names it
        if amount < 0:
            found.append(Violation(where, "must be >= 0"))
        out[name] = amount
    return out


def _extended(name: str) -> bool:
    """Neither standard nor in the kubernetes.io domain: a device, never overcommitted."""
    prefix = name.rpartition("/")[0]
    native = not prefix or prefix == "kubernetes.io" or prefix.endswith(".kubernetes.io")
    return not native and not name.startswith("hugepages-")


def _resources(res: Mapping[str, Any], at: Path) -> list[Violation]:
    found: list[Violation] = []
    limits = _amounts(_map(res, "limits"), (*at, "limits"), found)
    requests = _amounts(_map(res, "requests"), (*at, "requests"), found)
    for name, amount in requests.items():
        where = (*at, "requests", name)
        limit = limits.get(name)
        if _extended(name):
            if amount.denominator != 1:
                found.append(Violation(where, "must be a whole number (a device)"))
            if limit is None:
                found.append(Violation(where, f"needs limits.{name} equal to it (a device is "
                                       "never overcommitted)"))  # fmt: skip
            elif limit != amount:
                found.append(Violation(where, f"must equal limits.{name} (a device is never "
                                       "overcommitted)"))  # fmt: skip
        elif limit is not None and amount > limit:
            found.append(Violation(where, f"must be <= limits.{name}"))
    for name, amount in limits.items():
        if _extended(name) and amount.denominator != 1:
            found.append(Violation((*at, "limits", name), "must be a whole number (a device)"))
    return found


def _mounts(c: Mapping[str, Any], at: Path, volumes: set[str]) -> list[Violation]:
    found: list[Violation] = []
    paths: set[str] = set()
    for mount, where in _items(c, "volumeMounts", at):
        name = _text(mount, "name")
        if name not in volumes:
            found.append(Violation((*where, "name"), f"no volume named {show(name or '')}"))
        path = _text(mount, "mountPath")
        if not path:
            found.append(Violation((*where, "mountPath"), "required"))
        elif path in paths:
            found.append(Violation((*where, "mountPath"), f"{show(path)} is mounted twice"))
        else:
            paths.add(path)
        sub = _text(mount, "subPath") or ""
        if sub.startswith("/") or ".." in sub.split("/"):
            found.append(Violation((*where, "subPath"), "must be a relative path without '..'"))
    return found


def _handlers(c: Mapping[str, Any], at: Path) -> list[Violation]:
    found: list[Violation] = []
    probes = [(k, _map(c, k)) for k in ("livenessProbe", "readinessProbe", "startupProbe")]
    hooks = _map(c, "lifecycle")
    probes += [(f"lifecycle.{k}", _map(hooks, k)) for k in ("postStart", "preStop")]
    for key, handler in probes:
        if not handler:
            continue
        given = [h for h in _HANDLERS if handler.get(h) is not None]
        if len(given) != 1:
            where = (*at, *key.split("."))
            found.append(
                Violation(where, f"must name exactly one handler ({', '.join(_HANDLERS)})")
            )
    return found


def _tolerations(spec: Mapping[str, Any], at: Path) -> list[Violation]:
    found: list[Violation] = []
    for t, where in _items(spec, "tolerations", at):
        key, operator = _text(t, "key") or "", _text(t, "operator") or "Equal"
        if operator not in ("Equal", "Exists"):
            found.append(
                Violation((*where, "operator"), f"{show(operator)} is not Equal or Exists")
            )
        if key and qualified_name_problem(key) is not None:
            found.append(Violation((*where, "key"), qualified_name_problem(key) or ""))
        if not key and operator != "Exists":
            found.append(Violation((*where, "operator"), "must be Exists when key is empty"))
        if operator == "Exists" and _text(t, "value"):
            found.append(Violation((*where, "value"), "must be empty when operator is Exists"))
        found += _enum(t, "effect", where, _TAINT_EFFECTS)
        if t.get("tolerationSeconds") is not None and _text(t, "effect") != "NoExecute":
            found.append(Violation((*where, "effect"), "must be NoExecute when "
                                   "tolerationSeconds is set"))  # fmt: skip
    return found


# -- batch Jobs ----------------------------------------------------------------------------


def job_spec_problems(
    spec: Mapping[str, Any], at: Path, *, defaulted: bool = False
) -> list[Violation]:
    """What the API server refuses in a batch/v1 JobSpec at ``at`` beyond its pod template
    (``defaulted``: a controller writes OnFailure into an empty restartPolicy first, as
    JobSet's webhook does)."""
    found: list[Violation] = []
    pod = _map(_map(spec, "template"), "spec")
    policy_at = (*at, "template", "spec", "restartPolicy")
    policy = _text(pod, "restartPolicy")
    if policy is None and not defaulted:
        found.append(Violation(policy_at, "required: OnFailure or Never (a Job's pods may not "
                               "restart Always, the default)"))  # fmt: skip
    elif policy is not None and policy not in _JOB_RESTART_POLICIES:
        found.append(Violation(policy_at, f"{show(policy)} is not OnFailure or Never (a Job's "
                               "pods may not restart Always)"))  # fmt: skip
    for key, least in (("parallelism", 0), ("completions", 0), ("backoffLimit", 0),
                       ("ttlSecondsAfterFinished", 0), ("activeDeadlineSeconds", 1)):  # fmt: skip
        value = _int(spec, key)
        if value is not None and value < least:
            found.append(Violation((*at, key), f"must be >= {least}"))
    found += _enum(spec, "completionMode", at, ("NonIndexed", "Indexed"))
    found += _indexed(spec, at, policy)
    return found


def _indexed(spec: Mapping[str, Any], at: Path, policy: str | None) -> list[Violation]:
    found: list[Violation] = []
    indexed = _text(spec, "completionMode") == "Indexed"
    completions = _int(spec, "completions")
    if indexed and completions is None:
        found.append(Violation((*at, "completions"), "required when completionMode is Indexed"))
    for key in ("completions", "parallelism"):
        value = _int(spec, key)
        if indexed and value is not None and value > MAX_INDEXED_COMPLETIONS:
            found.append(Violation((*at, key), f"must be <= {MAX_INDEXED_COMPLETIONS} when "
                                   "completionMode is Indexed"))  # fmt: skip
    for key in ("backoffLimitPerIndex", "successPolicy"):
        if spec.get(key) is not None and not indexed:
            found.append(Violation((*at, key), "requires completionMode Indexed"))
    failed = _int(spec, "maxFailedIndexes")
    if failed is not None:
        if spec.get("backoffLimitPerIndex") is None:
            found.append(Violation((*at, "maxFailedIndexes"), "requires backoffLimitPerIndex"))
        elif completions is not None and failed > completions:
            found.append(Violation((*at, "maxFailedIndexes"), "must be <= completions"))
    if spec.get("podFailurePolicy") is not None and policy not in (None, "Never"):
        found.append(Violation((*at, "podFailurePolicy"), "requires the template's "
                               "restartPolicy to be Never"))  # fmt: skip
    replacement = _text(spec, "podReplacementPolicy")
    found += _enum(spec, "podReplacementPolicy", at, ("TerminatingOrFailed", "Failed"))
    if spec.get("podFailurePolicy") is not None and replacement not in (None, "Failed"):
        found.append(Violation((*at, "podReplacementPolicy"), "must be Failed with a "
                               "podFailurePolicy"))  # fmt: skip
    return found


__all__ = ["DNS1035_LABEL", "DNS1123_LABEL", "annotation_problems", "job_spec_problems",
           "label_problems", "name_problem", "pod_template_problems",
           "qualified_name_problem"]  # fmt: skip
