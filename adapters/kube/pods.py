"""Pods and logs back: a job's pods in a Kubernetes member and their logs, streamed.

``KubePods`` implements ``broker.ports.PodReader`` for one cluster with the launcher's
``GangObjects`` (namespaces, labels) and its own bounded calls (``ApiCalls``). Only pods carrying
our origin and the job's tenant and job labels, in the job's tenant namespace, are ever
listed or read (``GangObjects.ours``): a pod of another job, or of another tenant, is
``PodNotFound`` whatever its name. The rows come from one LIST in that namespace by the
job's labels: phase, node, restarts (the sum of its containers' ``restartCount``) and the
slot (the ``fedbroker.io/slot`` annotation the launcher records in pin mode, else the pod
set and the index its workload's kind reads from its controller's labels
(``WorkloadKind.pod_index``: the launcher's kinds) or its name gives).

Logs are read with ``read_namespaced_pod_log`` without preloading: the member's aiohttp
response is handed over chunk by chunk as it arrives (``MemberLog``), and ``aclose`` (the
HTTP handler calls it when its client goes away, or when its byte cap is reached) closes
that response, so the member's stream ends with ours. Errors name the pod and the HTTP
status only.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any, cast

import aiohttp
from kubernetes.aio.client import ApiClient, CoreV1Api
from kubernetes.aio.client.exceptions import ApiException
from tenacity.wait import wait_base

from adapters.kube.objects import (
    LABEL_JOB,
    LABEL_POD_SET,
    LABEL_TENANT,
    GangObjects,
    labels_of,
    namespace_of,
    pod_set_of,
)
from adapters.kube.workloads import kind_of
from adapters.kubeapi.calls import HTTP_NOT_FOUND, ApiCalls, describe
from broker.ports import (
    ContainerNotFound,
    LaunchSpec,
    LogRequest,
    LogStream,
    PodNotFound,
    PodReadError,
    PodRow,
    WorkloadKind,
)

log = logging.getLogger(__name__)

ANNOTATION_SLOT = "fedbroker.io/slot"
CHUNK_BYTES = 64 << 10
# A followed log's request ends after this long at most (the client follows again).
FOLLOW_SECONDS = 6 * 3600.0

HTTP_BAD_REQUEST = 400


def restarts_of(pod: Mapping[str, Any]) -> int:
    """The sum of the pod's containers' ``restartCount``s."""
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    return sum(int(s.get("restartCount") or 0) for s in statuses if isinstance(s, Mapping))


def slot_of(
    pod: Mapping[str, Any], spec: LaunchSpec, kinds: Sequence[WorkloadKind]
) -> tuple[str, str]:
    """``(pod set, slot)`` of one of the job's pods (see the module's docstring); a
    ``spec.workload`` job's kind is looked up in ``kinds``."""
    meta = pod.get("metadata") or {}
    name = str(meta.get("name") or "")
    labels = labels_of(pod)
    annotations = cast(Mapping[str, str], meta.get("annotations") or {})
    pod_set = labels.get(LABEL_POD_SET) or ""
    index: int | str | None = None
    if spec.workload is not None:
        index = kind_of(kinds, spec.workload).pod_index(spec.workload.object, pod)
    if not pod_set and index is None and name.startswith(f"{spec.job}-"):
        pod_set = pod_set_of(name, spec)  # the launcher's own <job>-<podset>-<index>
    if index is None and pod_set and name.startswith(f"{spec.job}-{pod_set}-"):
        index = name.rpartition("-")[2]
    slot = annotations.get(ANNOTATION_SLOT) or (f"{pod_set}-{index}" if index is not None else "")
    return pod_set, slot


def containers_of(pod: Mapping[str, Any]) -> list[str]:
    """The pod's container names: its containers, then its init containers."""
    spec = pod.get("spec") or {}
    return [
        str(c.get("name"))
        for kind in ("containers", "initContainers")
        for c in spec.get(kind) or ()
        if isinstance(c, Mapping)
    ]


class MemberLog:
    """One member's log response, chunk by chunk as it arrives; ``aclose`` closes it."""

    def __init__(self, response: aiohttp.ClientResponse, what: str) -> None:
        self._response = response
        self._what = what

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self._chunks()

    async def _chunks(self) -> AsyncIterator[bytes]:
        try:
            async for chunk in self._response.content.iter_chunked(CHUNK_BYTES):
                yield chunk
        except (aiohttp.ClientError, TimeoutError) as exc:
            # The member went away or the request's time ran out: the log ends here.
            log.info("%s ended: %s", self._what, type(exc).__name__)
        finally:
            self._response.close()

    async def aclose(self) -> None:
        self._response.close()

    @property
    def closed(self) -> bool:
        return self._response.closed


class KubePods:
    """The ``PodReader`` of one Kubernetes member (see the module's docstring), with the
    launcher's ``objects`` (namespaces, labels) and its own client calls."""

    def __init__(
        self,
        api_client: ApiClient,
        objects: GangObjects,
        *,
        kinds: Sequence[WorkloadKind],
        attempts: int = 3,
        request_timeout: float = 30.0,
        follow_seconds: float = FOLLOW_SECONDS,
        retry_wait: wait_base | None = None,
    ) -> None:
        self.core = CoreV1Api(api_client)
        self.objects = objects
        self.kinds = tuple(kinds)
        self.request_timeout = request_timeout
        self.follow_seconds = follow_seconds
        cluster = objects.cluster
        self.calls = ApiCalls(
            attempts=attempts, error=lambda m: PodReadError(f"cluster {cluster}: {m}"), log=log,
            wait=retry_wait, timeout=request_timeout,
        )  # fmt: skip

    def _selector(self, spec: LaunchSpec) -> str:
        return f"{self.objects.selector},{LABEL_TENANT}={spec.tenant},{LABEL_JOB}={spec.job}"

    def _ours(self, pod: Mapping[str, Any], spec: LaunchSpec) -> bool:
        return self.objects.ours(pod, spec) and namespace_of(pod) == self.objects.namespace(
            spec.tenant
        )

    async def _listed(self, spec: LaunchSpec) -> list[dict[str, Any]]:
        namespace = self.objects.namespace(spec.tenant)
        listed = await self.calls.checked(
            f"list pods of job {namespace}/{spec.job}",
            lambda: self.core.list_namespaced_pod(namespace, label_selector=self._selector(spec)),
        )
        body = self.core.api_client.sanitize_for_serialization(listed)
        items = cast(list[dict[str, Any]], body.get("items") or [])
        return [p for p in items if self._ours(p, spec)]

    async def pods(self, cluster: str, spec: LaunchSpec) -> list[PodRow]:
        rows = []
        for pod in await self._listed(spec):
            pod_set, slot = slot_of(pod, spec, self.kinds)
            rows.append(
                PodRow(
                    name=str(pod["metadata"]["name"]),
                    pod_set=pod_set,
                    cluster=cluster,
                    node=str((pod.get("spec") or {}).get("nodeName") or ""),
                    phase=str((pod.get("status") or {}).get("phase") or "Pending"),
                    restarts=restarts_of(pod),
                    slot=slot,
                )
            )
        return sorted(rows, key=lambda r: r.name)

    async def _our_pod(self, spec: LaunchSpec, name: str) -> dict[str, Any]:
        namespace = self.objects.namespace(spec.tenant)
        pod = await self.calls.maybe(
            f"read pod {namespace}/{name}", lambda: self.core.read_namespaced_pod(name, namespace)
        )
        found = None if pod is None else self.core.api_client.sanitize_for_serialization(pod)
        if found is None or not self._ours(found, spec):
            raise PodNotFound(f"no pod {name!r} in job {spec.job!r}")
        return cast(dict[str, Any], found)

    async def logs(self, cluster: str, spec: LaunchSpec, request: LogRequest) -> LogStream:
        pod = await self._our_pod(spec, request.pod)
        containers = containers_of(pod)
        if request.container is not None and request.container not in containers:
            raise ContainerNotFound.of(request.container, request.pod, containers)
        container = request.container or (containers[0] if containers else None)
        namespace = self.objects.namespace(spec.tenant)
        what = f"log of pod {namespace}/{request.pod}"
        timeout = self.follow_seconds if request.follow else self.request_timeout
        try:
            response = await self.core.read_namespaced_pod_log_without_preload_content(
                request.pod,
                namespace,
                container=container,
                follow=request.follow,
                tail_lines=request.tail_lines,
                timestamps=request.timestamps or None,
                previous=request.previous or None,
                _request_timeout=timeout,
            )
        except (aiohttp.ClientError, TimeoutError, ApiException) as exc:
            raise PodReadError(f"cluster {cluster}: {what}: {describe(exc)}") from exc
        if response.status >= 400:
            status = response.status
            response.close()
            if status == HTTP_NOT_FOUND:
                raise PodNotFound(f"no pod {request.pod!r} in job {spec.job!r}")
            if status == HTTP_BAD_REQUEST and request.previous:
                # The kubelet's answer when the container has not restarted.
                raise PodNotFound(
                    f"no previous instance of container {container!r} in pod {request.pod!r} "
                    "(it has not restarted)"
                )
            raise PodReadError(f"cluster {cluster}: {what}: HTTP {status}")
        return MemberLog(response, what)


__all__ = ["ANNOTATION_SLOT", "KubePods", "MemberLog", "containers_of", "restarts_of", "slot_of"]
