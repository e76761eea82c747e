"""kube-scheduler's default profile as a node chooser: the "before" of the replay.

The default profile (kubernetes/kubernetes, ``pkg/scheduler/apis/config/v1/default_plugins.go``)
enables the score plugins NodeResourcesFit and NodeResourcesBalancedAllocation with weight 1
each; the others it enables (TaintToleration, NodeAffinity, PodTopologySpread,
InterPodAffinity, ImageLocality) score every node alike for pods that ask for none of
their inputs, as the replay's pods ask for none. NodeResourcesFit's default scoring
strategy is LeastAllocated over cpu and memory, weight 1 each
(``pkg/scheduler/apis/config/v1/defaults.go``); GPUs (an extended resource) are filtered
on, not scored. Per node, with *requested* = what its pods request plus this pod:

- LeastAllocated (``noderesources/least_allocated.go``): for each resource
  ``(allocatable - requested) * 100 // allocatable``, then the weighted mean, so the
  emptiest node wins and pods spread.
- BalancedAllocation (``noderesources/balanced_allocation.go``): fractions
  ``requested / allocatable`` (capped at 1); with two resources the standard deviation is
  ``|f_cpu - f_mem| / 2``; score ``int((1 - std) * 100)``.

The node's score is their sum (weights 1 and 1). kube-scheduler breaks ties at random and
scores only a share of the feasible nodes in large clusters (``percentageOfNodesToScore``);
here ties go to the node name that sorts first and every feasible node is scored, so a
replay is deterministic. Filtering is fit (cores, memory, whole or shared GPUs) plus the
framework's GPU-type and taint groups.

``kube_default()`` decides a whole job pod after pod with this chooser on one cluster (the
emptiest first), which is what a one-pod job sees; a gang placed the way kube-scheduler
places it, pod by pod without atomicity, is the replay's own loop
(``broker.sim.replay_kube``), which calls the policy once per pod.
"""

from __future__ import annotations

from collections.abc import Sequence

from broker.model import NodeGroup, NodeState, Resources
from policies.framework import Choice, Overlay, candidate_states
from policies.scoring import NodeScoringPolicy, emptiest_first

NAME = "kube-default"
MAX_NODE_SCORE = 100


def least_allocated(state: NodeState, res: Resources) -> int:
    """NodeResourcesFit's LeastAllocated over cpu and memory, weight 1 each."""
    alloc = state.node.allocatable
    total = 0
    for capacity, free, ask in (
        (alloc.cpu_milli, state.cpu_free, res.cpu_milli),
        (alloc.memory_mib, state.memory_free, res.memory_mib),
    ):
        requested = capacity - free + ask
        if capacity and requested <= capacity:
            total += (capacity - requested) * MAX_NODE_SCORE // capacity
    return total // 2


def balanced_allocation(state: NodeState, res: Resources) -> int:
    """NodeResourcesBalancedAllocation over cpu and memory."""
    alloc = state.node.allocatable
    fractions = [
        min(1.0, (capacity - free + ask) / capacity)
        for capacity, free, ask in (
            (alloc.cpu_milli, state.cpu_free, res.cpu_milli),
            (alloc.memory_mib, state.memory_free, res.memory_mib),
        )
        if capacity
    ]
    std = abs(fractions[0] - fractions[1]) / 2 if len(fractions) == 2 else 0.0
    return int((1 - std) * MAX_NODE_SCORE)


def kube_score(state: NodeState, res: Resources) -> int:
    return least_allocated(state, res) + balanced_allocation(state, res)


def choose_kube_default(
    overlay: Overlay, groups: Sequence[NodeGroup], res: Resources
) -> Choice | None:
    """The feasible node with the highest default-profile score (ties: the first name)."""
    best: Choice | None = None
    for state in candidate_states(overlay, groups, res.gpu_request_milli):
        gpus = state.gpus_for(res)
        if gpus is None:
            continue
        score = float(kube_score(state, res))
        if best is None or score > best[2] or (score == best[2] and state.name < best[0]):
            best = (state.name, gpus, score)
    return best


def kube_default() -> NodeScoringPolicy:
    return NodeScoringPolicy(NAME, choose_kube_default, emptiest_first)
