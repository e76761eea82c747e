"""The agent's own policy: a launch spec from the wire checked again, in the member, before
anything of it is created (pure, no I/O).

The broker admitted the job already; the agent does not trust the wire. Every tenant's Pod
Security level, service accounts and runtime classes come from the agent's launch config
(``broker.agent.config``), never from the command: the level enforced is the stricter of
the spec's ``podSecurity`` and the agent's for its tenant (``enforced_level``: the
templates are checked at it, and the tenant's namespace is labelled with it, so a broker
configured laxer than the member's owner gets the member's level, not a blanket refusal),
by the same pure checks as admission (``broker.manifest``): ``template_violations`` and
the template metadata rule on every pod template, and for a ``spec.workload`` job its
kind's allowlist, the broker's own metadata keys, every template of the object and what
its controller adds. The templates of an admitted spec are conformed already, so the
checks accept exactly what admission accepted (tests/agent/test_policy.py runs admitted
specs of every kind through them).

Every refusal is one line naming the field, from the manifest's root where admission has
one (``spec.workload...``), else from the spec (``podTemplates.<pod set>...``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, get_args

from broker.config.members import RESERVED_NAMESPACES, TENANT_PLACEHOLDER
from broker.manifest import DEFAULT_RESERVED_TAINTS, FieldError, NodeAccess, field_path
from broker.manifest.noderules import DEFAULT_ACCESS
from broker.manifest.podpolicy import template_violations
from broker.manifest.podrequests import Path, Violation
from broker.manifest.podsecurity import Level
from broker.manifest.workloads import (
    INTEGRATIONS,
    field_violations,
    injection_refusals,
    pod_set_paths,
    templates,
)
from broker.manifest.workloads.allowlist import BROKER_DOMAIN, reserved_key, template_metadata
from broker.ports import LaunchSpec

LEVELS: tuple[Level, ...] = get_args(Level)  # laxest first
# A kind whose pods a member runtime shapes (its runtime is resolved by the broker from the
# members it reaches itself): an agent-fed cluster never gets one.
UNLAUNCHED_KINDS = frozenset(i.kind for i in INTEGRATIONS if i.runtime_pod_sets is not None)
LAUNCHED_KINDS: tuple[str, ...] = (
    "Pod",
    *(i.kind for i in INTEGRATIONS if i.kind not in UNLAUNCHED_KINDS),
)
_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
_WORKLOAD: Path = ("spec", "workload")


@dataclass(frozen=True, slots=True)
class TenantPolicy:
    """What one tenant's pods may be in this member: its Pod Security level, the service
    accounts they may name and what they may reach of a node."""

    level: Level = "baseline"
    service_accounts: frozenset[str] = frozenset({"default"})
    access: NodeAccess = DEFAULT_ACCESS


@dataclass(frozen=True, slots=True)
class AgentPolicy:
    """The tenants of the launch config (``tenants`` None: no list, every tenant gets
    ``default``), the namespace pattern, and the taints no tenant may tolerate."""

    namespace_pattern: str = "fedbroker-{tenant}"
    tenants: Mapping[str, TenantPolicy] | None = None
    reserved_taints: tuple[str, ...] = DEFAULT_RESERVED_TAINTS
    default: TenantPolicy = field(init=False)

    def __post_init__(self) -> None:
        access = NodeAccess.of((), self.reserved_taints)
        object.__setattr__(self, "default", TenantPolicy(access=access))

    def namespace_problem(self, name: str) -> str | None:
        """Why tenant ``name``'s namespace would be unusable here (naming ``spec.tenant``),
        or None."""
        problem = namespace_problem(self.namespace_pattern, name)
        return None if problem is None else f"spec.tenant: {problem}"

    def tenant(self, name: str) -> TenantPolicy | str:
        """The tenant's policy, or why it has none here."""
        problem = self.namespace_problem(name)
        if problem is not None:
            return problem
        if self.tenants is None:
            return self.default
        found = self.tenants.get(name)
        if found is None:
            return f"spec.tenant: {name!r} is not a tenant of this agent's launch config"
        return found


def namespace_problem(pattern: str, tenant: str) -> str | None:
    """Why ``tenant``'s namespace by ``pattern`` would be unusable, or None."""
    if not _LABEL.fullmatch(tenant):
        return f"{tenant[:64]!r} is not a DNS label"
    namespace = pattern.replace(TENANT_PLACEHOLDER, tenant)
    if len(namespace) > 63 or namespace in RESERVED_NAMESPACES:
        return f"tenant {tenant!r} gives namespace {namespace!r}, which is not usable"
    return None


def _lines(violations: Iterable[Violation], prefix: Path = ()) -> list[str]:
    """One line per field, the first problem found there."""
    first: dict[Path, str] = {}
    for v in violations:
        first.setdefault((*prefix, *v.path), v.message)
    return [f"{field_path(path)}: {message}" for path, message in first.items()]


def _template(
    template: Mapping[str, Any], at: Path, level: Level, tenant: TenantPolicy
) -> list[Violation]:
    found = template_metadata(template, at)
    found += template_violations(template, level, tenant.service_accounts, at, access=tenant.access)
    return found


def _workload(
    obj: Mapping[str, Any], sets: object, level: Level, tenant: TenantPolicy
) -> list[str]:
    kind = obj.get("kind")
    if kind in UNLAUNCHED_KINDS:
        return [f"spec.workload.kind: this agent does not launch {kind}"]
    try:
        out = _lines(field_violations(obj), _WORKLOAD)
        meta = obj.get("metadata") or {}
        if not isinstance(meta, Mapping):
            return ["spec.workload.metadata: must be a mapping"]
        for part in ("labels", "annotations"):
            keys = meta.get(part) or {}
            out += [
                f"{field_path((*_WORKLOAD, 'metadata', part, key))}: "
                f"{BROKER_DOMAIN} {part} are the broker's"
                for key in (keys if isinstance(keys, Mapping) else ())
                if reserved_key(str(key))
            ]
        for path, template in templates(obj):
            out += _lines(_template(template, (*_WORKLOAD, *path), level, tenant))
        out += _lines(injection_refusals(obj, level), _WORKLOAD)
        if tuple((n, tuple(p)) for n, p in pod_set_paths(obj)) != sets:
            out.append("spec.workload.podSets: not where the object's pod templates are")
    except FieldError as exc:
        return [f"{field_path((*_WORKLOAD, *exc.path))}: {exc.message}"]
    return out


def enforced_level(spec: LaunchSpec, tenant: TenantPolicy) -> Level | None:
    """The stricter of the spec's level and the agent's for its tenant; None when the
    spec's is not a level at all."""
    if spec.pod_security not in LEVELS:
        return None
    return LEVELS[max(LEVELS.index(spec.pod_security), LEVELS.index(tenant.level))]


def launch_violations(spec: LaunchSpec, tenant: TenantPolicy) -> list[str]:
    """Every problem of ``spec`` under ``tenant``'s policy (empty: launch it), one line
    each naming the field."""
    checked = enforced_level(spec, tenant)
    if checked is None:
        level = spec.pod_security
        return [f"spec.podSecurity: {level[:32]!r} is not one of {', '.join(LEVELS)}"]
    out: list[str] = []
    for name, template in spec.pod_templates.items():
        if not isinstance(template, Mapping):
            out.append(f"{field_path(('podTemplates', name))}: must be a mapping")
            continue
        out += _lines(_template(template, ("podTemplates", name), checked, tenant))
    if spec.workload is not None:
        out += _workload(spec.workload.object, spec.workload.pod_sets, checked, tenant)
    return out


__all__ = [
    "LAUNCHED_KINDS",
    "LEVELS",
    "UNLAUNCHED_KINDS",
    "AgentPolicy",
    "TenantPolicy",
    "enforced_level",
    "launch_violations",
    "namespace_problem",
]
