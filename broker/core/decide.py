"""The one decision path: precheck, then the policy, timed. Every driver decides through it.

``decide`` is what the cycle, the fill simulator and the decision benchmark call between
``ledger.snapshot()`` and ``ledger.assume()``: the cheap ``may_fit`` precheck first (a job
that visibly fits nowhere gets a short "no" without a policy asked, and without per-cluster
reasons: ``explain`` has them), else the policy's own decision with the seconds it took.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from broker.model import CapacitySnapshot, Job, Placement, Reason, ReasonCode, Unplaceable
from policies import Policy
from policies.framework import STALE_MESSAGE
from policies.precheck import may_fit

NO_ROOM = Reason(
    ReasonCode.INSUFFICIENT_GPUS,
    "not enough free GPUs of an allowed type in any cluster (see explain for each cluster)",
)


def _refused(view: CapacitySnapshot) -> tuple[Reason, ...]:
    """The precheck's "no": every cluster stale is why when it is so (no room is not),
    else no room."""
    clusters = view.clusters
    if clusters and all(v.stale for v in clusters.values()):
        return tuple(Reason(ReasonCode.STALE, STALE_MESSAGE, name) for name in clusters)
    return (NO_ROOM,)


@dataclass(frozen=True, slots=True)
class Decided:
    """A decision and the seconds the policy took (None: the precheck answered alone)."""

    decision: Placement | Unplaceable
    seconds: float | None


def decide(job: Job, view: CapacitySnapshot, policy: Policy, *, precheck: bool = True) -> Decided:
    """``policy``'s decision for ``job`` on ``view``; with ``precheck``, a job that fits
    nowhere by ``may_fit`` is refused without asking the policy."""
    if precheck and not may_fit(job, view):
        return Decided(Unplaceable(job.key, _refused(view)), None)
    started = time.perf_counter()
    decision = policy.decide(job, view)
    return Decided(decision, time.perf_counter() - started)
