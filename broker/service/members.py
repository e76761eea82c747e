"""Kubernetes member clusters of the live broker: their clients, watchers and launchers.

``KubeMembers`` is built by ``broker.service.compose`` for the clusters whose config
source is ``kube``: one API client per cluster (from its kubeconfig context), a
``ClusterWatcher`` feeding the ledger, a ``StaleTracker`` fed by the watcher's status, and a
``KubeLauncher`` and a ``KubePods`` (the job's pods and logs). It also holds the agent-fed
members whose agent launches (``AgentMember``: their ``RemoteLauncher``, and whether their
agent is heard), so staleness, failover, read back and garbage collection treat both
kinds alike (``recoverable``). ``ClusterLauncher`` dispatches each placement to its
cluster's launcher, and reads of pods and logs to its cluster's reader; the default
launcher (the simulated one) serves the simulated clusters only: a placement anywhere else
without a launcher of its own is refused for good, never simulated.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from adapters.kube.translate import GpuConfig
from adapters.kube.watch import ClusterWatcher, StaleTracker
from broker.config import ClusterConfig, KubeSource
from broker.manifest.workloads import INTEGRATIONS
from broker.model import Placement
from broker.ports import CapacitySink as Emit
from broker.ports import (
    GangRecovery,
    Launcher,
    LaunchError,
    LaunchSpec,
    LogRequest,
    LogStream,
    PodReader,
    PodReadError,
    PodRow,
    RunEnd,
    RunHandle,
    RunNotifier,
    RunWatcher,
)

if TYPE_CHECKING:
    from kubernetes.aio.client import ApiClient
    from tenacity.wait import wait_base

    from adapters.kube.launch import KubeLauncher
    from adapters.kube.pods import KubePods
    from adapters.kube.runtimes import RuntimeCache


class Refusing:
    """The launcher of a cluster nothing can launch into (an agent-fed cluster whose agent
    does not launch): every launch refused for good, with why."""

    def __init__(self, reason: str) -> None:
        self.reason = reason

    async def launch(self, placement: Placement) -> None:
        raise LaunchError(self.reason, permanent=True)

    async def delete(self, placement: Placement) -> None:
        return None  # nothing was ever created


class ClusterLauncher:
    """The launcher of each placement's cluster: a KubeLauncher for Kubernetes members, a
    RemoteLauncher for agent-fed ones whose agent launches, ``default`` (the simulated
    launcher, or the one a test injects) for the ``simulated`` clusters (None: every
    cluster without a launcher of its own), and a ``Refusing`` one for the rest."""

    def __init__(self, default: Launcher, simulated: frozenset[str] | None = None) -> None:
        self.default = default
        self.simulated = simulated
        self.by_cluster: dict[str, Launcher] = {}
        self.readers: dict[str, PodReader] = {}
        self.refusals: dict[str, str] = {}  # cluster -> why nothing launches there

    def _for(self, placement: Placement) -> Launcher:
        cluster = placement.cluster
        launcher = self.by_cluster.get(cluster)
        if launcher is not None:
            return launcher
        if self.simulated is None or cluster in self.simulated:
            return self.default
        why = self.refusals.get(cluster, f"cluster {cluster} has no launcher")
        return Refusing(why)

    async def launch(self, placement: Placement) -> None:
        await self._for(placement).launch(placement)

    async def delete(self, placement: Placement) -> None:
        await self._for(placement).delete(placement)

    async def finished(self, placement: Placement) -> RunEnd:
        """The end of a running job, from its cluster's launcher; a launcher that cannot
        tell leaves the job running until cancelled."""
        launcher = self._for(placement)
        if isinstance(launcher, RunWatcher):
            return await launcher.finished(placement)
        await asyncio.Event().wait()  # never set: cancelled with the job or at close
        return RunEnd(False)  # pragma: no cover

    def watch(self, placement: Placement, on_end: Callable[[RunEnd], None]) -> RunHandle:
        """The end of a running job, from its cluster's launcher: a callback where it can
        (the simulated one's timer, a Kubernetes member's one poll per cluster), else a
        task awaiting ``finished``."""
        launcher = self._for(placement)
        if isinstance(launcher, RunNotifier):
            return launcher.watch(placement, on_end)
        task = asyncio.ensure_future(self.finished(placement))

        def done(ended: asyncio.Future[RunEnd]) -> None:
            if ended.cancelled():
                return
            error = ended.exception()
            if isinstance(error, Exception):  # the caller's failure path says it
                on_end(RunEnd(False, error=error))
                return
            on_end(ended.result())

        task.add_done_callback(done)
        return task

    def _reader(self, cluster: str) -> PodReader:
        reader = self.readers.get(cluster)
        simulated = self.simulated is None or cluster in self.simulated
        if reader is None and simulated and isinstance(self.default, PodReader):
            reader = self.default
        if reader is None:
            raise PodReadError(f"cluster {cluster}: its launcher cannot show pods")
        return reader

    async def pods(self, cluster: str, spec: LaunchSpec) -> list[PodRow]:
        return await self._reader(cluster).pods(cluster, spec)

    async def logs(self, cluster: str, spec: LaunchSpec, request: LogRequest) -> LogStream:
        return await self._reader(cluster).logs(cluster, spec, request)


@dataclass(slots=True)
class KubeMember:
    name: str
    source: KubeSource
    client: ApiClient
    watcher: ClusterWatcher
    launcher: KubeLauncher
    pods: KubePods
    runtimes: RuntimeCache


@dataclass(slots=True)
class AgentMember:
    """An agent-fed member whose agent launches: recovery goes through the agent; down
    while the agent is not heard (``MqttMembers`` says), since ``down_since``."""

    name: str
    launcher: GangRecovery
    down_since: float | None = field(default=None)


class KubeMembers:
    """The members the broker launches into, Kubernetes ones and agent-fed ones whose
    agent launches (``agents``), and whether each is stale."""

    def __init__(
        self,
        clusters: list[ClusterConfig],
        stale_after: float,
        clock: Callable[[], float],
        retry_wait: wait_base | None = None,
    ):
        self.configs = [cc for cc in clusters if cc.source.kube is not None]
        # Between a launcher's retries of a failed request (None: the launcher's own
        # exponential wait with jitter; tests inject none).
        self.retry_wait = retry_wait
        self.tracker = StaleTracker(stale_after, clock)
        self.members: dict[str, KubeMember] = {}
        # Members seen down (stale) since their last garbage collection: kept out of
        # placements until a collection on them succeeded (failover: no job runs twice).
        self.dirty: set[str] = set()
        self.agents: dict[str, AgentMember] = {}
        self._clock = clock

    def __bool__(self) -> bool:
        return bool(self.configs) or bool(self.agents)

    def add_agent(self, name: str, launcher: GangRecovery) -> None:
        """An agent-fed member whose agent launches; down until its agent is heard."""
        self.agents[name] = AgentMember(name, launcher, self._clock())

    def agent_down(self, name: str, down: bool) -> None:
        """Its agent went unheard (stale) or was heard again."""
        member = self.agents[name]
        if not down:
            member.down_since = None
        elif member.down_since is None:
            member.down_since = self._clock()

    def names(self) -> list[str]:
        return [cc.name for cc in self.configs] + list(self.agents)

    def recoverable(self) -> list[tuple[str, GangRecovery]]:
        """Each member's launcher as what reads our objects back and collects them."""
        found: list[tuple[str, GangRecovery]] = [
            (name, member.launcher) for name, member in self.members.items()
        ]
        return found + [(name, member.launcher) for name, member in self.agents.items()]

    async def connect(
        self, emit: Emit, spec_for: Callable[[Placement], LaunchSpec], launchers: ClusterLauncher
    ) -> None:
        """Build a client, watcher and launcher per member (no request is sent yet).
        A kubeconfig that cannot be loaded raises KubeconfigError (its message is scrubbed)."""
        # Imported here, with the first Kubernetes member: kubernetes.aio is most of a
        # start's imports, and a broker of simulated members never needs it.
        from adapters.kube.launch import KubeLauncher
        from adapters.kube.pods import KubePods
        from adapters.kube.runtimes import RuntimeCache
        from adapters.kube.settings import LaunchSettings
        from adapters.kubeapi.kubeconfig import load_clients

        for cc in self.configs:
            source = cc.source.kube
            assert source is not None
            clients, _ = await load_clients(source.kubeconfig_source(), [source.context])
            client = clients[source.context]
            gpu = GpuConfig(
                tuple(source.gpu_resources), source.gpu_type_label, source.shared_gpu_resource
            )
            self.tracker.track(cc.name)
            watcher = ClusterWatcher(
                cc.name, client, emit, gpu, on_status=self.tracker.on_status,
                inactivity_timeout=source.watch_inactivity_seconds,
                request_timeout=source.request_timeout_seconds,
            )  # fmt: skip
            settings = LaunchSettings(
                source.namespace_pattern, source.launch_mode, source.pod_group,
                cluster=cc.name, gpu_resource=source.gpu_resources[0],
                shared_gpu_resource=source.shared_gpu_resource,
                scheduler_name=source.scheduler_name,
                volcano_queues=source.volcano_queues,
                poll_seconds=source.pod_poll_seconds,
                request_timeout=source.request_timeout_seconds,
                run_poll_seconds=source.pod_poll_seconds,
                resync_seconds=source.pod_resync_seconds,
                watch_inactivity_seconds=source.watch_inactivity_seconds,
                retry_wait=self.retry_wait,
            )  # fmt: skip
            launcher = KubeLauncher(client, settings, kinds=INTEGRATIONS, spec_for=spec_for)
            pods = KubePods(
                client,
                launcher.objects,
                kinds=INTEGRATIONS,
                request_timeout=source.request_timeout_seconds,
            )
            runtimes = RuntimeCache(
                cc.name, client, [r for kind in INTEGRATIONS for r in kind.reads],
                inactivity_timeout=source.watch_inactivity_seconds,
                request_timeout=source.request_timeout_seconds,
            )  # fmt: skip
            self.members[cc.name] = KubeMember(
                cc.name, source, client, watcher, launcher, pods, runtimes
            )
            launchers.by_cluster[cc.name] = launcher
            launchers.readers[cc.name] = pods

    def runtimes(self, kind: str, tenant: str, name: str) -> dict[str, Mapping[str, Any] | str]:
        """Each member's runtime ``kind``/``name`` as the tenant's workloads there would
        use it (a namespaced one: in the tenant's namespace), or why it has none."""
        out: dict[str, Mapping[str, Any] | str] = {}
        for cluster, member in sorted(self.members.items()):
            problem = member.runtimes.problem(kind)
            namespace = member.launcher.objects.namespace(tenant)
            found = None if problem else member.runtimes.lookup(kind, namespace, name)
            out[cluster] = found if found is not None else (problem or f"has no {kind} {name}")
        return out

    def down(self, name: str) -> bool:
        """Down for staleAfterSeconds, or never listed. A cluster that comes back is up
        only once its watcher has relisted it (the watcher reports itself connected after
        the relist's events are emitted). An agent-fed member: while its agent is unheard."""
        agent = self.agents.get(name)
        if agent is not None:
            return agent.down_since is not None
        member = self.members.get(name)
        return member is None or member.watcher.lists == 0 or self.tracker.is_stale(name)

    def stale(self, name: str) -> bool:
        """No new placements there: down, or back but not yet garbage-collected (a member
        seen down is marked dirty here, and stays stale until ``cleaned``)."""
        if self.down(name):
            self.dirty.add(name)
            return True
        return name in self.dirty

    def cleaned(self, name: str) -> None:
        """A garbage collection on the member succeeded while it was up: trust it again."""
        self.dirty.discard(name)

    def returned(self) -> list[str]:
        """Members up again but not yet garbage-collected."""
        return sorted(name for name in self.dirty if not self.down(name))

    def stale_since(self) -> dict[str, float]:
        """When each stale member became stale (for failover)."""
        out: dict[str, float] = {}
        for name in self.members:
            since = self.tracker.stale_since(name)
            if since is not None:
                out[name] = since
        for name, agent in self.agents.items():
            if agent.down_since is not None:
                out[name] = agent.down_since
        return out

    def connected(self, name: str) -> bool:
        """A Kubernetes member's watch is connected; a cluster that is not a member
        (simulated) always is."""
        member = self.members.get(name)
        if member is None:
            return not any(cc.name == name for cc in self.configs)
        return member.watcher.connected

    def relists(self, name: str) -> int:
        """Full relists of a member's watch (0 for a cluster that is not a member)."""
        member = self.members.get(name)
        return 0 if member is None else member.watcher.lists

    async def close(self) -> None:
        for member in self.members.values():
            await member.client.close()  # type: ignore[no-untyped-call]
        self.members.clear()
