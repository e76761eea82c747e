"""Delegate mode through the Service for a RayCluster, whose pods carry no index: the test
plays KubeRay (head and workers named with a random suffix, no index label,
``wait-gcs-ready`` on workers) beside the gang scheduler and kubelet of
``test_delegate_service``. Each pod takes the lowest free index of its pod set, so it is
counted once, where it runs, and a restart keys it as the watcher did."""

from __future__ import annotations

import copy
from pathlib import Path

import kmock
import pytest
from builders import until
from kmock_namespaces import NamespacedEmulator
from test_delegate_service import (
    FLAVORS,
    GPUS_PER_NODE,
    NS,
    PODS,
    broker,
    gang_scheduler,
    history,
    ledger_gpus,
    live,
    member,
    pods_gpus,
    workload_manifest,
)

from broker.manifest.workloads.raycommon import WAIT_GCS_READY

RAYCLUSTERS = kmock.resource("ray.io", "v1", "rayclusters")

RAY_WORKER = {"spec": {"containers": [{
    "name": "ray-worker", "image": "rayproject/ray:2.9.0",
    "resources": {"limits": {"nvidia.com/gpu": GPUS_PER_NODE, "cpu": "8", "memory": "32Gi"}},
}]}}  # fmt: skip
RAY_HEAD = {"spec": {"containers": [{
    "name": "ray-head", "image": "rayproject/ray:2.9.0",
    "resources": {"requests": {"cpu": "4", "memory": "16Gi"}},
}]}}  # fmt: skip
# A RayCluster: a head and a group of two 8-GPU workers; KubeRay labels no index on them.
RAYCLUSTER = {
    "apiVersion": "ray.io/v1",
    "kind": "RayCluster",
    "spec": {
        "headGroupSpec": {"rayStartParams": {}, "template": RAY_HEAD},
        "workerGroupSpecs": [{"groupName": "gpu", "replicas": 2, "minReplicas": 2,
                              "maxReplicas": 2, "rayStartParams": {}, "template": RAY_WORKER}],
    },
}  # fmt: skip


def kuberay(k8s: NamespacedEmulator) -> None:
    """KubeRay: every RayCluster's pods, once, from its stored templates, named and labelled
    as it does (``<cluster>-head-<x>``, ``<cluster>-<group>-worker-<x>``, no index), workers
    with its ``wait-gcs-ready`` init container (the Ray container's image)."""
    pods = live(k8s, PODS)
    for name, obj in live(k8s, RAYCLUSTERS).items():
        if any(p.startswith(f"{name}-") for p in pods):
            continue
        spec = obj.raw["spec"]
        made = [("head", "headgroup", f"{name}-head", spec["headGroupSpec"]["template"])]
        for group in spec["workerGroupSpecs"]:
            base = f"{name}-{group['groupName']}-worker"
            made += [("worker", group["groupName"], base, group["template"])] * group["replicas"]
        for n, (node_type, group_name, base, template) in enumerate(made):
            template = copy.deepcopy(template)
            meta, pod_spec = template.get("metadata") or {}, template["spec"]
            if node_type == "worker":
                image = pod_spec["containers"][0]["image"]
                pod_spec["initContainers"] = [{**WAIT_GCS_READY, "image": image}]
            labels = {**meta.get("labels", {}), "ray.io/cluster": name,
                      "ray.io/node-type": node_type, "ray.io/group": group_name,
                      "ray.io/is-ray-node": "yes"}  # fmt: skip
            pod_name = f"{base}-{n:05d}"
            k8s.controller_create(PODS, NS, {
                "apiVersion": "v1", "kind": "Pod", "spec": pod_spec,
                "metadata": {**meta, "name": pod_name, "namespace": NS, "labels": labels,
                             "uid": f"uid-{pod_name}",
                             "ownerReferences": [{
                                 "apiVersion": "ray.io/v1", "kind": "RayCluster",
                                 "name": name, "uid": f"uid-{name}",
                                 "controller": True}]},
            })  # fmt: skip


pytestmark = pytest.mark.kmock(cls=NamespacedEmulator)


@pytest.mark.parametrize("flavor", FLAVORS)
async def test_a_delegated_ray_clusters_pods_without_an_index_are_counted_once(
    kmock: kmock.KubernetesEmulator, tmp_path: Path, flavor: str
) -> None:
    k8s = member(kmock, nodes=3)
    async with broker(k8s, tmp_path, flavor) as service:
        await service.submit("team-a", workload_manifest("ray", RAYCLUSTER))
        await service.schedule_once()
        assert (await service.get("team-a", "ray")).state == "Placed"
        await until(lambda: "ray" in live(k8s, RAYCLUSTERS))
        kuberay(k8s)
        bound = await gang_scheduler(k8s, flavor)
        assert len(bound) == 3
        await service.launches_done(timeout=10)
        assert (await service.get("team-a", "ray")).state == "Running"
        await until(lambda: ledger_gpus(service) == pods_gpus(k8s))
        assert sum(pods_gpus(k8s).values()) == 2 * GPUS_PER_NODE
        await service.cancel("team-a", "ray")
        assert await history(service, "ray") == ["Queued", "Placed", "Running", "Cancelled"]
        await until(lambda: ledger_gpus(service) == {})


async def test_a_restart_restores_a_delegated_ray_cluster_keyed_as_the_watcher_keys_it(
    kmock: kmock.KubernetesEmulator, tmp_path: Path
) -> None:
    k8s = member(kmock, nodes=3)
    async with broker(k8s, tmp_path, "coscheduling") as service:
        await service.submit("team-a", workload_manifest("ray", RAYCLUSTER))
        await service.schedule_once()
        await until(lambda: "ray" in live(k8s, RAYCLUSTERS))
        kuberay(k8s)
        await gang_scheduler(k8s, "coscheduling")
        await service.launches_done(timeout=10)
        assert (await service.get("team-a", "ray")).state == "Running"
    async with broker(k8s, tmp_path, "coscheduling") as service:
        assert await history(service, "ray") == ["Queued", "Placed", "Running"]
        assert "ray" in live(k8s, RAYCLUSTERS) and len(live(k8s, PODS)) == 3
        assert ledger_gpus(service) == pods_gpus(k8s)
        await service.cancel("team-a", "ray")
        await until(lambda: ledger_gpus(service) == {})
        assert not service.ledger.reservations()
