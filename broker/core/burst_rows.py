"""What the burst controller reports: one typed row per pool and per open request.

The rows are the read model's (``broker.service.readmodel``) for ``/v1/pools``, metrics,
MQTT and the dashboard; ``as_json()`` gives each its API body, camelCase, in this order.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class PoolRow:
    """A burst pool as the controller counts it."""

    pool: str
    cluster: str
    owner: str  # "fedbroker", or "cluster-autoscaler" when the broker must not scale it
    gpu_type: str
    replicas: int
    min_nodes: int
    max_nodes: int
    ready: int  # nodes the broker added that are up
    coming: int  # nodes asked for, not up yet
    failing: bool  # backing off after a failure
    scale_ups: int
    scale_downs: int
    nodes_added: int
    provision_failures: int
    node_hours: float  # billed for nodes the broker added
    idle_node_hours: float  # of those, up with no pod on them
    cost: float
    cost_per_node_hour: float

    def as_json(self) -> dict[str, object]:
        return {
            "pool": self.pool, "cluster": self.cluster, "owner": self.owner,
            "gpuType": self.gpu_type, "replicas": self.replicas,
            "minNodes": self.min_nodes, "maxNodes": self.max_nodes,
            "ready": self.ready, "coming": self.coming, "failing": self.failing,
            "scaleUps": self.scale_ups, "scaleDowns": self.scale_downs,
            "nodesAdded": self.nodes_added, "provisionFailures": self.provision_failures,
            "nodeHours": self.node_hours, "idleNodeHours": self.idle_node_hours,
            "cost": self.cost, "costPerNodeHour": self.cost_per_node_hour,
        }  # fmt: skip


@dataclass(frozen=True, slots=True)
class RequestRow:
    """A gang's open burst request: the nodes asked for it and how many have arrived."""

    job: str
    pool: str
    nodes: int
    arrived: int
    requested_at: float
    deadline: float

    def as_json(self) -> dict[str, object]:
        return {
            "job": self.job, "pool": self.pool, "nodes": self.nodes, "arrived": self.arrived,
            "requestedAt": self.requested_at, "deadline": self.deadline,
        }  # fmt: skip
