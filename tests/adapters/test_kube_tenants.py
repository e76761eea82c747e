"""Tenant namespaces in a member cluster (issue 13): KubeLauncher against kmock with
Namespaces (``tests/kmock_namespaces.py``: real HTTP, the real ``kubernetes.aio`` client,
and an API server's refusal to create anything in a namespace that is not there).

Each tenant's gang goes into ``fedbroker-<tenant>``, created with the Pod Security labels of
the tenant's level before any object; two tenants' jobs of one name no longer collide; an
existing namespace (or one created meanwhile: 409) is used and its labels corrected; one
deleted behind the launcher's back is made again; reading back and garbage collection work
across the tenant namespaces and leave alone whatever is labelled ours elsewhere."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import kmock as kmocklib
import pytest
from kmock_namespaces import NAMESPACES, NamespacedEmulator
from kubernetes.aio.client import ApiClient, Configuration
from tenacity import wait_none

from adapters.kube.launch import KubeLauncher
from adapters.kube.objects import KubeLaunchError
from adapters.kube.settings import LaunchSettings
from adapters.kube.tenancy import labels_to_patch, pod_security_labels
from broker.manifest.workloads import INTEGRATIONS
from broker.model import Placement, PodBound, PodPlacement, Resources
from broker.ports import LaunchSpec

pytestmark = pytest.mark.kmock(cls=NamespacedEmulator)

PODS = kmocklib.resource("", "v1", "pods")
COSCHED = kmocklib.resource("scheduling.x-k8s.io", "v1alpha1", "podgroups")
GPU = Resources(gpus=1, cpu_milli=1000, memory_mib=1024)
PSA = "pod-security.kubernetes.io/"
# What the member-cluster kustomization names the broker's identity and its token Secret.
BROKER_ACCOUNT = "fedbroker-broker"
BROKER_SECRET = "fedbroker-broker-token"


@pytest.fixture
async def k8s(kmock: Any) -> NamespacedEmulator:
    emulator: NamespacedEmulator = kmock
    info = kmocklib.ResourceInfo(namespaced=True)
    emulator.resources["v1/pods"] = info
    emulator.resources["scheduling.x-k8s.io/v1alpha1/podgroups"] = info
    return emulator


@pytest.fixture
async def api(k8s: NamespacedEmulator) -> AsyncIterator[ApiClient]:
    async with ApiClient(Configuration(host=str(k8s.url).rstrip("/"))) as client:
        yield client


def gang(tenant: str, job: str = "train", pods: int = 2) -> Placement:
    return Placement(
        f"{tenant}/{job}",
        "east",
        tuple(PodPlacement(f"{tenant}.{job}-w-{i}", f"n{i}", (0,), GPU) for i in range(pods)),
    )


def kubelet(k8s: NamespacedEmulator) -> Callable[[float], Awaitable[None]]:
    async def step(_: float) -> None:
        await k8s.run_pods("n0")

    return step


LEVELS = {"acme": "restricted", "zeta": "baseline"}


def launcher(
    api: ApiClient, k8s: NamespacedEmulator, levels: dict[str, str] = LEVELS
) -> KubeLauncher:
    def spec_for(p: Placement) -> LaunchSpec:
        tenant, _, job = p.job.partition("/")
        template = {"spec": {"containers": [{"name": "main", "image": "pytorch:2"}]}}
        return LaunchSpec(
            tenant=tenant, job=job, pod_security=levels[tenant], pod_templates={"w": template}
        )

    return KubeLauncher(
        api, LaunchSettings("fedbroker-{tenant}", "delegate", cluster="east",
                            retry_wait=wait_none()),
        kinds=INTEGRATIONS,
        sleep=kubelet(k8s), spec_for=spec_for,
    )  # fmt: skip


def objects_in(k8s: NamespacedEmulator, res: Any, namespace: str) -> dict[str, dict[str, Any]]:
    return {
        name: obj.raw
        for (r, ns, name), obj in k8s.objects.items()
        if r == res and ns == namespace and not obj.deleted
    }


def labels(k8s: NamespacedEmulator, namespace: str) -> dict[str, str]:
    found = k8s.stored_namespace(namespace)
    assert found is not None, namespace
    return dict(found["metadata"].get("labels") or {})


@pytest.mark.parametrize("level", ["privileged", "baseline", "restricted"])
def test_pod_security_labels_enforce_warn_and_audit_the_level(level: str) -> None:
    assert pod_security_labels(level) == {
        f"{PSA}enforce": level, f"{PSA}enforce-version": "latest",
        f"{PSA}warn": level, f"{PSA}warn-version": "latest",
        f"{PSA}audit": level, f"{PSA}audit-version": "latest",
    }  # fmt: skip


@pytest.mark.parametrize(
    ("have", "level", "patch"),
    [
        ({}, "baseline", pod_security_labels("baseline")),
        (pod_security_labels("baseline"), "baseline", {}),
        ({**pod_security_labels("baseline"), "team": "x"}, "baseline", {}),
        (pod_security_labels("privileged"), "restricted",
         {f"{PSA}{m}": "restricted" for m in ("enforce", "warn", "audit")}),
        ({**pod_security_labels("restricted"), f"{PSA}enforce-version": "v1.29"}, "restricted",
         {f"{PSA}enforce-version": "latest"}),
    ],
)  # fmt: skip
def test_labels_to_patch_are_the_differing_pod_security_ones(
    have: dict[str, str], level: str, patch: dict[str, str]
) -> None:
    assert labels_to_patch({"metadata": {"labels": have}}, level) == patch


def test_an_unknown_level_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown Pod Security level 'lax'"):
        pod_security_labels("lax")


async def test_the_tenant_namespace_is_created_with_its_labels_then_launched_into(
    api: ApiClient, k8s: NamespacedEmulator
) -> None:
    kube = launcher(api, k8s)
    await kube.launch(gang("acme"))
    assert labels(k8s, "fedbroker-acme") == {
        "fedbroker.io/origin": "fedbroker", "fedbroker.io/tenant": "acme",
        **pod_security_labels("restricted"),
    }  # fmt: skip
    # Ensured before the first object: no create was refused for a missing namespace.
    assert k8s.refused == []
    assert sorted(objects_in(k8s, PODS, "fedbroker-acme")) == ["train-w-0", "train-w-1"]
    assert sorted(objects_in(k8s, COSCHED, "fedbroker-acme")) == ["train"]
    pod = objects_in(k8s, PODS, "fedbroker-acme")["train-w-0"]
    assert pod["metadata"]["namespace"] == "fedbroker-acme"
    # Once per process: a second gang of the tenant costs no namespace request.
    await kube.launch(gang("acme", "eval"))
    assert k8s.namespace_calls == [("GET", "fedbroker-acme"), ("POST", "fedbroker-acme")]


async def test_two_tenants_jobs_of_one_name_launch_into_two_namespaces(
    api: ApiClient, k8s: NamespacedEmulator
) -> None:
    kube = launcher(api, k8s)
    await kube.launch(gang("acme"))
    await kube.launch(gang("zeta"))  # no collision: it is not refused as "not its own"
    for tenant in ("acme", "zeta"):
        namespace = f"fedbroker-{tenant}"
        assert labels(k8s, namespace)[f"{PSA}enforce"] == LEVELS[tenant]
        pods = objects_in(k8s, PODS, namespace)
        assert sorted(pods) == ["train-w-0", "train-w-1"]
        assert {p["metadata"]["labels"]["fedbroker.io/tenant"] for p in pods.values()} == {tenant}
    # Deleting one tenant's gang leaves the other's same-named objects alone.
    await kube.delete(gang("acme"))
    assert not objects_in(k8s, PODS, "fedbroker-acme")
    assert not objects_in(k8s, COSCHED, "fedbroker-acme")
    assert sorted(objects_in(k8s, PODS, "fedbroker-zeta")) == ["train-w-0", "train-w-1"]
    assert sorted(objects_in(k8s, COSCHED, "fedbroker-zeta")) == ["train"]


async def test_no_launched_object_names_the_brokers_account_or_secret(
    api: ApiClient, k8s: NamespacedEmulator
) -> None:
    kube = launcher(api, k8s)
    await kube.launch(gang("acme"))
    await kube.launch(gang("zeta", "other", pods=1))
    made = [o.raw for (r, _, _), o in k8s.objects.items() if r in (PODS, COSCHED, NAMESPACES)]
    assert len(made) == 7  # acme: 2 pods, a PodGroup, a namespace; zeta: 1 pod, ...
    for obj in made:
        text = json.dumps(obj)
        assert BROKER_ACCOUNT not in text and BROKER_SECRET not in text, obj["metadata"]
        spec = obj.get("spec") or {}
        assert "serviceAccountName" not in spec and "serviceAccount" not in spec
        assert not spec.get("volumes"), obj["metadata"]
    # The broker's own namespace in a member cluster is never a tenant's.
    assert {ns for (r, ns, _) in k8s.objects if r == PODS} == {"fedbroker-acme", "fedbroker-zeta"}


async def test_an_existing_namespace_is_used_and_its_pod_security_labels_corrected(
    api: ApiClient, k8s: NamespacedEmulator
) -> None:
    old = {"owner": "ops", f"{PSA}enforce": "privileged"}
    k8s.objects[NAMESPACES, None, "fedbroker-acme"] = {
        "metadata": {"name": "fedbroker-acme", "labels": old}, "status": {"phase": "Active"},
    }  # fmt: skip
    await launcher(api, k8s).launch(gang("acme"))
    assert k8s.calls("POST") == []
    assert k8s.calls("PATCH") == ["fedbroker-acme"]
    assert labels(k8s, "fedbroker-acme") == {"owner": "ops", **pod_security_labels("restricted")}
    assert sorted(objects_in(k8s, PODS, "fedbroker-acme")) == ["train-w-0", "train-w-1"]


async def test_a_namespace_created_meanwhile_409_is_fine(
    api: ApiClient, k8s: NamespacedEmulator
) -> None:
    k8s.racing.add("fedbroker-acme")
    await launcher(api, k8s).launch(gang("acme"))
    assert k8s.namespace_calls == [
        ("GET", "fedbroker-acme"),
        ("POST", "fedbroker-acme"),  # 409 AlreadyExists: the other creator won
        ("GET", "fedbroker-acme"),
        ("PATCH", "fedbroker-acme"),  # it had no Pod Security labels
    ]
    assert labels(k8s, "fedbroker-acme") == pod_security_labels("restricted")
    assert sorted(objects_in(k8s, PODS, "fedbroker-acme")) == ["train-w-0", "train-w-1"]


async def test_a_namespace_deleted_behind_our_back_is_made_again(
    api: ApiClient, k8s: NamespacedEmulator
) -> None:
    kube = launcher(api, k8s)
    await kube.launch(gang("acme"))
    for (res, ns, name), obj in list(k8s.objects.items()):
        if ns == "fedbroker-acme" or (res == NAMESPACES and name == "fedbroker-acme"):
            obj.delete()  # the namespace and everything in it
    await kube.launch(gang("acme", "again"))  # the cached namespace answers 404: ensured again
    assert k8s.refused == ["/apis/scheduling.x-k8s.io/v1alpha1/namespaces/fedbroker-acme/podgroups"]
    assert k8s.calls("POST") == ["fedbroker-acme", "fedbroker-acme"]
    assert labels(k8s, "fedbroker-acme")[f"{PSA}enforce"] == "restricted"
    assert sorted(objects_in(k8s, PODS, "fedbroker-acme")) == ["again-w-0", "again-w-1"]


async def test_a_terminating_namespace_fails_the_launch_and_is_asked_again(
    api: ApiClient, k8s: NamespacedEmulator
) -> None:
    k8s.objects[NAMESPACES, None, "fedbroker-acme"] = {
        "metadata": {"name": "fedbroker-acme"}, "status": {"phase": "Terminating"},
    }  # fmt: skip
    kube = launcher(api, k8s)
    with pytest.raises(KubeLaunchError, match="namespace fedbroker-acme is being deleted"):
        await kube.launch(gang("acme"))
    assert not objects_in(k8s, PODS, "fedbroker-acme")
    k8s.objects[NAMESPACES, None, "fedbroker-acme"].patch({"status": {"phase": "Active"}})
    await kube.launch(gang("acme"))  # not remembered as ensured: asked again
    assert k8s.calls("GET") == ["fedbroker-acme", "fedbroker-acme"]
    assert sorted(objects_in(k8s, PODS, "fedbroker-acme")) == ["train-w-0", "train-w-1"]


async def test_a_changed_level_is_ensured_again(api: ApiClient, k8s: NamespacedEmulator) -> None:
    levels = dict(LEVELS)
    kube = launcher(api, k8s, levels)
    await kube.launch(gang("acme"))
    levels["acme"] = "baseline"  # the tenant's profile changed in the config
    await kube.launch(gang("acme", "next"))
    assert k8s.calls("GET") == ["fedbroker-acme", "fedbroker-acme"]
    assert k8s.calls("PATCH") == ["fedbroker-acme"]
    assert labels(k8s, "fedbroker-acme")[f"{PSA}enforce"] == "baseline"


async def test_read_back_and_garbage_collection_span_the_tenant_namespaces(
    api: ApiClient, k8s: NamespacedEmulator
) -> None:
    kube = launcher(api, k8s)
    await kube.launch(gang("acme"))
    await kube.launch(gang("zeta", pods=1))
    # Labelled ours, but not in its tenant's namespace: never read back, never deleted.
    stray = {"fedbroker.io/origin": "fedbroker", "fedbroker.io/tenant": "acme",
             "fedbroker.io/job": "train"}  # fmt: skip
    k8s.objects[PODS, "elsewhere", "train-w-0"] = {
        "metadata": {"name": "train-w-0", "namespace": "elsewhere", "labels": stray},
        "spec": {"nodeName": "n9", "containers": [{"name": "c"}]},
    }
    back = await launcher(api, k8s).read_back()  # a restarted broker: nothing cached
    assert sorted(back) == ["acme/train", "zeta/train"]
    assert sorted(b.pod for b in back["acme/train"]) == ["acme.train-w-0", "acme.train-w-1"]
    assert back["zeta/train"] == [PodBound("east", "zeta.train-w-0", "n0", GPU, (0,))]

    deleted = await launcher(api, k8s).collect_garbage({"zeta/train"})
    assert sorted(deleted) == [
        "Pod/fedbroker-acme/train-w-0", "Pod/fedbroker-acme/train-w-1",
        "PodGroup/fedbroker-acme/train",
        "Service/fedbroker-acme/rdzv-train",  # issue 14: the gang's rendezvous Service
    ]  # fmt: skip
    assert sorted(objects_in(k8s, PODS, "fedbroker-zeta")) == ["train-w-0"]
    assert sorted(objects_in(k8s, PODS, "elsewhere")) == ["train-w-0"]
