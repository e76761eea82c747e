"""The pod bodies the Kubernetes launcher sends (adapters.kube.objects, pure): the user's
node selector, tolerations and affinity kept and ANDed with the broker's pin, never
replacing it; every container's own resources kept; and one launch through kmock."""

from __future__ import annotations

import copy
from collections.abc import AsyncIterator
from typing import Any, cast

import kmock as kmocklib
import pytest
from kmock_namespaces import NamespacedEmulator
from kubernetes.aio.client import ApiClient, Configuration
from tenacity import wait_none

from adapters.kube.launch import KubeLauncher
from adapters.kube.objects import GangObjects, Mode, pinned_to
from adapters.kube.settings import LaunchSettings
from broker.manifest.workloads import INTEGRATIONS
from broker.model import Placement, PodPlacement, Resources
from broker.ports import LaunchSpec

NS = "team"
PODS = kmocklib.resource("", "v1", "pods")
GPU = Resources(gpus=2, cpu_milli=4000, memory_mib=8192)
PIN = {"key": "metadata.name", "operator": "In", "values": ["node-7"]}
ZONE = {"key": "zone", "operator": "In", "values": ["a"]}
FAST = {"key": "disk", "operator": "In", "values": ["ssd"]}
TOLERATIONS = [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}]
PREFERRED = [{"weight": 5, "preference": {"matchExpressions": [FAST]}}]
ANTI = {"requiredDuringSchedulingIgnoredDuringExecution": [
    {"labelSelector": {"matchLabels": {"app": "trainer"}}, "topologyKey": "kubernetes.io/hostname"}
]}  # fmt: skip
USER_AFFINITY = {
    "nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [ZONE]},
            {"matchExpressions": [FAST], "matchFields": [
                {"key": "metadata.name", "operator": "NotIn", "values": ["bad"]}]},
        ]},
        "preferredDuringSchedulingIgnoredDuringExecution": PREFERRED,
    },
    "podAntiAffinity": ANTI,
}  # fmt: skip
TEMPLATE: dict[str, Any] = {
    "metadata": {"labels": {"app": "trainer"}},
    "spec": {
        "nodeSelector": {"pool": "gpu"},
        "tolerations": TOLERATIONS,
        "affinity": USER_AFFINITY,
        "containers": [{"name": "trainer", "image": "pytorch:2"}],
    },
}


def objects(mode: Mode, gpu_resource: str = "nvidia.com/gpu") -> GangObjects:
    return GangObjects(
        NS, mode, "coscheduling", "fedbroker", cluster="east", gpu_resource=gpu_resource,
        shared_gpu_resource=None, scheduler_name=None, default_image="busybox",
    )  # fmt: skip


def spec(template: dict[str, Any]) -> LaunchSpec:
    return LaunchSpec(tenant="acme", job="train", pod_templates={"worker": template})


POD = PodPlacement("acme.train-worker-0", "node-7", (0, 1), GPU)


def test_pin_is_anded_into_every_user_term_and_the_rest_is_kept() -> None:
    before = copy.deepcopy(TEMPLATE)
    body = objects("pin").pod_body(POD, spec(TEMPLATE))["spec"]
    assert before == TEMPLATE  # the stored template is not edited in place
    assert body["nodeSelector"] == {"pool": "gpu"}
    assert body["tolerations"] == TOLERATIONS
    node = body["affinity"]["nodeAffinity"]
    terms = node["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert terms == [
        {"matchExpressions": [ZONE], "matchFields": [PIN]},
        {"matchExpressions": [FAST], "matchFields": [
            {"key": "metadata.name", "operator": "NotIn", "values": ["bad"]}, PIN]},
    ]  # fmt: skip
    assert node["preferredDuringSchedulingIgnoredDuringExecution"] == PREFERRED
    assert body["affinity"]["podAntiAffinity"] == ANTI


AFFINITIES: list[tuple[str, object, list[dict[str, Any]]]] = [
    ("no affinity", None, [{"matchFields": [PIN]}]),
    ("pod affinity only", {"podAntiAffinity": ANTI}, [{"matchFields": [PIN]}]),
    ("preferred only", {"nodeAffinity": {
        "preferredDuringSchedulingIgnoredDuringExecution": PREFERRED}}, [{"matchFields": [PIN]}]),
    ("no terms", {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": []}}}, [{"matchFields": [PIN]}]),
    ("an empty term matches nothing and stays so", {"nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {}, {"matchExpressions": [ZONE]}]}}},
     [{}, {"matchExpressions": [ZONE], "matchFields": [PIN]}]),
]  # fmt: skip


@pytest.mark.parametrize(
    ("affinity", "terms"), [a[1:] for a in AFFINITIES], ids=[a[0] for a in AFFINITIES]
)
def test_every_required_term_carries_the_pin(affinity: object, terms: list[dict[str, Any]]) -> None:
    merged = pinned_to("node-7", affinity)
    required = merged["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert required["nodeSelectorTerms"] == terms
    if isinstance(affinity, dict) and "podAntiAffinity" in affinity:
        assert merged["podAntiAffinity"] == ANTI


def test_delegate_mode_keeps_the_users_constraints_as_given() -> None:
    body = objects("delegate").pod_body(POD, spec(TEMPLATE))["spec"]
    assert body["affinity"] == USER_AFFINITY
    assert (body["nodeSelector"], body["tolerations"]) == ({"pool": "gpu"}, TOLERATIONS)


def test_each_container_keeps_its_resources_and_the_rest_goes_to_the_first() -> None:
    template = {"spec": {
        "nodeName": "chosen-by-me", "schedulerName": "mine",
        "containers": [
            {"name": "a", "resources": {"limits": {"cpu": "1", "ephemeral-storage": "1Gi"}}},
            {"name": "b", "resources": {"limits": {"nvidia.com/gpu": 2, "cpu": "3"}}},
        ],
    }}  # fmt: skip
    body = objects("pin", gpu_resource="amd.com/gpu").pod_body(POD, spec(template))["spec"]
    first, second = body["containers"]
    # memory, which the template gives nowhere, is the broker's, on the first container
    assert first["resources"] == {
        "limits": {"cpu": "1", "ephemeral-storage": "1Gi", "memory": "8192Mi"},
        "requests": {"memory": "8192Mi"},
    }
    # the GPUs stay on the container that asked for them, in this cluster's name
    assert second["resources"] == {"limits": {"amd.com/gpu": 2, "cpu": "3"}}
    assert "nodeName" not in body
    assert "schedulerName" not in body


@pytest.fixture
async def api(kmock: Any) -> AsyncIterator[tuple[ApiClient, kmocklib.KubernetesEmulator]]:
    k8s = cast(kmocklib.KubernetesEmulator, kmock)
    k8s.resources["v1/pods"] = kmocklib.ResourceInfo(namespaced=True)
    config = Configuration(host=str(k8s.url).rstrip("/"))
    async with ApiClient(config) as client:
        yield client, k8s


@pytest.mark.kmock(cls=NamespacedEmulator)
async def test_a_pinned_launch_carries_the_users_and_the_brokers_constraints(
    api: tuple[ApiClient, kmocklib.KubernetesEmulator],
) -> None:
    client, k8s = api

    async def kubelet(_: float) -> None:
        await cast(NamespacedEmulator, k8s).run_pods("node-7")

    settings = LaunchSettings(NS, "pin", cluster="east", retry_wait=wait_none())
    launcher = KubeLauncher(client, settings, kinds=INTEGRATIONS, sleep=kubelet)
    await launcher.launch(Placement("acme/train", "east", (POD,)), spec(TEMPLATE))
    pods = [o.raw for (r, _, _), o in k8s.objects.items() if r == PODS and not o.deleted]
    assert len(pods) == 1
    pod = pods[0]["spec"]
    assert pod["nodeSelector"] == {"pool": "gpu"}
    assert pod["tolerations"] == TOLERATIONS
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    assert all(PIN in term["matchFields"] for term in terms) and len(terms) == 2
    assert pod["affinity"]["podAntiAffinity"] == ANTI


def test_a_template_that_gives_every_resource_is_sent_as_written() -> None:
    given = {"limits": {"nvidia.com/gpu": 2, "cpu": "4", "memory": "8Gi"}}
    template = {"spec": {"containers": [{"name": "a", "resources": copy.deepcopy(given)}]}}
    body = objects("pin").pod_body(POD, spec(template))["spec"]
    assert body["containers"][0]["resources"] == given


def test_the_default_container_passes_the_restricted_profile() -> None:
    from broker.manifest.podpolicy import template_violations

    body = objects("pin").pod_body(POD, spec({}))
    assert body["spec"]["containers"][0]["image"] == "busybox"
    pod = {"metadata": {}, "spec": body["spec"]}
    assert template_violations(pod, "restricted", frozenset({"default"}), ("pod",)) == []
    # The same pod without the default security context is refused by restricted.
    del body["spec"]["containers"][0]["securityContext"]
    assert template_violations(pod, "restricted", frozenset({"default"}), ("pod",)) != []
