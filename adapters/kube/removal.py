"""Deleting what is ours in a member: one gang's objects (``delete``: after a failed launch,
a gang timeout, a cancel or a preemption) and the garbage collection of our objects whose
job is not live (``collect_garbage``).

A gang's objects are its workload (a ``spec.workload`` job: deleted first, with
``propagationPolicy: Background``, so its controller does not make again the pods deleted
after it), its pods (by name and by the job's labels), its rendezvous Service and, in
delegate mode, its PodGroup. Objects already gone are fine; only objects carrying our
origin are deleted, and with an owner only that job's (with one namespace pattern for all
tenants, another tenant's job of the same name has objects of the same names).
"""

from __future__ import annotations

import logging

from adapters.kube.namespace import NamespaceApi
from adapters.kube.objects import GangObjects, job_key, namespace_of, pod_group_name, pod_name
from adapters.kube.rendezvous import service_name
from adapters.kube.workload_runs import WorkloadLauncher
from broker.model import Placement
from broker.ports import LaunchSpec

log = logging.getLogger(__name__)


class GangRemoval:
    """Deletes the gangs, and the garbage, of one launcher's member."""

    def __init__(
        self, api: NamespaceApi, objects: GangObjects, workloads: WorkloadLauncher, cluster: str
    ) -> None:
        self.api = api
        self.objects = objects
        self.workloads = workloads
        self.cluster = cluster

    async def delete(self, placement: Placement, spec: LaunchSpec) -> None:
        """Delete every object of the gang (see the module's docstring)."""
        namespace = self.objects.namespace(spec.tenant)
        if spec.workload is not None:
            await self.workloads.delete(spec)
        names = {pod_name(p, spec) for p in placement.pods}
        # The job's own pods by its labels (O(its pods), not a listing of all of ours).
        names.update(
            p["metadata"]["name"] for p in await self.api.job_pods(namespace, spec.tenant, spec.job)
        )
        for name in sorted(names):
            await self._delete_pod(namespace, name, owner=spec)
        await self._delete_service(namespace, service_name(spec), owner=spec)
        if self.objects.mode == "delegate":
            await self._delete_pod_group(namespace, pod_group_name(spec), owner=spec)
        log.info("deleted gang %s in %s/%s", spec.key, self.cluster, namespace)

    async def collect_garbage(self, live_jobs: set[str]) -> list[str]:
        """Delete our objects, in every tenant namespace, whose job (``tenant/name``) is not
        in ``live_jobs``; returns what was deleted as ``kind/namespace/name``."""
        # Workloads first: their controllers would make again the pods deleted before them.
        deleted = await self.workloads.collect_garbage(live_jobs)
        for pod in await self.api.our_pods():
            if job_key(pod) not in live_jobs:
                namespace, name = namespace_of(pod), pod["metadata"]["name"]
                await self._delete_pod(namespace, name, owner=None)
                deleted.append(f"Pod/{namespace}/{name}")
        for service in await self.api.our_services():
            if job_key(service) not in live_jobs:
                namespace, name = namespace_of(service), service["metadata"]["name"]
                await self._delete_service(namespace, name, owner=None)
                deleted.append(f"Service/{namespace}/{name}")
        if self.objects.mode == "delegate":
            for group in await self.api.our_pod_groups():
                if job_key(group) not in live_jobs:
                    namespace, name = namespace_of(group), group["metadata"]["name"]
                    await self._delete_pod_group(namespace, name, owner=None)
                    deleted.append(f"PodGroup/{namespace}/{name}")
        if deleted:
            log.info("garbage-collected %d objects in %s", len(deleted), self.cluster)
        return deleted

    async def _delete_pod(self, namespace: str, name: str, *, owner: LaunchSpec | None) -> None:
        """Delete a pod; with ``owner``, only if it carries that job's labels."""
        if owner is not None:
            existing = await self.api.read_pod(namespace, name)
            if existing is None:
                return
            if not self.objects.ours(existing, owner):
                log.warning("not deleting pod %s/%s: it is not %s's", namespace, name, owner.key)
                return
        await self.api.delete_pod(namespace, name)

    async def _delete_service(self, namespace: str, name: str, *, owner: LaunchSpec | None) -> None:
        """Delete a Service if it is ours (with ``owner``: that job's)."""
        existing = await self.api.read_service(namespace, name)
        if existing is None:
            return
        mine = self.objects.ours(existing, owner) if owner else self.objects.has_origin(existing)
        if not mine:
            log.warning("not deleting service %s/%s: it is not ours to delete", namespace, name)
            return
        await self.api.delete_service(namespace, name)

    async def _delete_pod_group(
        self, namespace: str, name: str, *, owner: LaunchSpec | None
    ) -> None:
        """Delete a PodGroup if it is ours (with ``owner``: that job's)."""
        existing = await self.api.read_pod_group(namespace, name)
        if existing is None:
            return
        mine = self.objects.ours(existing, owner) if owner else self.objects.has_origin(existing)
        if not mine:
            log.warning("not deleting PodGroup %s/%s: it is not ours to delete", namespace, name)
            return
        await self.api.delete_pod_group(namespace, name)


__all__ = ["GangRemoval"]
