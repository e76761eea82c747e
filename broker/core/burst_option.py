"""What the burst controller would do for one waiting gang, for ``explain``: the pool it
would grow, by how many nodes, at what cost and from when; the request already open for
it; or why no pool can take it.

Read-only over the controller's books (``BurstController.option`` hands them over), and
decided by the planner itself (``policies.burst.plan``) asked as the controller will ask
it: a pool is offered to a gang only once the gang has waited the pool's
``burstAfterSeconds``, counted from the first cycle it waited in (the controller's own
count, restarted after a provisioning timeout). So the option is the first plan, in the
order the pools open to the gang, that finds a pool; the pools' state is taken as it is
now (a pool backing off now is refused, with the time its backoff ends).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Literal

from broker.core.burst_books import PoolBook, Request
from broker.model import BurstPlan, Job
from policies.burst import NoBurst, plan

# The planner's refusal codes (``policies.burst.RefusalCode``), the controller's own, and
# the service's (``unavailable``: a pool not read yet, so not in the controller).
OptionCode = Literal[
    "not-allowed", "autoscaler", "no-pools", "backing-off", "gpu-type", "selector",
    "topology", "node-shape", "maximum", "unavailable",
]  # fmt: skip


@dataclass(frozen=True, slots=True)
class PoolRefusal:
    """Why one pool will not be grown for the job (``pool`` empty: about no pool at all)."""

    pool: str
    code: OptionCode
    message: str
    until: float | None = None  # backing off: when it may grow again; unavailable: next read

    def as_json(self) -> dict[str, object]:
        return {"pool": self.pool, "code": self.code, "message": self.message, "until": self.until}


@dataclass(frozen=True, slots=True)
class BurstOption:
    """``requested``: nodes are coming for the gang; ``planned``: the pool the controller
    will grow once the gang may burst (``eligible_at``; now or past: the next cycle);
    ``none``: why no pool can take it (``refusals``, one per pool)."""

    status: Literal["requested", "planned", "none"]
    pool: str | None = None
    cluster: str | None = None
    nodes: int = 0  # the gang's nodes from the pool (new and claimed)
    new_nodes: int = 0  # of those, the pool grows by (others already come up unclaimed)
    arrived: int = 0  # requested: of those, up now
    provision_seconds: float | None = None
    cost_per_node_hour: float | None = None
    waiting_since: float | None = None  # the controller's count of the gang's wait
    burst_after_seconds: float | None = None
    eligible_at: float | None = None
    requested_at: float | None = None
    deadline: float | None = None  # requested: the provisioning timeout
    refusals: tuple[PoolRefusal, ...] = ()

    @property
    def cost_per_hour(self) -> float | None:
        """What the gang's nodes from the pool cost per hour."""
        rate = self.cost_per_node_hour
        return None if rate is None else round(self.nodes * rate, 4)

    def as_json(self) -> dict[str, object]:
        return {
            "status": self.status, "pool": self.pool, "cluster": self.cluster,
            "nodes": self.nodes, "newNodes": self.new_nodes, "arrived": self.arrived,
            "provisionSeconds": self.provision_seconds,
            "costPerNodeHour": self.cost_per_node_hour, "costPerHour": self.cost_per_hour,
            "waitingSince": self.waiting_since, "burstAfterSeconds": self.burst_after_seconds,
            "eligibleAt": self.eligible_at, "requestedAt": self.requested_at,
            "deadline": self.deadline, "refusals": [r.as_json() for r in self.refusals],
        }  # fmt: skip


NOT_ALLOWED = PoolRefusal(
    "", "not-allowed", "the job may not burst (its spec.placement.allowBurst is not true)"
)


def burst_option(
    job: Job,
    now: float,
    books: Mapping[str, PoolBook],
    since: float | None,
    request: Request | None,
    unclaimed: Callable[[str], int],
) -> BurstOption:
    """The controller's next step for ``job`` (``since``: when it started counting the
    gang's wait, None before the first cycle it waited in: from now)."""
    if request is not None:
        spec = books[request.pool].spec
        return BurstOption(
            "requested", spec.name, spec.cluster, request.nodes, request.nodes,
            len(request.arrived), spec.provision_seconds, spec.cost_per_node_hour,
            requested_at=request.at, deadline=request.deadline,
        )  # fmt: skip
    if not job.allow_burst:
        return BurstOption("none", refusals=(NOT_ALLOWED,))
    start = now if since is None else since
    refusals = [
        PoolRefusal(name, "autoscaler", "scaled by the cluster autoscaler, not by the broker")
        for name, book in sorted(books.items())
        if book.owner != "fedbroker"
    ]
    ours = sorted(
        (b for b in books.values() if b.owner == "fedbroker"),
        key=lambda b: (b.burst_after, b.spec.name),
    )
    if not ours and refusals:
        return BurstOption("none", waiting_since=start, refusals=tuple(refusals))
    decision: BurstPlan | NoBurst = plan(job, [])
    for i, book in enumerate(ours):
        if i + 1 < len(ours) and ours[i + 1].burst_after == book.burst_after:
            continue  # opens with the next: planned together
        decision = plan(job, [b.state(unclaimed(b.spec.name), now) for b in ours[: i + 1]])
        if isinstance(decision, BurstPlan):
            chosen = books[decision.pool]
            return BurstOption(
                "planned", decision.pool, decision.cluster, decision.total, decision.nodes, 0,
                chosen.spec.provision_seconds, chosen.spec.cost_per_node_hour, start,
                chosen.burst_after, start + chosen.burst_after,
            )  # fmt: skip
    assert isinstance(decision, NoBurst)  # every pool was offered, and none took it
    for refusal in decision.refusals:
        backing_off = refusal.code == "backing-off"
        until = books[refusal.pool].failing_until if backing_off else None
        refusals.append(PoolRefusal(refusal.pool, refusal.code, refusal.message, until))
    return BurstOption("none", waiting_since=start, refusals=tuple(refusals))


__all__ = ["BurstOption", "OptionCode", "PoolRefusal", "burst_option"]
