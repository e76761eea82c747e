"""Ports: every protocol the shell calls on an adapter, the data it passes, and their errors.

The shell (broker.service, broker.http, broker.cli, broker.sim, broker.bench) names these,
never an adapter's own types; only the composition roots construct a concrete adapter.
Each adapter (adapters.simulated, adapters.kube, adapters.capi, adapters.mqtt) declares the
port it implements and raises (subclasses of) the errors below. Adapters import
broker.model and this module, nothing else of the broker.

Live ports (asyncio, wall clock): ``CapacitySource`` feeding a ``CapacitySink``,
``Launcher`` (+ ``RunWatcher`` and its ``RunEnd``, ``GangRecovery``, ``PodReader``),
``ScalePool``, ``EventSink``.
Simulator ports (synchronous, virtual clock): ``NodeInventory``, ``VirtualLauncher``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from broker.model import CapacityEvent, Placement, PodBound
from broker.topology import Domains as Domains  # noqa: PLC0414 (re-exported: the vocabulary is one import)

# -- errors ----------------------------------------------------------------------------------


class LaunchError(Exception):
    """A gang's pods could not be started (the service rolls it back and requeues it).

    ``permanent``: the member refused what the job asked of it for a reason a retry will
    not change (a Kubernetes member's 400/403/404/409/422 on a create): the service fails
    the job after ``scheduler.launchRefusalLimit`` such refusals instead of backing off for
    ever. Otherwise (unreachable, 5xx, timeouts, a gang that did not start) it is
    transient. The message names the object and the member's answer, never a credential:
    it reaches the job's history."""

    def __init__(self, message: str, *, permanent: bool = False) -> None:
        super().__init__(message)
        self.permanent = permanent


class WatchError(Exception):
    """A capacity source failed to list or watch a member cluster (message: cluster,
    resource and status only)."""


class ScaleError(Exception):
    """A pool could not be read or scaled (its API failed, or the request was out of range)."""


class KubeconfigError(Exception):
    """A kubeconfig cannot be read or a context cannot be loaded (the message is scrubbed of
    the kubeconfig's credentials, so it can be logged or shown)."""


class ReportError(ValueError):
    """A member cluster agent's report breaks the schema (the message says where)."""


# -- capacity: what feeds the ledger ---------------------------------------------------------

CapacitySink = Callable[[list[CapacityEvent]], None]
"""Takes a batch of capacity events (the ledger's input), in order."""

StatusSink = Callable[[str, bool], None]
"""Told ``(cluster, connected)`` whenever a source's connection to its cluster changes."""


class CapacitySource(Protocol):
    """One member cluster's nodes and pods as capacity events (Kubernetes list+watch).

    ``list_once`` brings a consumer up to date (raises ``WatchError``); ``run`` feeds its
    sink for ever (relisting and reconnecting on its own) until cancelled. ``lists`` counts
    the full lists so far; ``connected`` says whether the last list or watch succeeded."""

    cluster: str
    connected: bool
    lists: int

    async def list_once(self) -> list[CapacityEvent]: ...

    async def run(self) -> None: ...


# -- launching: the live broker's gangs ------------------------------------------------------


TemplatePath = tuple[str | int, ...]
"""Where a pod template sits in a workload object: keys and list indexes from its root
(e.g. ``("spec", "replicatedJobs", 0, "template", "spec", "template")`` in a JobSet)."""


@dataclass(frozen=True, slots=True)
class WorkloadSpec:
    """A job's embedded Kubernetes workload (``spec.workload``: batch Job, JobSet,
    PyTorchJob, RayJob, RayCluster), as admitted: the launcher creates this object in the
    member (its own controller makes the pods) instead of creating pods itself.

    ``object`` holds ``apiVersion``, ``kind``, optional ``metadata.labels``/``annotations``
    and ``spec`` (API JSON field names; no name or namespace: the launcher names it).
    ``pod_sets`` maps each derived pod set's name, in the job's order, to the path of its
    pod template in ``object``; the pod set names are those of the job's ``PodSet``s."""

    object: Mapping[str, Any]
    pod_sets: tuple[tuple[str, TemplatePath], ...]

    @property
    def kind(self) -> str:
        return str(self.object.get("kind", ""))


class WorkloadKind(Protocol):
    """What a launcher must know of one workload kind to run it as a gang: the runtime half
    of a kind's integration (``broker.manifest.workloads``: one module per kind implements
    this and admission's half; the composition hands the registry to the launcher, so no
    adapter names a kind). Pure: every method reads the objects it is given.

    ``pod_index``: the index of one of the kind's pods within its pod set (the slot it
    takes, ``<podset>-<index>``), from the labels its controller writes, given the
    workload object as created; None when the pod carries none. ``end``: how the workload
    ended by its own status, with the controller's reason and message, or None while it
    runs (a kind that runs until cancelled always answers None). ``late_pod_sets``: pod
    sets whose pods its controller makes only once the others run (a RayJob's submitter):
    left out of a delegated gang's minMember and of what "started" waits for.
    ``templates_name_scheduler``: whether its pod templates take a ``schedulerName`` (a
    runtime's patches do not; the member's runtime names its scheduler then)."""

    @property
    def group(self) -> str: ...
    @property
    def version(self) -> str: ...
    @property
    def kind(self) -> str: ...
    @property
    def plural(self) -> str: ...
    @property
    def late_pod_sets(self) -> frozenset[str]: ...
    @property
    def templates_name_scheduler(self) -> bool: ...

    def pod_index(self, workload: Mapping[str, Any], pod: Mapping[str, Any]) -> int | None: ...

    def end(self, obj: Mapping[str, Any]) -> RunEnd | None: ...


@dataclass(frozen=True, slots=True)
class MemberResource:
    """A resource of a member the launcher reads to run some kind (a TrainJob's runtimes):
    listed and watched, never written."""

    kind: str
    group: str
    version: str
    plural: str
    namespaced: bool


@dataclass(frozen=True, slots=True)
class LaunchSpec:
    """What a launch needs besides the placement (the shell knows it, the launcher asks).

    ``job`` is the bare job name (the ``<job>`` of ``<job>-<podset>-<index>``); ``min_member``
    0 means all pods of the placement. ``pod_templates`` maps a pod set name to a Kubernetes
    pod template (``{"metadata": {...}, "spec": {...}}``, API JSON field names), already
    admitted by the tenant's template policy: each container keeps its own requests and
    limits, and the resources it gives nowhere go to the first container."""

    tenant: str
    job: str
    min_member: int = 0
    schedule_timeout_seconds: int = 600
    queue: str = "default"
    pod_templates: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    # The tenant's Pod Security Standards level (privileged/baseline/restricted): the member
    # namespace the gang goes into is labelled to enforce it.
    pod_security: str = "baseline"
    # The job's pod set names in manifest order (ranks run through them in this order;
    # empty: order of first appearance in the placement) and its rendezvous port.
    pod_sets: tuple[str, ...] = ()
    master_port: int = 29500
    # Set for a ``spec.workload`` job: the launcher creates this object, not pods.
    workload: WorkloadSpec | None = None
    # The job's launch attempt: a remote launcher's commands carry it, so a deletion voids
    # the launches of its attempt and earlier, never a later one.
    generation: int = 0
    # Pod set name -> its domains (pod sets with a topology request): what a delegate-mode
    # launcher passes to the gang scheduler (pin mode's pods are pinned to their nodes).
    domains: Mapping[str, Domains] = field(default_factory=dict)

    @property
    def key(self) -> str:
        return f"{self.tenant}/{self.job}"

    @staticmethod
    def of(placement: Placement) -> LaunchSpec:
        """A spec from the placement alone: ``placement.job`` is ``tenant/name`` (a job key)."""
        tenant, _, name = placement.job.rpartition("/")
        return LaunchSpec(tenant=tenant or "default", job=name)


class Launcher(Protocol):
    """Starts and removes placed gangs in their cluster (asyncio; the live broker's port)."""

    async def launch(self, placement: Placement) -> None:
        """Return once every pod of the placement runs; raise ``LaunchError`` if it fails
        (any other exception is a failure too). The caller applies the gang timeout by
        cancelling this, and deletes what a failed or cancelled launch left."""
        ...

    async def delete(self, placement: Placement) -> None:
        """Delete every pod of the placement (idempotent)."""
        ...


@dataclass(frozen=True, slots=True)
class RunEnd:
    """How a running job ended, as its member reported it: ``reason`` and ``message`` are
    the member's own (a workload's condition, e.g. ``BackoffLimitExceeded``), empty when
    the launcher has nothing to add to ``succeeded``.

    ``error``: not an end the member reported but the launcher losing the job: following
    it failed (after the launcher's own bounded retries) with this exception, so nothing
    would ever tell its end. The service does not record an end then: it deletes the job's
    objects and requeues it with backoff, as for a failed launch.

    ``refused``: the workload's controller refused its spec for good (a KubeRay
    ``ValidationFailed``): before the gang ran, its launch fails as a member's refusal for
    good does (``LaunchError.permanent``), not as an attempt worth retrying."""

    succeeded: bool
    reason: str = ""
    message: str = ""
    error: Exception | None = None
    refused: bool = False


@dataclass(frozen=True, slots=True)
class PlannedSlot:
    """One slot of a placement as the launcher recorded it with the job's objects: the
    ledger's pod name (``<tenant>.<job>-<pod set>-<index>``), its node and GPU indexes."""

    pod: str
    node: str
    gpus: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class WorkloadFound:
    """A workload job's object as a restarted broker finds it in its member.

    ``plan``: the placement recorded on the object when it was created (None: none was,
    say it was too large to record); ``plan_error`` says why a recorded plan could not be
    read (the job cannot be restored then). ``end``: how the workload ended while the
    broker was away (None: it has not). ``slotted``: its live pods that hold a slot, under
    the slot's ledger pod name (node ``""`` while unbound); ``gated``: how many of its
    live pods still wait for a slot; ``finished``: how many ended. ``delegated``: a
    delegate-mode workload: the member's gang scheduler placed its pods, no plan or slot is
    recorded, and its live pods are those read back by ``read_back``."""

    plan: tuple[PlannedSlot, ...] | None
    end: RunEnd | None = None
    slotted: tuple[PodBound, ...] = ()
    gated: int = 0
    finished: int = 0
    plan_error: str = ""
    delegated: bool = False


@runtime_checkable
class RunWatcher(Protocol):
    """A launcher that also reports when a running job's pods have exited."""

    async def finished(self, placement: Placement) -> RunEnd:
        """Wait until the running job ends (its pods exit, or its workload's status says
        so); ``RunEnd.succeeded`` when it succeeded. Raises when following it failed."""
        ...


class RunHandle(Protocol):
    """A watch on a running job, stopped by ``cancel``."""

    def cancel(self) -> object: ...


@runtime_checkable
class RunNotifier(Protocol):
    """A launcher that calls back when a running job ends, holding no task per running job
    (a timer, or one poll for all of them): what a broker holding 100,000 live jobs needs."""

    def watch(self, placement: Placement, on_end: Callable[[RunEnd], None]) -> RunHandle:
        """Call ``on_end`` once, from the event loop, when the running job ends (never,
        for a job that runs until cancelled), or with a ``RunEnd.error`` when following it
        failed; ``cancel`` on the handle stops the watch."""
        ...


class GangRecovery(Protocol):
    """What a launcher left in its cluster, read back after a restart or a takeover."""

    async def read_back(self) -> dict[str, list[PodBound]]:
        """The launcher's live pods as ``PodBound`` events, by job key (``tenant/name``)."""
        ...

    async def read_back_workloads(self) -> dict[str, WorkloadFound]:
        """The launcher's workload objects by job key: what restores a running workload
        job as it was, whatever part of it has finished."""
        ...

    async def collect_garbage(self, live_jobs: set[str]) -> list[str]:
        """Delete the launcher's objects of jobs not in ``live_jobs``; ``kind/name`` each."""
        ...


# -- pods and logs back: what a job's pods are doing in their member -------------------------


class PodNotFound(LookupError):
    """The pod (or container) named is not one of the job's (the API answers 404)."""


class ContainerNotFound(PodNotFound):
    """The pod is the job's but has no container of the name asked for; the message lists
    the containers it has (``of``), so the user sees what to ask for instead."""

    @classmethod
    def of(cls, container: str, pod: str, containers: Sequence[str]) -> ContainerNotFound:
        has = ", ".join(containers) if containers else "none"
        return cls(f"pod {pod!r} has no container {container!r} (its containers: {has})")


class PodReadError(Exception):
    """A member could not be asked for a job's pods or logs (message: cluster, object and
    HTTP status only)."""


@dataclass(frozen=True, slots=True)
class PodRow:
    """One pod of a job as its member sees it. ``slot`` is the placement slot the pod
    holds (``<pod set>-<index>``, or the one the broker recorded on it); ``node`` is empty
    while the pod is unbound."""

    name: str
    pod_set: str
    cluster: str
    node: str
    phase: str
    restarts: int
    slot: str


@dataclass(frozen=True, slots=True)
class LogRequest:
    """Which log to read: a pod of the job, its container (None: the pod's only or first
    one), the last ``tail_lines`` lines (None: all), and whether to follow it; with
    ``timestamps`` each line starts with when it was written (RFC 3339, as the kubelet
    writes it), and ``previous`` reads the container's previous instance (before its last
    restart) instead of the current one."""

    pod: str
    container: str | None = None
    tail_lines: int | None = None
    follow: bool = False
    timestamps: bool = False
    previous: bool = False


class LogStream(Protocol):
    """A log being read: chunks of bytes as the member sends them; ``aclose`` stops the
    read and closes the member's response (the reader calls it when its client leaves)."""

    def __aiter__(self) -> AsyncIterator[bytes]: ...

    async def aclose(self) -> None: ...


@runtime_checkable
class PodReader(Protocol):
    """The pods and logs of a placed job in one cluster (``spec`` names tenant and job;
    only that job's pods, in its tenant's namespace, are ever shown)."""

    async def pods(self, cluster: str, spec: LaunchSpec) -> list[PodRow]:
        """The job's pods in ``cluster`` (raises ``PodReadError``)."""
        ...

    async def logs(self, cluster: str, spec: LaunchSpec, request: LogRequest) -> LogStream:
        """Open one pod's log; ``PodNotFound`` when the pod or container is not the job's,
        ``PodReadError`` when the member fails. The caller iterates the stream and always
        ``aclose``s it."""
        ...


# -- burst pools -----------------------------------------------------------------------------


class ScalePool(Protocol):
    """A node pool the broker may grow and shrink (Cluster API MachineDeployment, or a
    simulated one). Failures raise ``ScaleError`` after the adapter's own bounded retries."""

    async def scale_to(self, replicas: int) -> int: ...

    async def cancel_coming(self, count: int) -> int: ...

    async def remove_node(self, node: str) -> None: ...

    async def label_node(self, node: str, labels: Mapping[str, str]) -> None: ...


# -- events out ------------------------------------------------------------------------------

MessageHandler = Callable[[str, bytes, bool], None]
"""Called with ``(topic, payload, retained)`` for each message of a subscription."""


class EventSink(Protocol):
    """A message bus the broker publishes job and capacity events to (MQTT), and whose
    agent reports it subscribes to. ``publish_nowait`` never waits: False (and counted in
    ``dropped``) when the outbox is ``full``."""

    connected: bool
    dropped: int

    @property
    def full(self) -> bool: ...

    @property
    def backlog(self) -> int: ...

    def publish_nowait(
        self, suffix: str, payload: bytes | str, *, qos: int = 1, retain: bool = False
    ) -> bool: ...

    def subscribe(self, topic_filter: str, handler: MessageHandler) -> None: ...


# -- the simulator's ports (synchronous, on a virtual clock) ---------------------------------


class NodeInventory(Protocol):
    """Where a simulation's capacity comes from: its member clusters' nodes, as events."""

    def node_events(self) -> list[CapacityEvent]: ...


class VirtualLauncher(Protocol):
    """Starts a placed job's pods on a virtual clock; returns the events that follow (the
    simulator's launcher; the live one is ``Launcher``)."""

    def launch(self, placement: Placement, run_seconds: float) -> list[CapacityEvent]: ...
