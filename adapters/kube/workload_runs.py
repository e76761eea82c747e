"""The workload launcher: a ``spec.workload`` job's object created in its member, its
controller's pods looked after by the launch mode (pin: given the placement's slots), its
end read from its own status.

* launch: the tenant's namespace, then (delegate mode) the PodGroup, then the workload
  (``adapters.kube.workloads.workload_body``; one already there with this job's labels is
  adopted, so a restarted broker creates no second one), in pin mode with the placement
  recorded on it (``adapters.kube.plan``: what a restart restores the job from,
  ``adapters.kube.workload_found``). Its controller makes the pods.
* wait_running: every poll, in pin mode, the job's gated pods get slots of the placement
  (``adapters.kube.slots``; a pod left without one stays gated, with one Warning Event).
  The PodGroup's minMember leaves out the kind's late pod sets (``WorkloadKind``).
  The gang has started when as many of the job's pods run (or already succeeded) as the
  placement has pods, those of the kind's late pod sets (a RayJob's submitter, made once
  the Ray cluster is ready) left out, or (delegate mode) its PodGroup is Running. A pod
  of the job Failed, or the workload failed by its kind's ``end`` (a RayJob's
  ``ValidationFailed`` among them, with KubeRay's reason) or vanished, before that:
  ``KubeLaunchError`` (the service rolls the gang back and requeues it with backoff).
* finished: the workload's own status (its kind's ``end``), with its reason and message; the
  workload gone: failed, ``WorkloadDeleted``. Pods its controller makes again (a retried
  Job pod) are granted the slots freed meanwhile. The member unreachable, it polls on (an
  unreachable cluster does not end a job: failover does, when configured); anything else
  failing ``FOLLOW_ATTEMPTS`` polls in a row (the workload and pods read again each time)
  raises, and the service rolls the job back rather than hold its capacity with nothing
  following it.
* delete and garbage collection: the workload, with ``propagationPolicy: Background`` so
  its controller's pods go too; of every kind the launcher was given. An object another
  controller made (``objects.controlled``) is never taken for ours.

Every kind-specific answer comes from the launcher's kinds (``broker.ports.WorkloadKind``):
this module names none.

Listings of pods and of each kind's workloads are shared by every gang polling at the same
time (``NamespaceApi.shared_listing``/``shared_workloads``): a poll costs one LIST per kind
per cluster, whatever the number of jobs. A poll joins only a listing begun after its own
create, and a workload absent from it is read once directly before it counts as gone: a
listing that began before the create (another tenant's launch polling meanwhile) cannot
roll a launch back as "disappeared". Slot grants decide on a fresh listing of the one
job's pods, so a grant made in the previous poll is always seen.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from adapters.kube.creating import Creator
from adapters.kube.modes import LaunchMode, PodIndex
from adapters.kube.namespace import NamespaceApi
from adapters.kube.objects import (
    LABEL_POD_SET,
    KubeLaunchError,
    controlled,
    job_key,
    labels_of,
    namespace_of,
)
from adapters.kube.plan import ANNOTATION_PLAN, plan_annotation
from adapters.kube.workloads import kind_of, late_pods, workload_body
from broker.model import Placement
from broker.ports import LaunchSpec, RunEnd, WorkloadKind

log = logging.getLogger(__name__)

# Polls in a row of a running workload that fail otherwise than by the member being
# unreachable, before following it is given up (the service then rolls the job back).
FOLLOW_ATTEMPTS = 3


class WorkloadLauncher:
    """Creates, confirms, follows and deletes the workload objects of one member."""

    def __init__(
        self,
        api: NamespaceApi,
        creator: Creator,
        mode: LaunchMode,
        kinds: Sequence[WorkloadKind],
        *,
        poll_seconds: float,
        run_poll_seconds: float,
        sleep: Callable[[float], Awaitable[None]],
    ) -> None:
        self._api = api
        self._objects = creator.objects
        self._creator = creator
        self._mode = mode
        self.kinds = tuple(kinds)
        self._poll_seconds = poll_seconds
        self._run_poll_seconds = run_poll_seconds
        self._sleep = sleep

    def kind(self, spec: LaunchSpec) -> WorkloadKind:
        if spec.workload is None:
            raise KubeLaunchError(f"job {spec.key} has no workload")
        return kind_of(self.kinds, spec.workload)

    # -- create ------------------------------------------------------------------------------

    async def create(self, placement: Placement, spec: LaunchSpec) -> None:
        kind = self.kind(spec)
        body = workload_body(self._objects, spec, kind)
        if self._objects.mode == "pin":  # what a restart restores it from (adapters.kube.plan)
            self._record_plan(body, placement, spec)
        await self._creator.ensure_namespace(spec)
        await self._mode.prepare(placement, spec, late_pods(kind, placement, spec))
        await self._creator.create_or_adopt(
            kind.kind, body, spec,
            lambda b: self._api.create_workload(kind, dict(b)),
            lambda ns, name: self._api.read_workload(kind, ns, name),
        )  # fmt: skip
        where = f"{self._objects.cluster}/{self._objects.namespace(spec.tenant)}"
        log.info("created %s %s (%s) in %s", kind.kind, spec.key, self._objects.mode, where)

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
        kind, namespace = self.kind(spec), self._objects.namespace(spec.tenant)
        for obj in await self._api.shared_workloads(kind, after=since):
            meta = obj.get("metadata") or {}
            here = meta.get("name") == spec.job and namespace_of(obj) == namespace
            if here and self._objects.ours(obj, spec):
                return obj
        read = await self._api.read_workload(kind, namespace, spec.job)
        mine = read is not None and self._objects.ours(read, spec) and not controlled(read)
        return read if mine else None

    async def _pods(self, spec: LaunchSpec, since: int) -> list[dict[str, Any]]:
        listing = await self._api.shared_listing(after=since)
        return [p for p in listing if self._objects.ours(p, spec)]

    @staticmethod
    def _index(kind: WorkloadKind, spec: LaunchSpec) -> PodIndex:
        """A pod's index within its pod set, as the kind's controller labels it."""
        created = spec.workload.object if spec.workload is not None else {}
        return lambda pod: kind.pod_index(created, pod)

    async def wait_running(self, placement: Placement, spec: LaunchSpec) -> None:
        """Return once the gang has started (see the module's docstring); raise
        ``KubeLaunchError`` as soon as it cannot. Polls every ``poll_seconds``; the caller
        applies the gang timeout."""
        kind = self.kind(spec)
        what = f"{kind.kind} {self._objects.namespace(spec.tenant)}/{spec.job}"
        since = self._api.listings_begun()  # the create is done: later listings show it
        while True:
            obj = await self._workload(spec, since)
            if obj is None:
                raise KubeLaunchError(f"gang {spec.key}: {what} disappeared")
            end = kind.end(obj)
            if end is not None and not end.succeeded:
                raise KubeLaunchError(
                    f"gang {spec.key}: {what} {end.reason}: {end.message}", permanent=end.refused
                )
            pods = await self._pods(spec, since)
            failed = sorted(p["metadata"]["name"] for p in pods if _phase(p) == "Failed")
            if failed:
                raise KubeLaunchError(
                    f"gang {spec.key}: pod {failed[0]} Failed before the gang ran"
                )
            if end is not None:
                return  # succeeded before we saw it run
            started = sum(
                1
                for p in pods
                if _phase(p) in ("Running", "Succeeded")
                and labels_of(p).get(LABEL_POD_SET) not in kind.late_pod_sets
            )
            if started >= len(placement.pods) - late_pods(kind, placement, spec):
                return
            await self._mode.tend(placement, spec, pods, self._index(kind, spec))
            if await self._mode.started(spec):
                return
            await self._sleep(self._poll_seconds)

    async def finished(self, placement: Placement, spec: LaunchSpec) -> RunEnd:
        """Wait for the running workload to end, by its own status (see the module's
        docstring). An API error is logged and polled again (an unreachable cluster does
        not end a job); any other failure ``FOLLOW_ATTEMPTS`` polls in a row is raised."""
        kind = self.kind(spec)
        failed = 0
        since = self._api.listings_begun()
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
            await self._sleep(self._run_poll_seconds)

    async def _poll_end(
        self, placement: Placement, spec: LaunchSpec, kind: WorkloadKind, since: int
    ) -> RunEnd | None:
        """One look at a running workload: its end, or None while it runs (its gated pods
        granted slots meanwhile, in pin mode)."""
        obj = await self._workload(spec, since)
        if obj is None:
            where = f"{self._objects.namespace(spec.tenant)}/{spec.job}"
            return RunEnd(False, "WorkloadDeleted", f"{kind.kind} {where} was deleted")
        end = kind.end(obj)
        if end is None:
            pods = await self._pods(spec, since)
            await self._mode.tend(placement, spec, pods, self._index(kind, spec))
        return end

    # -- delete ------------------------------------------------------------------------------

    async def delete(self, spec: LaunchSpec) -> None:
        """Delete the job's workload if it is this job's (its controller's pods go with it)."""
        kind = self.kind(spec)
        namespace = self._objects.namespace(spec.tenant)
        existing = await self._api.read_workload(kind, namespace, spec.job)
        if existing is None:
            return
        if not self._objects.ours(existing, spec) or controlled(existing):
            log.warning("not deleting %s %s/%s: it is not %s's", kind.kind, namespace,
                        spec.job, spec.key)  # fmt: skip
            return
        await self._api.delete_workload(kind, namespace, spec.job)

    async def collect_garbage(self, live_jobs: set[str]) -> list[str]:
        """Delete our workloads of every kind whose job is not live; a kind that cannot be
        listed (not served, not allowed) is skipped with a warning."""
        deleted: list[str] = []
        for kind in self.kinds:
            try:
                found = await self._api.our_workloads(kind)
            except KubeLaunchError as exc:
                log.warning("cannot list %s in %s: %s", kind.plural, self._objects.cluster, exc)
                continue
            for obj in found:
                if job_key(obj) in live_jobs:
                    continue
                namespace, name = namespace_of(obj), obj["metadata"]["name"]
                await self._api.delete_workload(kind, namespace, name)
                deleted.append(f"{kind.kind}/{namespace}/{name}")
        return deleted


def _phase(pod: Mapping[str, Any]) -> str:
    return str((pod.get("status") or {}).get("phase") or "Pending")
