"""The workload half of ``KubeLauncher``: a ``spec.workload`` job's object created in its
member, its controller's pods pinned to the placement, its end read from its own status.

* launch: the tenant's namespace, then (delegate mode) the PodGroup, then the workload
  (``adapters.kube.workloads.workload_body``; one already there with this job's labels is
  adopted, so a restarted broker creates no second one), in pin mode with the placement
  recorded on it (``adapters.kube.plan``: what a restart restores the job from,
  ``adapters.kube.workload_found``). Its controller makes the pods.
* wait_running: every poll, in pin mode, the job's gated pods get slots of the placement
  (``adapters.kube.slots``; a pod left without one stays gated, with one Warning Event).
  The gang has started when as many of the job's pods run (or already succeeded) as the
  placement has pods, or (delegate mode) its PodGroup is Running. A pod of the job Failed,
  or the workload failed or vanished, before that: ``KubeLaunchError`` (the service rolls
  the gang back and requeues it with backoff).
* finished: the workload's own status (``workload_end``), with its reason and message; the
  workload gone: failed, ``WorkloadDeleted``. Pods its controller makes again (a retried
  Job pod) are granted the slots freed meanwhile. The member unreachable, it polls on (an
  unreachable cluster does not end a job: failover does, when configured); anything else
  failing ``FOLLOW_ATTEMPTS`` polls in a row (the workload and pods read again each time)
  raises, and the service rolls the job back rather than hold its capacity with nothing
  following it.
* delete and garbage collection: the workload, with ``propagationPolicy: Background`` so
  its controller's pods go too.

Listings of pods and of each kind's workloads are shared by every gang polling at the same
time (``NamespaceApi.shared_listing``/``shared_workloads``): a poll costs one LIST per kind
per cluster, whatever the number of jobs. A poll joins only a listing begun after its own
create, and a workload absent from it is read once directly before it counts as gone: a
listing that began before the create (another tenant's launch polling meanwhile) cannot
roll a launch back as "disappeared". Slot grants decide on a fresh listing of the one
job's pods, so a grant made in the previous poll is always seen.
"""

from __future__ import annotations

import datetime
import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from kubernetes.aio.client.exceptions import ApiException

from adapters.kube.objects import KubeLaunchError, job_key, namespace_of, pod_group_name
from adapters.kube.plan import ANNOTATION_PLAN, plan_annotation
from adapters.kube.slots import gated, grants, no_slot_event, slot_name, terminal, ungate_patch
from adapters.kube.workloads import (
    WORKLOAD_KINDS,
    WorkloadKind,
    kind_of,
    workload_body,
    workload_end,
)
from adapters.kubeapi.calls import describe
from broker.model import Placement
from broker.ports import LaunchSpec, RunEnd

if TYPE_CHECKING:
    from adapters.kube.launch import KubeLauncher

log = logging.getLogger(__name__)

# Polls in a row of a running workload that fail otherwise than by the member being
# unreachable, before following it is given up (the service then rolls the job back).
FOLLOW_ATTEMPTS = 3
# A slot grant the API server refuses for good (not a pod changed or gone meanwhile, 409 or
# 404, which the next poll retries): the gang could never start, so its launch fails now.
_GRANT_REFUSED = frozenset({400, 403, 422})


class WorkloadRuns:
    """Creates, confirms, watches and deletes the workload objects of one launcher."""

    def __init__(self, launcher: KubeLauncher) -> None:
        self.launcher = launcher
        self.api = launcher.api
        self.objects = launcher.objects
        self._noted: set[str] = set()  # pods already given a no-slot Event (namespace/name)

    @staticmethod
    def kind(spec: LaunchSpec) -> WorkloadKind:
        if spec.workload is None:
            raise KubeLaunchError(f"job {spec.key} has no workload")
        return kind_of(spec.workload)

    # -- create ------------------------------------------------------------------------------

    async def create(self, placement: Placement, spec: LaunchSpec) -> None:
        kind = self.kind(spec)
        body = workload_body(self.objects, spec)
        if self.objects.mode == "pin":  # what a restart restores it from (adapters.kube.plan)
            self._record_plan(body, placement, spec)
        launcher = self.launcher
        await launcher.ensure_namespace(spec)
        if self.objects.mode == "delegate":
            await launcher.ensure_pod_group(placement, spec)
        await launcher.create_or_adopt(
            kind.kind, body, spec,
            lambda b: self.api.create_workload(kind, dict(b)),
            lambda ns, name: self.api.read_workload(kind, ns, name),
        )  # fmt: skip
        where = f"{launcher.cluster}/{self.objects.namespace(spec.tenant)}"
        log.info("created %s %s (%s) in %s", kind.kind, spec.key, self.objects.mode, where)

    @staticmethod
    def _record_plan(body: dict[str, Any], placement: Placement, spec: LaunchSpec) -> None:
        plan = plan_annotation(placement, spec)
        if plan is None:
            what = f"plan of {spec.key} ({len(placement.pods)} pods)"
            log.info("%s too large to record; a restart reads the stored placement", what)
            return
        meta = body.setdefault("metadata", {})
        meta["annotations"] = {**(meta.get("annotations") or {}), ANNOTATION_PLAN: plan}

    # -- confirm -----------------------------------------------------------------------------

    async def _workload(self, spec: LaunchSpec, since: int) -> dict[str, Any] | None:
        """The job's workload from the shared listing of its kind, one begun after ``since``
        (a ``listings_begun`` mark taken after the caller's create). Not there: read once
        directly before the caller concludes it is gone (None: it is, or is not ours)."""
        kind, namespace = self.kind(spec), self.objects.namespace(spec.tenant)
        for obj in await self.api.shared_workloads(kind, after=since):
            meta = obj.get("metadata") or {}
            here = meta.get("name") == spec.job and namespace_of(obj) == namespace
            if here and self.objects.ours(obj, spec):
                return obj
        read = await self.api.read_workload(kind, namespace, spec.job)
        return read if read is not None and self.objects.ours(read, spec) else None

    async def _pods(self, spec: LaunchSpec, since: int) -> list[dict[str, Any]]:
        listing = await self.api.shared_listing(after=since)
        return [p for p in listing if self.objects.ours(p, spec)]

    async def wait_running(self, placement: Placement, spec: LaunchSpec) -> None:
        """Return once the gang has started (see the module's docstring); raise
        ``KubeLaunchError`` as soon as it cannot. Polls every ``poll_seconds``; the caller
        applies the gang timeout."""
        kind = self.kind(spec)
        what = f"{kind.kind} {self.objects.namespace(spec.tenant)}/{spec.job}"
        since = self.api.listings_begun()  # the create is done: later listings show it
        while True:
            obj = await self._workload(spec, since)
            if obj is None:
                raise KubeLaunchError(f"gang {spec.key}: {what} disappeared")
            end = workload_end(kind.kind, obj)
            if end is not None and not end.succeeded:
                raise KubeLaunchError(f"gang {spec.key}: {what} {end.reason}: {end.message}")
            pods = await self._pods(spec, since)
            failed = sorted(p["metadata"]["name"] for p in pods if _phase(p) == "Failed")
            if failed:
                raise KubeLaunchError(
                    f"gang {spec.key}: pod {failed[0]} Failed before the gang ran"
                )
            if end is not None:
                return  # succeeded before we saw it run
            started = sum(1 for p in pods if _phase(p) in ("Running", "Succeeded"))
            if started >= len(placement.pods):
                return
            if self.objects.mode == "pin":
                await self.grant_slots(placement, spec, pods)
            elif await self._pod_group_running(spec):
                return
            await self.launcher.pause(self.launcher.poll_seconds)

    async def _pod_group_running(self, spec: LaunchSpec) -> bool:
        namespace = self.objects.namespace(spec.tenant)
        group = await self.api.read_pod_group(namespace, pod_group_name(spec))
        return group is not None and (group.get("status") or {}).get("phase") == "Running"

    async def grant_slots(
        self, placement: Placement, spec: LaunchSpec, pods: list[dict[str, Any]]
    ) -> None:
        """Give the job's gated pods slots of the placement (pin mode). Only when the shared
        listing shows a gated pod: the grants are decided on a fresh listing of the job's
        pods. A pod changed or gone meanwhile (409/404) is tried again next poll."""
        if not any(gated(p) and not terminal(p) for p in pods):
            return
        namespace = self.objects.namespace(spec.tenant)
        fresh = await self.api.job_pods(namespace, spec.tenant, spec.job)
        to_grant, left = grants(placement, spec, fresh)  # (job_pods keeps only this job's)
        for grant in to_grant:
            try:
                await self.api.patch_pod(namespace, grant.name, ungate_patch(grant, spec))
            except ApiException as exc:
                if exc.status in _GRANT_REFUSED:
                    raise KubeLaunchError(
                        f"grant pod {namespace}/{grant.name} a slot: {describe(exc)}"
                    ) from exc
                log.info("pod %s/%s not granted now (%s)", namespace, grant.name, describe(exc))
                continue
            log.info(
                "pod %s/%s: slot %s on node %s", namespace, grant.name,
                slot_name(grant.slot, spec), grant.slot.node,
            )  # fmt: skip
        await self._note_unslotted(spec, left)

    async def _note_unslotted(self, spec: LaunchSpec, pods: list[Mapping[str, Any]]) -> None:
        """One Warning Event per pod left gated (best effort: a failure is logged)."""
        now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        for pod in pods:
            key = f"{namespace_of(pod)}/{pod['metadata']['name']}"
            if key in self._noted:
                continue
            self._noted.add(key)
            log.warning("pod %s stays gated: no slot of %s's placement is free", key, spec.key)
            try:
                await self.api.create_event(no_slot_event(pod, spec, self.objects.origin, now))
            except KubeLaunchError as exc:
                log.warning("no event for pod %s: %s", key, exc)

    async def finished(self, placement: Placement, spec: LaunchSpec) -> RunEnd:
        """Wait for the running workload to end, by its own status (see the module's
        docstring). An API error is logged and polled again (an unreachable cluster does
        not end a job); any other failure ``FOLLOW_ATTEMPTS`` polls in a row is raised."""
        kind = self.kind(spec)
        failed = 0
        since = self.api.listings_begun()
        while True:
            try:
                end = await self._poll_end(placement, spec, kind, since)
                failed = 0
                if end is not None:
                    return end
            except KubeLaunchError as exc:
                log.warning("job %s: cannot read its workload (%s); polling again", spec.key, exc)
            except Exception as exc:  # not the member away: ours or its answers, bounded
                failed += 1
                if failed >= FOLLOW_ATTEMPTS:
                    raise
                log.warning("job %s: following its workload failed (%s, %d of %d); again",
                            spec.key, type(exc).__name__, failed, FOLLOW_ATTEMPTS)  # fmt: skip
            await self.launcher.pause(self.launcher.run_poll_seconds)

    async def _poll_end(
        self, placement: Placement, spec: LaunchSpec, kind: WorkloadKind, since: int
    ) -> RunEnd | None:
        """One look at a running workload: its end, or None while it runs (its gated pods
        granted slots meanwhile, in pin mode)."""
        obj = await self._workload(spec, since)
        if obj is None:
            where = f"{self.objects.namespace(spec.tenant)}/{spec.job}"
            return RunEnd(False, "WorkloadDeleted", f"{kind.kind} {where} was deleted")
        end = workload_end(kind.kind, obj)
        if end is None and self.objects.mode == "pin":
            await self.grant_slots(placement, spec, await self._pods(spec, since))
        return end

    # -- delete ------------------------------------------------------------------------------

    async def delete(self, spec: LaunchSpec) -> None:
        """Delete the job's workload if it is this job's (its controller's pods go with it)."""
        kind = self.kind(spec)
        namespace = self.objects.namespace(spec.tenant)
        existing = await self.api.read_workload(kind, namespace, spec.job)
        if existing is None:
            return
        if not self.objects.ours(existing, spec):
            log.warning("not deleting %s %s/%s: it is not %s's", kind.kind, namespace,
                        spec.job, spec.key)  # fmt: skip
            return
        await self.api.delete_workload(kind, namespace, spec.job)

    async def collect_garbage(self, live_jobs: set[str]) -> list[str]:
        """Delete our workloads of every kind whose job is not live; a kind that cannot be
        listed (not served, not allowed) is skipped with a warning."""
        deleted: list[str] = []
        for kind in WORKLOAD_KINDS.values():
            try:
                found = await self.api.our_workloads(kind)
            except KubeLaunchError as exc:
                log.warning("cannot list %s in %s: %s", kind.plural, self.launcher.cluster, exc)
                continue
            for obj in found:
                if job_key(obj) in live_jobs:
                    continue
                namespace, name = namespace_of(obj), obj["metadata"]["name"]
                await self.api.delete_workload(kind, namespace, name)
                deleted.append(f"{kind.kind}/{namespace}/{name}")
        return deleted


def _phase(pod: Mapping[str, Any]) -> str:
    return str((pod.get("status") or {}).get("phase") or "Pending")
