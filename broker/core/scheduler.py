"""The scheduling cycle: decide, serially, which waiting jobs are placed where, and reserve.

One function, ``run_cycle``, read as Kueue's recipe: (1) take the eligible jobs in queue
order, (2) for each, take a ledger snapshot and let the job's policy decide, (3) check the
queue's quota against the placement, (4) assume the placement in the ledger (the atomic,
all-or-nothing reservation) and charge the queue, (5) leave the rest waiting with their
reasons. Launching is not done here: the caller writes the decision to the store and hands
it to the lifecycle, which launches concurrently (kube-scheduler's binding cycle).

Preemption (kube-scheduler's PostFilter): a job that fits nowhere may evict whole jobs of
*reclaimable* queues with a lower priority than its own, never part of a gang. Per cluster,
victims are tried smallest first (then lowest priority, then newest) on a what-if snapshot
until the job fits, then any victim not needed is dropped again; the cluster whose victims
free the fewest GPUs wins. The victims are requeued at once and the job is placed in the same
cycle, so nothing else can take the freed capacity first.

No head-of-line blocking, no starvation: a job that does not fit never stops the jobs
behind it from being tried, so small jobs backfill around a waiting gang. Once a gang has
waited longer than ``starvation_seconds``, the cluster where it comes closest to fitting is
*held* for it: jobs behind it in the order may no longer be placed there, so capacity freed
in that cluster accumulates for the gang instead of being nibbled away. Holding is per
cycle and recomputed each cycle, so it ends by itself once the gang is placed.

A backlog of jobs that do not fit (a full federation, 100,000 queued) would cost a whole
policy decision each, every cycle. ``UnplaceableShapes`` remembers the *shapes* (everything
a decision depends on but the name) found unplaceable, as Armada skips jobs whose
scheduling key already failed in a round: a job of a remembered shape waits without a
decision, for as long as the federation has only lost room since (``Ledger.growth``
unchanged: only assumptions happened) and no cluster held then is free now. A starving
gang is always decided (its hold needs the largest fits), as is a job that might preempt
(running jobs below its priority in a reclaimable queue). ``max_jobs_per_cycle`` bounds
the decisions of a cycle; skipped jobs do not count.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Hashable, Mapping
from dataclasses import dataclass, field

from broker.core.decide import decide
from broker.core.ledger import ConflictError, Ledger
from broker.core.lifecycle import Launch, Lifecycle, Outcome
from broker.core.queue import JobQueue, Pending, gpu_milli_by_type
from broker.model import (
    CapacitySnapshot,
    ClusterCapacity,
    GpuType,
    Job,
    Placement,
    Reason,
    ReasonCode,
    Unplaceable,
)
from policies import Policy, make_policy


@dataclass(frozen=True, slots=True)
class SchedulerSettings:
    max_jobs_per_cycle: int = 1000
    starvation_seconds: float = 600.0
    # A cycle stops deciding once it has run this long (after one decision at least): it
    # runs on the event loop, so this bounds how long the API waits behind it. The jobs
    # not reached wait for the next cycle. None: no bound (replays, tests).
    max_cycle_seconds: float | None = None


@dataclass(slots=True)
class CycleResult:
    admitted: list[tuple[Pending, Placement]] = field(default_factory=list)
    waiting: dict[str, Unplaceable] = field(default_factory=dict)
    held: dict[str, str] = field(default_factory=dict)  # cluster -> the gang it is held for
    preempted: list[tuple[Launch, Outcome]] = field(default_factory=list)
    conflicts: int = 0
    # (seconds the policy took, None when the precheck answered; policy name; placed?) per
    # decision, for metrics.
    decisions: list[tuple[float | None, str, bool]] = field(default_factory=list)
    skipped: int = 0  # jobs of a shape known not to fit: waiting, no decision made
    cut_short: bool = False  # max_cycle_seconds ran out before the queue did


def shape_of(job: Job, policy: str, hidden: Mapping[str, Collection[str]] | None) -> Hashable:
    """Everything a placement decision depends on but the job's name: two jobs of one shape
    fit in exactly the same places."""
    return (
        policy, job.queue, job.priority, job.min_member, job.allow_burst, job.gpu_types,
        tuple(sorted(job.cluster_selector.items())),
        tuple((ps.count, ps.resources, ps.tolerations) for ps in job.pod_sets),
        tuple(sorted((c, tuple(sorted(n))) for c, n in hidden.items())) if hidden else (),
    )  # fmt: skip


@dataclass(slots=True)
class UnplaceableShapes:
    """Job shapes a decision found unplaceable, with the reasons and the clusters held at
    the time; kept across cycles while ``Ledger.growth`` stays put (see the module doc)."""

    ledger: Ledger | None = None  # whose growth it is (a rebuilt service has a new one)
    growth: int = -1
    shapes: dict[Hashable, tuple[frozenset[str], Unplaceable]] = field(default_factory=dict)

    def _current(self, ledger: Ledger) -> bool:
        if ledger is self.ledger and ledger.growth == self.growth:
            return True
        self.shapes.clear()
        self.ledger, self.growth = ledger, ledger.growth
        return False

    def lookup(
        self, shape: Hashable, ledger: Ledger, held: Mapping[str, str]
    ) -> Unplaceable | None:
        if not self._current(ledger):
            return None
        known = self.shapes.get(shape)
        if known is None or not all(cluster in held for cluster in known[0]):
            return None  # a cluster hidden then is visible now: decide again
        return known[1]

    def remember(
        self, shape: Hashable, ledger: Ledger, held: Mapping[str, str], why: Unplaceable
    ) -> None:
        self._current(ledger)
        self.shapes[shape] = (frozenset(held), why)


class _Without:
    """A snapshot with some clusters hidden (held for a starving gang)."""

    def __init__(self, snapshot: CapacitySnapshot, hidden: Mapping[str, str]) -> None:
        self._snapshot = snapshot
        self._hidden = hidden
        self._clusters = {n: v for n, v in snapshot.clusters.items() if n not in hidden}

    @property
    def clusters(self) -> Mapping[str, ClusterCapacity]:
        return self._clusters

    @property
    def version(self) -> int:
        return self._snapshot.version


class PolicyBook:
    """One policy instance per name, picked per job: the job's own unless ``auto``, else its
    queue's."""

    def __init__(self, queue: JobQueue, seed: int = 0) -> None:
        self._queue = queue
        self._seed = seed
        self._made: dict[str, Policy] = {}

    def for_job(self, pending: Pending) -> Policy:
        name: str = pending.job.policy
        if name == "auto":
            name = self._queue.spec(pending.job.queue).policy
        policy = self._made.get(name)
        if policy is None:
            policy = self._made[name] = make_policy(name, self._seed)
        return policy


def federation_capacity(snapshot: CapacitySnapshot) -> tuple[dict[str, int], dict[str, int]]:
    """GPU milli per type: (total, free), over clusters that are not stale."""
    total: dict[str, int] = {}
    free: dict[str, int] = {}
    for view in snapshot.clusters.values():
        if view.stale:
            continue
        for group in view.groups():
            key = str(group[0] or "")
            total[key] = total.get(key, 0) + view.gpus_total(group) * 1000
            free[key] = free.get(key, 0) + view.free_milli(group)
    return total, free


def node_types(snapshot: CapacitySnapshot, placement: Placement) -> dict[str, GpuType | None]:
    nodes = snapshot.clusters[placement.cluster].nodes
    return {p.node: nodes[p.node].node.gpu_type for p in placement.pods}


def run_cycle(
    queue: JobQueue,
    ledger: Ledger,
    policies: PolicyBook,
    now: float,
    settings: SchedulerSettings,
    on_decision: Callable[[Pending, Placement | Unplaceable], None] | None = None,
    lifecycle: Lifecycle | None = None,
    hiding: Callable[[Job], Mapping[str, Collection[str]]] | None = None,
    memo: UnplaceableShapes | None = None,
) -> CycleResult:
    """One cycle. ``hiding(job)`` (cluster -> nodes): nodes the job must decide without,
    such as burst nodes held for another gang (``BurstController.hiding``). ``memo``: the
    caller's unplaceable shapes, kept from cycle to cycle (None: every job is decided)."""
    result = CycleResult()

    def fresh(job: Job, hidden: Mapping[str, Collection[str]] | None) -> CapacitySnapshot:
        snapshot = ledger.snapshot_hiding(hidden) if hidden else ledger.snapshot()
        return _Without(snapshot, result.held) if result.held else snapshot

    floor: list[int | None] = []  # lowest priority a job could preempt from, once computed

    def may_preempt(job: Job) -> bool:
        if lifecycle is None:
            return False
        if not floor:
            floor.append(min((
                launch.pending.job.priority for launch in lifecycle.launches()
                if queue.spec(launch.pending.job.queue).reclaimable
            ), default=None))  # fmt: skip
        return floor[0] is not None and job.priority > floor[0]

    # 1. The eligible jobs, in order: priority, queue priority, fair share, FIFO.
    total, _ = federation_capacity(ledger.snapshot())
    ordered = queue.ordered(now, total)
    if memo is None:
        ordered = ordered[: settings.max_jobs_per_cycle]
    decided = 0
    began = time.perf_counter()
    budget = settings.max_cycle_seconds
    for pending in ordered:
        if decided >= settings.max_jobs_per_cycle:
            break
        if budget is not None and decided and time.perf_counter() - began >= budget:
            result.cut_short = True
            break
        job = pending.job
        # 2. Decide on a fresh snapshot (earlier admissions of this cycle are in it).
        snapshot = ledger.snapshot()
        policy = policies.for_job(pending)
        hidden = hiding(job) if hiding is not None else None
        starving = job.total_pods > 1 and now - pending.enqueued_at >= settings.starvation_seconds
        shape: Hashable = None
        if memo is not None and not starving and not may_preempt(job):
            shape = shape_of(job, policy.name, hidden)
            known = memo.lookup(shape, ledger, result.held)
            if known is not None:
                result.skipped += 1
                why = Unplaceable(job.key, known.reasons, known.largest_fit)
                result.waiting[job.key] = why
                if on_decision is not None:
                    on_decision(pending, why)
                continue
        decided += 1
        # A starving gang is always decided in full: its hold needs the largest fits.
        made = decide(job, fresh(job, hidden), policy, precheck=not starving)
        decision = made.decision
        result.decisions.append((made.seconds, policy.name, isinstance(decision, Placement)))
        if isinstance(decision, Unplaceable) and lifecycle is not None:
            victims = choose_victims(pending, ledger, queue, lifecycle, policies, result.held)
            if victims is not None:
                for victim in victims:
                    outcome = lifecycle.preempt(victim.placement.job, now, job.key)
                    if outcome is not None:
                        result.preempted.append((victim, outcome))
                snapshot = ledger.snapshot()
                decision = decide(job, fresh(job, hidden), policy, precheck=False).decision
        if isinstance(decision, Placement):
            # 3. Quota: what the placement would take, by GPU type, against the queue's.
            demand = gpu_milli_by_type(decision, node_types(snapshot, decision))
            spec = queue.spec(job.queue)
            # What is idle to borrow matters to a borrowing queue only (and costs a walk
            # over every cluster: not paid per placement otherwise).
            borrowing = spec.quota is not None and spec.borrow
            idle = federation_capacity(snapshot)[1] if borrowing else {}
            refused = queue.quota_allows(job.queue, demand, idle)
            if refused is not None:
                decision = Unplaceable(job.key, (Reason(ReasonCode.QUOTA, refused),))
            else:
                # 4. Reserve all or nothing, then charge the queue.
                try:
                    ledger.assume(decision)
                except ConflictError:
                    result.conflicts += 1
                    continue
                queue.remove(job.key)
                queue.charge(job.key, job.queue, demand)
                result.admitted.append((pending, decision))
                if on_decision is not None:
                    on_decision(pending, decision)
                continue
        elif memo is not None and shape is not None:
            # Unplaceable by the policy (not by quota, which changes with the queue's use).
            memo.remember(shape, ledger, result.held, decision)
        # 5. It waits; a gang that has waited too long gets its closest cluster held.
        result.waiting[job.key] = decision
        if on_decision is not None:
            on_decision(pending, decision)
        if job.total_pods > 1 and now - pending.enqueued_at >= settings.starvation_seconds:
            closest = max(
                (c for c in decision.largest_fit if c not in result.held),
                key=lambda c: (decision.largest_fit[c], c),
                default=None,
            )
            if closest is not None and decision.largest_fit[closest] > 0:
                result.held[closest] = job.key
    return result


def choose_victims(
    pending: Pending,
    ledger: Ledger,
    queue: JobQueue,
    lifecycle: Lifecycle,
    policies: PolicyBook,
    held: Mapping[str, str],
) -> list[Launch] | None:
    """The fewest GPUs of whole lower-priority reclaimable jobs whose eviction lets the job
    fit, or None when no such set exists."""
    job = pending.job
    policy = policies.for_job(pending)
    by_cluster: dict[str, list[Launch]] = {}
    for launch in lifecycle.launches():
        other = launch.pending.job
        if other.priority < job.priority and queue.spec(other.queue).reclaimable:
            by_cluster.setdefault(launch.placement.cluster, []).append(launch)
    best: tuple[int, str, list[Launch]] | None = None
    for cluster, candidates in sorted(by_cluster.items()):
        if cluster in held:
            continue
        candidates.sort(
            key=lambda la: (la.placement.gpu_milli, la.pending.job.priority, -la.pending.seq)
        )

        def fits(victims: list[Launch], cluster: str = cluster) -> bool:
            what_if = ledger.snapshot_without(v.placement for v in victims)
            only = _Without(what_if, {c: "" for c in what_if.clusters if c != cluster})
            return isinstance(policy.decide(job, only), Placement)

        chosen: list[Launch] = []
        for launch in candidates:
            chosen.append(launch)
            if fits(chosen):
                break
        else:
            continue
        for launch in sorted(chosen, key=lambda la: -la.placement.gpu_milli):
            trial = [v for v in chosen if v is not launch]
            if trial and fits(trial):
                chosen = trial
        freed = sum(v.placement.gpu_milli for v in chosen)
        if best is None or (freed, cluster) < (best[0], best[1]):
            best = (freed, cluster, chosen)
    return None if best is None else best[2]
