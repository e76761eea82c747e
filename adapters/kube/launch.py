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
  ``scheduling.volcano.sh/v1beta1`` with minMember and queue) and pods labelled into it, a
  pod set with a topology request kept in the domains it was placed in by a node selector
  (``LaunchSpec.domains``, ``objects.confine``);
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

Behind the ports, two launchers built from one ``LaunchSettings`` (``adapters.kube.settings``)
share the member's API calls, the creator of objects (``adapters.kube.creating``) and the
launch mode, a strategy (``adapters.kube.modes``: ``Pin`` or ``Delegate``):
``adapters.kube.gangs.PodGangLauncher`` for a ``podSets`` job's own pods, and
``adapters.kube.workload_runs.WorkloadLauncher`` for a ``spec.workload`` job: it creates
the workload object, the mode looks after its controller's pods (pin: slots,
``adapters.kube.slots``) and its end is read from the workload's own status. What each
kind is (its resource, its pods' index, its end, its late pod sets) comes from ``kinds``
(``broker.ports.WorkloadKind``: the composition passes the manifest's registry); the
adapter names no kind.

The objects themselves are built by ``adapters.kube.objects`` and sent by
``adapters.kube.namespace``. Logs and errors name objects and HTTP statuses only, never the
client configuration (tokens, keys).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from kubernetes.aio.client import ApiClient

from adapters.kube.creating import Creator
from adapters.kube.gangs import PodGangLauncher
from adapters.kube.modes import launch_mode
from adapters.kube.namespace import NamespaceApi
from adapters.kube.objects import KubeLaunchError, job_key, namespace_of
from adapters.kube.our_pods import OurPods
from adapters.kube.removal import GangRemoval
from adapters.kube.run_watch import GangPods
from adapters.kube.settings import LaunchSettings
from adapters.kube.tenancy import TenantNamespaces
from adapters.kube.translate import PodKeys
from adapters.kube.workload_found import workloads_found
from adapters.kube.workload_runs import WorkloadLauncher
from adapters.kubeapi.calls import ApiCalls, describe
from broker.model import Placement, PodBound
from broker.ports import (
    GangRecovery,
    Launcher,
    LaunchSpec,
    RunEnd,
    RunHandle,
    RunWatcher,
    WorkloadFound,
    WorkloadKind,
)

log = logging.getLogger(__name__)


class KubeLauncher(Launcher, RunWatcher, GangRecovery):
    """The ports of one member (see the module's docstring), over a pod-gang launcher and a
    workload launcher that share its settings, API calls, creator and launch mode.

    ``sleep`` (the poll pause) is injected so tests run without real delays, as is
    ``settings.retry_wait`` (tenacity wait strategy)."""

    def __init__(
        self,
        api_client: ApiClient,
        settings: LaunchSettings,
        *,
        kinds: Sequence[WorkloadKind],
        spec_for: Callable[[Placement], LaunchSpec] | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self.settings = settings
        self.cluster = settings.cluster
        self.objects = settings.objects()
        calls = ApiCalls(attempts=settings.attempts, error=KubeLaunchError, log=log,
                         wait=settings.retry_wait, timeout=settings.request_timeout)  # fmt: skip
        self.api = NamespaceApi(api_client, self.objects, calls)
        namespaces = TenantNamespaces(self.api.core, calls, settings.origin)
        creator = Creator(self.api, namespaces, self.objects, settings.attempts)
        mode = launch_mode(settings.mode, self.api, self.objects, creator)
        self._spec_for = spec_for
        self.pause = sleep  # read at each pause, so a test may swap it mid-run
        self.our_pods = OurPods(
            self.cluster, self.api, resync_seconds=settings.resync_seconds,
            inactivity_timeout=settings.watch_inactivity_seconds,
        )  # fmt: skip
        self.gangs = PodGangLauncher(
            self.api, creator, mode, self.our_pods,
            poll_seconds=settings.poll_seconds, sleep=self._pause,
        )  # fmt: skip
        self.workloads = WorkloadLauncher(
            self.api, creator, mode, kinds, poll_seconds=settings.poll_seconds,
            run_poll_seconds=settings.run_poll_seconds, sleep=self._pause,
        )  # fmt: skip
        self.removal = GangRemoval(self.api, self.objects, self.workloads, self.cluster)

    async def _pause(self, seconds: float) -> None:
        await self.pause(seconds)

    @property
    def runs(self) -> GangPods:
        """The pod gangs followed (``run_watch.GangPods``)."""
        return self.gangs.runs

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
                await self.gangs.create(placement, spec)
                await self.gangs.wait_running(placement, spec)
        except Exception:
            await self._delete_quietly(placement, spec)
            raise

    async def create(self, placement: Placement, spec: LaunchSpec | None = None) -> None:
        """Create a pod gang's objects without waiting for it to run."""
        await self.gangs.create(placement, self.spec(placement, spec))

    async def delete(self, placement: Placement, spec: LaunchSpec | None = None) -> None:
        """Delete every object of the gang (``removal.GangRemoval.delete``)."""
        await self.removal.delete(placement, self.spec(placement, spec))

    # -- following a running job ---------------------------------------------------------

    async def finished(self, placement: Placement, spec: LaunchSpec | None = None) -> RunEnd:
        """Wait for a running job to end: a pod gang by its pods, a workload by its own
        status; an unreachable cluster does not end a job."""
        spec = self.spec(placement, spec)
        if spec.workload is not None:
            return await self.workloads.finished(placement, spec)
        return await self.gangs.finished(placement, spec)

    def watch(self, placement: Placement, on_end: Callable[[RunEnd], None]) -> RunHandle:
        """The ``RunNotifier`` port: ``on_end`` when the running job ends. A pod gang from
        one list+watch of our pods for every gang of this cluster, no task per job; a
        ``spec.workload`` job by its workload's own status, a task each
        (``WorkloadLauncher.finished``). Following that fails for good: ``on_end`` gets a
        ``RunEnd.error``."""
        spec = self.spec(placement)
        if spec.workload is None:
            return self.gangs.watch(placement, spec, on_end)
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

    async def read_back_workloads(self) -> dict[str, WorkloadFound]:
        """Our workload objects with their recorded plans and their pods as they stand, by
        job key (``adapters.kube.workload_found``): what restores a running workload job
        after a restart. In delegate mode the gang scheduler, not a plan, put the pods:
        each is ``delegated``, its live pods those ``read_back`` keys."""
        delegated = self.settings.mode != "pin"
        return await workloads_found(self.api, self.objects, self.workloads.kinds, delegated)

    async def read_back(self) -> dict[str, list[PodBound]]:
        """Our non-terminal pods as the ledger's ``PodBound`` events keyed by job key
        (``tenant/name``): what rebuilds reservations after a broker restart. Each is named
        as the cluster's watcher counts it (``translate.PodKeys``, met in the order it lists
        them), so a restore trades exactly the pods counted for its reservation. A pod the
        cluster has not bound yet has node ``""``: the caller's stored placement says which
        node was reserved for it. A pod that cannot be read (say, a quantity the client
        cannot parse) is left out, with a warning: its job, one pod short, is requeued
        and its objects garbage-collected rather than adopted."""
        out: dict[str, list[PodBound]] = {}
        keys = PodKeys()  # keyed as the cluster's watcher keys them, bound pods first
        live = [p for p in await self.api.our_pods() if not _ended(p)]
        for pod in sorted(live, key=lambda p: not (p.get("spec") or {}).get("nodeName")):
            try:
                bound = self.objects.bound_of(pod, keys.hold(pod))
            except Exception as exc:  # one unreadable pod must not cost the others
                log.warning("cluster %s: pod %s/%s of %s not read back: %s", self.cluster,
                            namespace_of(pod), (pod.get("metadata") or {}).get("name"),
                            job_key(pod), type(exc).__name__)  # fmt: skip
                continue
            out.setdefault(job_key(pod), []).append(bound)
        return out

    async def _delete_quietly(self, placement: Placement, spec: LaunchSpec) -> None:
        """A failed launch's objects deleted, best effort: the caller deletes the gang
        again, and what is left meanwhile is garbage-collected."""
        try:
            await self.delete(placement, spec)
        except Exception as exc:  # the launch's own error is the one to raise
            log.warning("rollback of %s incomplete: %s", spec.key, describe(exc))


def _ended(pod: Mapping[str, Any]) -> bool:
    return (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")
