"""The burst controller: grow cloud pools by exactly what a waiting gang needs, hold the new
nodes for that gang, and give back nodes the broker added once they sit idle.

``BurstController`` decides; it does no I/O. Every cycle the caller (the service on the wall
clock, the replay on a virtual one) hands it the ledger's snapshot and the jobs still
waiting, and gets back *actions* (``ScaleTo``, ``RemoveNode``) to carry out through the
pool's port (Cluster API ``/scale``, or a simulated pool), reporting failures with
``failed``. The decision of which pool and how many nodes is the pure policy
``policies.burst.plan``.

What it tracks per pool and per gang, and why, is told in ``broker.core.burst_books``.

A pool owned by the cluster autoscaler (``owner``) is never scaled by the broker: the
autoscaler reacts to pending pods on its own, and two controllers would fight.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from broker.core.burst_books import BurstEvent, Owner, PoolBook, PoolStats, Request, empty
from broker.core.burst_option import BurstOption, burst_option
from broker.core.burst_rows import PoolRow, RequestRow
from broker.model import BurstPlan, BurstPool, CapacitySnapshot, Job, Placement, PoolState
from policies.burst import NoBurst, plan


@dataclass(frozen=True, slots=True)
class BurstSettings:
    burst_after_seconds: float = 30.0
    scale_down_after_seconds: float = 600.0
    provision_timeout_seconds: float = 900.0
    failure_backoff_seconds: float = 600.0


@dataclass(frozen=True, slots=True)
class ScaleTo:
    """Set the pool's replicas (``delta`` from what the controller had before; ``job``: the
    gang a scale-up is for)."""

    pool: str
    replicas: int
    delta: int
    reason: str
    job: str | None = None


@dataclass(frozen=True, slots=True)
class RemoveNode:
    pool: str
    cluster: str
    node: str


@dataclass(frozen=True, slots=True)
class LabelNode:
    """Label a node the broker added with its pool (``POOL_LABEL``), so that after a
    restart the broker still knows it as its own."""

    pool: str
    cluster: str
    node: str


POOL_LABEL = "fedbroker.io/burst-pool"

Action = ScaleTo | RemoveNode | LabelNode


class BurstController:
    def __init__(self, settings: BurstSettings) -> None:
        self.settings = settings
        self._pools: dict[str, PoolBook] = {}
        self._requests: dict[str, Request] = {}  # job -> its request
        self._since: dict[str, float] = {}  # job -> first seen waiting
        self._running: dict[str, tuple[float, int, float]] = {}  # job -> (at, nodes, $/h)
        self.job_node_seconds: dict[str, float] = {}
        self.job_cost: dict[str, float] = {}
        self.events: deque[BurstEvent] = deque(maxlen=1000)
        self._to_label: list[LabelNode] = []
        self._last: float | None = None

    # -- set-up ---------------------------------------------------------------------------

    def add_pool(
        self,
        pool: BurstPool,
        replicas: int,
        existing: Iterable[str] = (),
        owner: Owner = "fedbroker",
        burst_after_seconds: float | None = None,
        scale_down_after_seconds: float | None = None,
        provision_timeout_seconds: float | None = None,
    ) -> None:
        """A pool at its current size; ``existing`` nodes (already in its cluster and not
        labelled with this pool: see ``POOL_LABEL``) are not the broker's to remove. Unset
        times default to the controller's settings."""
        settings = self.settings
        self._pools[pool.name] = PoolBook(
            pool,
            owner,
            _or(burst_after_seconds, settings.burst_after_seconds),
            _or(scale_down_after_seconds, settings.scale_down_after_seconds),
            _or(provision_timeout_seconds, settings.provision_timeout_seconds),
            replicas,
            set(existing),
        )

    @property
    def pools(self) -> Mapping[str, BurstPool]:
        return {name: p.spec for name, p in self._pools.items()}

    def stats(self, pool: str) -> PoolStats:
        return self._pools[pool].stats

    # -- each cycle -----------------------------------------------------------------------

    def tick(self, now: float, snapshot: CapacitySnapshot, waiting: Sequence[Job]) -> list[Action]:
        """Account, notice nodes that came or went, settle requests, plan bursts for gangs
        waiting long enough, and pick idle nodes to give back."""
        self._account(now, snapshot)
        waiting_keys = {job.key for job in waiting}
        for key in list(self._since):
            if key not in waiting_keys:
                del self._since[key]
        for job in waiting:
            self._since.setdefault(job.key, now)
        actions: list[Action] = []
        self._notice_nodes(snapshot)
        actions.extend(self._to_label)
        self._to_label.clear()
        self._settle(now, waiting_keys, actions)
        self._plan(now, waiting, actions)
        self._cancel_unclaimed(now, actions)
        self._scale_down(now, snapshot, actions)
        return actions

    def _cancel_unclaimed(self, now: float, actions: list[Action]) -> None:
        """Nodes coming up that no gang waits for are scaled back before they cost more:
        at once when their gang started elsewhere or ended (and no gang planning in this
        tick claimed them); otherwise (after a restart the requests are gone) once no gang
        has claimed them for the pool's ``burstAfterSeconds``, time enough for the gangs
        that were waiting to plan again and claim them."""
        for name, pool in sorted(self._pools.items()):
            unclaimed = self._unclaimed(name) if pool.owner == "fedbroker" else 0
            orphaned, pool.orphaned = min(pool.orphaned, unclaimed), 0
            if unclaimed <= 0:
                pool.unclaimed_since = None
                continue
            if pool.unclaimed_since is None:
                pool.unclaimed_since = now
            cancel = unclaimed if now - pool.unclaimed_since >= pool.burst_after else orphaned
            if cancel <= 0:
                continue
            if cancel == unclaimed:
                pool.unclaimed_since = None
            pool.replicas -= cancel
            reason = f"{cancel} nodes coming up that no gang waits for"
            actions.append(ScaleTo(name, pool.replicas, -cancel, reason))
            self.events.append(BurstEvent(now, name, "scale-down", f"-{cancel}: {reason}"))

    def _account(self, now: float, snapshot: CapacitySnapshot) -> None:
        last, self._last = self._last, now
        if last is None or now <= last:
            return
        dt = now - last
        held = {n for r in self._requests.values() for n in r.arrived}
        for pool in self._pools.values():
            pool.stats.node_seconds += pool.billed * dt
            view = snapshot.clusters.get(pool.spec.cluster)
            if view is None:
                continue
            # Idle: up, no pod, and not held for a gang waiting for the rest of its nodes
            # (those are the gang's provisioning, charged to it, not a leak).
            idle = sum(
                1 for n in pool.ours - held if (s := view.nodes.get(n)) is not None and empty(s)
            )
            pool.stats.idle_node_seconds += idle * dt
        for request in self._requests.values():
            pool = self._pools[request.pool]
            self._charge(request.job, request.nodes * dt, pool.spec.cost_per_node_hour)
        for job, (_, nodes, rate) in self._running.items():
            self._charge(job, nodes * dt, rate)

    def _charge(self, job: str, node_seconds: float, cost_per_node_hour: float) -> None:
        self.job_node_seconds[job] = self.job_node_seconds.get(job, 0.0) + node_seconds
        cost = node_seconds / 3600.0 * cost_per_node_hour
        self.job_cost[job] = self.job_cost.get(job, 0.0) + cost

    def _notice_nodes(self, snapshot: CapacitySnapshot) -> None:
        for pool in self._pools.values():
            view = snapshot.clusters.get(pool.spec.cluster)
            present = set(view.nodes) if view is not None else set()
            gone = (pool.ours | pool.removing) - present
            pool.ours -= gone
            pool.removing -= gone
            for name in gone:
                pool.idle_since.pop(name, None)
            if view is None:
                continue
            for name, state in sorted(view.nodes.items()):
                if name in pool.baseline or name in pool.ours or name in pool.removing:
                    continue
                node = state.node
                if not (node.ready and node.schedulable and node.allocatable.gpus > 0):
                    continue  # not counted until Ready, schedulable and advertising GPUs
                pool.ours.add(name)
                if node.labels.get(POOL_LABEL) != pool.spec.name:
                    self._to_label.append(LabelNode(pool.spec.name, pool.spec.cluster, name))
                for request in self._requests.values():
                    if request.pool == pool.spec.name and request.missing > 0:
                        request.arrived.append(name)
                        break

    def _settle(self, now: float, waiting: set[str], actions: list[Action]) -> None:
        for job, request in list(self._requests.items()):
            pool = self._pools[request.pool]
            if job not in waiting:  # placed (maybe on its nodes), cancelled or failed
                del self._requests[job]
                pool.orphaned += max(0, request.missing)  # still coming, for nobody now
                continue
            if request.missing <= 0 or now < request.deadline:
                continue
            # Provisioning timeout: give back what never came, back off, let the gang wait.
            del self._requests[job]
            missing = request.missing
            pool.replicas = max(len(pool.baseline), pool.replicas - missing)
            pool.failures += 1
            backoff = self.settings.failure_backoff_seconds * 2 ** (pool.failures - 1)
            pool.failing_until = now + backoff
            pool.stats.provision_failures += 1
            self._since[job] = now  # a fresh wait before it may burst again
            reason = f"{missing} nodes for {job} never came"
            actions.append(ScaleTo(pool.spec.name, pool.replicas, -missing, reason))
            self.events.append(BurstEvent(
                now, pool.spec.name, "provision-timeout",
                f"{missing} of {request.nodes} nodes for {job} not ready after "
                f"{pool.provision_timeout:.0f}s; scaled back, pool backs off "
                f"{backoff:.0f}s", job,
            ))  # fmt: skip

    def _states(self, now: float, job: str) -> list[PoolState]:
        since = self._since.get(job, now)
        states = []
        for name, pool in sorted(self._pools.items()):
            if pool.owner != "fedbroker" or now - since < pool.burst_after:
                continue
            states.append(pool.state(self._unclaimed(name), now))
        return states

    def _unclaimed(self, name: str) -> int:
        """Nodes coming up in the pool that no request is waiting for."""
        pool = self._pools[name]
        coming = self._coming(pool)
        claimed = sum(r.missing for r in self._requests.values() if r.pool == name)
        return max(0, coming - claimed)

    def _plan(self, now: float, waiting: Sequence[Job], actions: list[Action]) -> None:
        for job in waiting:
            if not job.allow_burst or job.key in self._requests:
                continue
            states = self._states(now, job.key)
            if not states:
                continue
            decision = plan(job, states)
            if isinstance(decision, NoBurst):
                continue
            self._start(now, decision, actions)

    def _start(self, now: float, decision: BurstPlan, actions: list[Action]) -> None:
        pool = self._pools[decision.pool]
        deadline = now + pool.provision_timeout
        self._requests[decision.job] = Request(
            decision.job, decision.pool, decision.total, now, deadline
        )
        if decision.nodes == 0:
            return  # all claimed from nodes already coming up
        pool.replicas += decision.nodes
        pool.stats.scale_ups += 1
        pool.stats.nodes_added += decision.nodes
        reason = f"{decision.nodes} nodes for {decision.job}"
        actions.append(ScaleTo(pool.spec.name, pool.replicas, decision.nodes, reason, decision.job))
        self.events.append(BurstEvent(
            now, pool.spec.name, "scale-up",
            f"+{decision.nodes} nodes for {decision.job} ({decision.cost_per_hour:.2f}/h)",
            decision.job,
        ))  # fmt: skip

    def _scale_down(self, now: float, snapshot: CapacitySnapshot, actions: list[Action]) -> None:
        held = {n for r in self._requests.values() for n in r.arrived}
        for pool in self._pools.values():
            if pool.owner != "fedbroker":
                continue
            view = snapshot.clusters.get(pool.spec.cluster)
            if view is None:
                continue
            for name in sorted(pool.ours):
                state = view.nodes.get(name)
                if state is None or name in held or not empty(state):
                    pool.idle_since.pop(name, None)
                    continue
                since = pool.idle_since.setdefault(name, now)
                if now - since < pool.scale_down_after:
                    continue
                if pool.replicas - 1 < pool.spec.min_nodes:
                    continue
                pool.ours.discard(name)
                pool.removing.add(name)
                pool.idle_since.pop(name, None)
                pool.replicas -= 1
                pool.stats.scale_downs += 1
                pool.stats.nodes_removed += 1
                actions.append(RemoveNode(pool.spec.name, pool.spec.cluster, name))
                self.events.append(BurstEvent(
                    now, pool.spec.name, "scale-down",
                    f"-1 node ({name}, idle {now - since:.0f}s)",
                ))  # fmt: skip

    # -- feedback -------------------------------------------------------------------------

    def failed(self, action: Action, now: float, message: str) -> None:
        """An action could not be carried out (the port gave up after its retries): its
        change of replicas is undone; a failed scale-up drops its gang's request (the gang
        waits on) and the pool backs off; a failed removal leaves the node ours, to be
        tried again once idle long enough."""
        pool = self._pools[action.pool]
        if isinstance(action, LabelNode):
            pass  # it stays ours now; only a restart would forget it
        elif isinstance(action, RemoveNode):
            pool.removing.discard(action.node)
            pool.ours.add(action.node)
            pool.replicas += 1
            pool.stats.scale_downs -= 1
            pool.stats.nodes_removed -= 1
        else:
            pool.replicas -= action.delta
            if action.delta > 0:
                pool.stats.scale_ups -= 1
                pool.stats.nodes_added -= action.delta
                if action.job is not None:
                    self._requests.pop(action.job, None)
                pool.failures += 1
                backoff = self.settings.failure_backoff_seconds * 2 ** (pool.failures - 1)
                pool.failing_until = now + backoff
        self.events.append(
            BurstEvent(now, action.pool, "scale-failed", message, getattr(action, "job", None))
        )

    @staticmethod
    def _coming(pool: PoolBook) -> int:
        return pool.replicas - len(pool.baseline) - len(pool.ours) - len(pool.removing)

    def placed(self, placement: Placement, now: float) -> None:
        """A job was placed: if on burst nodes, its run is charged to it from now on."""
        pool = next((p for p in self._pools.values() if p.spec.cluster == placement.cluster), None)
        if pool is None:
            return
        nodes = len({p.node for p in placement.pods})
        self._running[placement.job] = (now, nodes, pool.spec.cost_per_node_hour)

    def ended(self, job: str) -> None:
        self._running.pop(job, None)

    # -- reads ----------------------------------------------------------------------------

    def added_nodes(self) -> dict[str, set[str]]:
        """Cluster -> the nodes the pools added (up, or being removed)."""
        added: dict[str, set[str]] = {}
        for pool in self._pools.values():
            if pool.ours or pool.removing:
                added.setdefault(pool.spec.cluster, set()).update(pool.ours | pool.removing)
        return added

    def hiding(self, snapshot: CapacitySnapshot) -> Callable[[Job], dict[str, set[str]]]:
        """For the scheduling cycle about to use ``snapshot``: which nodes each job must not
        see. Nodes held for a gang are hidden from every other job; every node the broker
        added is hidden from jobs not allowed to burst (cloud nodes are paid for the work
        that may use them: a small pod that may not burst would keep one alive for hours).
        Nodes that just came up are claimed first, so no other job sees them before their
        gang does."""
        holds = self.holds(snapshot)
        added = self.added_nodes()

        def hidden(job: Job) -> dict[str, set[str]]:
            out: dict[str, set[str]] = {}
            if not job.allow_burst:
                for cluster, names in added.items():
                    out.setdefault(cluster, set()).update(names)
            for holder, by_cluster in holds.items():
                if holder != job.key:
                    for cluster, held in by_cluster.items():
                        out.setdefault(cluster, set()).update(held)
            return out

        return hidden

    def holds(
        self, snapshot: CapacitySnapshot | None = None
    ) -> dict[str, dict[str, frozenset[str]]]:
        """Job -> cluster -> the nodes held for it (came up for it, not yet used). Given the
        snapshot the scheduling cycle is about to use, nodes that just came up are claimed
        first, so no other job sees them before their gang does."""
        if snapshot is not None:
            self._notice_nodes(snapshot)
        out: dict[str, dict[str, frozenset[str]]] = {}
        for job, request in self._requests.items():
            if request.arrived:
                cluster = self._pools[request.pool].spec.cluster
                out[job] = {cluster: frozenset(request.arrived)}
        return out

    def option(self, now: float, job: Job) -> BurstOption:
        """What this controller will do for the waiting ``job`` (``explain``)."""
        key = job.key
        request, since = self._requests.get(key), self._since.get(key)
        return burst_option(job, now, self._pools, since, request, self._unclaimed)

    def requests(self) -> list[RequestRow]:
        return [
            RequestRow(r.job, r.pool, r.nodes, len(r.arrived), r.at, r.deadline)
            for r in self._requests.values()
        ]

    def pool_rows(self, now: float) -> list[PoolRow]:
        return [self._row(name, pool, now) for name, pool in sorted(self._pools.items())]

    def _row(self, name: str, pool: PoolBook, now: float) -> PoolRow:
        s, spec = pool.stats, pool.spec
        return PoolRow(
            name, spec.cluster, pool.owner, str(spec.gpu_type), pool.replicas, spec.min_nodes,
            spec.max_nodes, len(pool.ours), max(0, self._coming(pool)), now < pool.failing_until,
            s.scale_ups, s.scale_downs, s.nodes_added, s.provision_failures,
            round(s.node_hours(), 4), round(s.idle_node_hours(), 4),
            round(s.node_hours() * spec.cost_per_node_hour, 4), spec.cost_per_node_hour,
        )  # fmt: skip


def _or(value: float | None, default: float) -> float:
    return default if value is None else value
