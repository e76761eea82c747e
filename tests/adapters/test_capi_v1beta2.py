"""CapiPool against a management cluster that serves Cluster API at ``v1beta2`` (the
storage version), kmock over real HTTP with the real client: status, scaling and Machine
marking all go to ``v1beta2``; ``v1beta1``, also served, is never asked. In ``v1beta2``
``status.readyReplicas`` counts Machines whose Ready condition is true, and the old
``v1beta1`` counters moved under ``status.deprecated.v1beta1`` (read only while a controller
writes nothing else). test_capi.py runs against a server serving ``v1beta1`` only."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any, cast

import kmock as kmocklib
import pytest
from kubernetes.aio.client import ApiClient, Configuration
from tenacity import wait_none
from test_capi import NAME, NS, SCALE, serve_scale

from adapters.capi import CapiPool, PoolShape, PoolStatus
from adapters.capi.objects import ANNOTATION_DELETE_MACHINE, ANNOTATION_MACHINE

Emulator = kmocklib.KubernetesEmulator
GROUP = "cluster.x-k8s.io"
MD = kmocklib.resource(GROUP, "v1beta2", "machinedeployments")
MACHINES = kmocklib.resource(GROUP, "v1beta2", "machines")
OLD_MD = kmocklib.resource(GROUP, "v1beta1", "machinedeployments")
OLD_MACHINES = kmocklib.resource(GROUP, "v1beta1", "machines")
NODES = kmocklib.resource("", "v1", "nodes")


@pytest.fixture
async def k8s(kmock: Any) -> Emulator:
    emulator = cast(Emulator, kmock)
    namespaced = kmocklib.ResourceInfo(namespaced=True)
    for version in ("v1beta1", "v1beta2"):
        for plural in ("machinedeployments", "machinepools", "machines"):
            emulator.resources[f"{GROUP}/{version}/{plural}"] = namespaced
    emulator.resources["v1/nodes"] = kmocklib.ResourceInfo(namespaced=False)
    return emulator


@pytest.fixture
async def api(k8s: Emulator) -> AsyncIterator[ApiClient]:
    async with ApiClient(Configuration(host=str(k8s.url).rstrip("/"))) as client:
        yield client


def add_pool(k8s: Emulator, replicas: int, status: dict[str, Any]) -> None:
    k8s.objects[MD, NS, NAME] = {
        "apiVersion": f"{GROUP}/v1beta2",
        "kind": "MachineDeployment",
        "metadata": {"name": NAME, "namespace": NS, "resourceVersion": "1", "annotations": {
            "capacity.cluster-autoscaler.kubernetes.io/gpu-count": "4",
            "capacity.cluster-autoscaler.kubernetes.io/gpu-type": "nvidia.com/gpu",
            "capacity.cluster-autoscaler.kubernetes.io/labels": "nvidia.com/gpu.product=L40S",
        }},
        "spec": {"replicas": replicas, "clusterName": "east"},
        "status": status,
    }  # fmt: skip


def pool(api: ApiClient, **kwargs: Any) -> CapiPool:
    return CapiPool(api, NS, NAME, retry_wait=wait_none(), **kwargs)


@pytest.mark.parametrize(
    ("status", "ready"),
    [
        ({"readyReplicas": 2, "deprecated": {"v1beta1": {"readyReplicas": 1}}}, 2),
        ({"deprecated": {"v1beta1": {"readyReplicas": 1}}}, 1),  # old controller: old field
        ({}, 0),
    ],
)
async def test_status_at_v1beta2(
    api: ApiClient, k8s: Emulator, status: dict[str, Any], ready: int
) -> None:
    add_pool(k8s, 3, status)
    capi = pool(api)
    assert await capi.status() == PoolStatus(3, ready, PoolShape(gpus=4, gpu_type="L40S"))
    assert capi.served.version == "v1beta2"
    assert len(k8s["get"][MD]) == 1
    assert len(k8s["get"][OLD_MD]) == 0


async def test_scale_at_v1beta2(api: ApiClient, k8s: Emulator) -> None:
    add_pool(k8s, 1, {})
    serve_scale(k8s, MD)
    assert await pool(api).scale_by(2) == 3
    assert k8s.objects[MD, NS, NAME]["spec"]["replicas"] == 3
    assert len(k8s["put"][MD][SCALE]) == 1
    assert len(k8s["get"][OLD_MD]) == 0


async def test_remove_node_marks_the_v1beta2_machine(api: ApiClient, k8s: Emulator) -> None:
    add_pool(k8s, 2, {})
    serve_scale(k8s, MD)
    k8s.objects[NODES, None, "node-a"] = {
        "apiVersion": "v1", "kind": "Node", "spec": {},
        "metadata": {"name": "node-a", "annotations": {ANNOTATION_MACHINE: "m-a"}},
    }  # fmt: skip
    k8s.objects[MACHINES, NS, "m-a"] = {
        "apiVersion": f"{GROUP}/v1beta2", "kind": "Machine",
        "metadata": {"name": "m-a", "namespace": NS, "annotations": {}},
        "spec": {"clusterName": "east"}, "status": {"nodeRef": {"name": "node-a"}},
    }  # fmt: skip
    await pool(api, workload=api).remove_node("node-a")
    machine = k8s.objects[MACHINES, NS, "m-a"]
    assert machine["metadata"]["annotations"] == {ANNOTATION_DELETE_MACHINE: "yes"}
    assert k8s.objects[MD, NS, NAME]["spec"]["replicas"] == 1
    assert len(k8s["patch"][OLD_MACHINES]) == 0
