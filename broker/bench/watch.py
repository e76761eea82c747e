"""The watch-ingestion benchmark: how many Kubernetes node/pod watch objects per second the
broker turns into capacity events and applies to its ledger (translation + ``Ledger.apply``,
one core). Run it with ``python -m broker.bench.watch``.

The stream: ``nodes`` Ready nodes of 8 x A100, then ``pods`` running one-GPU pods bound to
nodes drawn with the seed; past four pods per node the oldest pod is deleted for each new
one, so nodes never fill up and deletions are measured too.
"""

from __future__ import annotations

import random
import time
from typing import Any

from adapters.kube.translate import GpuConfig, translate_node, translate_pod
from broker.core.ledger import Ledger
from broker.model import Cluster, NodeUpdated

CLUSTER = "bench"


def node_object(name: str, gpu: GpuConfig) -> dict[str, Any]:
    """A Ready node with 8 A100s, as the API server lists it."""
    return {
        "metadata": {"name": name, "labels": {gpu.type_label: "A100"}},
        "status": {
            "allocatable": {"nvidia.com/gpu": "8", "cpu": "96", "memory": "1Ti"},
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }


def pod_object(name: str, node: str) -> dict[str, Any]:
    """A running pod asking one GPU, half a core and 2 GiB, bound to ``node``."""
    requests = {"nvidia.com/gpu": "1", "cpu": "500m", "memory": "2Gi"}
    return {
        "metadata": {"name": name, "namespace": "ml"},
        "spec": {"nodeName": node, "containers": [{"resources": {"requests": requests}}]},
        "status": {"phase": "Running"},
    }


def bench_ledger_updates(nodes: int = 500, pods: int = 100_000, seed: int = 0) -> float:
    """Ledger updates per second over the stream (see the module doc). Returns events/s."""
    rng = random.Random(seed)
    gpu = GpuConfig()
    node_objs = [node_object(f"n{i}", gpu) for i in range(nodes)]
    pod_objs = [pod_object(f"p{i}", f"n{rng.randrange(nodes)}") for i in range(pods)]
    ledger = Ledger()
    ledger.add_cluster(Cluster(CLUSTER))
    start = time.perf_counter()
    count = 0
    for obj in node_objs:
        ledger.apply(NodeUpdated(CLUSTER, translate_node(obj, gpu)))
        count += 1
    live: list[dict[str, Any]] = []
    for obj in pod_objs:
        ledger.apply(translate_pod(CLUSTER, obj, gpu))
        live.append(obj)
        count += 1
        if len(live) > nodes * 4:
            ledger.apply(translate_pod(CLUSTER, live.pop(0), gpu, deleted=True))
            count += 1
    return count / (time.perf_counter() - start)


if __name__ == "__main__":
    print(f"{bench_ledger_updates():,.0f} ledger updates/s (translate + apply)")
