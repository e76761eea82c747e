"""The burst controller's books: per pool its desired size, the nodes it added and is
removing, idle times, failures and stats; the open requests (a gang and the nodes coming
for it); and the events worth telling an operator. ``broker.core.burst.BurstController``
keeps them; nothing here decides.

Per pool the controller tracks:

* its desired size (``replicas``) as last set, so the same demand is never scaled twice:
  a gang with a request in flight is not planned again, and nodes coming up that no gang
  claims any more (their gang was placed elsewhere) are claimed first by the next plan;
* *requests*: a gang, the nodes it needs, and the nodes that came up for it so far. Those
  nodes are *held*: ``holds()`` tells the scheduler to hide them from every other job. A
  request ends when its gang is no longer waiting (placed, cancelled); it fails when its
  nodes have not all come up by the provisioning timeout: the nodes that never came are
  scaled back, the gang waits on (it never left the queue), and the pool backs off
  (doubling from ``failure_backoff_seconds``) so the next plan picks another pool;
* the nodes it added (``ours``): nodes of the pool's cluster that were not there when the
  controller started (or carry the pool's label). They serve only jobs allowed to burst
  (``hiding``): a small pod that may not burst would keep a paid node alive. A node
  counts once the ledger has it Ready, schedulable and with its GPUs. One that has had no
  pod for ``scale_down_after_seconds`` and is not held is removed (``RemoveNode``: cordon,
  mark the machine, replicas minus one), never below the pool's minimum. Nodes that were
  there before are never touched.
* nodes coming up that no gang claims any more are scaled back: at once when their gang
  started elsewhere (unless a gang planning in the same cycle claims them), else once
  unclaimed for the pool's ``burstAfterSeconds`` (after a restart, when requests are gone);
* cost: billed node-seconds (nodes added and not yet removed, from the scale-up on), idle
  node-seconds (added nodes up with no pod on them and not held for a gang: the cost
  leak), and per job the node-seconds
  of the nodes it waited for plus those it ran on.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from broker.model import MILLI_PER_GPU, BurstPool, NodeState, PoolState

Owner = Literal["fedbroker", "cluster-autoscaler"]


@dataclass(slots=True)
class Request:
    """A gang's scale-up: the nodes it needs from a pool and those that came up for it."""

    job: str
    pool: str
    nodes: int  # the gang's nodes from this pool, new and claimed
    at: float
    deadline: float
    arrived: list[str] = field(default_factory=list)

    @property
    def missing(self) -> int:
        return self.nodes - len(self.arrived)


@dataclass(slots=True)
class PoolStats:
    """What a pool did: scale-ups and -downs, nodes, failures, billed and idle seconds."""

    scale_ups: int = 0
    scale_downs: int = 0
    nodes_added: int = 0
    nodes_removed: int = 0
    provision_failures: int = 0
    node_seconds: float = 0.0
    idle_node_seconds: float = 0.0

    def node_hours(self) -> float:
        return self.node_seconds / 3600.0

    def idle_node_hours(self) -> float:
        return self.idle_node_seconds / 3600.0


@dataclass(slots=True)
class PoolBook:
    """One pool as the controller keeps it."""

    spec: BurstPool
    owner: Owner
    burst_after: float
    scale_down_after: float
    provision_timeout: float
    replicas: int
    baseline: set[str]
    ours: set[str] = field(default_factory=set)
    removing: set[str] = field(default_factory=set)
    idle_since: dict[str, float] = field(default_factory=dict)
    failing_until: float = 0.0
    unclaimed_since: float | None = None  # nodes coming up that no gang waits for
    orphaned: int = 0  # of those, nodes whose gang started elsewhere or ended this tick
    failures: int = 0
    stats: PoolStats = field(default_factory=PoolStats)

    @property
    def billed(self) -> int:
        """Nodes the broker asked for and has not given back yet (ready or coming up)."""
        return max(0, self.replicas - len(self.baseline))

    def state(self, unclaimed: int, now: float) -> PoolState:
        """The pool as the planner sees it at ``now``."""
        return PoolState(self.spec, self.replicas, unclaimed, now < self.failing_until)


@dataclass(frozen=True, slots=True)
class BurstEvent:
    """Something the operator should hear about (events stream, logs, alerts)."""

    at: float
    pool: str
    kind: Literal["scale-up", "scale-down", "provision-timeout", "scale-failed"]
    message: str
    job: str | None = None


def empty(state: NodeState) -> bool:
    """No pod on the node: every GPU, all CPU and memory free."""
    node = state.node
    return (
        state.free_milli == node.allocatable.gpus * MILLI_PER_GPU
        and state.cpu_free == node.allocatable.cpu_milli
        and state.memory_free == node.allocatable.memory_mib
    )
