"""Burst planning: the post-filter for a gang no member cluster can take now.

Pure and deterministic, like every policy: given a job and the burst pools as they stand,
say which pool to grow and by how many nodes, or why none will do.

How many nodes: exactly enough for the gang node by node on the pool's (identical, empty)
new nodes, found by first-fit decreasing. For a gang of identical pods, the common case,
that is optimal: ``ceil(pods / pods_per_node)``. Nodes already coming up in the pool that no
gang has claimed count first (``PoolState.unclaimed``), so a demand is never scaled for twice.
Existing free capacity in the pool's cluster is deliberately not counted: it is not held for
the gang, and if other work took it meanwhile the gang would still not fit on arrival.

Which pool: of those that allow the job (GPU type, cluster selector), whose new nodes can
hold it as its topology request asks, are not backing off after a failure and can grow by
the nodes needed within their maximum, the cheapest per hour for the nodes added, then the
fastest to provision, then by name.

Topology: a pod set that requires one domain of a level (``required``, or each slice one of
``slice_level``) can burst into a pool only if the pool's cluster declares the level and the
pool's ``topology_labels`` name it. Every node a pool adds carries the same labels, so the
gang on the new nodes alone lies inside one domain of every level named; a pool that names
no value for the level gives no such promise and is refused (``topology``). A ``preferred``
level never refuses a pool: the placement falls back to the cluster.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from broker.model import BurstPlan, BurstPool, Job, PoolState, Resources
from policies.topology import level_name

RefusalCode = Literal[
    "no-pools", "backing-off", "gpu-type", "selector", "topology", "node-shape", "maximum"
]


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why one pool cannot take the job (``pool`` empty: no pool at all), as data: explain
    shows the code, the message says it to a person."""

    pool: str
    code: RefusalCode
    message: str

    def __str__(self) -> str:
        return f"{self.pool}: {self.message}" if self.pool else self.message


@dataclass(frozen=True, slots=True)
class NoBurst:
    """Why no pool can take the job: one refusal per pool (or one for none at all)."""

    job: str
    refusals: tuple[Refusal, ...]

    @property
    def reasons(self) -> tuple[str, ...]:
        return tuple(str(r) for r in self.refusals)


def _fits(pod: Resources, free: Resources) -> bool:
    return (
        pod.gpu_count <= free.gpus
        and pod.cpu_milli <= free.cpu_milli
        and pod.memory_mib <= free.memory_mib
    )


def _take(pod: Resources, free: Resources) -> Resources:
    return Resources(
        gpus=free.gpus - pod.gpu_count,
        cpu_milli=free.cpu_milli - pod.cpu_milli,
        memory_mib=free.memory_mib - pod.memory_mib,
    )


def nodes_needed(job: Job, node: Resources) -> int | None:
    """Empty nodes of shape ``node`` the gang's required pods need (first-fit decreasing),
    or None when some pod fits no such node. A shared-GPU pod takes a whole GPU here:
    a new node is the gang's alone, so nothing else would share it."""
    pods = [ps.resources for ps in job.pod_sets for _ in range(ps.count)][: job.required_pods]
    pods.sort(key=lambda r: (r.gpu_count, r.cpu_milli, r.memory_mib), reverse=True)
    bins: list[Resources] = []
    for pod in pods:
        if not _fits(pod, node):
            return None
        for i, free in enumerate(bins):
            if _fits(pod, free):
                bins[i] = _take(pod, free)
                break
        else:
            bins.append(_take(pod, node))
    return len(bins)


def plan(job: Job, pools: Sequence[PoolState]) -> BurstPlan | NoBurst:
    """The pool to grow for ``job`` and by how much, or why none can."""
    if not pools:
        return NoBurst(job.key, (Refusal("", "no-pools", "no burst pools are configured"),))
    offers: list[tuple[float, float, str, BurstPlan]] = []
    refusals: list[Refusal] = []
    for state in pools:
        pool = state.pool
        why = _refusal(job, state)
        if why is not None:
            refusals.append(why)
            continue
        need = nodes_needed(job, pool.node)
        if need is None:
            message = "a pod of the gang does not fit one of its nodes"
            refusals.append(Refusal(pool.name, "node-shape", message))
            continue
        claimed = min(need, state.unclaimed)
        new = need - claimed
        room = pool.max_nodes - state.nodes
        if new > room:
            message = f"needs {new} more nodes, only {max(room, 0)} below its maximum"
            refusals.append(Refusal(pool.name, "maximum", message))
            continue
        cost = new * pool.cost_per_node_hour
        offers.append(
            (cost, pool.provision_seconds, pool.name,
             BurstPlan(job.key, pool.name, pool.cluster, new, claimed, cost))
        )  # fmt: skip
    if not offers:
        return NoBurst(job.key, tuple(refusals))
    return min(offers, key=lambda o: o[:3])[3]


def _refusal(job: Job, state: PoolState) -> Refusal | None:
    pool = state.pool
    if state.failing:
        return Refusal(pool.name, "backing-off", "backing off after a provisioning failure")
    if not job.allows_gpu_type(pool.gpu_type):
        message = f"its GPU type {pool.gpu_type} is not allowed by the job"
        return Refusal(pool.name, "gpu-type", message)
    if job.clusters and pool.cluster not in job.clusters:
        message = f"cluster {pool.cluster} has no {job.clusters_missing}"
        return Refusal(pool.name, "selector", message)
    for key, value in job.cluster_selector.items():
        if pool.cluster_labels.get(key) != value:
            message = f"cluster {pool.cluster} does not match the selector {key}={value}"
            return Refusal(pool.name, "selector", message)
    return _topology_refusal(job, pool)


def _topology_refusal(job: Job, pool: BurstPool) -> Refusal | None:
    """The first level a pod set needs one domain of that the pool's new nodes do not
    join (a preferred level is never needed)."""
    for ps in job.pod_sets:
        topo = ps.topology
        if topo is None:
            continue
        for key in (topo.required, topo.slice_level):
            if not key:
                continue
            if key not in pool.topology_levels:
                message = (
                    f"cluster {pool.cluster} declares no topology level {key}, which pod set "
                    f"{ps.name} requires"
                )
                return Refusal(pool.name, "topology", message)
            if key not in pool.topology_labels:
                message = (
                    f"pod set {ps.name} requires one {level_name(key)}, and its topologyLabels "
                    "name no value of that level for the nodes it adds"
                )
                return Refusal(pool.name, "topology", message)
    return None
