"""The broker's configuration file: its schema, its validation and the built-in demo.

This module owns what an operator writes in YAML (issue 3, "Config"): the store URL, the API
listener and its limits, scheduler timings, member clusters and where their capacity comes
from, queues with their quotas, and tenants with their tokens. Everything is checked at
load time, cross references included, and the first problem comes back as ONE line naming
the file and the key path. Tokens (and a database password in the store URL) are secrets:
they are held as SecretStr or kept out of ``repr``, and no error message ever repeats them.
"""

from __future__ import annotations

import hmac
import os
import socket
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    SecretStr,
    ValidationError,
    field_serializer,
    field_validator,
    model_validator,
)
from pydantic.alias_generators import to_camel

from adapters.simulated import OPENB_MIX, NodeShape
from broker.manifest import (
    MAX_GPUS_PER_POD,
    MAX_PRIORITY,
    CpuQuantity,
    DnsLabel,
    FieldError,
    GpuTypeName,
    Labels,
    MemoryQuantity,
    cpu_millicores,
    field_path,
    first_error,
    memory_mebibytes,
)
from broker.model import Cluster, ClusterKind
from broker.store import sqlite_path, sqlite_url

DEFAULT_STORE_URL = sqlite_url("data/fedbroker.db")  # relative to the working directory
QueuePolicy = Literal["gang", "binpack", "auto"]
MAX_SIMULATED_NODES = 50_000  # per cluster: far above the trace inventories, still in memory


class ConfigError(ValueError):
    """A configuration the operator got wrong: one line, ``<file>: <key path>: <problem>``."""


class Section(BaseModel):
    """camelCase keys as in the YAML, typos rejected, no silent coercion ("8080" is no port)."""

    model_config = ConfigDict(alias_generator=to_camel, extra="forbid", strict=True, frozen=True)


class StoreConfig(Section):
    # repr=False: a PostgreSQL URL may carry a password.
    url: str = Field(default=DEFAULT_STORE_URL, repr=False)

    @field_validator("url")
    @classmethod
    def _known_scheme(cls, url: str) -> str:
        # The URL itself is not repeated: it may hold a password.
        if not url.startswith(("sqlite://", "postgresql://", "postgres://")):
            raise ValueError("must start with sqlite:// or postgresql://")
        return url

    @field_serializer("url")
    def _dumped_redacted(self, url: str) -> str:
        return self.redacted_url  # dumps are for showing, like SecretStr's "**********"

    @property
    def sqlite_path(self) -> Path | None:
        """The database file of a SQLite URL (``sqlite://rel/path``, ``sqlite:///abs/path``:
        the store's convention, see broker.store.sqlite_path)."""
        return Path(sqlite_path(self.url)) if self.is_sqlite else None

    @property
    def is_sqlite(self) -> bool:
        return self.url.startswith("sqlite://")

    @property
    def redacted_url(self) -> str:
        """The URL fit for logs: any password replaced by ``***``."""
        parts = urlsplit(self.url)
        if parts.password is None:
            return self.url
        netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
        return parts._replace(netloc=netloc).geturl()


class RateLimit(Section):
    requests_per_second: float = Field(default=100.0, gt=0, le=1_000_000)
    burst: int = Field(default=200, ge=1, le=1_000_000)


class ApiConfig(Section):
    host: str = Field(default="127.0.0.1", min_length=1, max_length=253)
    port: int = Field(default=8080, ge=0, le=65_535)  # 0: any free port (tests)
    body_limit_bytes: int = Field(default=1 << 20, ge=1024, le=64 << 20)
    rate_limit_per_tenant: RateLimit = RateLimit()


class SchedulerConfig(Section):
    cycle_seconds: float = Field(default=1.0, gt=0, le=60)
    max_jobs_per_cycle: int = Field(default=1000, ge=1, le=100_000)
    # A cycle runs on the event loop: past this it stops deciding (the rest wait for the
    # next cycle), so the API never waits longer behind it.
    max_cycle_seconds: float = Field(default=0.5, gt=0, le=60)
    # Kueue's requeue defaults: 60 s, doubling, capped at one hour, no limit unless set.
    backoff_base_seconds: float = Field(default=60.0, gt=0, le=86_400)
    backoff_cap_seconds: float = Field(default=3600.0, gt=0, le=7 * 86_400)
    backoff_limit: int | None = Field(default=None, ge=0, le=1000)
    # How long a waiting gang lets smaller jobs backfill before its capacity is held for it.
    starvation_seconds: float = Field(default=300.0, ge=0, le=86_400)
    stale_after_seconds: float = Field(default=60.0, gt=0, le=3600)
    # How often objects with our origin label that belong to no live job are deleted from
    # Kubernetes members (finished jobs' pods stay that long for their logs).
    garbage_collect_seconds: float = Field(default=60.0, gt=0, le=86_400)
    # DESIGN.md: unplaceable this long -> the burst controller plans cloud nodes.
    burst_after_seconds: float = Field(default=30.0, ge=0, le=86_400)

    @model_validator(mode="after")
    def _cap_above_base(self) -> SchedulerConfig:
        if self.backoff_cap_seconds < self.backoff_base_seconds:
            raise FieldError(["backoffCapSeconds"], "must be >= backoffBaseSeconds")
        return self


class LeaderElectionConfig(Section):
    """Several replicas on one store: exactly one places (broker/leader.py). ``enabled``
    defaults to on for a PostgreSQL store; a SQLite store always elects with an OS file
    lock (one machine; the timings do not apply) and ``enabled: false`` on PostgreSQL means
    the operator runs exactly one replica."""

    enabled: bool | None = None
    lease_seconds: float = Field(default=15.0, gt=0, le=3600)
    renew_seconds: float = Field(default=2.0, gt=0, le=600)
    # A leader that has not renewed for this long stops placing: before its lease expires,
    # so before another replica can take it.
    stop_after_seconds: float = Field(default=10.0, gt=0, le=3600)
    identity: str | None = Field(default=None, min_length=1, max_length=253)
    # A follower proxies a write (POST/PUT/PATCH/DELETE under /v1/) to the leader when the
    # leader's identity is an address (host:port); false, or when that fails: 503 naming it.
    forward_writes: bool = True

    @model_validator(mode="after")
    def _ordered(self) -> LeaderElectionConfig:
        if self.renew_seconds >= self.stop_after_seconds:
            raise FieldError(["renewSeconds"], "must be < stopAfterSeconds")
        if self.stop_after_seconds >= self.lease_seconds:
            raise FieldError(["stopAfterSeconds"], "must be < leaseSeconds")
        return self


class ShapeSpec(Section):
    """``count`` nodes alike; for a cloud pool, the most nodes it can scale to."""

    gpu_type: GpuTypeName
    gpus: int = Field(ge=0, le=MAX_GPUS_PER_POD)
    cpu: CpuQuantity
    memory: MemoryQuantity
    count: int = Field(ge=1, le=MAX_SIMULATED_NODES)

    def node_shape(self) -> NodeShape:
        return NodeShape(
            self.gpu_type,
            self.gpus,
            cpu_millicores(self.cpu),
            memory_mebibytes(self.memory),
            self.count,
        )


class SimulatedSource(Section):
    # Empty for a cloud cluster that only burst pools fill.
    shapes: list[ShapeSpec] = Field(default_factory=list, max_length=64)
    scale: float = Field(default=1.0, gt=0, le=100)  # as in adapters.simulated.generate_nodes
    launch_delay_seconds: float = Field(default=0.0, ge=0, le=3600)
    failure_rate: float = Field(default=0.0, ge=0, le=1)

    @model_validator(mode="after")
    def _fits_in_memory(self) -> SimulatedSource:
        nodes = sum(max(1, round(s.count * self.scale)) for s in self.shapes)
        if nodes > MAX_SIMULATED_NODES:
            raise FieldError(["scale"], f"{nodes} nodes, at most {MAX_SIMULATED_NODES}")
        return self

    def node_shapes(self) -> list[NodeShape]:
        return [s.node_shape() for s in self.shapes]


class KubeconfigRef(Section):
    """A kubeconfig given as a file path (``kubeconfig``, relative to the working
    directory) or inline (``kubeconfigInline``: a mapping or YAML text), and its context."""

    kubeconfig: str | None = Field(default=None, min_length=1, max_length=4096)
    kubeconfig_inline: dict[str, Any] | str | None = Field(default=None, repr=False)
    context: str = Field(min_length=1, max_length=253)

    @model_validator(mode="after")
    def _one_kubeconfig(self) -> KubeconfigRef:
        if (self.kubeconfig is None) == (self.kubeconfig_inline is None):
            raise FieldError(["kubeconfig"], "give exactly one of: kubeconfig, kubeconfigInline")
        return self

    def kubeconfig_source(self) -> Path | str | dict[str, Any]:
        """What ``adapters.kube.kubeconfig.load_clients`` reads: the file, or the inline one."""
        if self.kubeconfig is not None:
            return Path(self.kubeconfig)
        assert self.kubeconfig_inline is not None
        return self.kubeconfig_inline


class KubeSource(KubeconfigRef):
    """A real Kubernetes member cluster: one context of a kubeconfig, given as a file path
    (``kubeconfig``, relative to the working directory) or inline (``kubeconfigInline``: the
    kubeconfig as a mapping or YAML text). Capacity comes from a list+watch of its nodes and
    pods; gangs are launched into ``namespace``."""

    namespace: DnsLabel = "fedbroker-jobs"
    gpu_resources: list[str] = Field(
        default_factory=lambda: ["nvidia.com/gpu", "amd.com/gpu"], min_length=1, max_length=16
    )
    gpu_type_label: str = Field(default="nvidia.com/gpu.product", min_length=1, max_length=317)
    shared_gpu_resource: str | None = Field(default=None, min_length=1, max_length=317)
    launch_mode: Literal["delegate", "pin"] = "delegate"
    pod_group: Literal["coscheduling", "volcano"] = "coscheduling"
    # How often the phases of our pods are read (one LIST for all gangs of the cluster):
    # a starting gang is confirmed, a running one noticed to end, within this.
    pod_poll_seconds: float = Field(default=2.0, gt=0, le=300)
    # A watch that hears nothing (not even a bookmark) this long is restarted; a server
    # that accepts but never answers counts as down after it. Lists time out after
    # requestTimeoutSeconds.
    watch_inactivity_seconds: float = Field(default=90.0, gt=0, le=3600)
    request_timeout_seconds: float = Field(default=30.0, gt=0, le=600)

    @field_validator("gpu_resources")
    @classmethod
    def _resource_names(cls, names: list[str]) -> list[str]:
        for name in names:
            if not name or len(name) > 317 or any(c.isspace() for c in name):
                raise ValueError(f"not a resource name: {name!r}")
        if len(set(names)) != len(names):
            raise ValueError("duplicate resource name")
        return names


class MqttSource(Section):
    """A member cluster whose capacity an agent (``fedbroker agent``) reports over MQTT
    (``events.mqtt`` names the MQTT broker). Stale while the agent's last heartbeat is older
    than ``staleAfterSeconds`` (default: ``scheduler.staleAfterSeconds``)."""

    stale_after_seconds: float | None = Field(default=None, gt=0, le=3600)


class ClusterSource(Section):
    """Where a cluster's capacity comes from: exactly one key names the adapter. A union
    keyed by its one key (``{simulated: {...}}``, ``{kube: {...}}`` or ``{mqtt: {...}}``)."""

    simulated: SimulatedSource | None = None
    kube: KubeSource | None = None
    mqtt: MqttSource | None = None

    @model_validator(mode="after")
    def _exactly_one(self) -> ClusterSource:
        given = [name for name in type(self).model_fields if getattr(self, name) is not None]
        if len(given) != 1:
            keys = ", ".join(type(self).model_fields)
            raise FieldError([], f"give exactly one of: {keys}")
        return self

    @property
    def kind(self) -> str:
        """The adapter's name: the one key given."""
        return next(name for name in type(self).model_fields if getattr(self, name) is not None)


class ClusterConfig(Section):
    name: DnsLabel
    kind: ClusterKind = "onprem"
    labels: Labels = Field(default_factory=dict)
    cost_per_gpu_hour: float = Field(default=0.0, ge=0, le=10_000)
    source: ClusterSource

    def to_cluster(self) -> Cluster:
        return Cluster(self.name, dict(self.labels), self.kind, self.cost_per_gpu_hour)


class SimulatedPoolSource(Section):
    """A simulated Cluster API pool: nodes come up ``provisionSeconds`` after a scale-up,
    or never (``failureRate``, seeded)."""

    failure_rate: float = Field(default=0.0, ge=0, le=1)
    seed: int = 0


class CapiPoolSource(KubeconfigRef):
    """A Cluster API MachineDeployment (or MachinePool) on a management cluster, scaled
    through its ``/scale`` subresource; the kubeconfig context is the management cluster's."""

    namespace: DnsLabel
    name: str = Field(min_length=1, max_length=253)
    kind: Literal["MachineDeployment", "MachinePool"] = "MachineDeployment"


class PoolSource(Section):
    """Where a burst pool's nodes come from: exactly one key names the adapter."""

    simulated: SimulatedPoolSource | None = None
    capi: CapiPoolSource | None = None

    @model_validator(mode="after")
    def _exactly_one(self) -> PoolSource:
        given = [name for name in type(self).model_fields if getattr(self, name) is not None]
        if len(given) != 1:
            raise FieldError([], f"give exactly one of: {', '.join(type(self).model_fields)}")
        return self


class BurstPoolConfig(Section):
    """A cloud node pool that grows member cluster ``cluster`` when a gang allowed to burst
    fits nowhere. The node shape and size bounds may be left out for a Cluster API pool
    whose MachineDeployment carries the cluster-autoscaler scale-from-zero annotations."""

    name: DnsLabel
    cluster: DnsLabel
    gpu_type: GpuTypeName | None = None
    gpus: int | None = Field(default=None, ge=1, le=MAX_GPUS_PER_POD)
    cpu: CpuQuantity | None = None
    memory: MemoryQuantity | None = None
    min_nodes: int | None = Field(default=None, ge=0, le=10_000)
    max_nodes: int | None = Field(default=None, ge=0, le=10_000)
    cost_per_node_hour: float = Field(default=0.0, ge=0, le=100_000)
    provision_seconds: float = Field(default=300.0, ge=0, le=86_400)  # expected (simulated: actual)
    burst_after_seconds: float | None = Field(default=None, ge=0, le=86_400)
    scale_down_after_seconds: float = Field(default=600.0, ge=0, le=86_400)
    provision_timeout_seconds: float = Field(default=900.0, gt=0, le=86_400)
    # Who scales the pool: the broker, or the cluster autoscaler (then the broker only
    # places onto what is there and never scales it, so the two never fight).
    owner: Literal["fedbroker", "cluster-autoscaler"] = "fedbroker"
    source: PoolSource

    @model_validator(mode="after")
    def _shape_for_simulated(self) -> BurstPoolConfig:
        if self.source.simulated is not None:
            for key in ("gpu_type", "gpus", "cpu", "memory", "max_nodes"):
                if getattr(self, key) is None:
                    raise FieldError([to_camel(key)], "required for a simulated pool")
        if None not in (self.min_nodes, self.max_nodes) and self.min_nodes > self.max_nodes:  # type: ignore[operator]
            raise FieldError(["minNodes"], "must be <= maxNodes")
        return self


class QueueConfig(Section):
    name: DnsLabel
    policy: QueuePolicy = "auto"
    priority: int = Field(default=0, ge=-MAX_PRIORITY, le=MAX_PRIORITY)
    weight: float = Field(default=1.0, gt=0, le=1000)  # fair share
    # Nominal GPUs of each type; whether unlisted types are usable is the queue's rule.
    quota: dict[GpuTypeName, Annotated[int, Field(ge=0, le=1_000_000)]] = Field(
        default_factory=dict
    )
    borrow: bool = False  # may use other queues' idle quota
    reclaimable: bool = False  # its jobs may be preempted, whole, by higher priority ones


class TokenRef(Section):
    """A bearer token, read from the environment (``env``) or written inline (``value``)."""

    env: str | None = Field(default=None, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$", max_length=128)
    value: SecretStr | None = None

    @model_validator(mode="after")
    def _exactly_one(self) -> TokenRef:
        if (self.env is None) == (self.value is None):
            raise FieldError([], "give exactly one of: env, value")
        return self

    def resolve(self, environ: Mapping[str, str]) -> SecretStr:
        """The token; raises FieldError (path relative to this TokenRef) when unusable."""
        if self.value is not None:
            token = self.value
        elif self.env is not None and self.env in environ:
            token = SecretStr(environ[self.env])
        else:
            raise FieldError(["env"], f"environment variable {self.env} is not set")
        if not token.get_secret_value():
            raise FieldError(["value" if self.value is not None else "env"], "token is empty")
        return token


# --- MQTT events (broker.service.mqtt) ----------------------------------------------------------


def _default_client_id() -> str:
    return f"fedbroker-{socket.gethostname()}"[:128]


class MqttEventsConfig(Section):
    """The MQTT broker fedbroker publishes its events to (and hears agents on)."""

    host: str = Field(min_length=1, max_length=253)
    port: int = Field(default=1883, ge=1, le=65_535)
    client_id: str = Field(
        default_factory=_default_client_id, min_length=1, max_length=128, pattern=r"^[^\s#+/]+$"
    )
    username: str | None = Field(default=None, min_length=1, max_length=256)
    password: TokenRef | None = Field(default=None, repr=False)
    # Topic levels without wildcards, no leading or trailing slash.
    topic_prefix: str = Field(
        default="fedbroker", max_length=128, pattern=r"^[^#+/\s]+(/[^#+/\s]+)*$"
    )
    outbox_size: int = Field(default=10_000, ge=1, le=1_000_000)


class EventsConfig(Section):
    mqtt: MqttEventsConfig | None = None


class TenantConfig(Section):
    name: DnsLabel
    default_queue: DnsLabel
    queues: list[DnsLabel] = Field(default_factory=list, max_length=256)
    token: TokenRef
    admin: bool = False

    @property
    def allowed_queues(self) -> frozenset[str]:
        """Queues this tenant may submit to: the listed ones and its default queue."""
        return frozenset([*self.queues, self.default_queue])


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
    # Resolved tokens, filled by parse_config / demo_config; private, so not in repr or dumps.
    _tokens: list[tuple[SecretStr, TenantConfig]] = PrivateAttr(default_factory=list)
    _mqtt_password: SecretStr | None = PrivateAttr(default=None)

    @model_validator(mode="after")
    def _cross_references(self) -> Config:
        for section in ("clusters", "burst_pools", "queues", "tenants"):
            seen: set[str] = set()
            for i, item in enumerate(getattr(self, section)):
                if item.name in seen:
                    raise FieldError(
                        [to_camel(section), i, "name"], f"duplicate name {item.name!r}"
                    )
                seen.add(item.name)
        clusters = {c.name for c in self.clusters}
        fed: set[str] = set()
        for i, pool in enumerate(self.burst_pools):
            if pool.cluster not in clusters:
                raise FieldError(["burstPools", i, "cluster"], f"no cluster named {pool.cluster!r}")
            if pool.cluster in fed:
                raise FieldError(
                    ["burstPools", i, "cluster"], f"cluster {pool.cluster!r} already has a pool"
                )
            fed.add(pool.cluster)
        if self.events.mqtt is None:
            for i, cc in enumerate(self.clusters):
                if cc.source.mqtt is not None:
                    raise FieldError(
                        ["clusters", i, "source", "mqtt"], "needs events.mqtt (the MQTT broker)"
                    )
        queues = {q.name for q in self.queues}
        for i, tenant in enumerate(self.tenants):
            if tenant.default_queue not in queues:
                raise FieldError(
                    ["tenants", i, "defaultQueue"], f"no queue named {tenant.default_queue!r}"
                )
            for j, name in enumerate(tenant.queues):
                if name not in queues:
                    raise FieldError(["tenants", i, "queues", j], f"no queue named {name!r}")
        return self

    def queue(self, name: str) -> QueueConfig | None:
        return next((q for q in self.queues if q.name == name), None)

    def tenant(self, name: str) -> TenantConfig | None:
        return next((t for t in self.tenants if t.name == name), None)

    def authenticate(self, token: str) -> TenantConfig | None:
        """The tenant a bearer token belongs to. Every token is compared in constant time,
        so the answer's timing does not tell how much of a guess was right."""
        found = None
        given = token.encode()
        for secret, tenant in self._tokens:
            if hmac.compare_digest(secret.get_secret_value().encode(), given):
                found = tenant
        return found

    def resolve_tokens(self, environ: Mapping[str, str]) -> None:
        """Read every tenant's token (from ``environ`` for ``env`` ones) and refuse a token
        shared by two tenants, which would make authentication ambiguous."""
        resolved: list[tuple[SecretStr, TenantConfig]] = []
        owners: dict[str, str] = {}
        for i, tenant in enumerate(self.tenants):
            try:
                secret = tenant.token.resolve(environ)
            except FieldError as exc:
                raise FieldError(["tenants", i, "token", *exc.path], exc.message) from None
            other = owners.setdefault(secret.get_secret_value(), tenant.name)
            if other != tenant.name:
                raise FieldError(["tenants", i, "token"], f"same token as tenant {other!r}")
            resolved.append((secret, tenant))
        self._tokens = resolved
        mqtt = self.events.mqtt
        if mqtt is not None and mqtt.password is not None:
            try:
                self._mqtt_password = mqtt.password.resolve(environ)
            except FieldError as exc:
                path = ["events", "mqtt", "password", *exc.path]
                raise FieldError(path, exc.message) from None

    @property
    def mqtt_password(self) -> SecretStr | None:
        """events.mqtt.password, resolved (from the environment for an ``env`` one)."""
        return self._mqtt_password


def parse_config(text: str, source_name: str, environ: Mapping[str, str] | None = None) -> Config:
    """Validate a YAML config; ``source_name`` (the file) starts every error message.
    Token environment variables are read from ``environ`` (default: os.environ)."""
    try:
        data: object = yaml.safe_load(text)
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
    return _validated(data, source_name, os.environ if environ is None else environ)


def load_config(path: str | Path, environ: Mapping[str, str] | None = None) -> Config:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
        raise ConfigError(f"{path}: cannot read: {reason}") from None
    return parse_config(text, str(path), environ)


def _validated(data: Mapping[str, Any], source_name: str, environ: Mapping[str, str]) -> Config:
    try:
        config = Config.model_validate(data)
        config.resolve_tokens(environ)
    except ValidationError as exc:
        path, message = first_error(exc)
        raise ConfigError(f"{source_name}: {path + ': ' if path else ''}{message}") from None
    except FieldError as exc:
        raise ConfigError(f"{source_name}: {field_path(exc.path)}: {exc.message}") from None
    return config


# --- the built-in demo -------------------------------------------------------------------

DEMO_TENANTS = ("team-a", "team-b", "admin")


def _openb_shapes(*gpu_types: str) -> list[dict[str, Any]]:
    """Node shapes of the openb trace with their real counts (scaled by the source)."""
    shapes = [next(s for s in OPENB_MIX if s.gpu_type == t) for t in gpu_types]
    return [
        {"gpuType": s.gpu_type, "gpus": s.gpus, "cpu": f"{s.cpu_milli}m",
         "memory": f"{s.memory_mib}Mi", "count": s.count}
        for s in shapes
    ]  # fmt: skip


def demo_config(data_dir: Path, tokens: Mapping[str, str]) -> Config:
    """The federation ``fedbroker demo`` runs: two on-prem clusters of real openb node
    shapes (counts scaled to a few dozen nodes, no H100 anywhere) and a cloud burst pool.

    onprem-a: G2 x8, T4 x2, V100M32 x8 at 5 % of openb's counts = 47 nodes, 262 GPUs.
    onprem-b: P100 x2, G3 x8, V100M16 x4 at 15 % = 30 nodes, 104 GPUs.
    cloud-burst: empty; the simulated pool cloud-a100 grows it by A100 x8 nodes (up to 16,
    20 s to come up, back after 60 s idle), priced like an on-demand p4d.24xlarge
    (32.77 $/h for 8 A100 in us-east-1).
    """
    missing = [name for name in DEMO_TENANTS if not tokens.get(name)]
    if missing:
        raise ValueError(f"demo tokens missing for: {', '.join(missing)}")
    openb_a = {"shapes": _openb_shapes("G2", "T4", "V100M32"), "scale": 0.05}
    openb_b = {"shapes": _openb_shapes("P100", "G3", "V100M16"), "scale": 0.15}
    cloud = {"shapes": [], "launchDelaySeconds": 5.0}  # empty until the pool grows it
    clusters: list[dict[str, Any]] = [
        {"name": "onprem-a", "labels": {"region": "eu"}, "source": {"simulated": openb_a}},
        {"name": "onprem-b", "labels": {"region": "us"}, "source": {"simulated": openb_b}},
        {"name": "cloud-burst", "kind": "cloud", "labels": {"region": "eu"},
         "costPerGpuHour": 4.1, "source": {"simulated": cloud}},
    ]  # fmt: skip
    burst_pools: list[dict[str, Any]] = [
        {"name": "cloud-a100", "cluster": "cloud-burst", "gpuType": "A100", "gpus": 8,
         "cpu": "96", "memory": "1152Gi", "minNodes": 0, "maxNodes": 16,
         "costPerNodeHour": 32.77, "provisionSeconds": 20.0, "scaleDownAfterSeconds": 60.0,
         "source": {"simulated": {}}},
    ]  # fmt: skip
    queues: list[dict[str, Any]] = [
        {"name": "training", "policy": "gang", "priority": 100, "weight": 2.0, "borrow": True,
         "quota": {"G2": 160, "G3": 48, "V100M32": 8, "A100": 128}},
        {"name": "inference", "policy": "binpack", "priority": 50, "borrow": True,
         "quota": {"T4": 38, "P100": 40, "V100M16": 16, "G2": 32}},
        {"name": "research", "policy": "auto", "quota": {"G2": 24}, "borrow": True,
         "reclaimable": True},
    ]  # fmt: skip
    tenants: list[dict[str, Any]] = [
        {"name": "team-a", "defaultQueue": "training", "queues": ["training", "research"]},
        {"name": "team-b", "defaultQueue": "inference", "queues": ["inference", "research"]},
        {"name": "admin", "defaultQueue": "research", "admin": True,
         "queues": ["training", "inference", "research"]},
    ]  # fmt: skip
    for tenant in tenants:
        tenant["token"] = {"value": tokens[tenant["name"]]}
    data = {
        "store": {"url": sqlite_url(str(data_dir / "fedbroker.db"))},
        # Generous per tenant: the demo's load generator and the crash test submit fast.
        "api": {"rateLimitPerTenant": {"requestsPerSecond": 2000.0, "burst": 4000}},
        "clusters": clusters,
        "burstPools": burst_pools,
        "queues": queues,
        "tenants": tenants,
    }
    return _validated(data, "demo config", {})
