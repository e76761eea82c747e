"""Who may submit what: queues (policy, priority, fair-share weight, quota, borrowing,
reclaimability) and tenants (their queues, their static tokens, admin or not, their Pod
Security profile and service accounts)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from broker.config.auth import BearerTokenRef, StaticToken
from broker.config.section import Section
from broker.manifest import MAX_PRIORITY, DnsLabel, GpuTypeName

# The policy of a queue's jobs that ask for ``auto``. The fgd family packs shared and small
# pods best and costs about three binpack decisions (docs/benchmarks.md); the baselines
# (spread, firstfit, random) and kube-default are for the simulator.
QueuePolicy = Literal["gang", "binpack", "auto", "fgd", "fgd-cpu", "fgd-lp"]
# Kubernetes' Pod Security Standards levels, as the Pod Security Admission labels spell them.
PodSecurityLevel = Literal["privileged", "baseline", "restricted"]
# A RuntimeClass's name (a DNS-1123 subdomain) and a taint's key (a qualified name).
RuntimeClassName = Annotated[
    str, Field(pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$", max_length=253)
]
TaintKey = Annotated[
    str,
    Field(
        pattern=r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$",
        max_length=317,
    ),
]


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
    # Failover: a job Placed or Running on a Kubernetes member stale for this long
    # is requeued (attempts kept) and placed elsewhere. Off (None) by default.
    failover_after_seconds: float | None = Field(default=None, ge=30, le=86_400)


class TenantConfig(Section):
    name: DnsLabel
    default_queue: DnsLabel
    queues: list[DnsLabel] = Field(default_factory=list, max_length=256)
    # The tenant's first token (roles submit, cancel, read; an admin tenant's: admin); more,
    # named and with their own roles, in ``tokens``. Neither: OIDC callers only.
    token: BearerTokenRef | None = None
    tokens: list[StaticToken] = Field(default_factory=list, max_length=64)
    admin: bool = False
    # The Pod Security Standards profile the tenant's pod templates are checked against
    # (and its member namespaces labelled with); "privileged" only by the operator's config.
    pod_security: PodSecurityLevel = "baseline"
    # Service accounts the tenant's pods may name (in its own member namespace).
    service_accounts: list[DnsLabel] = Field(default_factory=lambda: ["default"], max_length=64)
    # RuntimeClasses the tenant's pods may name (``runtimeClassName``); none by default. A
    # class picks the OCI runtime that starts the containers and may add overhead, a node
    # selector and tolerations the placement never sees: list only classes that add none.
    runtime_class_names: list[RuntimeClassName] = Field(default_factory=list, max_length=64)
    # Caps, so one tenant cannot fill the store or hold every connection: jobs
    # not yet finished (a submit beyond it: 403) and open /v1/events streams (beyond: 429).
    max_active_jobs: int = Field(default=10_000, ge=1, le=10_000_000)
    max_event_streams: int = Field(default=8, ge=1, le=10_000)
    # Logs followed at once (GET /v1/jobs/{name}/logs?follow=true; beyond: 429).
    max_log_follows: int = Field(default=4, ge=1, le=10_000)

    @property
    def allowed_queues(self) -> frozenset[str]:
        """Queues this tenant may submit to: the listed ones and its default queue."""
        return frozenset([*self.queues, self.default_queue])
