"""The broker's configuration file: its schema, its validation and the built-in demo.

This package owns what an operator writes in YAML: the store URL, the
API listener and its limits, scheduler timings and leader election (``server``), member
clusters and where their capacity comes from, and burst pools (``members``), queues with
their quotas and tenants with their tokens (``tenancy``), the whole document with its
cross references and loading (``document``), and the demo federation (``demo``).
Everything is checked at load time, cross references included, and the first problem
comes back as ONE line naming the file and the key path. Tokens (and a database password
in the store URL) are secrets: they are held as SecretStr or kept out of ``repr``, and no
error message ever repeats them. Import from the package: its names below are the API.
"""

from broker.config.auth import (
    MIN_TOKEN_LENGTH,
    AuthConfig,
    BearerTokenRef,
    OidcConfig,
    StaticGrant,
    StaticToken,
    TokenTable,
)
from broker.config.demo import DEMO_TENANTS, demo_config
from broker.config.document import Config, load_config, parse_config
from broker.config.members import (
    BurstPoolConfig,
    CapiPoolSource,
    ClusterConfig,
    ClusterSource,
    KubeconfigRef,
    KubeLaunchFields,
    KubeSource,
    MqttSource,
    PoolSource,
    ShapeSpec,
    SimulatedPoolSource,
    SimulatedSource,
)
from broker.config.section import ConfigError, Section, TokenRef
from broker.config.server import (
    ApiConfig,
    AuditConfig,
    EventsConfig,
    LeaderElectionConfig,
    MqttEventsConfig,
    MqttTlsConfig,
    PlanLimits,
    RateLimit,
    RetentionConfig,
    SchedulerConfig,
    StoreConfig,
    TlsConfig,
)
from broker.config.tenancy import QueueConfig, QueuePolicy, TenantConfig

__all__ = [
    "DEMO_TENANTS",
    "MIN_TOKEN_LENGTH",
    "ApiConfig",
    "AuditConfig",
    "AuthConfig",
    "BearerTokenRef",
    "BurstPoolConfig",
    "CapiPoolSource",
    "ClusterConfig",
    "ClusterSource",
    "Config",
    "ConfigError",
    "EventsConfig",
    "KubeLaunchFields",
    "KubeSource",
    "KubeconfigRef",
    "LeaderElectionConfig",
    "MqttEventsConfig",
    "MqttSource",
    "MqttTlsConfig",
    "OidcConfig",
    "PlanLimits",
    "PoolSource",
    "QueueConfig",
    "QueuePolicy",
    "RateLimit",
    "RetentionConfig",
    "SchedulerConfig",
    "Section",
    "ShapeSpec",
    "SimulatedPoolSource",
    "SimulatedSource",
    "StaticGrant",
    "StaticToken",
    "StoreConfig",
    "TenantConfig",
    "TlsConfig",
    "TokenRef",
    "TokenTable",
    "demo_config",
    "load_config",
    "parse_config",
]
