"""Cluster API: node pools (MachineDeployment / MachinePool) of a management cluster."""

from adapters.capi.pool import CapiPool, CapiPoolError, PoolKind, PoolShape, PoolStatus

__all__ = ["CapiPool", "CapiPoolError", "PoolKind", "PoolShape", "PoolStatus"]
