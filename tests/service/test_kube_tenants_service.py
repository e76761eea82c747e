"""Per-tenant member namespaces through the Service (issue 13, acceptance 2): kmock with
Namespaces (real HTTP, the real client from a kubeconfig file, no monkey-patching).

The broker creates ``fedbroker-<tenant>`` with the Pod Security labels of the tenant's
profile and launches there; two tenants' jobs of one name run side by side; no launched
object names the broker's service account or its token Secret; a restarted broker finds the
gangs of every tenant, and its garbage collection works in every tenant namespace while
leaving objects labelled ours anywhere else alone."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import kmock as kmocklib
import pytest
from builders import until
from kmock_namespaces import NAMESPACES, NamespacedEmulator
from test_kube_service import PODS, kubeconfig_doc, manifest, node_obj

from broker.config import Config, parse_config
from broker.service.facade import Service

pytestmark = pytest.mark.kmock(cls=NamespacedEmulator)

NODES = kmocklib.resource("", "v1", "nodes")
PSA = "pod-security.kubernetes.io/"
BROKER_ACCOUNT = "fedbroker-broker"  # deploy/kustomize/member-cluster's names
BROKER_SECRET = "fedbroker-broker-token"

CONFIG = """
store: {{url: "sqlite:///{db}"}}
scheduler: {{garbageCollectSeconds: 3600}}
clusters:
- name: east
  source:
    kube: {{kubeconfig: "{kubeconfig}", context: east, launchMode: pin, podPollSeconds: 0.02}}
queues:
- {{name: training, policy: gang}}
tenants:
- {{name: team-a, defaultQueue: training, podSecurity: restricted,
   token: {{value: tok-a-00000000000000000000000000}}}}
- {{name: team-b, defaultQueue: training, token: {{value: tok-b-00000000000000000000000000}}}}
"""


def config(tmp_path: Path, server: str) -> Config:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(json.dumps(kubeconfig_doc(server)))
    return parse_config(CONFIG.format(db=tmp_path / "jobs.db", kubeconfig=kubeconfig), "test")


@pytest.fixture
def k8s(kmock: NamespacedEmulator) -> NamespacedEmulator:
    kmock.resources["v1/pods"] = kmocklib.ResourceInfo(namespaced=True)
    kmock.resources["v1/nodes"] = kmocklib.ResourceInfo(namespaced=False)
    kmock.objects[NODES, None, "n1"] = node_obj("n1", gpus=8)
    return kmock


def pod(k8s: NamespacedEmulator, namespace: str, name: str) -> Any:
    for (res, ns, obj_name), obj in list(k8s.objects.items()):
        if res == PODS and ns == namespace and obj_name == name and not obj.deleted:
            return obj
    return None


def labelled_ours(namespace: str, tenant: str, job: str) -> dict[str, Any]:
    labels = {"fedbroker.io/origin": "fedbroker", "fedbroker.io/tenant": tenant,
              "fedbroker.io/job": job}  # fmt: skip
    return {
        "metadata": {"name": f"{job}-worker-0", "namespace": namespace, "labels": labels},
        "spec": {"nodeName": "n1", "containers": [{"name": "c"}]},
        "status": {"phase": "Running"},
    }


async def test_each_tenant_launches_into_its_own_namespace_with_its_pod_security_labels(
    k8s: NamespacedEmulator, tmp_path: Path
) -> None:
    server = str(k8s.url).rstrip("/")
    # Passes team-a's restricted profile (and so team-b's baseline one).
    restricted = {
        "runAsNonRoot": True, "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]}, "seccompProfile": {"type": "RuntimeDefault"},
    }  # fmt: skip
    container = {"name": "trainer", "image": "pytorch:2", "securityContext": restricted}
    template = {"spec": {"containers": [container]}}
    service = Service(config(tmp_path, server))
    await service.start()
    try:
        for tenant in ("team-a", "team-b"):  # one job name in both tenants
            _, created = await service.submit(tenant, manifest("train", template=template))
            assert created
        await service.schedule_once()
        for tenant in ("team-a", "team-b"):
            namespace = f"fedbroker-{tenant}"

            def started(ns: str = namespace) -> bool:
                return pod(k8s, ns, "train-worker-0") is not None

            await until(started)
            await k8s.patch_pod(
                namespace, "train-worker-0",
                {"spec": {"nodeName": "n1"}, "status": {"phase": "Running"}},
            )  # fmt: skip
        await service.launches_done(timeout=10)
        for tenant in ("team-a", "team-b"):
            assert (await service.get(tenant, "train")).state == "Running"
    finally:
        await service.close()

    # The namespaces: made by the broker, enforcing each tenant's profile.
    for tenant, level in (("team-a", "restricted"), ("team-b", "baseline")):
        labels = k8s.stored_namespace(f"fedbroker-{tenant}")["metadata"]["labels"]  # type: ignore[index]
        assert labels["fedbroker.io/origin"] == "fedbroker"
        assert labels["fedbroker.io/tenant"] == tenant
        for mode in ("enforce", "warn", "audit"):
            assert (labels[f"{PSA}{mode}"], labels[f"{PSA}{mode}-version"]) == (level, "latest")
        assert (
            pod(k8s, f"fedbroker-{tenant}", "train-worker-0").raw["metadata"]["labels"][
                "fedbroker.io/tenant"
            ]
            == tenant
        )
    # Nothing the broker made names its own account or its token Secret.
    made = [o.raw for (r, _, _), o in k8s.objects.items() if r in (PODS, NAMESPACES)]
    assert len(made) == 4
    for obj in made:
        assert BROKER_ACCOUNT not in json.dumps(obj) and BROKER_SECRET not in json.dumps(obj)
        assert "serviceAccountName" not in (obj.get("spec") or {})

    # A restarted broker finds the gangs of both tenants before placing anything.
    restarted = Service(config(tmp_path, server))
    await restarted.start()
    try:
        running = {launch.placement.job for launch in restarted.lifecycle.launches()}
        assert running == {"team-a/train", "team-b/train"}
        for tenant in ("team-a", "team-b"):
            assert (await restarted.get(tenant, "train")).state == "Running"
            assert restarted.queue.get(f"{tenant}/train") is None  # restored, not requeued
        await restarted.cancel("team-a", "train")  # deletes team-a's pods only
        assert pod(k8s, "fedbroker-team-a", "train-worker-0") is None
        assert pod(k8s, "fedbroker-team-b", "train-worker-0") is not None
    finally:
        await restarted.close()


async def test_garbage_collection_works_in_every_tenant_namespace_and_nowhere_else(
    k8s: NamespacedEmulator, tmp_path: Path
) -> None:
    for namespace, tenant in (("fedbroker-team-a", "team-a"), ("fedbroker-team-b", "team-b")):
        k8s.objects[PODS, namespace, "left-worker-0"] = labelled_ours(namespace, tenant, "left")
    # Labelled ours but outside its tenant's namespace (the shared namespace of earlier
    # releases, say): never read back, never deleted.
    k8s.objects[PODS, "fedbroker-jobs", "left-worker-0"] = labelled_ours(
        "fedbroker-jobs", "team-a", "left"
    )
    service = Service(config(tmp_path, str(k8s.url).rstrip("/")))
    await service.start()
    try:
        assert service.ready  # collected once at start, before readiness
        assert pod(k8s, "fedbroker-team-a", "left-worker-0") is None
        assert pod(k8s, "fedbroker-team-b", "left-worker-0") is None
        assert pod(k8s, "fedbroker-jobs", "left-worker-0") is not None
        assert not service.ledger.reservations()
    finally:
        await service.close()
