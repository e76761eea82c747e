"""The requests a Cluster API pool sends besides scaling: workload Nodes and Machines.

``PoolMachines`` reads and cordons a workload cluster's Node, reads, lists and marks the
pool's Machines (``cluster.x-k8s.io/delete-machine: "yes"``: deleted first when the replicas
go down) in the management cluster. ``ServedVersion`` finds, once, the Cluster API version
the management cluster serves (``v1beta2``, else ``v1beta1``) by API discovery. Every
request goes through ``adapters.kubeapi.calls.ApiCalls``; failures raise ``CapiPoolError``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, cast

from kubernetes.aio.client import CoreV1Api, CustomObjectsApi

from adapters.capi.objects import (
    ANNOTATION_DELETE_MACHINE,
    GROUP,
    MACHINES,
    MERGE_PATCH,
    VERSIONS,
    CapiPoolError,
)
from adapters.kubeapi.calls import ApiCalls

log = logging.getLogger(__name__)


class ServedVersion:
    """The Cluster API version to read and write at: the first of ``VERSIONS`` (``v1beta2``,
    the storage version, then ``v1beta1``) whose discovery document the management cluster
    serves (``GET /apis/cluster.x-k8s.io/<version>``; 404 = not served). Found on first use
    and kept: a server does not stop serving a version under a running broker."""

    def __init__(self, custom: CustomObjectsApi, calls: ApiCalls) -> None:
        self.custom = custom
        self.calls = calls
        self.version: str | None = None

    async def get(self) -> str:
        if self.version is None:
            for version in VERSIONS:
                if await self._served(version):
                    self.version = version
                    log.info("Cluster API served at %s/%s", GROUP, version)
                    break
            else:
                raise CapiPoolError(f"the management cluster serves none of {GROUP} "
                                    f"{', '.join(VERSIONS)} (HTTP 404)", status=404)  # fmt: skip
        return self.version

    async def _served(self, version: str) -> bool:
        found = await self.calls.maybe(
            f"discover {GROUP}/{version}", lambda: self.custom.get_api_resources(GROUP, version)
        )
        return found is not None


class PoolMachines:
    """Machines in ``namespace`` of the management cluster (``custom``) and the Nodes of
    the workload cluster (``workload``: None when the pool was given no client for it)."""

    def __init__(
        self,
        custom: CustomObjectsApi,
        workload: CoreV1Api | None,
        namespace: str,
        calls: ApiCalls,
        served: ServedVersion,
    ) -> None:
        self.custom = custom
        self.served = served
        self.workload = workload
        self.namespace = namespace
        self.calls = calls

    def _core(self, what: str) -> CoreV1Api:
        if self.workload is None:
            raise CapiPoolError(f"{what}: no workload cluster client given")
        return self.workload

    # -- workload Nodes ----------------------------------------------------------------------

    async def read_node(self, node: str, what: str) -> dict[str, Any] | None:
        core = self._core(what)
        found = await self.calls.maybe(f"{what}: read Node", lambda: core.read_node(node))
        if found is None:
            return None
        return cast(dict[str, Any], core.api_client.sanitize_for_serialization(found))

    async def cordon(self, node: str, what: str) -> None:
        await self._patch_node(node, {"spec": {"unschedulable": True}}, f"{what}: cordon")
        log.info("%s: cordoned", what)

    async def label_node(self, node: str, labels: Mapping[str, str], what: str) -> None:
        await self._patch_node(node, {"metadata": {"labels": dict(labels)}}, what)

    async def _patch_node(self, node: str, patch: dict[str, Any], step: str) -> None:
        core = self._core(step)
        await self.calls.checked(
            step, lambda: core.patch_node(node, patch, _content_type=MERGE_PATCH)
        )

    # -- Machines ----------------------------------------------------------------------------

    async def read_machine(self, machine: str, what: str) -> dict[str, Any] | None:
        version = await self.served.get()
        found = await self.calls.maybe(
            f"{what}: read Machine {machine}",
            lambda: self.custom.get_namespaced_custom_object(
                GROUP, version, self.namespace, MACHINES, machine
            ),
        )
        return None if found is None else cast(dict[str, Any], found)

    async def list(self, what: str, selector: str | None = None) -> list[dict[str, Any]]:
        """Machines in the pool's namespace (``selector``: a label selector, also checked
        by the caller, since not every server applies it)."""
        version = await self.served.get()
        listing = await self.calls.checked(
            f"{what}: list Machines",
            lambda: self.custom.list_namespaced_custom_object(
                GROUP, version, self.namespace, MACHINES, label_selector=selector or ""
            ),
        )
        return list(cast(dict[str, Any], listing).get("items") or [])

    async def of_gone_node(self, node: str, what: str) -> dict[str, Any]:
        """The Machine whose ``status.nodeRef`` names a Node no longer in the cluster."""
        for machine in await self.list(what):
            node_ref = (machine.get("status") or {}).get("nodeRef") or {}
            if node_ref.get("name") == node:
                return machine
        raise CapiPoolError(
            f"{what}: no Node {node} in the workload cluster and no Machine in "
            f"{self.namespace} refers to it"
        )

    async def mark(self, machine: str, what: str) -> None:
        """Annotate the Machine ``delete-machine: "yes"``: the first one deleted."""
        patch = {"metadata": {"annotations": {ANNOTATION_DELETE_MACHINE: "yes"}}}
        version = await self.served.get()
        await self.calls.checked(
            f"{what}: mark Machine {machine}",
            lambda: self.custom.patch_namespaced_custom_object(
                GROUP, version, self.namespace, MACHINES, machine, patch,
                _content_type=MERGE_PATCH,
            ),
        )  # fmt: skip
        log.info("%s: Machine %s marked %s", what, machine, ANNOTATION_DELETE_MACHINE)
