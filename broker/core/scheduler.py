"""The scheduling cycle: decide, serially, which waiting jobs are placed where, and reserve.

One function, ``run_cycle``, read as Kueue's recipe: (1) take the eligible jobs in queue
order, (2) for each, take a ledger snapshot and let the job's policy decide (through
``broker.core.decide``), preempting lower-priority reclaimable jobs if it fits nowhere
(``broker.core.preemption``), (3) check the queue's quota against the placement, (4) assume
the placement in the ledger (the atomic, all-or-nothing reservation) and charge the queue,
(5) leave the rest waiting with their reasons. Launching is not done here: the caller
writes the decision to the store and hands it to the lifecycle, which launches concurrently
(kube-scheduler's binding cycle). Preemption's victims are requeued at once and the job is
placed in the same cycle, so nothing else can take the freed capacity first.

No head-of-line blocking, no starvation: a job that does not fit never stops the jobs
behind it from being tried, so small jobs backfill around a waiting gang. Once a gang has
waited longer than ``starvation_seconds`` and is among the ``max_held_gangs`` oldest such
(default one), nodes are *held* for it in the cluster where it comes closest to fitting
(``broker.core.holds``: just enough nodes to take the gang once empty): jobs behind it in
the order decide without those nodes, so capacity freed there accumulates for the gang
instead of being nibbled away, while the rest of the cluster stays open. Holding is per
cycle and recomputed each cycle, so it ends once the gang is placed.

A job of a shape the memo (``broker.core.shapes``) knows to be unplaceable waits without
a decision. A starving gang is decided in full (its hold needs the largest fits) and its
shape remembered apart, so a skipped starving gang still holds nodes in the cluster its
remembered largest fits point to (the fits can only have shrunk since: the memo is dropped
when room appears). A job that might preempt (running jobs below its priority in a reclaimable
queue) is always decided.
``max_jobs_per_cycle`` bounds the decisions of a cycle; skipped jobs do not count.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Hashable, Mapping
from dataclasses import dataclass, field

from broker.core.decide import decide
from broker.core.holds import Holds, hidden_with, nodes_to_hold
from broker.core.ledger import ConflictError, Ledger
from broker.core.lifecycle import Launch, Lifecycle, Outcome
from broker.core.pod_mix import PodMix
from broker.core.preemption import choose_victims
from broker.core.queue import JobQueue, Ordering, Pending, gpu_milli_by_type
from broker.core.shapes import UnplaceableShapes, shape_of
from broker.model import (
    CapacitySnapshot,
    GpuType,
    Job,
    Placement,
    Reason,
    ReasonCode,
    Unplaceable,
)
from policies import WORKLOAD_POLICIES, Policy, make_policy


@dataclass(frozen=True, slots=True)
class SchedulerSettings:
    max_jobs_per_cycle: int = 1000
    starvation_seconds: float = 600.0
    # A cycle stops deciding once it has run this long (after one decision at least): it
    # runs on the event loop, so this bounds how long the API waits behind it. The jobs
    # not reached wait for the next cycle. None: no bound (replays, tests).
    max_cycle_seconds: float | None = None
    # How many starving gangs may hold nodes at once, oldest first (as Slurm's backfill
    # reserves for the jobs at the head only): each hold idles capacity, and in the openb
    # replay holding for every starving gang raised the p95 gang wait four-fold, while one
    # at a time still guarantees the oldest its nodes, then the next.
    max_held_gangs: int = 1


@dataclass(slots=True)
class CycleResult:
    admitted: list[tuple[Pending, Placement]] = field(default_factory=list)
    waiting: dict[str, Unplaceable] = field(default_factory=dict)
    held: Holds = field(default_factory=dict)  # cluster -> node -> the gang it is held for
    preempted: list[tuple[Launch, Outcome]] = field(default_factory=list)
    conflicts: int = 0
    # (seconds the policy took, None when the precheck answered; policy name; placed?) per
    # decision, for metrics.
    decisions: list[tuple[float | None, str, bool]] = field(default_factory=list)
    skipped: int = 0  # jobs of a shape known not to fit: waiting, no decision made
    cut_short: bool = False  # max_cycle_seconds ran out before the queue did


class PolicyBook:
    """The one per-queue choice of policy: the job's own unless ``auto``, else its queue's
    (which may be ``auto`` too: gang or binpack by the job's size). One instance per name;
    the fgd family's is made again when the pod mix it places against has moved."""

    def __init__(self, queue: JobQueue, seed: int = 0, mix: PodMix | None = None) -> None:
        self._queue = queue
        self._seed = seed
        self.mix = mix if mix is not None else PodMix()
        self._made: dict[str, tuple[int, Policy]] = {}

    def name_for(self, pending: Pending) -> str:
        name: str = pending.job.policy
        return self._queue.spec(pending.job.queue).policy if name == "auto" else name

    def for_job(self, pending: Pending) -> Policy:
        self.mix.observe(pending.job)
        name = self.name_for(pending)
        version = self.mix.version if name in WORKLOAD_POLICIES else 0
        made = self._made.get(name)
        if made is None or made[0] != version:
            made = self._made[name] = (version, self._make(name))
        return made[1]

    def fresh(self, pending: Pending) -> Policy:
        """A new instance of the policy ``for_job`` gives, sharing no memo and no random
        generator with the cycle's: for a dry run in another thread."""
        return self._make(self.name_for(pending))

    def _make(self, name: str) -> Policy:
        return make_policy(name, self._seed, self.mix.workload)


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
    cycle = _Cycle(queue, ledger, policies, now, settings, on_decision, lifecycle, hiding, memo)
    # 1. The eligible jobs, in order: priority, queue priority, fair share, FIFO.
    decided = 0
    began = time.perf_counter()
    budget = settings.max_cycle_seconds
    with cycle.eligible() as ordered:
        for pending in ordered:
            if decided >= settings.max_jobs_per_cycle:
                break
            if budget is not None and decided and time.perf_counter() - began >= budget:
                cycle.result.cut_short = True
                break
            # 2.-5. Decide (unless the memo knows the shape), check quota, reserve, or wait.
            decided += cycle.consider(pending)
    return cycle.result


@dataclass(slots=True)
class _Cycle:
    """One cycle's inputs and what it has done so far, shared by the steps of the recipe."""

    queue: JobQueue
    ledger: Ledger
    policies: PolicyBook
    now: float
    settings: SchedulerSettings
    on_decision: Callable[[Pending, Placement | Unplaceable], None] | None
    lifecycle: Lifecycle | None
    hiding: Callable[[Job], Mapping[str, Collection[str]]] | None
    memo: UnplaceableShapes | None
    result: CycleResult = field(default_factory=CycleResult)
    floor: int | None = None  # Lifecycle.lowest_reclaimable(), once known
    floor_known: bool = False
    held_keys: set[tuple[str, str]] = field(default_factory=set)  # result.held, as pairs
    holders: int = 0  # gangs holding nodes so far this cycle
    # The snapshot without the held nodes, for the ledger version and holds it was made at.
    held_view: tuple[int, int, CapacitySnapshot] | None = None

    def eligible(self) -> Ordering:
        """The eligible jobs, lazily in order: a cycle pays for the jobs it looks at."""
        total, _ = federation_capacity(self.ledger.snapshot())
        return self.queue.ordering(self.now, total)

    def consider(self, pending: Pending) -> int:
        """Steps 2 to 5 for one job: 1 if a decision was made, 0 if the memo skipped it."""
        job = pending.job
        snapshot = self.ledger.snapshot()
        policy = self.policies.for_job(pending)
        hidden = self.hiding(job) if self.hiding is not None else None
        waited = self.now - pending.enqueued_at
        starving = job.total_pods > 1 and waited >= self.settings.starvation_seconds
        shape: Hashable = None
        if self.memo is not None:
            # A starving gang's decision is remembered apart: made in full (no precheck),
            # it carries the largest fits its hold is chosen by. A job that may preempt was
            # refused with preemption tried: that holds until a launch it might reclaim
            # appears (or the ledger grows).
            life = self.lifecycle
            reclaim = life.reclaim_version if life is not None and self._may_preempt(job) else None
            shape = (shape_of(job, policy.name, hidden), starving, reclaim)
            known = self.memo.lookup(shape, self.ledger, self.held_keys)
            if known is not None:
                self.result.skipped += 1
                why = Unplaceable(job.key, known.reasons, known.largest_fit)
                self._wait(pending, why)
                if starving:
                    self._hold_for(job, why)
                return 0
        # 2. Decide on a fresh snapshot (earlier admissions of this cycle are in it). A
        # starving gang is always decided in full: its hold needs the largest fits.
        made = decide(job, self._view(hidden), policy, precheck=not starving)
        decision = made.decision
        self.result.decisions.append((made.seconds, policy.name, isinstance(decision, Placement)))
        if isinstance(decision, Unplaceable) and self._preempt_for(pending, policy):
            snapshot = self.ledger.snapshot()
            decision = decide(job, self._view(hidden), policy, precheck=False).decision
        if isinstance(decision, Placement):
            refused = self._admit(pending, decision, snapshot)
            if refused is None:
                return 1
            decision = refused
        elif self.memo is not None and shape is not None:
            # Unplaceable by the policy (not by quota, which changes with the queue's use).
            self.memo.remember(shape, self.ledger, self.held_keys, decision)
        # 5. It waits; a gang that has waited too long gets nodes held in its closest cluster.
        self._wait(pending, decision)
        if starving:
            self._hold_for(job, decision)
        return 1

    def _view(self, hidden: Mapping[str, Collection[str]] | None) -> CapacitySnapshot:
        """A fresh snapshot without the nodes ``hidden`` and the nodes held so far."""
        if not self.held_keys:
            return self.ledger.snapshot_hiding(hidden) if hidden else self.ledger.snapshot()
        if hidden:
            return self.ledger.snapshot_hiding(hidden_with(self.result.held, hidden))
        # Jobs decided one after another see the same held view until something changes.
        version = self.ledger.snapshot().version
        cached = self.held_view
        if cached is None or cached[:2] != (version, len(self.held_keys)):
            view = self.ledger.snapshot_hiding(self.result.held)
            cached = self.held_view = (version, len(self.held_keys), view)
        return cached[2]

    def _may_preempt(self, job: Job) -> bool:
        if self.lifecycle is None:
            return False
        if not self.floor_known:
            self.floor, self.floor_known = self.lifecycle.lowest_reclaimable(), True
        return self.floor is not None and job.priority > self.floor

    def _preempt_for(self, pending: Pending, policy: Policy) -> bool:
        """Evict the victims that let the job fit, if any set does; True if it did."""
        if self.lifecycle is None:
            return False
        job = pending.job
        victims = choose_victims(
            job, policy, self.ledger, self.queue, self.lifecycle, self.result.held
        )
        if victims is None:
            return False
        for victim in victims:
            outcome = self.lifecycle.preempt(victim.placement.job, self.now, job.key)
            if outcome is not None:
                self.result.preempted.append((victim, outcome))
        return True

    def _admit(
        self, pending: Pending, placement: Placement, snapshot: CapacitySnapshot
    ) -> Unplaceable | None:
        """3. The queue's quota, then 4. reserve all or nothing and charge the queue. The
        quota's refusal, or None: admitted (or lost to a conflict, to be tried again)."""
        job = pending.job
        # Quota: what the placement would take, by GPU type, against the queue's.
        demand = gpu_milli_by_type(placement, node_types(snapshot, placement))
        spec = self.queue.spec(job.queue)
        # What is idle to borrow matters to a borrowing queue only (and costs a walk over
        # every cluster: not paid per placement otherwise).
        borrowing = spec.quota is not None and spec.borrow
        idle = federation_capacity(snapshot)[1] if borrowing else {}
        refused = self.queue.quota_allows(job.queue, demand, idle)
        if refused is not None:
            return Unplaceable(job.key, (Reason(ReasonCode.QUOTA, refused),))
        try:
            self.ledger.assume(placement)
        except ConflictError:
            self.result.conflicts += 1
            return None
        self.queue.remove(job.key)
        self.queue.charge(job.key, job.queue, demand)
        self.result.admitted.append((pending, placement))
        if self.on_decision is not None:
            self.on_decision(pending, placement)
        return None

    def _wait(self, pending: Pending, why: Unplaceable) -> None:
        self.result.waiting[pending.job.key] = why
        pending.waiting = why.reasons
        if self.on_decision is not None:
            self.on_decision(pending, why)

    def _hold_for(self, job: Job, why: Unplaceable) -> None:
        """Hold nodes for the starving gang in the cluster where it comes closest to fitting
        (its largest fits were found without the nodes already held) among those that could
        take it whole once their nodes empty."""
        if self.holders >= self.settings.max_held_gangs:
            return
        fits = why.largest_fit
        snapshot = self.ledger.snapshot()
        for cluster in sorted(fits, key=lambda c: (fits[c], c), reverse=True):
            view = snapshot.clusters.get(cluster)
            if fits[cluster] <= 0 or view is None:
                break
            mine = self.result.held.get(cluster, {})
            chosen = nodes_to_hold(job, view, mine)
            if chosen:
                self.result.held[cluster] = mine
                for node in chosen:
                    mine[node] = job.key
                    self.held_keys.add((cluster, node))
                self.holders += 1
                return
