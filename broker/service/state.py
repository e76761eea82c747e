"""The live broker's shared state: what admission, binding and recovery act on, and when.

``Shared`` holds the ledger, the queue, the gang lifecycle, the store, the one lock every
state change runs under, the scheduler's wake-up, the task supervisor and the single
answer to "is this replica placing now" (``leading``: elected, state rebuilt, and the lease
renewed recently enough). ``compose.build`` makes one per service.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from broker.config import Config
from broker.core.ledger import Ledger
from broker.core.lifecycle import Lifecycle
from broker.core.queue import JobQueue, Pending
from broker.core.scheduler import PolicyBook, SchedulerSettings
from broker.core.shapes import UnplaceableShapes
from broker.manifest import (
    API_VERSION,
    KIND,
    master_port,
    pod_templates,
    stored_manifest,
    to_job,
    workload_object,
)
from broker.model import CapacitySnapshot, Job, Placement, Unplaceable
from broker.ports import Launcher
from broker.service.active import ActiveCounts
from broker.service.finished_pods import FinishedPods
from broker.service.leader import Leadership
from broker.service.members import KubeMembers
from broker.service.metrics import SchedulerMetrics
from broker.service.pools import BurstPools
from broker.service.statelock import StateLock
from broker.service.tasks import Supervisor
from broker.store import JobRecord, Store
from policies.framework import Policy

log = logging.getLogger(__name__)


@dataclass(eq=False)
class Shared:
    config: Config
    clock: Callable[[], float]
    ledger: Ledger
    queue: JobQueue
    lifecycle: Lifecycle
    policies: PolicyBook
    settings: SchedulerSettings
    store: Store
    launcher: Launcher
    kube: KubeMembers
    pools: BurstPools
    metrics: SchedulerMetrics
    leadership: Leadership
    tasks: Supervisor = field(default_factory=Supervisor)
    unplaceable: UnplaceableShapes = field(default_factory=UnplaceableShapes)
    # Active jobs per tenant as this replica writes them; cleared at every change of lead.
    active: ActiveCounts = field(default_factory=ActiveCounts)
    lock: StateLock = field(default_factory=StateLock)
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    # State rebuilt from the store under the lease we hold (set by recovery, cleared when
    # the lease is lost); ``leading`` is the one question the rest asks.
    rebuilt: bool = False
    # Finished jobs whose pods are kept in their member for their logs (the leader's).
    finished_pods: FinishedPods = field(init=False)

    def __post_init__(self) -> None:
        self.finished_pods = FinishedPods(self.config.retention.finished_pods_seconds, self.clock)

    @property
    def leading(self) -> bool:
        """Placing now: elected, state rebuilt, and the lease renewed recently enough."""
        return self.rebuilt and self.leadership.valid()

    def check_stale(self) -> None:
        """Mark the members we launch into (Kubernetes, launching agents) stale (no new
        placements) or trusted again."""
        for name in self.kube.names():
            stale = self.kube.stale(name)
            if self.ledger.snapshot().clusters[name].stale != stale:
                log.warning("cluster %s is %s", name, "stale" if stale else "back")
                self.ledger.set_stale(name, stale)
                self.wake.set()


def pending_of(record: JobRecord, job: Job | None = None) -> Pending:
    """The queue entry of a stored job; its Job is rebuilt from the stored spec unless the
    caller (a fresh submission) already has it."""
    if job is not None:
        manifest = record.manifest
        return Pending(
            job, record.seq, record.created_at, record.attempts, record.not_before or 0.0,
            pod_templates(manifest), master_port(manifest), workload_object(manifest),
        )  # fmt: skip
    of_spec = _of_spec(record)
    return Pending(
        of_spec.job.renamed(record.name), record.seq, record.created_at, record.attempts,
        record.not_before or 0.0, of_spec.pod_templates, of_spec.master_port, of_spec.workload,
    )  # fmt: skip


@dataclass(frozen=True, slots=True)
class _OfSpec:
    """What a queue entry takes from a stored spec alone (the Job under a stand-in name).
    Shared by every job of that spec: the launchers copy templates and objects before
    changing them (adapters/kube/objects.py, workloads.py)."""

    job: Job
    pod_templates: Mapping[str, Mapping[str, Any]]
    master_port: int
    workload: Mapping[str, Any] | None


# (how the spec is keyed, the key, tenant, queue) -> what it gives; at most _OF_SPEC_MAX.
_OF_SPEC: dict[tuple[str, str, str, str], _OfSpec] = {}
_OF_SPEC_MAX = 1024


def _of_spec(record: JobRecord) -> _OfSpec:
    """The Job, pod templates, rendezvous port and workload object of a stored job's spec,
    validated again (the rules may have changed since it was admitted). Cached: jobs sent
    from one template (sweeps, arrays, retries) share a spec, and a restart rebuilds every
    live job through here, so each distinct spec is validated once, not once per job.

    Keyed by the spec's JSON text when the store read it (``JobRecord.spec_text``: a
    restart's pages), so a hit decodes nothing; otherwise by the decoded spec's repr (equal
    reprs of JSON values are equal values; cheaper than JSON text). The two kinds of key
    are kept apart. The oldest entry goes when full; a refused spec is never kept. The
    metadata (name, namespace) was checked at admission and is not part of the Job."""
    text, spec = record.spec_text, None
    if text is not None:
        key = ("json", text, record.tenant, record.queue)
    else:
        spec = record.manifest.get("spec")
        key = ("repr", repr(spec), record.tenant, record.queue)
    found = _OF_SPEC.get(key)
    if found is not None:
        return found
    if text is not None:
        spec = json.loads(text)
    wire = {"apiVersion": API_VERSION, "kind": KIND, "metadata": {"name": "stored"},
            "spec": spec}  # fmt: skip
    found = _OfSpec(
        to_job(stored_manifest(wire), record.tenant, record.queue),
        pod_templates(wire), master_port(wire), workload_object(wire),
    )  # fmt: skip
    if len(_OF_SPEC) >= _OF_SPEC_MAX:
        del _OF_SPEC[next(iter(_OF_SPEC))]
    _OF_SPEC[key] = found
    return found


class _TenantPods:
    """A policy whose pod names carry the tenant (``team-a.train-worker-0``): the ledger
    keys pods by cluster and name, and two tenants may both call a job ``train``. A dot
    never occurs in a DNS label, so the names cannot collide."""

    def __init__(self, policy: Policy) -> None:
        self._policy = policy
        self.name = policy.name

    def decide(self, job: Job, snapshot: CapacitySnapshot) -> Placement | Unplaceable:
        decision = self._policy.decide(job, snapshot)
        if isinstance(decision, Unplaceable):
            return decision
        pods = tuple(dataclasses.replace(p, pod=f"{job.tenant}.{p.pod}") for p in decision.pods)
        return dataclasses.replace(decision, pods=pods)


class TenantPolicyBook(PolicyBook):
    def for_job(self, pending: Pending) -> Policy:
        return _TenantPods(super().for_job(pending))

    def fresh(self, pending: Pending) -> Policy:
        return _TenantPods(super().fresh(pending))


def placement_json(placement: Placement) -> dict[str, Any]:
    return {
        "job": placement.job,
        "cluster": placement.cluster,
        "policy": placement.policy,
        "pods": [
            {"pod": p.pod, "node": p.node, "gpus": list(p.gpus),
             "gpuMilli": p.resources.gpu_request_milli}
            for p in placement.pods
        ],
    }  # fmt: skip


__all__ = [
    "Shared",
    "TenantPolicyBook",
    "pending_of",
    "placement_json",
]
