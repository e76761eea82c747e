"""The running broker as one object: a thin facade over the service's rooms.

``Service`` is what the HTTP API, ``fedbroker serve``, the demo and the tests hold. It
starts and stops the broker and answers "are we leading"; everything else is a room it
delegates to (built once by ``broker.service.compose``):

- ``admission``: tenants, submit (stored FIRST, then queued; a resubmit answers the stored
  job), get, cancel;
- ``cycles`` and ``binding``: the scheduling loop and one cycle (reserve in the ledger,
  write Placed, launch in a supervised task; all pods running -> Running; a launch failure
  or gang timeout -> delete the pods, release, requeue with backoff; pods ended ->
  Succeeded or Failed);
- ``recovery``: on winning the lease every active job of the store goes back into the
  queue (or gets its reservation back from the pods read back from Kubernetes); on losing
  it placing stops at once and that state is dropped; Kubernetes garbage collection;
- ``view``: the typed read model; ``explain``/``plan`` through ``broker.service.explain``,
  computed by ``planner`` (``broker.service.planner``: one worker thread, bounded, on a
  time budget);
- ``job_pods``: a placed job's pods and logs from its member (``broker.service.pods``).

State changes run under one lock (``Shared.lock``). The clock is injected; tests drive
``schedule_once(now)`` directly. Several replicas on one store elect a leader
(broker/service/leader.py); followers serve reads and refuse writes (``NotLeader``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Unpack

from broker.config import Config
from broker.core.queue import Pending
from broker.manifest import FederatedJob, ManifestError
from broker.service.compose import Options, build
from broker.service.explain import explain_work, plan_work, what_next
from broker.service.leader import default_identity
from broker.service.never_fits import Largest
from broker.service.planner import Planner
from broker.service.pods import JobPods
from broker.service.retention import Retention
from broker.service.waiting import never_fits_line, waiting_summary
from broker.store import JobRecord, Store, Transition

log = logging.getLogger(__name__)

# How long ``close`` waits for the cancelled background tasks; one still running then is
# logged by name and left (a stop must not hang on it: serve's supervisor waits as long).
CLOSE_TASKS_SECONDS = 10.0


class Service:
    def __init__(self, config: Config, **options: Unpack[Options]) -> None:
        """``options``: see ``broker.service.compose.Options`` (launcher, clock, store, ...)."""
        parts = build(config, **options)
        self.shared = s = parts.shared
        self.config = config
        self.ledger, self.queue, self.lifecycle = s.ledger, s.queue, s.lifecycle
        self.pools, self.kube, self.metrics, self.tasks = s.pools, s.kube, s.metrics, s.tasks
        self.leadership = s.leadership
        self.binding, self.cycles, self.recovery = parts.binding, parts.cycles, parts.recovery
        self.admission, self.view, self.bus = parts.admission, parts.view, parts.bus
        self.mqtt = parts.mqtt
        self.metric_sources = parts.metric_sources  # adapters' own families (MQTT, ...)
        self._dispatch = parts.dispatch
        self.ready = False
        self.retention = Retention(s)
        # Public reads and writes of the rooms, as the API and the CLI call them.
        admission = parts.admission
        self.submit, self.get, self.cancel = admission.submit, admission.get, admission.cancel
        self.schedule_once, self.run = parts.cycles.schedule_once, parts.cycles.run
        self.launches_done, self.runs_done = parts.binding.launches_done, parts.binding.runs_done
        self.job_pods = JobPods(s, admission)
        self.planner = Planner(config.api.plans, options.get("plan_clock", time.monotonic))
        self.pods, self.logs = self.job_pods.pods, self.job_pods.logs
        self.largest = Largest(s.ledger, s.pools, s.kube)

    @property
    def store(self) -> Store:
        """The event-publishing store every write goes through."""
        return self.shared.store

    @property
    def leading(self) -> bool:
        """Placing now: elected, state rebuilt, and the lease renewed recently enough."""
        return self.shared.leading

    # -- start and stop -------------------------------------------------------------------

    async def start(self, *, elect: bool = True) -> None:
        """Open the store and connect the members; ready only afterwards. With ``elect``
        (the default) the first attempt at the lease is made here, and a replica that wins
        rebuilds its state before readiness; ``fedbroker serve`` passes False and campaigns
        (``lead``) once it listens, so that two processes given one address never both
        lead: the second cannot listen. Kubernetes members are listed first (their capacity
        is known before readiness)."""
        await self.store.open()
        await self.recovery.start_kube(self._dispatch)
        if self.pools:
            s = self.shared
            await self.pools.start(s.ledger, self.recovery.workload_client, s.tasks, s.lock)
        if self.mqtt is not None:
            self.mqtt.start(self.tasks)
        if elect:
            await self.campaign()

    async def campaign(self) -> None:
        """The first attempt at the lease (the leader rebuilds its state here); ready
        afterwards, as the leader or as a follower."""
        await self.leadership.step()
        self.recovery.found = None  # stale by the time a later election could use it
        self.ready = True

    def advertise(self, port: int) -> None:
        """The port this replica listens on, known once bound: it goes into the identity
        (``hostname:port``) unless the config names one. Before the first campaign only."""
        if not self.config.leader_election.identity and not self.leadership.held:
            self.leadership.elector.identity = default_identity(port)

    async def lead(self) -> None:
        """Campaign for the lease and keep it (a supervised task of ``serve``)."""
        await self.leadership.run()

    def spawn_loop(self) -> None:
        """Run the scheduler loop, the leader election, retention and the deletion of
        finished jobs' pods as supervised tasks."""
        self.tasks.keep("scheduler", self.run)
        self.tasks.keep("leader", self.lead)
        self.tasks.keep("retention", self.retention.run)
        kept, shared = self.shared.finished_pods, self.shared
        self.tasks.keep(
            "finished-pods", lambda: kept.run(self.binding.delete, lambda: shared.leading)
        )

    async def _delete_finished_pods(self) -> None:
        """Finished jobs' pods past ``retention.finishedPodsSeconds`` deleted while leading."""
        s = self.shared
        await s.finished_pods.run(self.binding.delete, lambda: s.leading)

    async def close(self, timeout: float = CLOSE_TASKS_SECONDS) -> None:
        self.ready = False
        self.shared.rebuilt = False
        if self.leadership.held:
            self.leadership.held = False
            try:
                async with asyncio.timeout(self.leadership.timings.renew_seconds):
                    await self.leadership.elector.release()
            except Exception as exc:  # it expires on its own
                log.warning("could not release the leader lease: %s", type(exc).__name__)
        self.planner.close()
        self.binding.drop()  # run watches too: a timer or poll must not outlive the store
        tasks = self.tasks.cancel()
        # The clients first: closing their connections ends the watch streams, whose reads
        # do not always notice a cancellation on their own.
        await self.kube.close()
        await self.pools.close()
        if self.mqtt is not None:
            await self.mqtt.close()
        if tasks:  # their failures are logged by the supervisor as they end
            _, late = await asyncio.wait(tasks, timeout=timeout)
            for task in late:
                name = task.get_name()
                log.error("task %s did not stop within %ss", name, timeout, extra={"task": name})
        await self.store.close()

    # -- reads ------------------------------------------------------------------------------

    async def explain(self, tenant: str, name: str, caller: str | None = None) -> dict[str, Any]:
        """Per cluster: does the queued job fit now, why not, the largest gang it could take;
        then its place in the queues and its burst option (null when not queued here).
        Computed in the planner's thread as ``caller``'s dry run (default ``tenant``)."""
        record: JobRecord = await self.get(tenant, name)
        doc: dict[str, Any] = {
            "job": name, "state": record.state, "cluster": record.cluster,
            "reason": record.reason, "clusters": [], "position": None, "burst": None,
            "neverFits": None,
        }  # fmt: skip
        pending = self.queue.get(f"{tenant}/{name}")
        if pending is None:
            return doc
        job, now = pending.job, self.shared.clock()
        policy = self.shared.policies.fresh(Pending(job, 0, 0.0))
        work = explain_work(job, policy, self.queue, self.ledger.snapshot(), now)
        explained = await self.planner.run(caller or tenant, work)
        doc["clusters"] = [r.as_json() for r in explained.clusters]
        never = self.largest.never_fits(job)
        doc["neverFits"] = never_fits_line(job, never) if never is not None else None
        unavailable = self.pools.unavailable()
        return doc | what_next(explained, job, self.pools.controller, now, unavailable)

    def burst_history(self, tenant: str, name: str, since: float) -> list[Transition]:
        """What the burst pools did for a job since ``since`` (its run's submission), as
        rows of its history: a scale-up for it, its nodes not come in time, a failed
        scale-up. The job waits meanwhile, so each row says Queued, on the pool's cluster.
        They are the controller's recent events, kept in memory, so a restarted broker
        has forgotten those of before."""
        key, pools = f"{tenant}/{name}", self.pools.controller.pools
        return [
            Transition(e.at, "Queued", f"burst {e.kind} in pool {e.pool}: {e.message}",
                       pools[e.pool].cluster if e.pool in pools else None)
            for e in self.pools.controller.events if e.job == key and e.at >= since
        ]  # fmt: skip

    def waiting(self, tenant: str, name: str) -> str | None:
        """Why a queued job waited at the last cycle that looked at it, in one line (None:
        not queued here, or not looked at yet): "never fits: ..." for a job the federation
        could not take even empty (``Largest``: per job, O(clusters x kinds of node))."""
        pending = self.queue.get(f"{tenant}/{name}")
        if pending is None or not pending.waiting:
            return None
        never = self.largest.never_fits(pending.job)
        if never is not None and never.clusters:  # else its reasons name what does not match
            return never_fits_line(pending.job, never)
        return waiting_summary(pending.job, pending.waiting)

    async def plan(self, tenant: str, manifest: FederatedJob) -> dict[str, Any]:
        """Dry run: where the manifest would go now. Nothing is stored or reserved.
        ManifestError beyond ``api.plans.maxPods``; PlanRefused as the planner's ``run``."""
        job = self.admission.job_for(tenant, manifest)
        most = self.planner.limits.max_pods
        if job.total_pods > most:
            raise ManifestError(
                f"spec: {job.total_pods} pods, more than a dry run may ask ({most}, "
                "api.plans.maxPods)",
                "spec",
            )
        policy = self.shared.policies.fresh(Pending(job, 0, 0.0))
        plan = await self.planner.run(tenant, plan_work(job, policy, self.ledger.snapshot()))
        placement = plan.placement
        return {
            "job": job.name, "queue": job.queue, "fits": placement is not None,
            "cluster": placement.cluster if placement is not None else None,
            "pods": len(placement.pods) if placement is not None else 0,
            "clusters": [r.as_json() for r in plan.clusters],
        }  # fmt: skip

    def clusters(self, *, stranded_gpus_too: bool = False) -> list[dict[str, Any]]:
        """The body of ``GET /v1/clusters`` (with ``stranded_gpus_too``) and of the capacity
        events of ``/v1/events`` and MQTT (without: they follow every capacity change)."""
        rows = self.view.clusters(stranded_gpus_too=stranded_gpus_too)
        return [row.as_json() for row in rows]

    def queues(self) -> list[dict[str, Any]]:
        return [row.as_json() for row in self.view.queues()]

    def burst(self, tenant: str | None) -> dict[str, Any]:
        return self.view.burst(tenant)


__all__ = ["Service"]
