"""Creating one job's objects in a member: the tenant's namespace made to exist first, a
create that answered 404 tried again once the namespace was ensured again, AlreadyExists
with this job's labels adopted (idempotent relaunch), and the delegate mode's PodGroup
brought up to date when adopted. Shared by the pod-gang and the workload launchers.

A create the member refuses for good (``calls.refused``: 400/403/409 not ours/422, or 404
after the namespace was ensured again) raises ``KubeLaunchError`` with ``permanent``, so
the service fails the job at its refusal limit instead of retrying forever.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from kubernetes.aio.client.exceptions import ApiException

from adapters.kube.namespace import NamespaceApi
from adapters.kube.objects import GangObjects, KubeLaunchError, controlled
from adapters.kube.tenancy import TenantNamespaces
from adapters.kubeapi.calls import HTTP_NOT_FOUND, describe, refused
from broker.model import Placement
from broker.ports import LaunchSpec

log = logging.getLogger(__name__)

HTTP_CONFLICT = 409


class Creator:
    """Creates, or adopts, the objects of one member's jobs (see the module's docstring);
    ``attempts`` bounds the re-reads of a PodGroup that keeps changing under us."""

    def __init__(
        self,
        api: NamespaceApi,
        namespaces: TenantNamespaces,
        objects: GangObjects,
        attempts: int,
    ) -> None:
        self.api = api
        self.namespaces = namespaces
        self.objects = objects
        self.attempts = attempts

    async def ensure_namespace(self, spec: LaunchSpec) -> None:
        namespace = self.objects.namespace(spec.tenant)
        await self.namespaces.ensure(namespace, spec.tenant, spec.pod_security)

    async def _in_namespace(
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
            await self._in_namespace(
                spec, f"create {kind} {namespace}/{name}", lambda: create(body)
            )
        except ApiException as exc:
            if exc.status != HTTP_CONFLICT:
                raise KubeLaunchError(
                    f"create {kind} {name}: {describe(exc)}", permanent=refused(exc)
                ) from exc
            existing = await read(namespace, name)
            # One another controller made (copying our labels) is not ours to adopt.
            mine = existing is not None and self.objects.ours(existing, spec)
            if existing is not None and (not mine or controlled(existing)):
                raise KubeLaunchError(
                    f"{kind} {name} already exists and does not belong to {spec.key}",
                    permanent=True,
                ) from exc
            if existing is None:  # gone again since: the next attempt creates it
                raise KubeLaunchError(
                    f"create {kind} {name}: AlreadyExists, then not found"
                ) from exc
            log.info("%s %s already exists with our labels; adopted", kind, name)

    async def ensure_pod_group(self, placement: Placement, spec: LaunchSpec, late: int = 0) -> None:
        """Create the job's PodGroup (delegate mode), or adopt ours and bring its spec up
        to date (``late``: pods left out of its minMember, ``GangObjects.pod_group_body``)."""
        body = self.objects.pod_group_body(placement, spec, late)
        namespace, name = body["metadata"]["namespace"], body["metadata"]["name"]
        try:
            await self._in_namespace(
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
        await self._adopt_pod_group(spec, body)

    async def _adopt_pod_group(self, spec: LaunchSpec, body: dict[str, Any]) -> None:
        """AlreadyExists: adopt it if ours, and bring its spec up to date (optimistic
        update: a 409 Conflict there means someone changed it meanwhile; re-read, again)."""
        namespace, name = body["metadata"]["namespace"], body["metadata"]["name"]
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


__all__ = ["Creator"]
