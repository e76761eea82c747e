"""The whole config document: its sections, the checks across them, the tenants' resolved
static tokens (``config.auth.TokenTable``), and reading it from YAML text or a file."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import Field, PrivateAttr, SecretStr, ValidationError, model_validator
from pydantic.alias_generators import to_camel

from broker.config.auth import MIN_TOKEN_LENGTH, AuthConfig, TokenTable, build_token_table, queue_of
from broker.config.members import BurstPoolConfig, ClusterConfig
from broker.config.section import ConfigError, Section
from broker.config.server import (
    ApiConfig,
    AuditConfig,
    EventsConfig,
    LeaderElectionConfig,
    RetentionConfig,
    SchedulerConfig,
    StoreConfig,
)
from broker.config.tenancy import QueueConfig, TaintKey, TenantConfig
from broker.manifest import (
    DEFAULT_RESERVED_TAINTS,
    FieldError,
    NodeAccess,
    field_path,
    first_error,
)
from broker.manifest.documents import DuplicateKey
from broker.manifest.parsing import load_yaml


class Config(Section):
    store: StoreConfig = StoreConfig()
    api: ApiConfig = ApiConfig()
    scheduler: SchedulerConfig = SchedulerConfig()
    clusters: list[ClusterConfig] = Field(default_factory=list, max_length=256)
    burst_pools: list[BurstPoolConfig] = Field(default_factory=list, max_length=256)
    queues: list[QueueConfig] = Field(default_factory=list, max_length=1024)
    tenants: list[TenantConfig] = Field(default_factory=list, max_length=10_000)
    events: EventsConfig = EventsConfig()
    leader_election: LeaderElectionConfig = LeaderElectionConfig()
    retention: RetentionConfig = RetentionConfig()
    audit: AuditConfig = AuditConfig()
    auth: AuthConfig = AuthConfig()
    # Taints (by key) no tenant's pod may tolerate, whatever its value; a keyless Exists
    # toleration would tolerate them too, so it is refused while any is reserved.
    reserved_taints: list[TaintKey] = Field(
        default_factory=lambda: list(DEFAULT_RESERVED_TAINTS), max_length=64
    )
    # Resolved tokens, filled by parse_config / demo_config; private, so not in repr or dumps.
    _tokens: TokenTable = PrivateAttr(default_factory=TokenTable)
    _mqtt_password: SecretStr | None = PrivateAttr(default=None)
    _command_keys: dict[str, SecretStr] = PrivateAttr(default_factory=dict)

    @model_validator(mode="after")
    def _cross_references(self) -> Config:
        _unique_names(self)
        _one_pool_per_cluster(self)
        if self.events.mqtt is None:
            for i, cc in enumerate(self.clusters):
                if cc.source.mqtt is not None:
                    raise FieldError(
                        ["clusters", i, "source", "mqtt"], "needs events.mqtt (the MQTT broker)"
                    )
        _known_queues(self)
        _tenant_namespaces(self)
        _oidc_mapping(self)
        return self

    def queue(self, name: str) -> QueueConfig | None:
        return next((q for q in self.queues if q.name == name), None)

    def tenant(self, name: str) -> TenantConfig | None:
        return next((t for t in self.tenants if t.name == name), None)

    def node_access(self, tenant: TenantConfig) -> NodeAccess:
        """What ``tenant``'s pods may reach of a node: its runtime classes, no reserved taint."""
        return NodeAccess.of(tenant.runtime_class_names, self.reserved_taints)

    def authenticate(self, token: str) -> TenantConfig | None:
        """The tenant a static bearer token belongs to (see ``tokens`` for its roles)."""
        grant = self._tokens.lookup(token)
        return None if grant is None else self.tenant(grant.tenant)

    @property
    def tokens(self) -> TokenTable:
        """The static tokens, resolved and hashed."""
        return self._tokens

    def resolve_tokens(
        self, environ: Mapping[str, str], min_token_length: int = MIN_TOKEN_LENGTH
    ) -> None:
        """Read every tenant's tokens (from ``environ`` for ``env`` ones); refuse a short
        one, and a token two entries share, which would make authentication ambiguous."""
        self._tokens = build_token_table(self.tenants, environ, min_token_length)
        mqtt = self.events.mqtt
        if mqtt is not None and mqtt.password is not None:
            try:
                self._mqtt_password = mqtt.password.resolve(environ)
            except FieldError as exc:
                path = ["events", "mqtt", "password", *exc.path]
                raise FieldError(path, exc.message) from None
        keys: dict[str, SecretStr] = {}
        for i, cc in enumerate(self.clusters):
            ref = cc.source.mqtt.command_key if cc.source.mqtt is not None else None
            if ref is None:
                continue
            try:
                keys[cc.name] = ref.resolve(environ)
            except FieldError as exc:
                path = ["clusters", i, "source", "mqtt", "commandKey", *exc.path]
                raise FieldError(path, exc.message) from None
        self._command_keys = keys

    @property
    def mqtt_password(self) -> SecretStr | None:
        """events.mqtt.password, resolved (from the environment for an ``env`` one)."""
        return self._mqtt_password

    @property
    def command_keys(self) -> dict[str, SecretStr]:
        """Agent-fed clusters' ``source.mqtt.commandKey``, resolved, by cluster."""
        return self._command_keys


def _unique_names(config: Config) -> None:
    for section in ("clusters", "burst_pools", "queues", "tenants"):
        seen: set[str] = set()
        for i, item in enumerate(getattr(config, section)):
            if item.name in seen:
                raise FieldError([to_camel(section), i, "name"], f"duplicate name {item.name!r}")
            seen.add(item.name)


def _one_pool_per_cluster(config: Config) -> None:
    clusters = {c.name for c in config.clusters}
    fed: set[str] = set()
    for i, pool in enumerate(config.burst_pools):
        if pool.cluster not in clusters:
            raise FieldError(["burstPools", i, "cluster"], f"no cluster named {pool.cluster!r}")
        if pool.cluster in fed:
            raise FieldError(
                ["burstPools", i, "cluster"], f"cluster {pool.cluster!r} already has a pool"
            )
        fed.add(pool.cluster)


def _known_queues(config: Config) -> None:
    queues = {q.name for q in config.queues}
    for i, tenant in enumerate(config.tenants):
        if tenant.default_queue not in queues:
            raise FieldError(
                ["tenants", i, "defaultQueue"], f"no queue named {tenant.default_queue!r}"
            )
        for j, name in enumerate(tenant.queues):
            if name not in queues:
                raise FieldError(["tenants", i, "queues", j], f"no queue named {name!r}")
    for i, cc in enumerate(config.clusters):
        for name in cc.source.kube.volcano_queues if cc.source.kube else ():
            if name not in queues:
                path: list[str | int] = ["clusters", i, "source", "kube", "volcanoQueues", name]
                raise FieldError(path, f"no queue named {name!r}")


def _tenant_namespaces(config: Config) -> None:
    """Every Kubernetes member's namespace pattern gives a usable namespace for every tenant."""
    for i, cc in enumerate(config.clusters):
        if cc.source.kube is None:
            continue
        for tenant in config.tenants:
            problem = cc.source.kube.namespace_problem(tenant.name)
            if problem is not None:
                raise FieldError(["clusters", i, "source", "kube", "namespacePattern"], problem)


def _oidc_mapping(config: Config) -> None:
    oidc = config.auth.oidc
    if oidc is None:
        return
    tenants, queues = {t.name for t in config.tenants}, {q.name for q in config.queues}
    for value, tenant in oidc.tenants.items():
        if tenant not in tenants:
            raise FieldError(["auth", "oidc", "tenants", value], f"no tenant named {tenant!r}")
    for value, roles in oidc.roles.items():
        for k, role in enumerate(roles):
            queue = queue_of(role)
            if queue is not None and queue not in queues:
                raise FieldError(["auth", "oidc", "roles", value, k], f"no queue named {queue!r}")


def parse_config(text: str, source_name: str, environ: Mapping[str, str] | None = None) -> Config:
    """Validate a YAML config (a key given twice in a mapping refused, naming its path);
    ``source_name`` (the file) starts every error message.
    Token environment variables are read from ``environ`` (default: os.environ)."""
    try:
        data: object = load_yaml(text)
    except DuplicateKey as exc:  # an operator's mistake that would silently win
        raise ConfigError(f"{source_name}: {exc.message(None)}") from None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise ConfigError(f"{source_name}: invalid YAML{where}: {exc.problem}") from None
    except (yaml.YAMLError, ValueError, TypeError, RecursionError):
        raise ConfigError(f"{source_name}: invalid YAML") from None
    if data is None:
        raise ConfigError(f"{source_name}: empty config")
    if not isinstance(data, dict):
        raise ConfigError(f"{source_name}: must be a mapping of sections")
    return validated(data, source_name, os.environ if environ is None else environ)


def load_config(path: str | Path, environ: Mapping[str, str] | None = None) -> Config:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
        raise ConfigError(f"{path}: cannot read: {reason}") from None
    return parse_config(text, str(path), environ)


def validated(
    data: Mapping[str, Any],
    source_name: str,
    environ: Mapping[str, str],
    min_token_length: int = MIN_TOKEN_LENGTH,
) -> Config:
    """``data`` as a Config with its tokens resolved; raises ConfigError (one line).
    ``min_token_length``: the shortest non-hashed token accepted (the demo's are shorter)."""
    try:
        config = Config.model_validate(data)
        config.resolve_tokens(environ, min_token_length)
    except ValidationError as exc:
        path, message = first_error(exc)
        raise ConfigError(f"{source_name}: {path + ': ' if path else ''}{message}") from None
    except FieldError as exc:
        raise ConfigError(f"{source_name}: {field_path(exc.path)}: {exc.message}") from None
    return config
