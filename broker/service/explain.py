"""Explain and plan: where a job would go now and, per cluster, why not.

One function, ``plan_of``, for every caller: ``GET /v1/jobs/{name}/explain``, ``POST
/v1/plan`` and ``fedbroker plan`` (which reads Kubernetes clusters directly). The policy is
the one the scheduler would use for the job (its own, or its queue's for ``auto``); each
cluster is asked about alone, so its reasons and largest gang are its own.

For a job waiting in the queue, explain also says what happens next (``what_next``): its
place in the order the next cycles try jobs in (the queue's own order,
``JobQueue.position_frame``) and the burst controller's next step for it (its own planner,
``BurstController.option``): the pool it will grow, by how many nodes, at what cost and
from when, or why no pool can take it; a Cluster API pool that cannot be read yet is
named as unavailable (``with_unavailable``), never silently left out.

The API's dry runs are computed in the planner's thread (``broker.service.planner``):
``plan_work`` and ``explain_work`` are what it runs, everything they read taken on the
loop first and checked against the dry run's budget as it goes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from broker.core import views
from broker.core.burst import BurstController
from broker.core.burst_option import BurstOption, PoolRefusal
from broker.core.queue import JobQueue, PositionFrame, QueuePosition
from broker.core.scheduler import federation_capacity
from broker.model import CapacitySnapshot, Job, Placement, Reason, Unplaceable
from broker.service.budget import Budget, budgeted
from broker.service.pool_reading import Availability
from policies.framework import Policy
from policies.topology import largest_fit_in_domains


@dataclass(frozen=True, slots=True)
class ExplainRow:
    """One cluster's answer: does the job fit there alone, why not, the largest gang."""

    cluster: str
    fits: bool
    reasons: tuple[Reason, ...]
    largest_fit: int

    def reasons_json(self) -> list[dict[str, str]]:
        return [{"code": str(r.code), "message": r.message} for r in self.reasons]

    def as_json(self) -> dict[str, Any]:
        return {
            "cluster": self.cluster,
            "fits": self.fits,
            "reasons": self.reasons_json(),
            "largestFit": self.largest_fit,
        }


@dataclass(frozen=True, slots=True)
class Plan:
    """The decision on the whole federation, and each cluster's own answer."""

    job: Job
    decision: Placement | Unplaceable
    clusters: tuple[ExplainRow, ...]

    @property
    def placement(self) -> Placement | None:
        return self.decision if isinstance(self.decision, Placement) else None


def explain_rows(job: Job, policy: Policy, snapshot: CapacitySnapshot) -> tuple[ExplainRow, ...]:
    """Per cluster (sorted): does the job fit now, why not, and the largest gang it could
    take."""
    rows = []
    for name in sorted(snapshot.clusters):
        view = snapshot.clusters[name]
        decision = policy.decide(job, views.only(snapshot, name))
        reasons = decision.for_cluster(name) if isinstance(decision, Unplaceable) else ()
        rows.append(
            ExplainRow(
                name, isinstance(decision, Placement), reasons, largest_fit_in_domains(job, view)
            )
        )
    return tuple(rows)


def plan_of(job: Job, policy: Policy, snapshot: CapacitySnapshot) -> Plan:
    """Dry run: ``policy``'s decision for ``job`` on ``snapshot``; nothing is reserved."""
    return Plan(job, policy.decide(job, snapshot), explain_rows(job, policy, snapshot))


def plan_work(job: Job, policy: Policy, snapshot: CapacitySnapshot) -> Callable[[Budget], Plan]:
    """``plan_of`` as the planner's thread runs it: on ``snapshot`` checking the budget."""
    return lambda budget: plan_of(job, policy, budgeted(snapshot, budget))


@dataclass(frozen=True, slots=True)
class Explained:
    """What explain computes in the planner's thread: the per-cluster rows and the job's
    place in the queues (None: not in them)."""

    clusters: tuple[ExplainRow, ...]
    position: QueuePosition | None


def explain_work(
    job: Job, policy: Policy, queue: JobQueue, snapshot: CapacitySnapshot, now: float
) -> Callable[[Budget], Explained]:
    """A waiting job's rows and place, to be computed in the planner's thread: what they
    read of the live queue is copied here, on the loop (``position_frame``); the fair
    shares are over the capacity the cycle uses."""
    frame = queue.position_frame(job.key, now)
    capacity = federation_capacity(snapshot)[0]

    def work(budget: Budget) -> Explained:
        rows = explain_rows(job, policy, budgeted(snapshot, budget))
        place = frame.walk(capacity, budget.check) if isinstance(frame, PositionFrame) else frame
        return Explained(rows, place)

    return work


def what_next(
    explained: Explained,
    job: Job,
    bursting: BurstController,
    now: float,
    unavailable: Sequence[Availability] = (),
) -> dict[str, Any]:
    """A waiting job's place in the queues and its burst option, as explain answers them
    (``position`` and ``burst``). ``unavailable``: the pools not read yet, which the
    controller does not know of."""
    position = explained.position
    option = with_unavailable(bursting.option(now, job), unavailable)
    return {
        "position": position.as_json() if position is not None else None,
        "burst": option.as_json(),
    }


def with_unavailable(option: BurstOption, unavailable: Sequence[Availability]) -> BurstOption:
    """The option, with a refusal (``unavailable``, ``until`` the next read) for each pool
    that has not been read yet: it may be the pool the job waits for, and it joins the
    controller, with no restart, once a read succeeds. Not for a job whose nodes are
    already requested or that may not burst: no pool would be grown for it."""
    if option.status == "requested" or any(r.code == "not-allowed" for r in option.refusals):
        return option
    if not unavailable:
        return option
    refusals = tuple(r for r in option.refusals if r.code != "no-pools")  # pools there are
    message = (
        "the pool cannot be read on its management cluster ({}); it is read again with "
        "backoff and takes part once it can be"
    )
    refusals += tuple(
        PoolRefusal(a.pool, "unavailable", message.format(a.reason), a.retry_at)
        for a in unavailable
    )
    return dataclasses.replace(option, refusals=refusals)


__all__ = [
    "ExplainRow", "Explained", "Plan", "explain_rows", "explain_work", "plan_of", "plan_work",
    "what_next", "with_unavailable",
]  # fmt: skip
