"""Bursting into a Kubernetes member through Cluster API, end to end against kmock (real
HTTP, the real clients): the pool's shape and bounds come from the MachineDeployment's
scale-from-zero annotations, a gang that fits nowhere scales it through ``/scale`` by
exactly its nodes, the nodes join the member cluster's watch and the gang is pinned to them,
and no second scale-up follows while it waits or runs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import kmock as kmocklib
import pytest
from builders import until
from kmock_namespaces import NamespacedEmulator
from test_capi import MD, NAME, NS, SCALE, add_pool, replicas, serve_scale
from test_kube_service import CANARY, kubeconfig_doc, manifest, our_pod

from broker.config import parse_config
from broker.service.facade import Service

Emulator = kmocklib.KubernetesEmulator
NODES = kmocklib.resource("", "v1", "nodes")

pytestmark = pytest.mark.kmock(cls=NamespacedEmulator)  # the gang's tenant namespace is made

CONFIG = """
store: {{url: "sqlite:///{db}"}}
scheduler: {{cycleSeconds: 10, burstAfterSeconds: 0}}
clusters:
- name: west
  kind: cloud
  source:
    kube: {{kubeconfig: "{kubeconfig}", context: east, launchMode: pin, podPollSeconds: 0.02}}
burstPools:
- name: west-a100
  cluster: west
  costPerNodeHour: 32.77
  source:
    capi: {{kubeconfig: "{kubeconfig}", context: east, namespace: {ns}, name: {name}}}
queues:
- {{name: training, policy: gang}}
tenants:
- {{name: team-a, defaultQueue: training, token: {{value: tok-a-00000000000000000000000000}}}}
"""

ANNOTATIONS = {
    "capacity.cluster-autoscaler.kubernetes.io/gpu-count": "8",
    # As the autoscaler documents them: gpu-type is the resource name, the model a label.
    "capacity.cluster-autoscaler.kubernetes.io/gpu-type": "nvidia.com/gpu",
    "capacity.cluster-autoscaler.kubernetes.io/labels": "nvidia.com/gpu.product=A100",
    "capacity.cluster-autoscaler.kubernetes.io/cpu": "96",
    "capacity.cluster-autoscaler.kubernetes.io/memory": "1152Gi",
    "cluster.x-k8s.io/cluster-api-autoscaler-node-group-min-size": "0",
    "cluster.x-k8s.io/cluster-api-autoscaler-node-group-max-size": "4",
}


def a100_node(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {"nvidia.com/gpu.product": "A100"},
                     "annotations": {"cluster.x-k8s.io/machine": f"m-{name}"}},
        "spec": {},
        "status": {
            "allocatable": {"nvidia.com/gpu": "8", "cpu": "96", "memory": "1152Gi"},
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }  # fmt: skip


def capi_member(kmock: Emulator) -> Emulator:
    """kmock as the member and management cluster: pods, nodes, a MachineDeployment pool of
    no replicas (scale-from-zero annotations) with its /scale and Machines."""
    namespaced = kmocklib.ResourceInfo(namespaced=True)
    kmock.resources["v1/pods"] = namespaced
    kmock.resources["v1/nodes"] = kmocklib.ResourceInfo(namespaced=False)
    kmock.resources["cluster.x-k8s.io/v1beta1/machinedeployments"] = namespaced
    kmock.resources["cluster.x-k8s.io/v1beta1/machines"] = namespaced
    add_pool(kmock, replicas=0, annotations=ANNOTATIONS)
    serve_scale(kmock)
    return kmock


@pytest.fixture
def k8s(kmock: Emulator) -> Emulator:
    return capi_member(kmock)


async def test_gang_scales_the_machine_deployment_once_and_runs_on_its_nodes(
    k8s: Emulator, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(json.dumps(kubeconfig_doc(str(k8s.url).rstrip("/"))))
    text = CONFIG.format(db=tmp_path / "jobs.db", kubeconfig=kubeconfig, ns=NS, name=NAME)
    service = Service(parse_config(text, "test config"))
    await service.start()
    try:
        [pool] = service.pools.rows()
        assert (pool.gpu_type, pool.max_nodes, pool.replicas) == ("A100", 4, 0)
        burst = {"allowBurst": True, "gpuTypes": ["A100"]}
        await service.submit("team-a", manifest("big", gpus=8, count=3, placement=burst))
        await service.schedule_once()
        await service.pools.drain()
        assert replicas(k8s) == 3  # exactly the gang's nodes, through /scale
        for _ in range(20):  # waiting for the machines: no second scale-up
            await service.schedule_once()
        await service.pools.drain()
        assert len(k8s["put"][MD][SCALE]) == 1
        assert (await service.get("team-a", "big")).state == "Queued"
        # Cluster API brings the machines; their nodes join the member cluster's watch.
        for i in range(3):
            await k8s.post("/api/v1/nodes", json=a100_node(f"a100-{i}"))
        await until(lambda: len(service.ledger.snapshot().clusters["west"].nodes) == 3)
        await service.schedule_once()
        assert (await service.get("team-a", "big")).state == "Placed"
        await until(lambda: our_pod(k8s, "big-worker-2") is not None)
        nodes = set()
        for i in range(3):
            pod = our_pod(k8s, f"big-worker-{i}").raw
            terms = pod["spec"]["affinity"]["nodeAffinity"][
                "requiredDuringSchedulingIgnoredDuringExecution"
            ]["nodeSelectorTerms"]
            nodes.add(terms[0]["matchFields"][0]["values"][0])
        assert nodes == {"a100-0", "a100-1", "a100-2"}  # one pod per new node
        for _ in range(20):
            await service.schedule_once()
        await service.pools.drain()
        assert len(k8s["put"][MD][SCALE]) == 1 and replicas(k8s) == 3
        # The nodes are labelled as the pool's, so a restarted broker still knows them.
        for i in range(3):
            labels = k8s.objects[NODES, None, f"a100-{i}"]["metadata"]["labels"]
            assert labels["fedbroker.io/burst-pool"] == "west-a100"
        assert CANARY not in caplog.text
    finally:
        await service.close()
    restarted = Service(parse_config(text, "test config"))
    await restarted.start()
    try:
        await restarted.schedule_once()
        [pool] = restarted.pools.rows()
        assert (pool.replicas, pool.ready, pool.coming) == (3, 3, 0)
    finally:
        await restarted.close()
