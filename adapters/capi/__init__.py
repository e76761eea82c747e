"""Cluster API: node pools (MachineDeployment / MachinePool) of a management cluster."""

from adapters.capi.objects import CapiPoolError, PoolKind, PoolShape, PoolStatus
from adapters.capi.pool import CapiPool, unreadable

__all__ = ["CapiPool", "CapiPoolError", "PoolKind", "PoolShape", "PoolStatus", "unreadable"]
