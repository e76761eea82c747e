"""The member clusters and their burst pools: where each cluster's capacity comes from
(simulated shapes, a Kubernetes list+watch, an MQTT agent) and where a pool's nodes come
from (simulated, Cluster API); each source is a union keyed by its one key."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal, Self

from pydantic import Field, field_validator, model_validator
from pydantic.alias_generators import to_camel

from adapters.simulated import NodeShape, generate_nodes, lay_topology
from broker.config.section import Section, TokenRef
from broker.manifest import (
    MAX_GPUS_PER_POD,
    CpuQuantity,
    DnsLabel,
    FieldError,
    GpuTypeName,
    Labels,
    LabelValue,
    MemoryQuantity,
    cpu_millicores,
    memory_mebibytes,
    qualified_key,
)
from broker.model import Cluster, ClusterKind, Node

MAX_TOPOLOGY_LEVELS = 8

MAX_SIMULATED_NODES = 50_000  # per cluster: far above the trace inventories, still in memory

TENANT_PLACEHOLDER = "{tenant}"
# Namespaces a tenant's pods must never go into: Kubernetes' own, the broker's own in a
# member cluster (deploy/kustomize/member-cluster: its ServiceAccount and token Secret), and
# fedbroker-jobs, where member clusters set up before per-tenant namespaces keep that token.
RESERVED_NAMESPACES = frozenset(
    {"default", "kube-system", "kube-public", "kube-node-lease", "fedbroker", "fedbroker-jobs"}
)
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_NAME_PART = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")
_PATTERN_HEAD = re.compile(r"([a-z0-9][-a-z0-9]*)?")
_PATTERN_TAIL = re.compile(r"([-a-z0-9]*[a-z0-9])?")


def _namespace_pattern(pattern: str) -> str:
    """DNS-1123 label characters around exactly one ``{tenant}``: every tenant name (itself
    a DNS-1123 label) then gives a DNS-1123 label, if short enough (checked per tenant)."""
    head, *tails = pattern.split(TENANT_PLACEHOLDER)
    if (
        len(tails) != 1
        or not _PATTERN_HEAD.fullmatch(head)
        or not _PATTERN_TAIL.fullmatch(tails[0])
        or len(head) + len(tails[0]) > 62
    ):
        raise ValueError(
            "must be lowercase letters, digits and '-' around exactly one '{tenant}' "
            "(e.g. 'fedbroker-{tenant}'), at most 62 characters besides it"
        )
    return pattern


def dns_subdomain(name: str) -> str:
    """A DNS-1123 subdomain (a scheduler's or a Volcano queue's name)."""
    if len(name) > 253 or not _DNS_SUBDOMAIN.fullmatch(name):
        raise ValueError(
            f"not a DNS-1123 subdomain (lowercase letters, digits, '-' and '.', starting and "
            f"ending with a letter or digit, at most 253 characters): {name!r}"
        )
    return name


def extended_resource(name: str) -> str:
    """A domain-qualified extended resource name (``example.com/gpu``), as Kubernetes
    requires of every resource that is not its own (``cpu``, ``memory``, ...): a DNS
    subdomain outside ``kubernetes.io``, ``/``, a name of at most 63 characters."""
    domain, slash, rest = name.partition("/")
    if (
        not slash
        or len(domain) > 253
        or not _DNS_SUBDOMAIN.fullmatch(domain)
        or len(rest) > 63
        or not _NAME_PART.fullmatch(rest)
        or domain == "kubernetes.io"
        or domain.endswith(".kubernetes.io")
        or name.startswith("requests.")
    ):
        raise ValueError(
            f"not a domain-qualified extended resource name (e.g. example.com/gpu-milli; "
            f"Kubernetes refuses others): {name!r}"
        )
    return name


class OneOf(Section):
    """A union keyed by its one key: every field names an adapter, exactly one is given."""

    @model_validator(mode="after")
    def _exactly_one(self) -> Self:
        given = [name for name in type(self).model_fields if getattr(self, name) is not None]
        if len(given) != 1:
            raise FieldError([], f"give exactly one of: {', '.join(type(self).model_fields)}")
        return self

    @property
    def kind(self) -> str:
        """The adapter's name: the one key given."""
        return next(name for name in type(self).model_fields if getattr(self, name) is not None)


class ShapeSpec(Section):
    """``count`` nodes alike; for a cloud pool, the most nodes it can scale to."""

    gpu_type: GpuTypeName
    gpus: int = Field(ge=0, le=MAX_GPUS_PER_POD)
    cpu: CpuQuantity
    memory: MemoryQuantity
    count: int = Field(ge=1, le=MAX_SIMULATED_NODES)
    labels: Labels = Field(default_factory=dict)  # every node of the shape carries them

    def node_shape(self) -> NodeShape:
        return NodeShape(
            self.gpu_type,
            self.gpus,
            cpu_millicores(self.cpu),
            memory_mebibytes(self.memory),
            self.count,
            tuple(sorted(self.labels.items())),
        )


def _label_keys(keys: list[str]) -> list[str]:
    """Node label keys, each once (ValueError naming the first that is not)."""
    for key in keys:
        qualified_key(key)
    if len(set(keys)) != len(keys):
        raise ValueError("duplicate label key")
    return keys


class SimulatedTopology(Section):
    """Racks (and blocks) laid over the generated nodes (``adapters.simulated.
    lay_topology``): ``levels`` are the label keys, ``[rack]`` or ``[block, rack]``; racks
    of ``nodesPerRack`` alike nodes, blocks of ``racksPerBlock`` racks; values ``b0``,
    ``b0-r1``, ... (``r0``, ``r1``, ... without blocks)."""

    levels: list[str] = Field(min_length=1, max_length=2)
    nodes_per_rack: int = Field(ge=1, le=MAX_SIMULATED_NODES)
    racks_per_block: int | None = Field(default=None, ge=1, le=MAX_SIMULATED_NODES)

    @field_validator("levels")
    @classmethod
    def _levels(cls, levels: list[str]) -> list[str]:
        return _label_keys(levels)

    @model_validator(mode="after")
    def _blocks(self) -> SimulatedTopology:
        if (len(self.levels) == 2) != (self.racks_per_block is not None):
            raise FieldError(["racksPerBlock"], "given exactly when levels are [block, rack]")
        return self


class SimulatedSource(Section):
    # Empty for a cloud cluster that only burst pools fill.
    shapes: list[ShapeSpec] = Field(default_factory=list, max_length=64)
    scale: float = Field(default=1.0, gt=0, le=100)  # as in adapters.simulated.generate_nodes
    launch_delay_seconds: float = Field(default=0.0, ge=0, le=3600)
    failure_rate: float = Field(default=0.0, ge=0, le=1)
    topology: SimulatedTopology | None = None

    @model_validator(mode="after")
    def _fits_in_memory(self) -> SimulatedSource:
        nodes = sum(max(1, round(s.count * self.scale)) for s in self.shapes)
        if nodes > MAX_SIMULATED_NODES:
            raise FieldError(["scale"], f"{nodes} nodes, at most {MAX_SIMULATED_NODES}")
        return self

    def node_shapes(self) -> list[NodeShape]:
        return [s.node_shape() for s in self.shapes]

    def nodes(self, prefix: str) -> list[Node]:
        """The cluster's nodes, named ``<prefix>-0000``..., with their racks and blocks."""
        nodes = generate_nodes(self.node_shapes(), prefix, self.scale)
        top = self.topology
        if top is None:
            return nodes
        return lay_topology(nodes, top.levels, top.nodes_per_rack, top.racks_per_block or 0)


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
        """What ``adapters.kubeapi.kubeconfig.load_clients`` reads: the file, or the inline one."""
        if self.kubeconfig is not None:
            return Path(self.kubeconfig)
        assert self.kubeconfig_inline is not None
        return self.kubeconfig_inline


class KubeLaunchFields(Section):
    """How gangs are launched into a Kubernetes member, whoever launches them (the broker
    for a ``kube`` member, the member's agent in pull mode: ``broker.agent.config``): into
    their tenant's namespace, ``namespacePattern`` with ``{tenant}`` replaced by the
    tenant's name (created if missing), in ``launchMode``, with the member's GPU resource
    names and timings."""

    namespace_pattern: str = Field(default="fedbroker-{tenant}", max_length=80)
    gpu_resources: list[str] = Field(
        default_factory=lambda: ["nvidia.com/gpu", "amd.com/gpu"], min_length=1, max_length=16
    )
    gpu_type_label: str = Field(default="nvidia.com/gpu.product", min_length=1, max_length=317)
    shared_gpu_resource: str | None = Field(default=None, min_length=1, max_length=317)
    launch_mode: Literal["delegate", "pin"] = "delegate"
    pod_group: Literal["coscheduling", "volcano"] = "coscheduling"
    # Delegate mode: the scheduler our pods name (scheduler-plugins installed as a second
    # scheduler: its name, e.g. scheduler-plugins-scheduler). Default: none for coscheduling
    # (the member's default scheduler), "volcano" for volcano.
    scheduler_name: str | None = Field(default=None, max_length=253)
    # Volcano PodGroups: fedbroker queue -> Volcano Queue (which must exist and be Open);
    # an unmapped queue -> "default", the Queue Volcano installs.
    volcano_queues: dict[DnsLabel, str] = Field(default_factory=dict, max_length=256)
    # How often workload objects (and their pods) are read, one LIST per kind for all of
    # them, and a starting delegate-mode gang's PodGroup. Our pods' phases (a gang started,
    # a gang ended) come from one watch of our pods instead, as they change.
    pod_poll_seconds: float = Field(default=2.0, gt=0, le=300)
    # The watch of our pods is backed by a full relist this often (and after a failure): a
    # lost event delays a gang's start or end by at most this much.
    pod_resync_seconds: float = Field(default=300.0, gt=0, le=86400)
    # A watch that hears nothing (not even a bookmark) this long is restarted; a server
    # that accepts but never answers counts as down after it. Lists time out after
    # requestTimeoutSeconds.
    watch_inactivity_seconds: float = Field(default=90.0, gt=0, le=3600)
    request_timeout_seconds: float = Field(default=30.0, gt=0, le=600)

    @model_validator(mode="before")
    @classmethod
    def _no_fixed_namespace(cls, data: Any) -> Any:
        if isinstance(data, dict) and "namespace" in data:
            raise FieldError(
                ["namespace"],
                "replaced by namespacePattern: one namespace per tenant, created by the broker "
                "(default 'fedbroker-{tenant}')",
            )
        return data

    @field_validator("namespace_pattern")
    @classmethod
    def _pattern(cls, pattern: str) -> str:
        return _namespace_pattern(pattern)

    def namespace_for(self, tenant: str) -> str:
        return self.namespace_pattern.replace(TENANT_PLACEHOLDER, tenant)

    def namespace_problem(self, tenant: str) -> str | None:
        """Why the tenant's namespace would be unusable (too long, reserved), or None."""
        name = self.namespace_for(tenant)
        if len(name) > 63:
            return f"gives {name!r} for tenant {tenant!r}: longer than 63 characters"
        if name in RESERVED_NAMESPACES:
            return f"gives {name!r} for tenant {tenant!r}: a namespace reserved for the system"
        return None

    @field_validator("gpu_resources")
    @classmethod
    def _resource_names(cls, names: list[str]) -> list[str]:
        for name in names:
            extended_resource(name)
        if len(set(names)) != len(names):
            raise ValueError("duplicate resource name")
        return names

    @field_validator("shared_gpu_resource")
    @classmethod
    def _shared_resource_name(cls, name: str | None) -> str | None:
        return None if name is None else extended_resource(name)

    @field_validator("scheduler_name")
    @classmethod
    def _scheduler_name(cls, name: str | None) -> str | None:
        return None if name is None else dns_subdomain(name)

    @field_validator("volcano_queues")
    @classmethod
    def _volcano_queues(cls, queues: dict[str, str]) -> dict[str, str]:
        for name in queues.values():
            dns_subdomain(name)
        return queues


class KubeSource(KubeconfigRef, KubeLaunchFields):
    """A real Kubernetes member cluster: one context of a kubeconfig, given as a file path
    (``kubeconfig``, relative to the working directory) or inline (``kubeconfigInline``: the
    kubeconfig as a mapping or YAML text). Capacity comes from a list+watch of its nodes and
    pods; gangs are launched as ``KubeLaunchFields`` say."""


class MqttSource(Section):
    """A member cluster whose capacity an agent (``fedbroker agent``) reports over MQTT
    (``events.mqtt`` names the MQTT broker). Stale while the agent's last heartbeat is older
    than ``staleAfterSeconds`` (default: ``scheduler.staleAfterSeconds``). ``commandKey``:
    the secret the broker and that cluster's agent sign commands and replies with; without
    it the broker sends the agent nothing, and no job that needs a launch goes there."""

    stale_after_seconds: float | None = Field(default=None, gt=0, le=3600)
    command_key: TokenRef | None = Field(default=None, repr=False)


class ClusterSource(OneOf):
    """Where a cluster's capacity comes from: exactly one key names the adapter. A union
    keyed by its one key (``{simulated: {...}}``, ``{kube: {...}}`` or ``{mqtt: {...}}``)."""

    simulated: SimulatedSource | None = None
    kube: KubeSource | None = None
    mqtt: MqttSource | None = None


class ClusterConfig(Section):
    name: DnsLabel
    kind: ClusterKind = "onprem"
    labels: Labels = Field(default_factory=dict)
    cost_per_gpu_hour: float = Field(default=0.0, ge=0, le=10_000)
    # Node label keys of its topology domains, widest first (block, rack, host).
    topology_levels: list[str] = Field(default_factory=list, max_length=MAX_TOPOLOGY_LEVELS)
    source: ClusterSource

    @field_validator("topology_levels")
    @classmethod
    def _levels(cls, levels: list[str]) -> list[str]:
        return _label_keys(levels)

    def to_cluster(self) -> Cluster:
        return Cluster(
            self.name, dict(self.labels), self.kind, self.cost_per_gpu_hour,
            tuple(self.topology_levels),
        )  # fmt: skip


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


class PoolSource(OneOf):
    """Where a burst pool's nodes come from: exactly one key names the adapter."""

    simulated: SimulatedPoolSource | None = None
    capi: CapiPoolSource | None = None


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
    # The topology domains its nodes join: level label key -> value (``b0-r3``).
    topology_labels: dict[str, LabelValue] = Field(
        default_factory=dict, max_length=MAX_TOPOLOGY_LEVELS
    )
    source: PoolSource

    @field_validator("topology_labels")
    @classmethod
    def _topology_keys(cls, labels: dict[str, str]) -> dict[str, str]:
        _label_keys(list(labels))
        return labels

    @model_validator(mode="after")
    def _shape_for_simulated(self) -> BurstPoolConfig:
        if self.source.simulated is not None:
            for key in ("gpu_type", "gpus", "cpu", "memory", "max_nodes"):
                if getattr(self, key) is None:
                    raise FieldError([to_camel(key)], "required for a simulated pool")
        if None not in (self.min_nodes, self.max_nodes) and self.min_nodes > self.max_nodes:  # type: ignore[operator]
            raise FieldError(["minNodes"], "must be <= maxNodes")
        return self
