"""The agent's launch config (``fedbroker agent --launch-config FILE``): how the agent
launches into its member and what each tenant may run there.

The launch fields are a ``kube`` member's (``broker.config.KubeLaunchFields``:
``namespacePattern``, ``launchMode``, ``podGroup``, ``schedulerName``, ``volcanoQueues``,
``gpuResources``, ``sharedGpuResource``, ``gpuTypeLabel``, the timings), so a member moves
between push and pull mode with the same settings. Besides them:

``tenants``  ``[{name, podSecurity, serviceAccounts, runtimeClassNames}]``: the tenants
    this member runs and what their pods may be (defaults as in the broker's config:
    ``baseline``, ``[default]``, none). Left out: every tenant, at ``baseline`` with the
    service account ``default`` only. A tenant not listed is refused.
``reservedTaints``  taint keys no tenant's pod may tolerate (default: the control plane's).

An example::

    namespacePattern: "fedbroker-{tenant}"
    launchMode: pin
    tenants:
    - {name: team-a, podSecurity: restricted, serviceAccounts: [default, trainer]}
    - {name: team-b}

A file the model refuses is a ``ConfigError``: one line, ``<file>: <key path>: <problem>``.
"""

from __future__ import annotations

from pathlib import Path

import yaml
from pydantic import Field, ValidationError, model_validator

from broker.agent.policy import AgentPolicy, TenantPolicy, namespace_problem
from broker.config import ConfigError, KubeLaunchFields, Section
from broker.config.tenancy import PodSecurityLevel, RuntimeClassName, TaintKey
from broker.manifest import (
    DEFAULT_RESERVED_TAINTS,
    DnsLabel,
    FieldError,
    NodeAccess,
    field_path,
    first_error,
)
from broker.manifest.documents import DuplicateKey
from broker.manifest.parsing import load_yaml

MAX_BYTES = 1 << 20


class AgentTenant(Section):
    name: DnsLabel
    pod_security: PodSecurityLevel = "baseline"
    service_accounts: list[DnsLabel] = Field(default_factory=lambda: ["default"], max_length=64)
    runtime_class_names: list[RuntimeClassName] = Field(default_factory=list, max_length=64)


class AgentLaunchConfig(KubeLaunchFields):
    """See the module's docstring."""

    tenants: list[AgentTenant] | None = Field(default=None, max_length=10_000)
    reserved_taints: list[TaintKey] = Field(
        default_factory=lambda: list(DEFAULT_RESERVED_TAINTS), max_length=64
    )

    @model_validator(mode="after")
    def _tenants(self) -> AgentLaunchConfig:
        seen: set[str] = set()
        for i, tenant in enumerate(self.tenants or ()):
            if tenant.name in seen:
                raise FieldError(["tenants", i, "name"], f"tenant {tenant.name!r} listed twice")
            seen.add(tenant.name)
            problem = self._namespace_problem(tenant.name)
            if problem is not None:
                raise FieldError(["namespacePattern"], problem)
        return self

    def _namespace_problem(self, tenant: str) -> str | None:
        return namespace_problem(self.namespace_pattern, tenant)

    def policy(self) -> AgentPolicy:
        """The policy the agent checks every launch against."""
        tenants = None
        if self.tenants is not None:
            tenants = {
                t.name: TenantPolicy(
                    t.pod_security,
                    frozenset(t.service_accounts),
                    NodeAccess.of(t.runtime_class_names, self.reserved_taints),
                )
                for t in self.tenants
            }
        return AgentPolicy(self.namespace_pattern, tenants, tuple(self.reserved_taints))


def parse_launch_config(text: str, source_name: str) -> AgentLaunchConfig:
    """The launch config of YAML ``text``; ``ConfigError`` (one line) when it is wrong."""
    try:
        data: object = load_yaml(text)
    except DuplicateKey as exc:  # an operator's mistake that would silently win
        raise ConfigError(f"{source_name}: {exc.message(None)}") from None
    except (yaml.YAMLError, ValueError, TypeError, RecursionError):
        raise ConfigError(f"{source_name}: invalid YAML") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{source_name}: must be a mapping of launch settings")
    try:
        return AgentLaunchConfig.model_validate(data)
    except ValidationError as exc:
        path, message = first_error(exc)
        raise ConfigError(f"{source_name}: {path + ': ' if path else ''}{message}") from None
    except FieldError as exc:
        raise ConfigError(f"{source_name}: {field_path(exc.path)}: {exc.message}") from None


def load_launch_config(path: Path) -> AgentLaunchConfig:
    try:
        with path.open("rb") as f:
            raw = f.read(MAX_BYTES + 1)
        if len(raw) > MAX_BYTES:
            raise ConfigError(f"{path}: larger than {MAX_BYTES} bytes")
        text = raw.decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
        raise ConfigError(f"{path}: cannot read: {reason}") from None
    return parse_launch_config(text, str(path))


__all__ = ["AgentLaunchConfig", "AgentTenant", "load_launch_config", "parse_launch_config"]
