"""The Service with a Kubernetes member cluster served by kmock (real HTTP, the real
``kubernetes.aio`` client from a kubeconfig file, no monkey-patching): listed before
readiness, a job placed and launched there, and reservations rebuilt after a restart."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import kmock
import kmock as kmocklib
import pytest

from broker.config import Config, ConfigError, parse_config
from broker.manifest import parse_manifest
from broker.service import Service

NODES = kmock.resource("", "v1", "nodes")
PODS = kmock.resource("", "v1", "pods")
NS = "fedbroker-jobs"
CANARY = "canary-token-kube-service-51c2"

CONFIG = """
store: {{url: "sqlite:///{db}"}}
clusters:
- name: east
  source:
    kube: {{kubeconfig: "{kubeconfig}", context: east, launchMode: pin}}
queues:
- {{name: training, policy: gang}}
tenants:
- {{name: team-a, defaultQueue: training, token: {{value: tok-a}}}}
"""


def node_obj(name: str, gpus: int = 4) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {"nvidia.com/gpu.product": "A100"}},
        "spec": {},
        "status": {
            "allocatable": {"nvidia.com/gpu": str(gpus), "cpu": "64", "memory": "256Gi"},
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }


def foreign_pod(name: str, node: str, gpus: int) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "ml"},
        "spec": {
            "nodeName": node,
            "containers": [{"name": "c", "resources": {"requests": {"nvidia.com/gpu": str(gpus)}}}],
        },
        "status": {"phase": "Running"},
    }


def make_config(tmp_path: Path, server: str) -> Config:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "current-context": "east",
                "contexts": [{"name": "east", "context": {"cluster": "c-east", "user": "u"}}],
                "clusters": [{"name": "c-east", "cluster": {"server": server}}],
                "users": [{"name": "u", "user": {"token": CANARY}}],
            }
        )
    )
    text = CONFIG.format(db=tmp_path / "jobs.db", kubeconfig=kubeconfig)
    return parse_config(text, "test config")


def manifest(name: str, gpus: int = 1) -> Any:
    body = {
        "apiVersion": "fedbroker.io/v1alpha1",
        "kind": "FederatedJob",
        "metadata": {"name": name},
        "spec": {
            "podSets": [
                {"name": "worker", "count": 1,
                 "resources": {"nvidia.com/gpu": gpus, "cpu": "1", "memory": "1Gi"}}
            ]
        },
    }  # fmt: skip
    return parse_manifest(json.dumps(body).encode(), "application/json")


def used_gpus(service: Service, cluster: str = "east") -> float:
    view = service.ledger.snapshot().clusters[cluster]
    return view.gpus_total() - view.free_milli() / 1000


async def until(predicate: Callable[[], bool], timeout: float = 10.0) -> None:
    """Poll (yielding to the event loop) until ``predicate`` holds or the deadline passes."""
    async with asyncio.timeout(timeout):
        while not predicate():
            await asyncio.sleep(0.01)


@pytest.fixture
def k8s(kmock: kmock.KubernetesEmulator) -> kmock.KubernetesEmulator:
    kmock.resources["v1/pods"] = kmocklib.ResourceInfo(namespaced=True)
    kmock.resources["v1/nodes"] = kmocklib.ResourceInfo(namespaced=False)
    kmock.objects[NODES, None, "n1"] = node_obj("n1")
    kmock.objects[PODS, "ml", "other"] = foreign_pod("other", "n1", gpus=2)
    return kmock


def our_pod(k8s: kmock.KubernetesEmulator, name: str) -> Any:
    for (res, ns, obj_name), obj in list(k8s.objects.items()):
        if res == PODS and ns == NS and obj_name == name and not obj.deleted:
            return obj
    return None


async def test_kube_member_listed_placed_and_restored(
    k8s: kmock.KubernetesEmulator, tmp_path: Path
) -> None:
    config = make_config(tmp_path, str(k8s.url).rstrip("/"))
    service = Service(config)
    await service.start()
    try:
        # Listed before readiness: the node and the foreign pod's 2 GPUs.
        assert service.ready
        assert set(service.ledger.snapshot().clusters["east"].nodes) == {"n1"}
        assert used_gpus(service) == 2
        assert not service.ledger.snapshot().clusters["east"].stale

        _, created = await service.submit("team-a", manifest("train"))
        assert created
        await service.schedule_once()
        assert (await service.get("team-a", "train")).state == "Placed"
        await until(lambda: our_pod(k8s, "train-worker-0") is not None)
        pod = our_pod(k8s, "train-worker-0").raw
        affinity = pod["spec"]["affinity"]["nodeAffinity"]
        terms = affinity["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
        assert terms[0]["matchFields"][0]["values"] == ["n1"]
        assert pod["metadata"]["labels"]["fedbroker.io/job"] == "train"
        # The kubelet: bound where the broker pinned it, and running.
        our_pod(k8s, "train-worker-0").patch(
            {"spec": {"nodeName": "n1"}, "status": {"phase": "Running"}}
        )
        await service.launches_done(timeout=10)
        assert (await service.get("team-a", "train")).state == "Running"
        assert used_gpus(service) == 3  # the foreign pod's 2 and ours, not counted twice
        before = used_gpus(service)
    finally:
        await service.close()

    restarted = Service(make_config(tmp_path, str(k8s.url).rstrip("/")))
    await restarted.start()
    try:
        assert (await restarted.get("team-a", "train")).state == "Running"
        assert used_gpus(restarted) == before
        launch = restarted.lifecycle.get("team-a/train")
        assert launch is not None and launch.running
        assert launch.placement.pods[0].node == "n1"
        assert restarted.queue.get("team-a/train") is None
        assert not restarted.ledger.reservations()
        # Cancelling deletes the pod and frees its GPU.
        await restarted.cancel("team-a", "train")
        assert our_pod(k8s, "train-worker-0") is None
        await until(lambda: used_gpus(restarted) == 2)
    finally:
        await restarted.close()


async def test_unreachable_member_is_stale(tmp_path: Path) -> None:
    service = Service(make_config(tmp_path, "http://127.0.0.1:9"))
    await service.start()
    try:
        assert service.ready
        assert service.ledger.snapshot().clusters["east"].stale
    finally:
        await service.close()


def test_kube_source_errors_name_the_key(tmp_path: Path) -> None:
    text = CONFIG.format(db=tmp_path / "jobs.db", kubeconfig="kc").replace(
        "launchMode: pin", "launchMode: pinned"
    )
    with pytest.raises(ConfigError, match=r"clusters\[0\]\.source\.kube\.launchMode"):
        parse_config(text, "test config")
    text = CONFIG.format(db=tmp_path / "jobs.db", kubeconfig="kc").replace(", context: east", "")
    with pytest.raises(ConfigError, match=r"clusters\[0\]\.source\.kube\.context"):
        parse_config(text, "test config")


def test_example_federation_config_is_valid() -> None:
    example = Path(__file__).parent.parent / "deploy" / "examples" / "federation.yaml"
    config = parse_config(
        example.read_text(encoding="utf-8"), str(example), {"FEDBROKER_TOKEN_TEAM_A": "t"}
    )
    sources = [cc.source.kube for cc in config.clusters]
    assert [s.context for s in sources if s is not None] == ["gpu-east", "gpu-west"]
