"""Why a job does not fit a cluster: the codes explain, the API and the metrics share, and a
reason naming its cluster (pure values; ``broker.model`` re-exports both)."""

from __future__ import annotations

import enum
from dataclasses import dataclass


class ReasonCode(enum.StrEnum):
    STALE = "ClusterStale"
    SELECTOR = "ClusterSelectorMismatch"
    GPU_TYPE = "NoAllowedGpuType"
    INSUFFICIENT_GPUS = "InsufficientGpus"
    NODE_FIT = "NoNodeFits"
    GANG_TOO_LARGE = "GangLargerThanNodeLevelFit"
    TAINT = "Taint"
    CPU_MEMORY = "InsufficientCpuOrMemory"
    NO_CLUSTERS = "NoClusters"
    QUOTA = "QuotaExceeded"
    NO_BURST_POOL = "NoBurstPool"
    MISSING = "ClusterLacksWorkloadDependency"
    TOPOLOGY = "NoTopologyDomainFits"


@dataclass(frozen=True, slots=True)
class Reason:
    code: ReasonCode
    message: str
    cluster: str | None = None

    def __str__(self) -> str:
        where = f"{self.cluster}: " if self.cluster else ""
        return f"{where}{self.code}: {self.message}"


__all__ = ["Reason", "ReasonCode"]
