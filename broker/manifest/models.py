"""The FederatedJob wire models: what a user may submit, in camelCase wire names.

Pydantic models whose aliases are the wire names, nothing unknown accepted and no silent
coercion; the cross-field checks of a whole job; and the JSON schema the OpenAPI document
is generated from (broker.http.openapi).
"""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    field_validator,
    model_validator,
)
from pydantic.alias_generators import to_camel
from pydantic.json_schema import DEFAULT_REF_TEMPLATE, WithJsonSchema

from broker.interned import frozen, shared
from broker.manifest import workloads
from broker.manifest.errors import FieldError, show
from broker.manifest.fields import (
    MAX_BACKOFF_LIMIT,
    MAX_GPU_TYPES,
    MAX_GPUS_PER_POD,
    MAX_KIND_LENGTH,
    MAX_POD_SETS,
    MAX_PODS,
    MAX_PODS_PER_SET,
    MAX_PRIORITY,
    MAX_TIMEOUT_SECONDS,
    Annotations,
    CpuQuantity,
    DnsLabel,
    GpuTypeName,
    Labels,
    MemoryQuantity,
)
from broker.manifest.noderules import toleration_of
from broker.manifest.topology import annotated, check_slices, qualified_key
from broker.manifest.workloads import Path
from broker.model import PolicyName, TopologyRequest
from broker.taints import Toleration

API_VERSION = "fedbroker.io/v1alpha1"
KIND = "FederatedJob"
DEFAULT_MASTER_PORT = 29500


class WireModel(BaseModel):
    """camelCase on the wire, nothing unknown, no silent coercion ("8" is not a count)."""

    model_config = ConfigDict(alias_generator=to_camel, extra="forbid", strict=True, frozen=True)


def plain_json(data: dict[str, Any]) -> dict[str, Any]:
    """``data`` if it is plain JSON (string keys, finite numbers, no dates, sets or bytes),
    so storing and echoing it can never fail later; FieldError naming the first culprit."""
    stack: list[tuple[tuple[str | int, ...], object]] = [((), data)]
    while stack:
        path, value = stack.pop()
        if isinstance(value, dict):
            for key, item in value.items():
                if not isinstance(key, str):
                    raise FieldError(path, f"keys must be strings, got {show(key)}")
                stack.append(((*path, key), item))
        elif isinstance(value, list):
            stack.extend(((*path, i), item) for i, item in enumerate(value))
        elif isinstance(value, float) and not math.isfinite(value):
            raise FieldError(path, "must be a finite number")
        elif value is not None and not isinstance(value, str | int | float | bool):
            raise FieldError(path, f"must be plain JSON, got {type(value).__name__}")
    return data


class Metadata(WireModel):
    name: DnsLabel
    namespace: DnsLabel | None = None
    # Free for the owner (``fedbroker list -l team=vision``); the CLI's submit adds
    # ``fedbroker.io/submitted-by`` (``list --mine``). Not copied to pods. None when absent
    # (so a manifest without labels is stored, and shown, as it was sent).
    labels: Labels | None = None


class GangSpec(WireModel):
    min_member: int = Field(default=0, ge=0, le=MAX_PODS, description="0 means all pods")
    schedule_timeout_seconds: int = Field(default=600, ge=1, le=MAX_TIMEOUT_SECONDS)
    backoff_limit: int | None = Field(default=None, ge=0, le=MAX_BACKOFF_LIMIT)


class PlacementSpec(WireModel):
    gpu_types: list[GpuTypeName] = Field(default_factory=list, max_length=MAX_GPU_TYPES)
    cluster_selector: Labels = Field(default_factory=dict)
    # Opt-in: a cloud node costs money, so a job bursts only when its owner said so.
    allow_burst: bool = False


class ResourcesSpec(WireModel):
    nvidia_gpu: int | None = Field(default=None, alias="nvidia.com/gpu", ge=0, le=MAX_GPUS_PER_POD)
    amd_gpu: int | None = Field(default=None, alias="amd.com/gpu", ge=0, le=MAX_GPUS_PER_POD)
    gpu_milli: int | None = Field(default=None, alias="fedbroker.io/gpu-milli", ge=1, le=999)
    cpu: CpuQuantity | None = None
    memory: MemoryQuantity | None = None

    @model_validator(mode="after")
    def _one_kind_of_gpu(self) -> ResourcesSpec:
        if self.nvidia_gpu is not None and self.amd_gpu is not None:
            raise FieldError(["amd.com/gpu"], "ask for nvidia.com/gpu or amd.com/gpu, not both")
        if self.gpus and self.gpu_milli is not None:
            raise FieldError(
                ["fedbroker.io/gpu-milli"],
                "ask for whole GPUs or a fedbroker.io/gpu-milli share of one, not both",
            )
        return self

    @property
    def gpus(self) -> int:
        return self.nvidia_gpu or self.amd_gpu or 0


TopologyKey = Annotated[
    str,
    AfterValidator(qualified_key),
    WithJsonSchema({"type": "string", "maxLength": 317, "description": "a node label key"}),
]


class TopologySpec(WireModel):
    """Where a pod set's pods sit together (node label keys of the member's
    ``topologyLevels``): inside one domain of ``required`` (never spanning) or of
    ``preferred`` (wider ones, then the whole cluster, when none fits), and in slices of
    ``sliceSize`` pods each inside one domain of ``sliceRequired``."""

    required: TopologyKey | None = None
    preferred: TopologyKey | None = None
    slice_size: int | None = Field(default=None, ge=1, le=MAX_PODS_PER_SET)
    slice_required: TopologyKey | None = None

    @model_validator(mode="after")
    def _coherent(self) -> TopologySpec:
        if self.required is not None and self.preferred is not None:
            raise FieldError(["preferred"], "give required or preferred, not both")
        if (self.slice_size is None) != (self.slice_required is None):
            missing = "sliceRequired" if self.slice_required is None else "sliceSize"
            raise FieldError([missing], "sliceSize and sliceRequired go together")
        if self.required is None and self.preferred is None and self.slice_size is None:
            raise FieldError([], "give required, preferred, or sliceSize with sliceRequired")
        return self

    def request(self) -> TopologyRequest:
        return TopologyRequest(
            self.required or "", self.preferred or "", self.slice_size or 0,
            self.slice_required or "",
        )  # fmt: skip


class PodSetSpec(WireModel):
    name: DnsLabel
    count: int = Field(ge=1, le=MAX_PODS_PER_SET)
    # Left out (or partly), the resources are derived from the template's containers when
    # the tenant's template policy admits the job (broker.manifest.podpolicy).
    resources: ResourcesSpec = Field(default_factory=ResourcesSpec)
    # Free-form pod template, handed to the cluster as is; only checked to be plain JSON so
    # storing and echoing it can never fail later (YAML can hold dates, sets and bytes).
    template: dict[str, Any] = Field(default_factory=dict)
    topology: TopologySpec | None = None

    @field_validator("template")
    @classmethod
    def _plain_json(cls, template: dict[str, Any]) -> dict[str, Any]:
        return plain_json(template)

    @model_validator(mode="after")
    def _whole_slices(self) -> PodSetSpec:
        if self.topology is not None and self.topology.slice_size is not None:
            check_slices(self.count, self.topology.slice_size, ("topology", "sliceSize"))
        return self

    def tolerations(self) -> frozenset[Toleration]:
        """What the template's pods tolerate (``spec.tolerations``), so the placement honours
        the tolerations the cluster will, matched as Kubernetes matches them; one shared set
        for equal ones. An entry the template policy would refuse tolerates nothing here."""
        spec = self.template.get("spec")
        items = spec.get("tolerations") if isinstance(spec, dict) else None
        if not isinstance(items, list):
            return frozen(())
        return shared(frozen(t for t in map(toleration_of, items) if t is not None))


class RendezvousSpec(WireModel):
    # The port every pod of a podSets gang is told in MASTER_PORT (rank 0 listens on it).
    master_port: int = Field(default=DEFAULT_MASTER_PORT, ge=1, le=65535)


class WorkloadMetadata(WireModel):
    """A workload object's metadata: only labels and annotations (the launcher names it and
    chooses its namespace)."""

    labels: Labels = Field(default_factory=dict)
    annotations: Annotations = Field(default_factory=dict)


class WorkloadObject(WireModel):
    """``spec.workload``: one Kubernetes object of a supported kind (``workloads``), created
    in the member by the launcher; its controller makes the pods. Its pod sets are derived
    from it as Kueue derives them, and every bound of ``podSets`` holds for them."""

    api_version: str = Field(max_length=MAX_KIND_LENGTH)
    kind: str = Field(max_length=MAX_KIND_LENGTH)
    metadata: WorkloadMetadata | None = None
    spec: dict[str, Any]
    # The member runtime a kind's pods are shaped by (a TrainJob's), written by the broker
    # when the job is admitted (``broker.service.admission`` replaces whatever was sent):
    # ``kind``, ``name``, ``clusters`` (the members whose runtime makes these pods) and the
    # runtime's ``spec``.
    runtime: dict[str, Any] | None = None

    @field_validator("spec", "runtime")
    @classmethod
    def _plain_json(cls, spec: dict[str, Any] | None) -> dict[str, Any] | None:
        return None if spec is None else plain_json(spec)

    @property
    def unresolved(self) -> bool:
        """Its pods are shaped by a member runtime not looked up yet (pod sets unknown)."""
        return self.runtime is None and workloads.runtime_named(self.wire()) is not None

    @model_validator(mode="after")
    def _derived(self) -> WorkloadObject:
        found = workloads.integration(self.api_version, self.kind)
        if self.runtime is not None and found.runtime_ref is None:
            # Only the broker writes a runtime, and only for a kind a runtime shapes.
            raise FieldError(("runtime",), f"a {self.kind} has no member runtime")
        if self.unresolved:
            return self  # counted once the service has looked its runtime up
        spec = found.completed(self.spec)
        obj = {"apiVersion": self.api_version, "kind": self.kind, "spec": spec}
        workloads.derive(obj if self.runtime is None else {**obj, "runtime": self.runtime})
        return self if spec is self.spec else self.model_copy(update={"spec": spec})

    def wire(self) -> dict[str, Any]:
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)

    def pod_sets(self) -> list[workloads.DerivedPodSet]:
        return workloads.derive(self.wire())


class JobSpec(WireModel):
    queue: DnsLabel | None = None
    priority: int = Field(default=0, ge=-MAX_PRIORITY, le=MAX_PRIORITY)
    policy: PolicyName = "auto"
    gang: GangSpec = GangSpec()  # frozen, so one shared default is safe
    placement: PlacementSpec = PlacementSpec()
    pod_sets: list[PodSetSpec] | None = Field(default=None, min_length=1, max_length=MAX_POD_SETS)
    workload: WorkloadObject | None = None
    rendezvous: RendezvousSpec | None = None

    @model_validator(mode="after")
    def _whole_job(self) -> JobSpec:
        if (self.pod_sets is None) == (self.workload is None):
            both = self.workload is not None
            raise FieldError(
                ["workload" if both else "podSets"],
                "give podSets or workload, not both" if both else "required: podSets or workload",
            )
        seen: set[str] = set()
        for i, pod_set in enumerate(self.pod_sets or ()):
            if pod_set.name in seen:
                raise FieldError(["podSets", i, "name"], f"duplicate pod set name {pod_set.name!r}")
            seen.add(pod_set.name)
        if self.workload is not None and self.workload.unresolved:
            return self  # its pods are counted once its runtime is looked up
        views = self.pod_set_views()
        total = sum(ps.count for ps, _ in views)
        if total > MAX_PODS:
            raise FieldError(["podSets"], f"{total} pods in all, at most {MAX_PODS} allowed")
        if self.gang.min_member > total:
            raise FieldError(["gang", "minMember"], f"must be <= the job's {total} pods")
        self.topologies(views)
        return self

    def topologies(
        self, views: list[tuple[PodSetSpec, Path]] | None = None
    ) -> list[TopologyRequest | None]:
        """Each pod set's topology request (in the order of ``views``, default
        ``pod_set_views()``): its ``topology``, or what its template's Kueue or KAI
        annotations say (KAI's also on the workload object); FieldError (path from the
        spec) naming the annotation that is wrong or conflicts."""
        meta = self.workload.metadata if self.workload is not None else None
        owner = meta.annotations if meta is not None else None
        out: list[TopologyRequest | None] = []
        for ps, at in self.pod_set_views() if views is None else views:
            found = annotated(
                ps.template, ps.count, at[1:], owner, ("workload", "metadata", "annotations")
            )
            given = ps.topology.request() if ps.topology is not None else None
            if given is not None and found is not None and found != given:
                why = "a topology annotation conflicts with the pod set's topology"
                raise FieldError((*at[1:], "metadata", "annotations"), why)
            out.append(given or found)
        return out

    def pod_set_views(self) -> list[tuple[PodSetSpec, Path]]:
        """Every pod set with its template's path from the manifest root: the given
        ``podSets``, or those derived from ``workload`` (resources left out: the template
        says them)."""
        if self.workload is None:
            return [(ps, ("spec", "podSets", i, "template"))
                    for i, ps in enumerate(self.pod_sets or ())]  # fmt: skip
        return [
            (
                PodSetSpec.model_construct(
                    name=d.name, count=d.count, resources=ResourcesSpec(), template=d.template
                ),
                ("spec", "workload", *d.path),
            )
            for d in self.workload.pod_sets()
        ]

    @property
    def total_pods(self) -> int:
        return sum(ps.count for ps, _ in self.pod_set_views())


class FederatedJob(WireModel):
    api_version: Literal["fedbroker.io/v1alpha1"]
    kind: Literal["FederatedJob"]
    metadata: Metadata
    spec: JobSpec

    def wire(self) -> dict[str, Any]:
        """The manifest as JSON-ready data in its wire names (parses back to an equal one)."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)


def json_schema(ref_template: str = DEFAULT_REF_TEMPLATE) -> dict[str, Any]:
    """The FederatedJob JSON schema, in wire names, for the OpenAPI document."""
    return FederatedJob.model_json_schema(by_alias=True, ref_template=ref_template)
