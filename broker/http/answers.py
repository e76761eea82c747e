"""The pydantic models of the API's answers: what ``broker.http.routes`` writes, as the
OpenAPI document (``broker.http.openapi``) describes it; the schemathesis test checks every
answer against them."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from broker.config import QueuePolicy
from broker.core.burst_option import OptionCode
from broker.figures import ALLOCATED, FREE, RESERVED, STRANDED, TOTAL
from broker.http.openapi_pods import POD_MODELS
from broker.store import JOB_STATES

REF = "#/components/schemas/{model}"
JobStateName = Literal["Queued", "Placed", "Running", "Succeeded", "Failed", "Cancelled"]
assert set(JobStateName.__args__) == set(JOB_STATES)  # type: ignore[attr-defined]


class Out(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True)


class Error(Out):
    error: str = Field(description="what is wrong, starting with the field it is about")


class HistoryEntry(Out):
    at: float
    state: JobStateName
    reason: str
    cluster: str | None


class JobStatus(Out):
    state: JobStateName
    cluster: str | None
    reason: str
    queue: str
    attempts: int
    generation: int = Field(description="1, then +1 each time a finished job's name is reused")
    not_before: float | None
    created_at: float
    updated_at: float
    history: list[HistoryEntry] | None = Field(default=None, description="GET of one job only")
    waiting: str | None = Field(
        default=None,
        description="a queued job: why it waited at the scheduler's last look, in one line "
        "(the leader's answer; `explain` has every cluster's)",
    )


class Job(Out):
    api_version: str | None
    kind: str | None
    metadata: dict[str, Any]
    spec: dict[str, Any]
    status: JobStatus


class JobList(Out):
    items: list[Job]
    continue_: str | None = Field(
        alias="continue", description="the cursor for the next page (query `continue`)"
    )


class Reason(Out):
    code: str
    message: str


class ClusterFit(Out):
    cluster: str
    fits: bool
    reasons: list[Reason]
    largest_fit: int


class QueuePosition(Out):
    queue: str
    position: int | None = Field(
        description="1 = the next job the cycles try, across every queue (null while the job "
        "backs off); jobs ahead counted as placed in turn, each charged to its queue's fair share"
    )
    waiting: int | None = Field(description="jobs eligible now, every queue")
    in_queue: int | None = Field(description="1 = next among its own queue's jobs")
    queue_waiting: int | None
    same_gpu_type_ahead: int | None = Field(
        description="jobs ahead of it that may take GPUs of a type it may take"
    )
    backoff_until: float | None = Field(description="backing off after a failed attempt until")


class BurstRefusal(Out):
    pool: str = Field(description="empty when about no pool in particular")
    code: OptionCode
    message: str
    until: float | None = Field(
        description="backing-off: when the pool may grow again; unavailable: its next read"
    )


class BurstOption(Out):
    status: Literal["requested", "planned", "none"] = Field(
        description="requested: nodes are coming for it; planned: the pool that will be grown "
        "once it may burst (eligibleAt); none: why no pool can take it (refusals)"
    )
    pool: str | None
    cluster: str | None
    nodes: int = Field(description="the gang's nodes from the pool")
    new_nodes: int = Field(description="of those, the nodes the pool grows by")
    arrived: int = Field(description="requested: of those, the nodes up now")
    provision_seconds: float | None
    cost_per_node_hour: float | None
    cost_per_hour: float | None = Field(description="of the gang's nodes from the pool")
    waiting_since: float | None
    burst_after_seconds: float | None
    eligible_at: float | None = Field(description="waitingSince + the pool's burstAfterSeconds")
    requested_at: float | None
    deadline: float | None = Field(description="requested: the provisioning timeout")
    refusals: list[BurstRefusal]


class Explain(Out):
    job: str
    state: JobStateName
    cluster: str | None
    reason: str
    clusters: list[ClusterFit]
    position: QueuePosition | None = Field(description="null when not waiting in a queue")
    burst: BurstOption | None = Field(description="null when not waiting in a queue")
    never_fits: str | None = Field(
        description="why no cluster could take the job even empty (and, if it may burst, with "
        "every burst pool at its maxNodes); null when one may, when a cluster it may go to is "
        "not read yet or stale, or when not waiting in a queue"
    )


class Plan(Out):
    job: str
    queue: str
    fits: bool
    cluster: str | None
    pods: int
    clusters: list[ClusterFit]


class GpuTypeCapacity(Out):
    """One GPU type of a cluster, its figures named as in docs/observability.md's glossary."""

    gpu_type: str
    total: int = Field(description=TOTAL.meaning)
    free: float = Field(description=FREE.meaning)
    reserved: float = Field(description=RESERVED.meaning)
    allocated: float = Field(description=ALLOCATED.meaning)
    largest_gang: int = Field(
        description="pods of gangGpusPerPod whole GPUs that could be "
        "placed now (the metric counts them in GPUs)"
    )
    gang_gpus_per_pod: int
    stranded: float | None = Field(
        default=None, description=f"{STRANDED.meaning}; in GET /v1/clusters only"
    )


class TopologyDomain(Out):
    domain: str = Field(description="the level's label value")
    nodes: int = Field(description="schedulable GPU nodes")
    free_nodes: int = Field(description="of them, with every GPU free")
    gpus: int
    free_gpus: float


class DomainGang(Out):
    gpu_type: str
    largest_gang: int = Field(description="pods of gangGpusPerPod whole GPUs in one domain")
    domain: str = Field(description="where (empty: no domain takes one pod)")


class TopologyLevel(Out):
    level: str = Field(description="the node label key")
    name: str = Field(description="its short name (rack for .../topology-rack)")
    domains: list[TopologyDomain] = Field(description="by label value, at most 64")
    more: int = Field(description="domains not listed")
    unlabelled: int = Field(description="schedulable GPU nodes without the label")
    largest_gangs: list[DomainGang]
    gang_gpus_per_pod: int


class ClusterCapacity(Out):
    cluster: str
    kind: Literal["onprem", "cloud"]
    stale: bool
    labels: dict[str, str]
    gpu_types: list[GpuTypeCapacity]
    # Kubernetes members only: is the watch connected, and how often it relisted.
    connected: bool | None = None
    relists: int | None = None
    topology: list[TopologyLevel] = Field(
        default_factory=list, description="its declared topology levels, widest first"
    )


class Clusters(Out):
    clusters: list[ClusterCapacity]


class QueueInfo(Out):
    name: str
    policy: QueuePolicy
    priority: int
    weight: float
    quota: dict[str, float]
    borrow: bool
    reclaimable: bool
    pending: int
    usage: dict[str, float]
    oldest_wait_seconds: float = Field(
        description="seconds its longest-waiting pending job has been queued (0: none waits)"
    )


class Queues(Out):
    queues: list[QueueInfo]


class PoolInfo(Out):
    pool: str
    cluster: str
    owner: Literal["fedbroker", "cluster-autoscaler"]
    gpu_type: str
    replicas: int
    min_nodes: int
    max_nodes: int
    ready: int = Field(description="nodes the broker added that are up")
    coming: int = Field(description="nodes asked for and not up yet")
    failing: bool = Field(description="backing off after a provisioning failure")
    scale_ups: int
    scale_downs: int
    nodes_added: int
    provision_failures: int
    node_hours: float
    idle_node_hours: float
    cost: float
    cost_per_node_hour: float


class BurstRequest(Out):
    job: str
    pool: str
    nodes: int
    arrived: int
    requested_at: float
    deadline: float


class JobBurstCost(Out):
    job: str
    node_hours: float
    cost: float


class Pools(Out):
    pools: list[PoolInfo]
    requests: list[BurstRequest] = Field(description="gangs waiting for burst nodes")
    jobs: list[JobBurstCost] = Field(description="burst node-hours and cost per job")


class NodeOccupancy(Out):
    name: str
    gpu_type: str
    gpus: int
    used: float = Field(description="GPUs taken by bound pods")
    reserved: float = Field(description="GPUs the broker assumed for placements not yet running")
    free: float
    burst: bool = Field(description="added by a burst pool")
    schedulable: bool
    reserved_for: list[str] = Field(description="jobs holding reservations here (own tenant's)")


class ClusterNodes(Out):
    cluster: str
    kind: Literal["onprem", "cloud"]
    stale: bool
    nodes: list[NodeOccupancy]


class Nodes(Out):
    clusters: list[ClusterNodes]


class PoolAvailability(Out):
    pool: str
    available: bool = Field(description="read, and taking part in bursting")
    reason: str | None = Field(
        description="why it cannot be read yet: the HTTP status or the kind of failure"
    )
    since: float | None = Field(description="unavailable since (the broker's start)")
    attempts: int = Field(description="reads failed so far")
    retry_at: float | None = Field(description="the next read")


class Health(Out):
    status: str
    burst_pools: list[PoolAvailability] | None = Field(
        default=None, description="/readyz once ready: every burst pool, read or why not yet"
    )


RESPONSE_MODELS: tuple[type[BaseModel], ...] = (
    Error, Job, JobList, Explain, Plan, Clusters, Queues, Pools, Nodes, Health, *POD_MODELS,
)  # fmt: skip
