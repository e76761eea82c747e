"""Placement policies: pure, synchronous functions of (job, snapshot), deterministic for a
seed. They import broker.model only (enforced by import-linter)."""

from __future__ import annotations

from collections.abc import Sequence

from broker.model import CapacitySnapshot, Job, Placement, Unplaceable
from policies.fgd import DEFAULT_WORKLOAD, PodShape, fgd
from policies.fgd_cpu import fgd_cpu
from policies.fgd_lp import fgd_lp
from policies.fgd_share import fgd_share
from policies.framework import Policy
from policies.gang import GangPolicy
from policies.kube_default import kube_default
from policies.scoring import binpack, firstfit, random_policy, spread

POLICY_NAMES = (
    "auto",
    "gang",
    "binpack",
    "spread",
    "firstfit",
    "random",
    "fgd",
    "fgd-share",
    "fgd-cpu",
    "fgd-lp",
    "kube-default",
)

# The policies placed against a workload (a pod shape distribution): the fgd family.
WORKLOAD_POLICIES = frozenset({"fgd", "fgd-share", "fgd-cpu", "fgd-lp"})


class AutoPolicy:
    """Gang for jobs of more than one pod, binpack for single pods. (Which policy a queue
    uses is the scheduler's ``PolicyBook``.)"""

    name = "auto"

    def __init__(self) -> None:
        self._gang = GangPolicy()
        self._binpack = binpack()

    def decide(self, job: Job, snapshot: CapacitySnapshot) -> Placement | Unplaceable:
        policy = self._gang if job.total_pods > 1 else self._binpack
        return policy.decide(job, snapshot)


def make_policy(
    name: str, seed: int = 0, workload: Sequence[tuple[PodShape, float]] | None = None
) -> Policy:
    """The policy called ``name``; ValueError names the known ones otherwise."""
    match name:
        case "auto":
            return AutoPolicy()
        case "gang":
            return GangPolicy()
        case "binpack":
            return binpack()
        case "spread":
            return spread()
        case "firstfit":
            return firstfit()
        case "random":
            return random_policy(seed)
        case "fgd":
            return fgd(workload or DEFAULT_WORKLOAD)
        case "fgd-share":
            return fgd_share(workload or DEFAULT_WORKLOAD)
        case "fgd-cpu":
            return fgd_cpu(workload or DEFAULT_WORKLOAD)
        case "fgd-lp":
            return fgd_lp(workload or DEFAULT_WORKLOAD)
        case "kube-default":
            return kube_default()
    raise ValueError(f"unknown policy {name!r} (known: {', '.join(POLICY_NAMES)})")


__all__ = ["POLICY_NAMES", "WORKLOAD_POLICIES", "AutoPolicy", "Policy", "make_policy"]
