"""The replay's burst pool: its defaults, the CLI's flags for it, and its set-up on the
virtual clock (the ``BurstController`` and a ``SimulatedPool`` behind the pool port).

Default pool (``DEFAULT_BURST_POOL``; the CLI's flags change some of it): nodes of 8 x A100,
96 cores and 1,152 GiB, the shape of AWS p4d.24xlarge (8 x A100 40 GB, 96 vCPUs, 1,152 GiB;
https://aws.amazon.com/ec2/instance-types/p4/), at its on-demand list price of 32.77 USD
per hour in us-east-1 (https://aws.amazon.com/ec2/pricing/on-demand/; AWS cut its P4 and
P5 on-demand prices in June 2025, so read cost as "that list price x node-hours"); at most
32 nodes; a node is up 300 s after the scale-up (GPU instances take minutes to boot and
join); ``burstAfterSeconds`` 120, ``scaleDownAfterSeconds`` 600, provisioning timeout 900 s.
The generated gangs ask for no GPU type (any type will do), so A100 nodes can take them;
their pods (8 cores and 32 GiB per GPU) fit one p4d node 8 GPUs at a time.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

from adapters.simulated import SimulatedFederation, SimulatedPool
from broker.core.burst import BurstController, BurstSettings
from broker.core.burst_actions import OnClock, carry_out, run_now
from broker.core.ledger import Ledger
from broker.model import BurstPool, CapacitySnapshot, Cluster, GpuType, Job, Resources
from broker.ports import ScaleError

BURST_CLUSTER = "burst-0"
# AWS p4d.24xlarge: 8 x A100 40 GB, 96 vCPUs, 1,152 GiB; on-demand 32.77 USD/h, us-east-1.
DEFAULT_BURST_POOL = BurstPool(
    name="cloud-a100",
    cluster=BURST_CLUSTER,
    gpu_type=GpuType("A100"),
    node=Resources(gpus=8, cpu_milli=96_000, memory_mib=1_152 * 1024),
    min_nodes=0,
    max_nodes=32,
    cost_per_node_hour=32.77,
    provision_seconds=300.0,
)
DEFAULT_BURST_SETTINGS = BurstSettings(
    burst_after_seconds=120.0,
    scale_down_after_seconds=600.0,
    provision_timeout_seconds=900.0,
    failure_backoff_seconds=600.0,
)


@dataclass(frozen=True, slots=True)
class BurstConfig:
    """One simulated burst pool (its cluster is ``pool.cluster``) and the controller's
    settings; ``failure_rate``: the share of new machines that never come up."""

    pool: BurstPool = DEFAULT_BURST_POOL
    settings: BurstSettings = DEFAULT_BURST_SETTINGS
    failure_rate: float = 0.0


@dataclass(slots=True)
class Bursting:
    """The burst pool of one policy's replay: the controller, the simulated pool it drives
    (behind the pool port, on the replay's clock) and the jobs started on its nodes."""

    controller: BurstController
    pool: SimulatedPool
    port: OnClock
    spec: BurstPool
    placements: int = 0

    def hiding(self, snapshot: CapacitySnapshot) -> Callable[[Job], dict[str, set[str]]]:
        return self.controller.hiding(snapshot)

    def tick(self, now: float, snapshot: CapacitySnapshot, waiting: list[Job]) -> None:
        """The controller's turn after a cycle: its actions are carried out on the pool by
        the core's executor, one after another, as the service does."""
        for action in self.controller.tick(now, snapshot, waiting):
            failure = run_now(carry_out(action, self.port, (ScaleError,)))
            if failure is not None:
                self.controller.failed(action, now, failure)


def start_bursting(
    config: BurstConfig,
    fed: SimulatedFederation,
    ledger: Ledger,
    seed: int,
    clock: Callable[[], float],
    levels: tuple[str, ...] = (),
    node_labels: Mapping[str, str] | None = None,
) -> Bursting:
    """The pool's cloud cluster joins empty, declaring ``levels``; the pool's nodes carry
    ``node_labels`` (their domains), which the planner is told too, so a gang requiring a
    level bursts only when they name it. The controller starts with the pool at zero."""
    spec = replace(config.pool, topology_levels=levels, topology_labels=dict(node_labels or {}))
    per_gpu = spec.cost_per_node_hour / spec.node.gpus if spec.node.gpus else 0.0
    cluster = Cluster(spec.cluster, dict(spec.cluster_labels), "cloud", per_gpu, levels)
    fed.add(cluster, [])
    ledger.add_cluster(cluster)
    pool = SimulatedPool(
        spec.cluster,
        str(spec.gpu_type),
        spec.node,
        name=spec.name,
        provision_seconds=spec.provision_seconds,
        failure_rate=config.failure_rate,
        seed=seed,
        labels=node_labels,
    )
    controller = BurstController(config.settings)
    controller.add_pool(spec, replicas=0)
    return Bursting(controller, pool, OnClock(pool, clock), spec)


def burst_config(args: argparse.Namespace) -> BurstConfig | None:
    """The CLI's pool: the default one with its flags applied, or None for --no-burst."""
    if getattr(args, "no_burst", False):
        return None
    pool = DEFAULT_BURST_POOL
    max_nodes = getattr(args, "burst_max_nodes", None)
    provision = getattr(args, "burst_provision_seconds", None)
    pool = replace(
        pool,
        max_nodes=pool.max_nodes if max_nodes is None else max_nodes,
        provision_seconds=pool.provision_seconds if provision is None else provision,
    )
    return BurstConfig(pool, DEFAULT_BURST_SETTINGS, getattr(args, "burst_failure_rate", 0.0))


def burst_doc(config: BurstConfig | None) -> dict[str, object] | None:
    """The JSON document's ``burst`` object: the pool and the controller's settings."""
    if config is None:
        return None
    pool, settings = config.pool, config.settings
    return {
        "pool": pool.name,
        "cluster": pool.cluster,
        "gpu_type": str(pool.gpu_type),
        "node": {
            "gpus": pool.node.gpus,
            "cpu_milli": pool.node.cpu_milli,
            "memory_mib": pool.node.memory_mib,
        },
        "max_nodes": pool.max_nodes,
        "cost_per_node_hour": pool.cost_per_node_hour,
        "provision_seconds": pool.provision_seconds,
        "failure_rate": config.failure_rate,
        "burst_after_seconds": settings.burst_after_seconds,
        "scale_down_after_seconds": settings.scale_down_after_seconds,
        "provision_timeout_seconds": settings.provision_timeout_seconds,
    }
