"""A pod template's effective request, counted as Kubernetes counts it, and every
``resources`` field of the template checked on the way (pure, no I/O).

Every container's requests count (DESIGN.md invariant 8): the effective request of a pod is
the larger of (a) the sum of its regular containers plus its sidecars (init containers with
``restartPolicy: Always``, KEP-753) and (b) each init container plus the sidecars started
before it, and then ``overhead`` is added. A container's request defaults to its limit, as
the API server defaults it. GPU-like resources are whole numbers, requests equal limits when
both are given, and a GPU request needs its limit (Kubernetes refuses anything else for
extended resources).

The pod's own ``spec.resources`` (KEP-2837, PodLevelResources: beta and on by default since
Kubernetes 1.34) counts as the scheduler counts it (``PodRequests`` in
k8s.io/component-helpers/resource): for cpu and memory a pod-level request replaces what the
containers add up to; a pod-level limit with no request stands for it where no container
requests that resource (the API server's defaulting, ``defaultPodRequests``); the overhead
is added after. Only cpu, memory and ``hugepages-*`` may be given for the whole pod (GPUs and
other devices are asked per container), a pod-level request may not be below what the
containers request nor above its limit, and no container's limit above the pod's: the API
server refuses the rest (``validatePodResourceConsistency``). A member without the feature
drops the field and counts the containers alone, never more than this count.

Only the resources the broker counts, plus the node-local ones it leaves to the member
(``ephemeral-storage``, ``hugepages-*``), may be asked for; any other extended resource (a
MIG slice, an RDMA device, a DRA claim) would reach hardware the placement never counted.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from broker.manifest.errors import show
from broker.quantity import parse_quantity

Path = tuple[str | int, ...]

GPU = "nvidia.com/gpu"
AMD_GPU = "amd.com/gpu"
GPU_MILLI = "fedbroker.io/gpu-milli"
CPU = "cpu"
MEMORY = "memory"
# The resources the placement counts, in the pod set's ``resources`` names.
COUNTED = (GPU, AMD_GPU, GPU_MILLI, CPU, MEMORY)
_WHOLE = frozenset({GPU, AMD_GPU, GPU_MILLI})  # extended resources: integers, no overcommit
_NODE_LOCAL = ("ephemeral-storage",)
_POD_LEVEL = (CPU, MEMORY)  # pod-level resources the placement counts (hugepages: the node's)
_PER_CONTAINER = "is asked per container: only cpu, memory and hugepages-* may be given for the pod"


@dataclass(frozen=True, slots=True)
class Violation:
    """One thing wrong with a template, at its full field path from the manifest root."""

    path: Path
    message: str


@dataclass(frozen=True, slots=True)
class _Term:
    """One container's part of the effective request: its amount and where it was given."""

    amount: Fraction
    path: Path


@dataclass(slots=True)
class Requests:
    """A template's effective request per counted resource it declares, and how it got there
    (kept to name the field that makes a total wrong)."""

    effective: dict[str, Fraction] = field(default_factory=dict)
    running: dict[str, list[_Term]] = field(default_factory=dict)  # containers + sidecars
    init_peaks: dict[str, list[_Term]] = field(default_factory=dict)  # init + earlier sidecars
    overhead: dict[str, _Term] = field(default_factory=dict)
    pod_level: dict[str, _Term] = field(default_factory=dict)  # spec.resources, if it counts

    def blame(self, resource: str, limit: Fraction) -> Path:
        """The field that first takes ``resource`` above ``limit``: the pod-level request
        where it counts, else an init container whose peak does, else the container at which
        the running sum does; else the overhead."""
        level = self.pod_level.get(resource)
        if level is not None:
            over = self.overhead.get(resource)
            return level.path if level.amount > limit or over is None else over.path
        running = self.running.get(resource, [])
        total = sum((t.amount for t in running), Fraction(0))
        peaks = [t for t in self.init_peaks.get(resource, []) if t.amount > max(total, limit)]
        if peaks:
            return max(peaks, key=lambda t: t.amount).path
        so_far = Fraction(0)
        for term in running:
            so_far += term.amount
            if so_far > limit:
                return term.path
        over = self.overhead.get(resource)
        return over.path if over is not None else (running[-1].path if running else ())


def _allowed(name: str) -> bool:
    return name in COUNTED or name in _NODE_LOCAL or name.startswith("hugepages-")


def _amounts(
    raw: object, path: Path, found: list[Violation]
) -> dict[str, tuple[Fraction, Path]] | None:
    """A requests/limits/overhead map as ``name -> (amount, path)``; problems to ``found``."""
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        found.append(Violation(path, "must be a mapping"))
        return None
    out: dict[str, tuple[Fraction, Path]] = {}
    for name, value in raw.items():
        at = (*path, name)
        if not _allowed(name):
            found.append(Violation(at, f"{show(name)} is not a resource the broker counts"))
            continue
        try:
            amount = parse_quantity(value)
        except ValueError as exc:
            found.append(Violation(at, str(exc)))
            continue
        if amount < 0:
            found.append(Violation(at, "must not be negative"))
        elif name in _WHOLE and amount.denominator != 1:
            found.append(Violation(at, "must be a whole number"))
        else:
            out[name] = (amount, at)
    return out


def _container_requests(
    container: Mapping[str, Any], path: Path, found: list[Violation]
) -> dict[str, tuple[Fraction, Path]]:
    """A container's requests, defaulted from its limits, with the path each came from."""
    raw = container.get("resources")
    at = (*path, "resources")
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        found.append(Violation(at, "must be a mapping"))
        return {}
    if raw.get("claims"):
        found.append(Violation((*at, "claims"), "resource claims (DRA) are not counted"))
    limits = _amounts(raw.get("limits"), (*at, "limits"), found) or {}
    requests = _amounts(raw.get("requests"), (*at, "requests"), found) or {}
    for name, (amount, where) in requests.items():
        limit = limits.get(name)
        if limit is None:
            if name in (GPU, AMD_GPU):  # the API server refuses it: devices need limits
                found.append(Violation(where, f"needs limits.{name} equal to it"))
            continue
        if name in _WHOLE and amount != limit[0]:
            found.append(Violation(where, f"must equal limits.{name} (it is not overcommitted)"))
        elif amount > limit[0]:
            found.append(Violation(where, f"must not exceed limits.{name}"))
    return {**limits, **requests}


def _containers(
    spec: Mapping[str, Any], kind: str, base: Path, found: list[Violation]
) -> Iterator[tuple[Mapping[str, Any], Path]]:
    items = spec.get(kind)
    if items is None:
        return
    if not isinstance(items, list):
        found.append(Violation((*base, kind), "must be a list"))
        return
    for i, item in enumerate(items):
        if isinstance(item, Mapping):
            yield item, (*base, kind, i)
        else:
            found.append(Violation((*base, kind, i), "must be a mapping"))


def pod_requests(spec: Mapping[str, Any], base: Path) -> tuple[Requests, list[Violation]]:
    """The effective request of a pod spec (at ``base``, e.g. ``...template.spec``) per
    counted resource it declares anywhere, and the problems found in its resources."""
    found: list[Violation] = []
    req = Requests()
    sidecars: dict[str, Fraction] = {}
    for container, path in _containers(spec, "containers", base, found):
        for name, (amount, at) in _container_requests(container, path, found).items():
            req.running.setdefault(name, []).append(_Term(amount, at))
    for container, path in _containers(spec, "initContainers", base, found):
        sidecar = container.get("restartPolicy") == "Always"
        for name, (amount, at) in _container_requests(container, path, found).items():
            before = sidecars.get(name, Fraction(0))
            if sidecar:  # runs alongside everything after it
                sidecars[name] = before + amount
                req.running.setdefault(name, []).append(_Term(amount, at))
            req.init_peaks.setdefault(name, []).append(_Term(before + amount, at))
    overhead = _amounts(spec.get("overhead"), (*base, "overhead"), found) or {}
    for name, (amount, at) in overhead.items():
        req.overhead[name] = _Term(amount, at)
    aggregate: dict[str, Fraction] = {}
    for name in {*req.running, *req.init_peaks}:
        running = sum((t.amount for t in req.running.get(name, [])), Fraction(0))
        peak = max((t.amount for t in req.init_peaks.get(name, [])), default=Fraction(0))
        aggregate[name] = max(running, peak)
    _pod_level(spec, base, aggregate, req, found)
    for name in {*aggregate, *req.overhead, *req.pod_level}:
        if name not in COUNTED:
            continue
        level = req.pod_level.get(name)
        amount = level.amount if level is not None else aggregate.get(name, Fraction(0))
        over = req.overhead[name].amount if name in req.overhead else Fraction(0)
        req.effective[name] = amount + over
    return req, found


def _pod_level(
    spec: Mapping[str, Any],
    base: Path,
    aggregate: Mapping[str, Fraction],
    req: Requests,
    found: list[Violation],
) -> None:
    """The pod's own ``spec.resources`` checked as the API server checks it, and the
    pod-level request of each counted resource where it replaces the containers' (to
    ``req.pod_level``)."""
    raw, at = spec.get("resources"), (*base, "resources")
    if raw is None:
        return
    if not isinstance(raw, Mapping):
        found.append(Violation(at, "must be a mapping"))
        return
    if raw.get("claims"):
        found.append(Violation((*at, "claims"), "resource claims (DRA) are not counted"))
    requests, limits = (
        _amounts(_pod_level_names(raw.get(part), (*at, part), found), (*at, part), found) or {}
        for part in ("requests", "limits")
    )
    for name in _POD_LEVEL:
        request, limit, containers = requests.get(name), limits.get(name), aggregate.get(name)
        asked = _show(containers or Fraction(0))
        below = f"must be at least what the containers request ({asked})"
        if request is not None:
            if containers is not None and containers > request[0]:
                found.append(Violation(request[1], below))
            elif limit is not None and request[0] > limit[0]:
                found.append(Violation(request[1], f"must not exceed limits.{name}"))
            req.pod_level[name] = _Term(*request)
        elif limit is not None:
            if containers is None:
                req.pod_level[name] = _Term(*limit)  # the request defaults to the limit
            elif containers > limit[0]:
                found.append(Violation(limit[1], below))
    if limits:
        _within_pod_limits(spec, base, limits, found)


def _pod_level_names(raw: object, path: Path, found: list[Violation]) -> object:
    """``raw`` without (and each refused) the names Kubernetes takes only per container."""
    if not isinstance(raw, Mapping):
        return raw
    kept = {}
    for name, value in raw.items():
        if name in _POD_LEVEL or (isinstance(name, str) and name.startswith("hugepages-")):
            kept[name] = value
        else:
            found.append(Violation((*path, name), f"{show(name)} {_PER_CONTAINER}"))
    return kept


def _within_pod_limits(
    spec: Mapping[str, Any],
    base: Path,
    limits: Mapping[str, tuple[Fraction, Path]],
    found: list[Violation],
) -> None:
    """No container's limit above the pod's (the API server checks regular containers)."""
    for container, path in _containers(spec, "containers", base, []):
        res = container.get("resources")
        own = res.get("limits") if isinstance(res, Mapping) else None
        at = (*path, "resources", "limits")
        for name, (amount, where) in (_amounts(own, at, []) or {}).items():
            if name in limits and amount > limits[name][0]:
                found.append(Violation(where, f"must not exceed the pod's limits.{name}"))


def _show(q: Fraction) -> str:
    return str(q.numerator) if q.denominator == 1 else f"{float(q):g}"


__all__ = ["COUNTED", "CPU", "GPU", "GPU_MILLI", "MEMORY", "Path", "Requests", "Violation",
           "pod_requests"]  # fmt: skip
