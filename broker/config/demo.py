"""The built-in federation ``fedbroker demo`` runs, as a validated Config."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from adapters.simulated import OPENB_MIX
from broker.config.document import Config, validated
from broker.store import sqlite_url

DEMO_TENANTS = ("team-a", "team-b", "admin")
# onprem-a's topology levels (Kueue's example keys): racks of 4 alike nodes, blocks of 2 racks
BLOCK, RACK = "cloud.provider.com/topology-block", "cloud.provider.com/topology-rack"


def _openb_shapes(*gpu_types: str) -> list[dict[str, Any]]:
    """Node shapes of the openb trace with their real counts (scaled by the source)."""
    shapes = [next(s for s in OPENB_MIX if s.gpu_type == t) for t in gpu_types]
    return [
        {"gpuType": s.gpu_type, "gpus": s.gpus, "cpu": f"{s.cpu_milli}m",
         "memory": f"{s.memory_mib}Mi", "count": s.count}
        for s in shapes
    ]  # fmt: skip


def _burst_pools() -> list[dict[str, Any]]:
    """The demo's one pool: A100 x8 nodes for cloud-burst, up to 16."""
    return [
        {"name": "cloud-a100", "cluster": "cloud-burst", "gpuType": "A100", "gpus": 8,
         "cpu": "96", "memory": "1152Gi", "minNodes": 0, "maxNodes": 16,
         "costPerNodeHour": 32.77, "provisionSeconds": 20.0, "scaleDownAfterSeconds": 60.0,
         # A gang waits 10 s, not the default 30, before it bursts: the README's job, when
         # the on-prem clusters are full, runs well within a minute.
         "burstAfterSeconds": 10.0,
         "source": {"simulated": {}}},
    ]  # fmt: skip


def demo_config(data_dir: Path, tokens: Mapping[str, str]) -> Config:
    """The federation ``fedbroker demo`` runs: two on-prem clusters of real openb node
    shapes (counts scaled to a few dozen nodes, no H100 anywhere) and a cloud burst pool.

    onprem-a: G2 x8, T4 x2, V100M32 x8 at 5 % of openb's counts = 47 nodes, 262 GPUs, in
    racks of 4 alike nodes and blocks of 2 racks (so topology requests have domains to go to).
    onprem-b: P100 x2, G3 x8, V100M16 x4 at 15 % = 30 nodes, 104 GPUs.
    cloud-burst: empty; the simulated pool cloud-a100 grows it by A100 x8 nodes (up to 16,
    for a gang that has waited 10 s, 20 s to come up, back after 60 s idle), priced like an
    on-demand p4d.24xlarge (32.77 $/h for 8 A100 in us-east-1).
    """
    missing = [name for name in DEMO_TENANTS if not tokens.get(name)]
    if missing:
        raise ValueError(f"demo tokens missing for: {', '.join(missing)}")
    racks = {"levels": [BLOCK, RACK], "nodesPerRack": 4, "racksPerBlock": 2}
    openb_a = {"shapes": _openb_shapes("G2", "T4", "V100M32"), "scale": 0.05, "topology": racks}
    openb_b = {"shapes": _openb_shapes("P100", "G3", "V100M16"), "scale": 0.15}
    cloud = {"shapes": [], "launchDelaySeconds": 5.0}  # empty until the pool grows it
    clusters: list[dict[str, Any]] = [
        {"name": "onprem-a", "labels": {"region": "eu"}, "topologyLevels": [BLOCK, RACK],
         "source": {"simulated": openb_a}},
        {"name": "onprem-b", "labels": {"region": "us"}, "source": {"simulated": openb_b}},
        {"name": "cloud-burst", "kind": "cloud", "labels": {"region": "eu"},
         "costPerGpuHour": 4.1, "source": {"simulated": cloud}},
    ]  # fmt: skip
    queues: list[dict[str, Any]] = [
        {"name": "training", "policy": "gang", "priority": 100, "weight": 2.0, "borrow": True,
         "quota": {"G2": 160, "G3": 48, "V100M32": 8, "A100": 128}},
        {"name": "inference", "policy": "binpack", "priority": 50, "borrow": True,
         "quota": {"T4": 38, "P100": 40, "V100M16": 16, "G2": 32}},
        {"name": "research", "policy": "auto", "quota": {"G2": 24}, "borrow": True,
         "reclaimable": True},
    ]  # fmt: skip
    tenants: list[dict[str, Any]] = [
        {"name": "team-a", "defaultQueue": "training", "queues": ["training", "research"]},
        {"name": "team-b", "defaultQueue": "inference", "queues": ["inference", "research"]},
        {"name": "admin", "defaultQueue": "research", "admin": True,
         "queues": ["training", "inference", "research"]},
    ]  # fmt: skip
    for tenant in tenants:
        tenant["token"] = {"value": tokens[tenant["name"]]}
    data = {
        "store": {"url": sqlite_url(str(data_dir / "fedbroker.db"))},
        # Generous per tenant: the demo's load generator and the crash test submit fast.
        "api": {"rateLimitPerTenant": {"requestsPerSecond": 2000.0, "burst": 4000}},
        "clusters": clusters,
        "burstPools": _burst_pools(),
        "queues": queues,
        "tenants": tenants,
    }
    # The demo's generated tokens are short enough to type; outside it 32 is the minimum.
    return validated(data, "demo config", {}, min_token_length=1)
