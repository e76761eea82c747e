"""Admission: tenants, submit, get and cancel, and the errors a caller gets for them.

Submit commits the job to the store FIRST, then queues it; a resubmit of the same
tenant/name and spec answers the stored job (idempotency), another spec is a ``Conflict``
while the job is active, and a finished job's name starts its next generation. Writes are
the leader's: a replica that is not placing now answers ``NotLeader`` (a 503 naming the
leader). A cancel is recorded under the lock, so it never interleaves with a placement of
the same job; the pods are deleted after the lock is released. A tenant's active jobs are
capped (``maxActiveJobs``).
"""

from __future__ import annotations

import math

from broker.config import TenantConfig
from broker.manifest import FederatedJob, PolicyViolation, admit_templates, to_job
from broker.model import Job
from broker.service.binding import Binding
from broker.service.runtimes import resolved
from broker.service.state import Shared, pending_of
from broker.store import ACTIVE_STATES, FINAL_STATES, JobRecord, StateConflict


class Forbidden(Exception):
    """The tenant may not do this (403); the message says why."""


class Conflict(Exception):
    """The name is taken by an active job with another spec (409); the message names it."""


class NotFound(Exception):
    """No such job for this tenant (404; also for other tenants' jobs)."""


class NotLeader(Exception):
    """This replica does not place jobs now (503): the message names the leader."""

    def __init__(self, message: str, holder: str | None, retry_after: int) -> None:
        super().__init__(message)
        self.holder = holder
        self.retry_after = retry_after


class Admission:
    """The jobs of tenants in and out: submit, get, cancel."""

    def __init__(self, shared: Shared, binding: Binding) -> None:
        self.s = shared
        self.binding = binding

    def not_leader(self) -> NotLeader:
        """The error a write gets on a replica that is not placing now."""
        leadership = self.s.leadership
        retry = max(1, math.ceil(leadership.timings.renew_seconds))
        holder, me = leadership.holder, leadership.identity
        if leadership.held and not self.s.rebuilt:
            message = f"leader: this replica ({me}) is taking over; retry after {retry} s"
        elif holder and holder != me:
            message = f"leader: this replica ({me}) is a follower; the leader is {holder}"
        else:
            message = f"leader: no leader elected right now; retry after {retry} s"
        return NotLeader(message, holder, retry)

    def tenant(self, name: str) -> TenantConfig:
        tenant = self.s.config.tenant(name)
        if tenant is None:
            raise Forbidden(f"unknown tenant {name!r}")
        return tenant

    def job_for(self, tenant_name: str, manifest: FederatedJob) -> Job:
        """The Job a tenant's manifest becomes, or Forbidden (namespace, queue, template)."""
        return self.admitted(tenant_name, manifest)[1]

    def admitted(self, tenant_name: str, manifest: FederatedJob) -> tuple[FederatedJob, Job]:
        """The manifest as it is stored (pod set resources derived from the templates where
        it gave none, a workload's member runtime looked up) and its Job; Forbidden for a
        namespace, queue or pod template the tenant may not use, ManifestError for requests
        that do not add up or a runtime no member has. Nothing is stored before this passes."""
        tenant = self.tenant(tenant_name)
        namespace = manifest.metadata.namespace
        if namespace is not None and namespace != tenant.name:
            raise Forbidden(f"metadata.namespace: {namespace!r} is not your tenant {tenant.name!r}")
        manifest = resolved(manifest, tenant.name, self.s.kube)
        try:
            manifest = admit_templates(
                manifest,
                tenant.pod_security,
                tenant.service_accounts,
                access=self.s.config.node_access(tenant),
            )
        except PolicyViolation as exc:
            raise Forbidden(str(exc)) from None
        job = to_job(manifest, tenant.name, tenant.default_queue)
        if job.queue not in tenant.allowed_queues:
            allowed = ", ".join(sorted(tenant.allowed_queues))
            raise Forbidden(f"spec.queue: tenant may not use queue {job.queue!r} ({allowed})")
        return manifest, job

    async def submit(self, tenant: str, manifest: FederatedJob) -> tuple[JobRecord, bool]:
        s = self.s
        manifest, job = self.admitted(tenant, manifest)
        if not s.leading:
            raise self.not_leader()
        # The commit runs outside the service lock, so submissions do not wait for a
        # scheduling cycle's store writes; the queue is only touched under the lock. A cancel
        # that lands between the two is harmless: placing a cancelled job fails its
        # compare-and-set in schedule_once and the reservation is given back.
        await self._within_cap(job)
        wire = manifest.wire()
        # A finished job's name starts its next generation; an active one answers as stored
        # when the spec is the same (a retried submission), else 409.
        record, created = await s.store.create_job(
            job.tenant, job.name, job.queue, job.priority, wire, s.clock(), reuse_finished=True
        )
        if not created and record.manifest.get("spec") != wire.get("spec"):
            raise Conflict(
                f"metadata.name: job {job.name!r} exists with another spec ({record.state}); "
                f"cancel it first (`fedbroker cancel {job.name}`: a finished name is reused "
                "by the next submission), or submit under another name"
            )
        key = job.key
        kept = s.finished_pods.forget(key) if created else None
        if kept is not None:  # the last run's pods go first: the next must not adopt them
            await self.binding.delete(kept.placement, kept.launch)
        # A Queued job not created now may be one whose creation committed while its answer
        # was lost (the store failed: 503, and the client retried): nobody queued it then.
        unqueued = record.state == "Queued" and (
            s.queue.get(key) is None
            and s.lifecycle.get(key) is None
            and key not in s.ledger.reservations()
        )
        if unqueued and s.rebuilt:
            # Not leading any more: the job is stored, the next leader queues it.
            # No lock: push is synchronous, so no cycle can be half-way through the queue
            # (its own walk is over a copy), and taking the lock would make every submission
            # wait for the fsync of whatever cycle holds it.
            s.queue.push(pending_of(record, job))
            s.wake.set()
        return record, created

    async def _within_cap(self, job: Job) -> None:
        """Forbidden past the tenant's cap of active jobs, as a Kubernetes quota answers
        (403: no retry helps until some finish); a resubmission of an active job passes.
        Checked before the insert: concurrent submissions may overshoot it by their number."""
        cap = self.tenant(job.tenant).max_active_jobs
        if await self.s.store.count_active(job.tenant) < cap:
            return
        existing = await self.s.store.get_job(job.tenant, job.name)
        if existing is None or existing.state in FINAL_STATES:
            raise Forbidden(
                f"limit: tenant {job.tenant!r} has {cap} active jobs, its maxActiveJobs cap; "
                "cancel some or wait for them to finish"
            )

    async def get(self, tenant: str, name: str) -> JobRecord:
        record = await self.s.store.get_job(tenant, name)
        if record is None:
            raise NotFound(f"job {name!r} not found")
        return record

    async def cancel(self, tenant: str, name: str) -> JobRecord:
        s = self.s
        if not s.leading:
            raise self.not_leader()
        async with s.lock:
            if not s.rebuilt:
                raise self.not_leader()
            record = await self.get(tenant, name)
            if record.state in FINAL_STATES:
                return record
            try:
                record = await s.store.transition(
                    tenant, name, "Cancelled", "cancelled by request", s.clock(),
                    expect=ACTIVE_STATES,
                )  # fmt: skip
            except StateConflict:
                return await self.get(tenant, name)
            key = f"{tenant}/{name}"
            self.binding.stop(key)
            launch = s.lifecycle.get(key)
            s.lifecycle.cancel(key)
            s.pools.ended(key)
        # The cluster's API is called outside the lock: an unreachable cluster delays this
        # answer (bounded by the launcher's timeouts and retries), never the scheduler.
        if launch is not None:
            await self.binding.delete(launch.placement, launch)
        return record


__all__ = ["Admission", "Conflict", "Forbidden", "NotFound", "NotLeader"]
