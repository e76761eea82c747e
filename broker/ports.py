"""Ports: the protocols adapters implement, so the shell never names a concrete adapter.

Only the composition roots (cli, simulator, bench; later the service runtime) pick the
adapter behind each port. Adapters import broker.model and this module, nothing else of
the broker.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from broker.model import CapacityEvent, Placement


class ClusterSource(Protocol):
    """Where capacity comes from: the nodes of member clusters, as capacity events."""

    def node_events(self) -> list[CapacityEvent]: ...


class Launcher(Protocol):
    """Starts a placed job's pods in its cluster; returns the events that follow."""

    def launch(self, placement: Placement, run_seconds: float) -> list[CapacityEvent]: ...


class ScalePool(Protocol):
    """A node pool the broker may grow and shrink (Cluster API MachineDeployment, or a
    simulated one). Failures raise the adapter's error after its own bounded retries."""

    async def scale_to(self, replicas: int) -> int: ...

    async def cancel_coming(self, count: int) -> int: ...

    async def remove_node(self, node: str) -> None: ...

    async def label_node(self, node: str, labels: Mapping[str, str]) -> None: ...
