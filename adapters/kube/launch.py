"""Gangs out: launch placed gangs into a Kubernetes member cluster.

``KubeLauncher`` implements the live ports ``broker.ports.Launcher`` (``launch(placement)``
returns once every pod of the gang runs and raises ``KubeLaunchError``, a ``LaunchError``,
on failure, ``permanent`` when the member refused a create for good (``calls.refused``:
400/403/409/422, or 404 once the namespace was ensured again; an object of that name that
is not this job's); ``delete(placement)`` removes every object of the gang:
``adapters.kube.removal``), ``RunWatcher`` (``finished``), ``RunNotifier`` (``watch``: from
one list+watch of our pods per cluster, ``adapters.kube.our_pods`` and
``adapters.kube.run_watch``; a follow that fails for good calls back with a
``RunEnd.error``) and ``GangRecovery`` (``read_back``, ``read_back_workloads``,
``collect_garbage``) in the tenant
namespaces of one cluster, with the official client's asyncio API (``kubernetes.aio``).

Each tenant's gangs go into its own namespace (the pattern with ``{tenant}`` replaced,
``adapters.kube.objects``), which is made to exist with the Pod Security labels of the
tenant's level (``LaunchSpec.pod_security``) before the first object goes in
(``adapters.kube.tenancy``: once per launcher, again after a create answered 404). Reading
back and garbage collection list our objects across all namespaces.

Two modes:

* ``delegate``: a PodGroup for the cluster's gang scheduler (scheduler-plugins coscheduling
  ``scheduling.x-k8s.io/v1alpha1`` with minMember and scheduleTimeoutSeconds, or Volcano
  ``scheduling.volcano.sh/v1beta1`` with minMember and queue) and pods labelled into it;
* ``pin``: pods with required node affinity to the node the broker chose.

In both, every gang gets rendezvous (``adapters.kube.rendezvous``): a headless Service
selecting its pods, created before them, and on every pod ``hostname``/``subdomain`` and the
env ``WORLD_SIZE``, ``RANK``, ``MASTER_ADDR``, ``MASTER_PORT``, ``FEDBROKER_JOB``,
``FEDBROKER_POD_SET``, ``FEDBROKER_POD_INDEX``. The Service carries our labels, so deleting
the gang, its rollback and garbage collection remove it with the pods.

What the service knows about a job beyond the ``Placement`` (tenant, job name, pod templates,
minMember, timeout, queue) comes in a ``broker.ports.LaunchSpec``: passed to ``launch``
directly, or looked up by the constructor's ``spec_for`` callback so ``launch(placement)``
keeps the port's signature. Without either, a spec is derived from the placement alone.

A ``spec.workload`` job (batch Job, JobSet, PyTorchJob, RayJob, RayCluster) gets its
workload object instead of pods and a Service: ``adapters.kube.workload_runs`` creates it,
pins its controller's pods to the placement (pin mode: ``adapters.kube.slots``) and reads
its end from the workload's own status.

The objects themselves are built by ``adapters.kube.objects`` and sent by
``adapters.kube.namespace``. Logs and errors name objects and HTTP statuses only, never the
client configuration (tokens, keys).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from kubernetes.aio.client import ApiClient
from kubernetes.aio.client.exceptions import ApiException
from tenacity.wait import wait_base

from adapters.kube.namespace import NamespaceApi
from adapters.kube.objects import (
    Flavor,
    GangObjects,
    KubeLaunchError,
    Mode,
    job_key,
    namespace_of,
    pod_group_name,
)
from adapters.kube.our_pods import OurPods
from adapters.kube.removal import GangRemoval
from adapters.kube.rendezvous import Rendezvous
from adapters.kube.run_watch import GangPods
from adapters.kube.tenancy import TenantNamespaces
from adapters.kube.workload_found import workloads_found
from adapters.kube.workload_runs import WorkloadRuns
from adapters.kubeapi.calls import HTTP_NOT_FOUND, ApiCalls, describe, refused
from broker.model import Placement, PodBound, PodPlacement
from broker.ports import (
    GangRecovery,
    Launcher,
    LaunchSpec,
    RunEnd,
    RunHandle,
    RunWatcher,
    WorkloadFound,
)

log = logging.getLogger(__name__)

HTTP_CONFLICT = 409


class KubeLauncher(Launcher, RunWatcher, GangRecovery):
    """Launches, confirms, deletes and garbage-collects gangs in the tenant namespaces of a
    cluster (``namespace_pattern``: ``{tenant}`` is replaced by the tenant's name).

    ``retry_wait`` (tenacity wait strategy) and ``sleep`` (the poll pause of
    ``wait_running``) are injected so tests run without real delays."""

    def __init__(
        self,
        api_client: ApiClient,
        namespace_pattern: str,
        mode: Mode,
        podgroup_flavor: Flavor = "coscheduling",
        origin: str = "fedbroker",
        *,
        cluster: str = "",
        spec_for: Callable[[Placement], LaunchSpec] | None = None,
        gpu_resource: str = "nvidia.com/gpu",
        shared_gpu_resource: str | None = None,
        scheduler_name: str | None = None,
        volcano_queues: Mapping[str, str] | None = None,
        default_image: str = "busybox:stable",
        attempts: int = 5,
        request_timeout: float = 30.0,
        retry_wait: wait_base | None = None,
        poll_seconds: float = 1.0,
        run_poll_seconds: float = 5.0,
        resync_seconds: float = 300.0,
        watch_inactivity_seconds: float = 90.0,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self.objects = GangObjects(
            namespace_pattern, mode, podgroup_flavor, origin, cluster=cluster,
            gpu_resource=gpu_resource, shared_gpu_resource=shared_gpu_resource,
            scheduler_name=scheduler_name, default_image=default_image,
            volcano_queues=volcano_queues,
        )  # fmt: skip
        calls = ApiCalls(attempts=attempts, error=KubeLaunchError, log=log, wait=retry_wait,
                         timeout=request_timeout)  # fmt: skip
        self.api = NamespaceApi(api_client, self.objects, calls)
        self.namespaces = TenantNamespaces(self.api.core, calls, origin)
        self.mode: Mode = mode
        self.cluster = cluster
        self.attempts = attempts
        self._spec_for = spec_for
        self.poll_seconds = poll_seconds
        self.run_poll_seconds = run_poll_seconds
        self.pause = sleep
        self.workloads = WorkloadRuns(self)
        self.removal = GangRemoval(self.api, self.objects, self.workloads, cluster)
        self.our_pods = OurPods(
            cluster, self.api, resync_seconds=resync_seconds,
            inactivity_timeout=watch_inactivity_seconds,
        )  # fmt: skip
        self.runs = GangPods(self.our_pods, self.objects)

    def spec(self, placement: Placement, spec: LaunchSpec | None = None) -> LaunchSpec:
        if spec is not None:
            return spec
        if self._spec_for is not None:
            return self._spec_for(placement)
        return LaunchSpec.of(placement)

    # -- the Launcher port -------------------------------------------------------------------

    async def launch(self, placement: Placement, spec: LaunchSpec | None = None) -> None:
        """Create the gang's objects, then wait until it runs. On failure (whatever it
        raised: ``KubeLaunchError`` or anything the client or a bad answer threw) what was
        created is deleted, best effort, and the error raised. The caller applies the gang
        timeout (by cancelling this) and deletes the gang then, and after a failure too."""
        spec = self.spec(placement, spec)
        try:
            if spec.workload is not None:
                await self.workloads.create(placement, spec)
                await self.workloads.wait_running(placement, spec)
            else:
                await self.create(placement, spec)
                await self.wait_running(placement, spec)
        except Exception:
            await self._delete_quietly(placement, spec)
            raise

    async def delete(self, placement: Placement, spec: LaunchSpec | None = None) -> None:
        """Delete every object of the gang (``removal.GangRemoval.delete``)."""
        await self.removal.delete(placement, self.spec(placement, spec))

    # -- create ------------------------------------------------------------------------------

    async def create(self, placement: Placement, spec: LaunchSpec | None = None) -> None:
        """Make the tenant's namespace exist, then create the PodGroup (delegate mode) and
        the gang's rendezvous Service, then the pods; objects that already exist with our
        labels count as created."""
        spec = self.spec(placement, spec)
        await self.ensure_namespace(spec)
        if self.mode == "delegate":
            await self.ensure_pod_group(placement, spec)
        rendezvous = self.objects.rendezvous(placement, spec)
        await self._ensure_service(rendezvous, spec)
        for pod in placement.pods:
            await self._ensure_pod(pod, spec, rendezvous)
        where = f"{self.cluster}/{self.objects.namespace(spec.tenant)}"
        log.info(
            "created gang %s (%d pods, %s) in %s", spec.key, len(placement.pods), self.mode, where
        )

    async def ensure_namespace(self, spec: LaunchSpec) -> None:
        namespace = self.objects.namespace(spec.tenant)
        await self.namespaces.ensure(namespace, spec.tenant, spec.pod_security)

    async def _create_in_namespace(
        self, spec: LaunchSpec, what: str, create: Callable[[], Awaitable[None]]
    ) -> None:
        """``create``, and once more if it answered 404: the namespace was deleted since it
        was ensured, so it is ensured again first. Other ``ApiException``s propagate."""
        try:
            await create()
            return
        except ApiException as exc:
            if exc.status != HTTP_NOT_FOUND:
                raise
        namespace = self.objects.namespace(spec.tenant)
        log.warning("%s: 404 Not Found; ensuring namespace %s again", what, namespace)
        self.namespaces.forget(namespace)
        await self.ensure_namespace(spec)
        await create()

    async def _ensure_service(self, rendezvous: Rendezvous, spec: LaunchSpec) -> None:
        body = self.objects.service_body(rendezvous, spec)
        await self.create_or_adopt(
            "service", body, spec, self.api.create_service, self.api.read_service
        )

    async def _ensure_pod(
        self, pod: PodPlacement, spec: LaunchSpec, rendezvous: Rendezvous | None = None
    ) -> None:
        body = self.objects.pod_body(pod, spec, rendezvous)
        await self.create_or_adopt("pod", body, spec, self.api.create_pod, self.api.read_pod)

    async def create_or_adopt(
        self,
        kind: str,
        body: dict[str, Any],
        spec: LaunchSpec,
        create: Callable[[Mapping[str, Any]], Awaitable[None]],
        read: Callable[[str, str], Awaitable[dict[str, Any] | None]],
    ) -> None:
        """Create ``body``; AlreadyExists with this job's labels is success (idempotent
        relaunch), anyone else's object of that name fails the launch for good and is left
        alone, as does any other refusal of the create (``refused``)."""
        namespace, name = body["metadata"]["namespace"], body["metadata"]["name"]
        try:
            await self._create_in_namespace(
                spec, f"create {kind} {namespace}/{name}", lambda: create(body)
            )
        except ApiException as exc:
            if exc.status != HTTP_CONFLICT:
                raise KubeLaunchError(
                    f"create {kind} {name}: {describe(exc)}", permanent=refused(exc)
                ) from exc
            existing = await read(namespace, name)
            if existing is not None and not self.objects.ours(existing, spec):
                raise KubeLaunchError(
                    f"{kind} {name} already exists and does not belong to {spec.key}",
                    permanent=True,
                ) from exc
            if existing is None:  # gone again since: the next attempt creates it
                raise KubeLaunchError(
                    f"create {kind} {name}: AlreadyExists, then not found"
                ) from exc
            log.info("%s %s already exists with our labels; adopted", kind, name)

    async def ensure_pod_group(self, placement: Placement, spec: LaunchSpec) -> None:
        body = self.objects.pod_group_body(placement, spec)
        namespace, name = body["metadata"]["namespace"], body["metadata"]["name"]
        try:
            await self._create_in_namespace(
                spec,
                f"create PodGroup {namespace}/{name}",
                lambda: self.api.create_pod_group(body),
            )
            return
        except ApiException as exc:
            if exc.status != HTTP_CONFLICT:
                raise KubeLaunchError(
                    f"create PodGroup {name}: {describe(exc)}", permanent=refused(exc)
                ) from exc
        # AlreadyExists: adopt it if ours, and bring its spec up to date (optimistic update:
        # a 409 Conflict there means someone changed it meanwhile; re-read and try again).
        for _ in range(self.attempts):
            existing = await self.api.read_pod_group(namespace, name)
            if existing is None:
                raise KubeLaunchError(f"create PodGroup {name}: AlreadyExists, then not found")
            if not self.objects.ours(existing, spec):
                raise KubeLaunchError(
                    f"PodGroup {name} already exists and does not belong to {spec.key}",
                    permanent=True,
                )
            current = existing.get("spec") or {}
            if all(current.get(k) == v for k, v in body["spec"].items()):
                log.info("PodGroup %s already exists with our labels; adopted", name)
                return
            version = (existing.get("metadata") or {}).get("resourceVersion")
            patch = {"metadata": {"resourceVersion": version}, "spec": body["spec"]}
            try:
                await self.api.patch_pod_group(namespace, name, patch)
                log.info("PodGroup %s adopted and updated", name)
                return
            except ApiException as exc:
                if exc.status != HTTP_CONFLICT:
                    raise KubeLaunchError(f"update PodGroup {name}: {describe(exc)}") from exc
                log.info("PodGroup %s changed meanwhile (409 Conflict); re-reading", name)
        raise KubeLaunchError(f"update PodGroup {name}: still conflicting after re-reads")

    # -- confirm -----------------------------------------------------------------------------

    async def wait_running(self, placement: Placement, spec: LaunchSpec | None = None) -> None:
        """Return when every pod of the gang is Running (or, in delegate mode, the PodGroup's
        phase is Running); raise ``KubeLaunchError`` as soon as a pod failed or vanished, or
        our pods cannot be listed (the list's bounded retries spent) before they ever were.
        The pods' phases come from the watch of our pods (``run_watch.GangPods.started``);
        a delegate-mode PodGroup is read every ``poll_seconds``. The caller applies the gang
        timeout."""
        spec = self.spec(placement, spec)
        running, handle = self.runs.started(placement, spec)
        try:
            while not running.done():
                failure = self.our_pods.list_failure
                if failure is not None and not self.our_pods.synced:
                    raise KubeLaunchError(failure)
                if self.mode == "delegate" and await self._pod_group_running(spec):
                    return
                pause = asyncio.ensure_future(self.pause(self.poll_seconds))
                try:
                    await asyncio.wait({running, pause}, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    pause.cancel()
            running.result()
        finally:
            handle.cancel()

    async def _pod_group_running(self, spec: LaunchSpec) -> bool:
        namespace = self.objects.namespace(spec.tenant)
        group = await self.api.read_pod_group(namespace, pod_group_name(spec))
        return group is not None and (group.get("status") or {}).get("phase") == "Running"

    async def finished(self, placement: Placement, spec: LaunchSpec | None = None) -> RunEnd:
        """Wait for a running gang to end (``run_watch.run_end``: succeeded once every pod
        Succeeded, failed as soon as one Failed or vanished), as ``watch`` sees it; an
        unreachable cluster does not end a job."""
        spec = self.spec(placement, spec)
        if spec.workload is not None:
            return await self.workloads.finished(placement, spec)
        ended: asyncio.Future[RunEnd] = asyncio.get_running_loop().create_future()

        def on_end(end: RunEnd) -> None:
            if not ended.done():
                ended.set_result(end)

        handle = self.runs.watch(placement, spec, on_end)
        try:
            return await ended
        finally:
            handle.cancel()

    # -- the RunNotifier port ----------------------------------------------------------------

    def watch(self, placement: Placement, on_end: Callable[[RunEnd], None]) -> RunHandle:
        """Call ``on_end`` when the running gang ends: one list+watch of our pods for every
        gang of this cluster (``run_watch.GangPods``), no task per job; a ``spec.workload`` job is
        followed by its workload's own status, a task each (``WorkloadRuns.finished``).
        Following that fails for good: ``on_end`` gets a ``RunEnd.error``."""
        spec = self.spec(placement)
        if spec.workload is None:
            return self.runs.watch(placement, spec, on_end)
        task = asyncio.ensure_future(self.workloads.finished(placement, spec))

        def done(ended: asyncio.Future[RunEnd]) -> None:
            if ended.cancelled():
                return
            error = ended.exception()
            if isinstance(error, Exception):
                on_end(RunEnd(False, error=error))
            elif error is None:
                on_end(ended.result())

        task.add_done_callback(done)
        return task

    # -- the GangRecovery port ---------------------------------------------------------------

    async def collect_garbage(self, live_jobs: set[str]) -> list[str]:
        """Delete our objects whose job is not live (``removal.GangRemoval``)."""
        return await self.removal.collect_garbage(live_jobs)

    async def read_back(self) -> dict[str, list[PodBound]]:
        """Our non-terminal pods as the ledger's ``PodBound`` events keyed by job key
        (``tenant/name``): what rebuilds reservations after a broker restart. A pod the
        cluster has not bound yet has node ``""``: the caller's stored placement says which
        node was reserved for it. A pod that cannot be read (say, a quantity the client
        cannot parse) is left out, with a warning: its job, one pod short, is requeued
        and its objects garbage-collected rather than adopted."""
        out: dict[str, list[PodBound]] = {}
        for pod in await self.api.our_pods():
            if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
                continue
            try:
                bound = self.objects.bound_of(pod)
            except Exception as exc:  # one unreadable pod must not cost the others
                log.warning("cluster %s: pod %s/%s of %s not read back: %s", self.cluster,
                            namespace_of(pod), (pod.get("metadata") or {}).get("name"),
                            job_key(pod), type(exc).__name__)  # fmt: skip
                continue
            out.setdefault(job_key(pod), []).append(bound)
        return out

    async def read_back_workloads(self) -> dict[str, WorkloadFound]:
        """Our workload objects with their recorded plans and their pods as they stand, by
        job key (``adapters.kube.workload_found``): what restores a running workload job
        after a restart. Pin mode only: in delegate mode the gang scheduler, not a plan,
        put the pods, and the job is restored from its pods (``read_back``)."""
        if self.mode != "pin":
            return {}
        return await workloads_found(self.api, self.objects)

    async def _delete_quietly(self, placement: Placement, spec: LaunchSpec) -> None:
        """A failed launch's objects deleted, best effort: the caller deletes the gang
        again, and what is left meanwhile is garbage-collected."""
        try:
            await self.delete(placement, spec)
        except Exception as exc:  # the launch's own error is the one to raise
            log.warning("rollback of %s incomplete: %s", spec.key, describe(exc))
