"""Gangs out: launch placed gangs into a Kubernetes member cluster.

``KubeLauncher`` implements the service's ``Launcher`` protocol (``launch(placement)`` returns
once every pod of the gang runs and raises ``LaunchError`` on failure; ``delete(placement)``
removes every object of the gang) against one namespace of one cluster, with the official
client's asyncio API (``kubernetes.aio``).

Two modes:

* ``delegate``: a PodGroup for the cluster's gang scheduler (scheduler-plugins coscheduling
  ``scheduling.x-k8s.io/v1alpha1`` with minMember and scheduleTimeoutSeconds, or Volcano
  ``scheduling.volcano.sh/v1beta1`` with minMember and queue) and pods labelled into it;
* ``pin``: pods with required node affinity to the node the broker chose.

What the service knows about a job beyond the ``Placement`` (tenant, job name, pod templates,
minMember, timeout, queue) comes in a ``LaunchSpec``: passed to ``launch`` directly, or looked
up by the constructor's ``spec_for`` callback so ``launch(placement)`` keeps the protocol's
signature. Without either, a spec is derived from the placement alone.

Every object carries the labels ``fedbroker.io/origin``, ``fedbroker.io/tenant`` and
``fedbroker.io/job``; only objects carrying our origin are ever adopted or deleted. Logs and
errors name objects and HTTP statuses only, never the client configuration (tokens, keys).
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar, cast

from kubernetes.aio.client import ApiClient, CoreV1Api, CustomObjectsApi, V1Pod
from kubernetes.aio.client.exceptions import ApiException
from tenacity import (
    wait_exponential_jitter,
)
from tenacity.wait import wait_base

from adapters.kube import retry
from adapters.kube.translate import ANNOTATION_POD  # the ledger's pod name (PodPlacement.pod)
from adapters.simulated import LaunchError
from broker.model import MILLI_PER_GPU, Placement, PodBound, PodPlacement, Resources

log = logging.getLogger(__name__)

Mode = Literal["delegate", "pin"]
Flavor = Literal["coscheduling", "volcano"]

LABEL_ORIGIN = "fedbroker.io/origin"
LABEL_TENANT = "fedbroker.io/tenant"
LABEL_JOB = "fedbroker.io/job"
LABEL_POD_SET = "fedbroker.io/pod-set"
ANNOTATION_GPUS = "fedbroker.io/gpus"  # GPU indexes the broker picked, comma-separated
COSCHEDULING_LABEL = "scheduling.x-k8s.io/pod-group"
VOLCANO_ANNOTATION = "scheduling.k8s.io/group-name"

_T = TypeVar("_T")


@dataclass(frozen=True, slots=True)
class PodGroupKind:
    group: str
    version: str
    plural: str = "podgroups"

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}"


POD_GROUP_KINDS: Mapping[Flavor, PodGroupKind] = {
    "coscheduling": PodGroupKind("scheduling.x-k8s.io", "v1alpha1"),
    "volcano": PodGroupKind("scheduling.volcano.sh", "v1beta1"),
}


class KubeLaunchError(LaunchError):
    """A gang could not be created or did not start in a Kubernetes cluster.

    A subclass of ``adapters.simulated.LaunchError``, so the service's rollback catches it."""


@dataclass(frozen=True, slots=True)
class LaunchSpec:
    """What a launch needs besides the placement.

    ``job`` is the bare job name (the ``<job>`` of ``<job>-<podset>-<index>``); ``min_member``
    0 means all pods of the placement. ``pod_templates`` maps a pod set name to a Kubernetes
    pod template (``{"metadata": {...}, "spec": {...}}``, API JSON field names); the broker's
    resources replace the first container's requests and limits."""

    tenant: str
    job: str
    min_member: int = 0
    schedule_timeout_seconds: int = 600
    queue: str = "default"
    pod_templates: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)

    @property
    def key(self) -> str:
        return f"{self.tenant}/{self.job}"

    @staticmethod
    def of(placement: Placement) -> LaunchSpec:
        """A spec from the placement alone: ``placement.job`` is ``tenant/name`` (a job key)."""
        tenant, _, name = placement.job.rpartition("/")
        return LaunchSpec(tenant=tenant or "default", job=name)


def _labels(obj: Mapping[str, Any]) -> Mapping[str, str]:
    meta = obj.get("metadata") or {}
    return cast(Mapping[str, str], meta.get("labels") or {})


_QUANTITY = re.compile(r"^([0-9.]+)([a-zA-Z]*)$")
_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}
_DECIMAL = {"": 1, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}


def _quantity(text: str, unit: float = 1.0) -> float:
    """A Kubernetes quantity (the forms the broker writes and common ones) in ``unit``s."""
    match = _QUANTITY.match(str(text).strip())
    if match is None:
        raise ValueError(f"unsupported quantity {text!r}")
    number, suffix = float(match.group(1)), match.group(2)
    if suffix == "m":
        return number / 1000 / unit
    scale = _BINARY.get(suffix) or _DECIMAL.get(suffix)
    if scale is None:
        raise ValueError(f"unsupported quantity {text!r}")
    return number * scale / unit


class KubeLauncher:
    """Launches, confirms, deletes and garbage-collects gangs in one namespace of a cluster.

    ``retry_wait`` (tenacity wait strategy) and ``sleep`` (the poll pause of
    ``wait_running``) are injected so tests run without real delays."""

    def __init__(
        self,
        api_client: ApiClient,
        namespace: str,
        mode: Mode,
        podgroup_flavor: Flavor = "coscheduling",
        origin: str = "fedbroker",
        *,
        cluster: str = "",
        spec_for: Callable[[Placement], LaunchSpec] | None = None,
        gpu_resource: str = "nvidia.com/gpu",
        shared_gpu_resource: str | None = None,
        scheduler_name: str | None = None,
        default_image: str = "busybox:stable",
        attempts: int = 5,
        request_timeout: float = 30.0,
        retry_wait: wait_base | None = None,
        poll_seconds: float = 1.0,
        run_poll_seconds: float = 5.0,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        if mode not in ("delegate", "pin"):
            raise ValueError(f"unknown launch mode {mode!r}")
        if podgroup_flavor not in POD_GROUP_KINDS:
            raise ValueError(f"unknown PodGroup flavour {podgroup_flavor!r}")
        if attempts < 1:
            raise ValueError("attempts must be at least 1")
        self.core = CoreV1Api(api_client)
        self.custom = CustomObjectsApi(api_client)
        self.namespace = namespace
        self.mode: Mode = mode
        self.flavor: Flavor = podgroup_flavor
        self.pod_group_kind = POD_GROUP_KINDS[podgroup_flavor]
        self.origin = origin
        self.cluster = cluster
        self._spec_for = spec_for
        self.gpu_resource = gpu_resource
        self.shared_gpu_resource = shared_gpu_resource
        volcano = podgroup_flavor == "volcano"
        self.scheduler_name = scheduler_name or ("volcano" if volcano else None)
        self.default_image = default_image
        self.attempts = attempts
        self.request_timeout = request_timeout
        self._wait: wait_base = retry_wait or wait_exponential_jitter(
            multiplier=0.2, max=10, jitter=1
        )
        self.poll_seconds = poll_seconds
        self.run_poll_seconds = run_poll_seconds
        self._sleep = sleep
        self._listing: asyncio.Future[list[dict[str, Any]]] | None = None

    # -- the Launcher protocol ---------------------------------------------------------------

    async def launch(self, placement: Placement, spec: LaunchSpec | None = None) -> None:
        """Create the gang's objects, then wait until it runs. On failure the gang's objects
        are deleted and ``KubeLaunchError`` is raised. The caller applies the gang timeout
        (by cancelling this) and deletes the gang then."""
        spec = self.spec(placement, spec)
        try:
            await self.create(placement, spec)
            await self.wait_running(placement, spec)
        except KubeLaunchError:
            await self._delete_quietly(placement, spec)
            raise

    async def delete(self, placement: Placement, spec: LaunchSpec | None = None) -> None:
        """Delete every object of the gang: its pods (by name and by job label) and its
        PodGroup. Objects already gone are fine; objects without our origin are left alone."""
        spec = self.spec(placement, spec)
        names = {self.pod_name(p, spec) for p in placement.pods}
        for pod in await self._our_pods():
            labels = _labels(pod)
            if labels.get(LABEL_TENANT) == spec.tenant and labels.get(LABEL_JOB) == spec.job:
                names.add(pod["metadata"]["name"])
        for name in sorted(names):
            await self._delete_pod(name, owner=spec)
        if self.mode == "delegate":
            await self._delete_pod_group(self.pod_group_name(spec), owner=spec)
        log.info("deleted gang %s in %s/%s", spec.key, self.cluster, self.namespace)

    # -- naming and specs --------------------------------------------------------------------

    def spec(self, placement: Placement, spec: LaunchSpec | None = None) -> LaunchSpec:
        if spec is not None:
            return spec
        if self._spec_for is not None:
            return self._spec_for(placement)
        return LaunchSpec.of(placement)

    @staticmethod
    def pod_name(pod: PodPlacement, spec: LaunchSpec) -> str:
        """``<job>-<podset>-<index>``: the placement's pod name without the service's
        ``<tenant>.`` prefix."""
        prefix = f"{spec.tenant}."
        return pod.pod[len(prefix) :] if pod.pod.startswith(prefix) else pod.pod

    @staticmethod
    def pod_set_of(pod_name: str, spec: LaunchSpec) -> str:
        head = f"{spec.job}-"
        rest = pod_name[len(head) :] if pod_name.startswith(head) else pod_name
        return rest.rpartition("-")[0] or rest

    @staticmethod
    def pod_group_name(spec: LaunchSpec) -> str:
        return spec.job

    def labels(self, spec: LaunchSpec) -> dict[str, str]:
        return {LABEL_ORIGIN: self.origin, LABEL_TENANT: spec.tenant, LABEL_JOB: spec.job}

    def _ours(self, obj: Mapping[str, Any], spec: LaunchSpec) -> bool:
        labels = _labels(obj)
        return (
            labels.get(LABEL_ORIGIN) == self.origin
            and labels.get(LABEL_TENANT) == spec.tenant
            and labels.get(LABEL_JOB) == spec.job
        )

    # -- object bodies -----------------------------------------------------------------------

    def pod_group_body(self, placement: Placement, spec: LaunchSpec) -> dict[str, Any]:
        min_member = spec.min_member or len(placement.pods)
        pg_spec: dict[str, Any] = {"minMember": min_member}
        if self.flavor == "coscheduling":
            pg_spec["scheduleTimeoutSeconds"] = spec.schedule_timeout_seconds
        else:
            pg_spec["queue"] = spec.queue
        return {
            "apiVersion": self.pod_group_kind.api_version,
            "kind": "PodGroup",
            "metadata": {
                "name": self.pod_group_name(spec),
                "namespace": self.namespace,
                "labels": self.labels(spec),
            },
            "spec": pg_spec,
        }

    def resource_list(self, resources: Resources) -> dict[str, str]:
        out: dict[str, str] = {}
        if resources.cpu_milli:
            out["cpu"] = f"{resources.cpu_milli}m"
        if resources.memory_mib:
            out["memory"] = f"{resources.memory_mib}Mi"
        if resources.gpus:
            out[self.gpu_resource] = str(resources.gpus)
        if resources.gpu_milli:
            if self.shared_gpu_resource is None:
                raise KubeLaunchError(
                    f"a shared-GPU pod needs a shared GPU resource name in cluster {self.cluster}"
                )
            out[self.shared_gpu_resource] = str(resources.gpu_milli)
        return out

    def pod_body(self, pod: PodPlacement, spec: LaunchSpec) -> dict[str, Any]:
        name = self.pod_name(pod, spec)
        template = spec.pod_templates.get(self.pod_set_of(name, spec), {})
        template_meta = cast(Mapping[str, Any], template.get("metadata") or {})
        pod_spec: dict[str, Any] = json.loads(json.dumps(template.get("spec") or {}))
        labels = {**cast(Mapping[str, str], template_meta.get("labels") or {})}
        labels.update(self.labels(spec))
        labels[LABEL_POD_SET] = self.pod_set_of(name, spec)
        annotations = {**cast(Mapping[str, str], template_meta.get("annotations") or {})}
        annotations[ANNOTATION_POD] = pod.pod
        annotations[ANNOTATION_GPUS] = ",".join(str(g) for g in pod.gpus)

        containers: list[dict[str, Any]] = pod_spec.get("containers") or [
            {"name": "main", "image": self.default_image}
        ]
        amounts = self.resource_list(pod.resources)
        containers[0]["resources"] = {"requests": dict(amounts), "limits": dict(amounts)}
        pod_spec["containers"] = containers
        pod_spec.setdefault("restartPolicy", "Never")

        if self.mode == "pin":
            pod_spec["affinity"] = {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [
                            {
                                "matchFields": [
                                    {"key": "metadata.name", "operator": "In", "values": [pod.node]}
                                ]
                            }
                        ]
                    }
                }
            }
        else:
            group = self.pod_group_name(spec)
            if self.flavor == "coscheduling":
                labels[COSCHEDULING_LABEL] = group
            else:
                annotations[VOLCANO_ANNOTATION] = group
            if self.scheduler_name:
                pod_spec["schedulerName"] = self.scheduler_name
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": name,
                "namespace": self.namespace,
                "labels": labels,
                "annotations": annotations,
            },
            "spec": pod_spec,
        }

    # -- create ------------------------------------------------------------------------------

    async def create(self, placement: Placement, spec: LaunchSpec | None = None) -> None:
        """Create the PodGroup (delegate mode) and the pods; objects that already exist with
        our labels count as created."""
        spec = self.spec(placement, spec)
        if self.mode == "delegate":
            await self._ensure_pod_group(placement, spec)
        for pod in placement.pods:
            await self._ensure_pod(pod, spec)
        log.info(
            "created gang %s (%d pods, %s) in %s/%s",
            spec.key,
            len(placement.pods),
            self.mode,
            self.cluster,
            self.namespace,
        )

    async def _ensure_pod(self, pod: PodPlacement, spec: LaunchSpec) -> None:
        body = self.pod_body(pod, spec)
        name = body["metadata"]["name"]
        try:
            await self._call(
                f"create pod {name}",
                lambda: self.core.create_namespaced_pod(self.namespace, V1Pod.from_dict(body)),  # type: ignore[arg-type]
            )
        except ApiException as exc:
            if exc.status != 409:
                raise KubeLaunchError(f"create pod {name}: {retry.describe(exc)}") from exc
            existing = await self._read_pod(name)
            if existing is None or not self._ours(existing, spec):
                raise KubeLaunchError(
                    f"pod {name} already exists and does not belong to {spec.key}"
                ) from exc
            log.info("pod %s already exists with our labels; adopted", name)

    async def _ensure_pod_group(self, placement: Placement, spec: LaunchSpec) -> None:
        body = self.pod_group_body(placement, spec)
        name = body["metadata"]["name"]
        try:
            await self._call(
                f"create PodGroup {name}",
                lambda: self.custom.create_namespaced_custom_object(
                    self.pod_group_kind.group,
                    self.pod_group_kind.version,
                    self.namespace,
                    self.pod_group_kind.plural,
                    body,
                ),
            )
            return
        except ApiException as exc:
            if exc.status != 409:
                raise KubeLaunchError(f"create PodGroup {name}: {retry.describe(exc)}") from exc
        # AlreadyExists: adopt it if ours, and bring its spec up to date (optimistic update:
        # a 409 Conflict there means someone changed it meanwhile; re-read and try again).
        for _ in range(self.attempts):
            existing = await self._read_pod_group(name)
            if existing is None or not self._ours(existing, spec):
                raise KubeLaunchError(
                    f"PodGroup {name} already exists and does not belong to {spec.key}"
                )
            current = existing.get("spec") or {}
            if all(current.get(k) == v for k, v in body["spec"].items()):
                log.info("PodGroup %s already exists with our labels; adopted", name)
                return
            version = (existing.get("metadata") or {}).get("resourceVersion")
            patch = {"metadata": {"resourceVersion": version}, "spec": body["spec"]}
            try:
                await self._call(
                    f"update PodGroup {name}",
                    lambda patch=patch: self.custom.patch_namespaced_custom_object(  # type: ignore[misc]
                        self.pod_group_kind.group,
                        self.pod_group_kind.version,
                        self.namespace,
                        self.pod_group_kind.plural,
                        name,
                        patch,
                        _content_type="application/merge-patch+json",
                    ),
                )
                log.info("PodGroup %s adopted and updated", name)
                return
            except ApiException as exc:
                if exc.status != 409:
                    raise KubeLaunchError(f"update PodGroup {name}: {retry.describe(exc)}") from exc
                log.info("PodGroup %s changed meanwhile (409 Conflict); re-reading", name)
        raise KubeLaunchError(f"update PodGroup {name}: still conflicting after re-reads")

    # -- confirm -----------------------------------------------------------------------------

    async def wait_running(self, placement: Placement, spec: LaunchSpec | None = None) -> None:
        """Return when every pod of the gang is Running (or, in delegate mode, the PodGroup's
        phase is Running); raise ``KubeLaunchError`` as soon as a pod failed or vanished.
        Polls every ``poll_seconds``; the caller applies the gang timeout."""
        spec = self.spec(placement, spec)
        expected = {self.pod_name(p, spec) for p in placement.pods}
        while True:
            phases = self._phases(await self._shared_listing(), expected, spec)
            failed = sorted(n for n, phase in phases.items() if phase in ("Failed", "Succeeded"))
            if failed:
                raise KubeLaunchError(
                    f"gang {spec.key}: pod {failed[0]} {phases[failed[0]]} before the gang ran"
                )
            missing = sorted(expected - phases.keys())
            if missing:
                raise KubeLaunchError(f"gang {spec.key}: pod {missing[0]} disappeared")
            if all(phase == "Running" for phase in phases.values()):
                return
            if self.mode == "delegate":
                group = await self._read_pod_group(self.pod_group_name(spec))
                if group is not None and (group.get("status") or {}).get("phase") == "Running":
                    return
            await self._sleep(self.poll_seconds)

    async def finished(self, placement: Placement, spec: LaunchSpec | None = None) -> bool:
        """Wait for a running gang to end: True once every pod Succeeded, False as soon as
        one Failed or vanished (deleted behind our back). Polls every ``run_poll_seconds``
        on a listing shared by every gang waiting in this namespace; an API error is logged
        and polled again (an unreachable cluster does not end a job)."""
        spec = self.spec(placement, spec)
        expected = {self.pod_name(p, spec) for p in placement.pods}
        while True:
            try:
                phases = self._phases(await self._shared_listing(), expected, spec)
            except KubeLaunchError as exc:
                log.warning("gang %s: cannot read its pods (%s); polling again", spec.key, exc)
            else:
                if any(phase == "Failed" for phase in phases.values()):
                    return False
                if expected - phases.keys():
                    return False
                if all(phase == "Succeeded" for phase in phases.values()):
                    return True
            await self._sleep(self.run_poll_seconds)

    def _phases(
        self, pods: Iterable[Mapping[str, Any]], expected: set[str], spec: LaunchSpec
    ) -> dict[str, str]:
        """Pod name -> phase of the gang's pods among ``pods``."""
        phases: dict[str, str] = {}
        for pod in pods:
            name = pod["metadata"]["name"]
            if name in expected and self._ours(pod, spec):
                phases[name] = str((pod.get("status") or {}).get("phase") or "Pending")
        return phases

    async def _shared_listing(self) -> list[dict[str, Any]]:
        """Our pods, listed once for every caller waiting at the same time: a thousand gangs
        polling their phases cost one LIST per poll, not a thousand. Always a fresh listing
        (one started after the call, or the one in flight), never a cached one."""
        listing = self._listing
        if listing is None:
            listing = asyncio.ensure_future(self._our_pods())
            self._listing = listing

            def done(future: asyncio.Future[list[dict[str, Any]]]) -> None:
                if self._listing is future:
                    self._listing = None
                if not future.cancelled():
                    future.exception()  # retrieved here, so an error nobody awaits is quiet

            listing.add_done_callback(done)
        return await asyncio.shield(listing)

    # -- garbage collection and restart ------------------------------------------------------

    async def collect_garbage(self, live_jobs: set[str]) -> list[str]:
        """Delete our objects whose job (``tenant/name``) is not in ``live_jobs``; returns
        what was deleted as ``kind/name``."""
        deleted: list[str] = []
        for pod in await self._our_pods():
            if self._job_key(pod) not in live_jobs:
                name = pod["metadata"]["name"]
                await self._delete_pod(name, owner=None)
                deleted.append(f"Pod/{name}")
        if self.mode == "delegate":
            for group in await self._our_pod_groups():
                if self._job_key(group) not in live_jobs:
                    name = group["metadata"]["name"]
                    await self._delete_pod_group(name, owner=None)
                    deleted.append(f"PodGroup/{name}")
        if deleted:
            log.info("garbage-collected %d objects in %s", len(deleted), self.namespace)
        return deleted

    async def read_back(self) -> dict[str, list[PodBound]]:
        """Our non-terminal pods as the ledger's ``PodBound`` events keyed by job key
        (``tenant/name``): what rebuilds reservations after a broker restart. A pod the
        cluster has not bound yet has node ``""``: the caller's stored placement says which
        node was reserved for it."""
        out: dict[str, list[PodBound]] = {}
        for pod in await self._our_pods():
            status = pod.get("status") or {}
            spec = pod.get("spec") or {}
            if status.get("phase") in ("Succeeded", "Failed"):
                continue
            node = spec.get("nodeName") or ""
            meta = pod["metadata"]
            annotations = cast(Mapping[str, str], meta.get("annotations") or {})
            gpus_text = annotations.get(ANNOTATION_GPUS)
            gpus = (
                tuple(int(g) for g in gpus_text.split(",") if g) if gpus_text is not None else None
            )
            event = PodBound(
                self.cluster,
                annotations.get(ANNOTATION_POD, meta["name"]),
                str(node),
                self._resources_of(pod),
                gpus,
            )
            out.setdefault(self._job_key(pod), []).append(event)
        return out

    def _resources_of(self, pod: Mapping[str, Any]) -> Resources:
        cpu = memory = 0.0
        gpus = 0
        milli = 0
        for container in (pod.get("spec") or {}).get("containers") or []:
            requests = cast(
                Mapping[str, str], (container.get("resources") or {}).get("requests") or {}
            )
            cpu += _quantity(requests.get("cpu", "0")) * 1000
            memory += _quantity(requests.get("memory", "0"), 2**20)
            gpus += int(_quantity(requests.get(self.gpu_resource, "0")))
            if self.shared_gpu_resource:
                milli += int(_quantity(requests.get(self.shared_gpu_resource, "0")))
        if milli >= MILLI_PER_GPU:
            gpus, milli = gpus + milli // MILLI_PER_GPU, milli % MILLI_PER_GPU
        return Resources(gpus=gpus, gpu_milli=milli, cpu_milli=round(cpu), memory_mib=round(memory))

    @staticmethod
    def _job_key(obj: Mapping[str, Any]) -> str:
        labels = _labels(obj)
        return f"{labels.get(LABEL_TENANT, '')}/{labels.get(LABEL_JOB, '')}"

    # -- API helpers -------------------------------------------------------------------------

    async def _call(self, what: str, op: Callable[[], Awaitable[_T]]) -> _T:
        """``op`` with 429/5xx/connection errors retried (bounded, exponential with jitter).
        Other API errors propagate as ``ApiException``; exhausting the retries raises
        ``KubeLaunchError`` with the last status."""
        timeout = self.request_timeout

        async def bounded() -> _T:
            # A server that accepts and never answers (a black hole) must not hold a
            # launch, a delete or a cancel for the client's default five minutes.
            # (asyncio.timeout, not wait_for: on 3.11 wait_for can swallow a cancel.)
            async with asyncio.timeout(timeout):
                return await op()

        return await retry.call(
            what, bounded, attempts=self.attempts, wait=self._wait, error=KubeLaunchError, log=log
        )

    async def _read_pod(self, name: str) -> dict[str, Any] | None:
        try:
            pod = await self._call(
                f"read pod {name}", lambda: self.core.read_namespaced_pod(name, self.namespace)
            )
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise KubeLaunchError(f"read pod {name}: {retry.describe(exc)}") from exc
        return cast(dict[str, Any], self.core.api_client.sanitize_for_serialization(pod))

    async def _read_pod_group(self, name: str) -> dict[str, Any] | None:
        kind = self.pod_group_kind
        try:
            obj = await self._call(
                f"read PodGroup {name}",
                lambda: self.custom.get_namespaced_custom_object(
                    kind.group, kind.version, self.namespace, kind.plural, name
                ),
            )
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise KubeLaunchError(f"read PodGroup {name}: {retry.describe(exc)}") from exc
        return cast(dict[str, Any], obj)

    def _selector(self) -> str:
        return f"{LABEL_ORIGIN}={self.origin}"

    async def _our_pods(self) -> list[dict[str, Any]]:
        """Pods with our origin label (filtered here too, not only by the server)."""
        try:
            pods = await self._call(
                "list pods",
                lambda: self.core.list_namespaced_pod(
                    self.namespace, label_selector=self._selector()
                ),
            )
        except ApiException as exc:
            raise KubeLaunchError(f"list pods: {retry.describe(exc)}") from exc
        raw = cast(dict[str, Any], self.core.api_client.sanitize_for_serialization(pods))
        return [p for p in raw.get("items") or [] if _labels(p).get(LABEL_ORIGIN) == self.origin]

    async def _our_pod_groups(self) -> list[dict[str, Any]]:
        kind = self.pod_group_kind
        try:
            listed = await self._call(
                "list PodGroups",
                lambda: self.custom.list_namespaced_custom_object(
                    kind.group,
                    kind.version,
                    self.namespace,
                    kind.plural,
                    label_selector=self._selector(),
                ),
            )
        except ApiException as exc:
            if exc.status == 404:  # no such resource (CRD not installed) or nothing listed
                return []
            raise KubeLaunchError(f"list PodGroups: {retry.describe(exc)}") from exc
        items = cast(Iterable[dict[str, Any]], cast(dict[str, Any], listed).get("items") or [])
        return [g for g in items if _labels(g).get(LABEL_ORIGIN) == self.origin]

    async def _delete_pod(self, name: str, *, owner: LaunchSpec | None) -> None:
        """Delete a pod; with ``owner``, only if it carries that job's labels (another
        tenant's job of the same name has pods of the same names)."""
        if owner is not None:
            existing = await self._read_pod(name)
            if existing is None:
                return
            if not self._ours(existing, owner):
                log.warning("not deleting pod %s: it is not %s's", name, owner.key)
                return
        try:
            await self._call(
                f"delete pod {name}",
                lambda: self.core.delete_namespaced_pod(name, self.namespace),
            )
        except ApiException as exc:
            if exc.status != 404:
                raise KubeLaunchError(f"delete pod {name}: {retry.describe(exc)}") from exc

    async def _delete_pod_group(self, name: str, *, owner: LaunchSpec | None) -> None:
        existing = await self._read_pod_group(name)
        if existing is None:
            return
        mine = (
            self._ours(existing, owner)
            if owner is not None
            else (_labels(existing).get(LABEL_ORIGIN) == self.origin)
        )
        if not mine:
            log.warning("not deleting PodGroup %s: it is not ours to delete", name)
            return
        kind = self.pod_group_kind
        try:
            await self._call(
                f"delete PodGroup {name}",
                lambda: self.custom.delete_namespaced_custom_object(
                    kind.group, kind.version, self.namespace, kind.plural, name
                ),
            )
        except ApiException as exc:
            if exc.status != 404:
                raise KubeLaunchError(f"delete PodGroup {name}: {retry.describe(exc)}") from exc

    async def _delete_quietly(self, placement: Placement, spec: LaunchSpec) -> None:
        try:
            await self.delete(placement, spec)
        except KubeLaunchError as exc:
            log.warning("rollback of %s incomplete: %s", spec.key, exc)
