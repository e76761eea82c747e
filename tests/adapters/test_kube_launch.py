"""KubeLauncher against kmock (a Kubernetes API mock over real HTTP, with Namespaces:
``tests/kmock_namespaces.py``) with the real ``kubernetes.aio`` client. No client
monkey-patching: pods are moved to Running or Failed by a fake kubelet, the launcher's
injected poll pause, which edits kmock's stored objects. Tenant ``acme``'s objects go into
namespace ``team-acme`` (pattern ``team-{tenant}``); tests/adapters/test_kube_tenants.py has
the namespaces themselves."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, cast

import kmock as kmocklib
import pytest
from crds import schema_problems
from kmock_namespaces import NamespacedEmulator
from kubernetes.aio.client import ApiClient, Configuration
from tenacity import wait_none

from adapters.kube.launch import KubeLauncher
from adapters.kube.objects import (
    COSCHEDULING_LABEL,
    LABEL_ORIGIN,
    VOLCANO_ANNOTATION,
    Flavor,
    KubeLaunchError,
    Mode,
)
from adapters.kube.settings import LaunchSettings
from broker.manifest.workloads import INTEGRATIONS
from broker.model import Placement, PodBound, PodPlacement, Resources
from broker.ports import LaunchError, LaunchSpec

pytestmark = pytest.mark.kmock(cls=NamespacedEmulator)

CANARY = "canary-token-3f9e1c0d7b"
PATTERN = "team-{tenant}"
NS = "team-acme"
PODS = kmocklib.resource("", "v1", "pods")
COSCHED = kmocklib.resource("scheduling.x-k8s.io", "v1alpha1", "podgroups")
VOLCANO = kmocklib.resource("scheduling.volcano.sh", "v1beta1", "podgroups")
GPU = Resources(gpus=4, cpu_milli=8000, memory_mib=32768)

Emulator = NamespacedEmulator


@pytest.fixture
async def k8s(kmock: Any) -> Emulator:
    emulator = cast(Emulator, kmock)
    info = kmocklib.ResourceInfo(namespaced=True)
    emulator.resources["v1/pods"] = info
    emulator.resources["scheduling.x-k8s.io/v1alpha1/podgroups"] = info
    emulator.resources["scheduling.volcano.sh/v1beta1/podgroups"] = info
    return emulator


@pytest.fixture
async def api(k8s: Emulator) -> AsyncIterator[ApiClient]:
    config = Configuration(
        host=str(k8s.url).rstrip("/"),
        api_key={"BearerToken": CANARY},
        api_key_prefix={"BearerToken": "Bearer"},
    )
    async with ApiClient(config) as client:
        yield client


def placement(job: str = "train", pods: int = 2) -> Placement:
    return Placement(
        job=f"acme/{job}",
        cluster="east",
        pods=tuple(
            PodPlacement(f"acme.{job}-worker-{i}", f"node-{i}", (0, 1, 2, 3), GPU)
            for i in range(pods)
        ),
    )


def kubelet(
    k8s: Emulator, phase: str = "Running", only: str | None = None
) -> Callable[[float], Awaitable[None]]:
    """A poll pause that binds every stored pod of ours and sets its phase (through the
    API: the launcher hears its pods by a watch)."""

    async def step(_: float) -> None:
        await k8s.run_pods("node-x", phase, only)

    return step


def creates(k8s: Emulator) -> list[Any]:
    """The POSTs creating pods (not the scheduler's bindings)."""
    return [r for r in k8s["post"][PODS] if r.subresource is None]


def stored(k8s: Emulator, res: Any) -> dict[str, dict[str, Any]]:
    return {
        name: obj.raw for (r, _, name), obj in k8s.objects.items() if r == res and not obj.deleted
    }


def launcher(
    api: ApiClient,
    k8s: Emulator,
    mode: Mode = "delegate",
    flavor: Flavor = "coscheduling",
    pattern: str = PATTERN,
    **kwargs: Any,
) -> KubeLauncher:
    sleep = kwargs.pop("sleep", kubelet(k8s))
    settings = LaunchSettings(pattern, mode, flavor, cluster="east", retry_wait=wait_none(),
                              **kwargs)  # fmt: skip
    return KubeLauncher(
        api,
        settings,
        kinds=INTEGRATIONS,
        sleep=sleep,
        spec_for=lambda p: LaunchSpec(
            tenant="acme",
            job=p.job.split("/")[1],
            min_member=2,
            schedule_timeout_seconds=120,
            queue="gpu-q",
            pod_templates={
                "worker": {
                    "metadata": {"labels": {"app": "trainer"}},
                    "spec": {"containers": [{"name": "trainer", "image": "pytorch:2"}]},
                }
            },
        ),
    )


async def test_coscheduling_pod_group_and_pods(api: ApiClient, k8s: Emulator) -> None:
    await launcher(api, k8s).launch(placement())
    group = stored(k8s, COSCHED)["train"]
    assert group["apiVersion"] == "scheduling.x-k8s.io/v1alpha1"
    assert group["kind"] == "PodGroup"
    assert group["spec"] == {"minMember": 2, "scheduleTimeoutSeconds": 120}
    assert group["metadata"]["labels"][LABEL_ORIGIN] == "fedbroker"
    pods = stored(k8s, PODS)
    assert sorted(pods) == ["train-worker-0", "train-worker-1"]
    pod = pods["train-worker-0"]
    labels = pod["metadata"]["labels"]
    assert labels[COSCHEDULING_LABEL] == "train"
    assert labels["fedbroker.io/tenant"] == "acme"
    assert labels["fedbroker.io/job"] == "train"
    assert labels["app"] == "trainer"
    container = pod["spec"]["containers"][0]
    assert container["image"] == "pytorch:2"
    # as the member stores what the broker sent (8000m, 32768Mi): canonical quantities
    want = {"nvidia.com/gpu": "4", "cpu": "8", "memory": "32Gi"}
    assert container["resources"] == {"requests": want, "limits": want}
    assert "affinity" not in pod["spec"]
    # no schedulerName configured: none sent, so the member's default scheduler
    assert pod["spec"]["schedulerName"] == "default-scheduler"
    assert schema_problems(group, "scheduling.x-k8s.io_podgroups.yaml") == []


async def test_coscheduling_pods_name_the_configured_scheduler(
    api: ApiClient, k8s: Emulator
) -> None:
    # scheduler-plugins installed as a second scheduler (its chart's usual install): the
    # pods must name it, or the default scheduler binds them one by one, ignoring the group.
    name = "scheduler-plugins-scheduler"
    await launcher(api, k8s, scheduler_name=name).launch(placement())
    pods = stored(k8s, PODS)
    assert {p["spec"]["schedulerName"] for p in pods.values()} == {name}
    assert all(p["metadata"]["labels"][COSCHEDULING_LABEL] == "train" for p in pods.values())


@pytest.mark.parametrize(
    ("queues", "want"),
    [
        ({"gpu-q": "ml", "other": "x"}, "ml"),  # the job's queue is mapped
        ({"other": "x"}, "default"),  # unmapped: Volcano's own default Queue
        (None, "default"),
    ],
)
async def test_volcano_pod_group_and_pods(
    api: ApiClient, k8s: Emulator, queues: dict[str, str] | None, want: str
) -> None:
    await launcher(api, k8s, flavor="volcano", volcano_queues=queues).launch(placement())
    group = stored(k8s, VOLCANO)["train"]
    assert group["apiVersion"] == "scheduling.volcano.sh/v1beta1"
    assert group["spec"] == {"minMember": 2, "queue": want}
    assert schema_problems(group, "scheduling.volcano.sh_podgroups.yaml") == []
    pod = stored(k8s, PODS)["train-worker-1"]
    assert pod["metadata"]["annotations"][VOLCANO_ANNOTATION] == "train"
    assert pod["spec"]["schedulerName"] == "volcano"
    assert not stored(k8s, COSCHED)


async def test_pin_mode_affinity_and_no_pod_group(api: ApiClient, k8s: Emulator) -> None:
    await launcher(api, k8s, mode="pin").launch(placement())
    pod = stored(k8s, PODS)["train-worker-1"]
    terms = pod["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]["nodeSelectorTerms"]
    assert terms == [
        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["node-1"]}]}
    ]
    assert not stored(k8s, COSCHED)


async def test_shared_gpu_resource_name(api: ApiClient, k8s: Emulator) -> None:
    shared = Placement(
        "acme/s", "east", (PodPlacement("acme.s-w-0", "n", (2,), Resources(gpu_milli=250)),)
    )
    kube = launcher(api, k8s, mode="pin", shared_gpu_resource="example.com/gpu-milli")
    await kube.launch(shared)
    requests = stored(k8s, PODS)["s-w-0"]["spec"]["containers"][0]["resources"]["requests"]
    assert requests == {"example.com/gpu-milli": "250"}
    with pytest.raises(KubeLaunchError, match="shared GPU resource"):
        await launcher(api, k8s, mode="pin").launch(shared)


async def test_already_exists_with_our_label_is_idempotent(api: ApiClient, k8s: Emulator) -> None:
    kube = launcher(api, k8s)
    await kube.launch(placement())
    await kube.launch(placement())
    assert sorted(stored(k8s, PODS)) == ["train-worker-0", "train-worker-1"]
    assert len(creates(k8s)) == 4  # both creations answered 409 the second time


async def test_already_exists_without_our_label_fails(api: ApiClient, k8s: Emulator) -> None:
    k8s.objects[PODS, NS, "train-worker-1"] = {
        "metadata": {"name": "train-worker-1", "namespace": NS, "labels": {"app": "other"}}
    }
    with pytest.raises(KubeLaunchError, match="does not belong"):
        await launcher(api, k8s).launch(placement())
    # rolled back: ours are gone, the foreign pod stays
    assert sorted(stored(k8s, PODS)) == ["train-worker-1"]
    assert not stored(k8s, COSCHED)


async def test_foreign_pod_group_fails(api: ApiClient, k8s: Emulator) -> None:
    k8s.objects[COSCHED, NS, "train"] = {"metadata": {"name": "train", "namespace": NS}}
    with pytest.raises(LaunchError, match="PodGroup train already exists"):
        await launcher(api, k8s).launch(placement())
    assert "train" in stored(k8s, COSCHED)


async def test_pod_group_spec_update_retries_on_conflict(api: ApiClient, k8s: Emulator) -> None:
    k8s.objects[COSCHED, NS, "train"] = {
        "metadata": {
            "name": "train",
            "namespace": NS,
            "resourceVersion": "7",
            "labels": {
                LABEL_ORIGIN: "fedbroker",
                "fedbroker.io/tenant": "acme",
                "fedbroker.io/job": "train",
            },
        },
        "spec": {"minMember": 5, "scheduleTimeoutSeconds": 1},
    }
    k8s["patch"][COSCHED][:1] << 409 << {"kind": "Status", "code": 409, "reason": "Conflict"}
    await launcher(api, k8s).launch(placement())
    # kmock applies a PATCH even when a reaction answers 409, so the re-read after the
    # conflict already shows the wanted spec: no second PATCH is needed.
    assert len(k8s["patch"][COSCHED]) == 1
    assert len(k8s["get"][COSCHED]) >= 2
    assert stored(k8s, COSCHED)["train"]["spec"]["minMember"] == 2


async def test_failed_pod_rolls_back_the_gang(api: ApiClient, k8s: Emulator) -> None:
    kube = launcher(api, k8s, sleep=kubelet(k8s, "Failed", only="train-worker-1"))
    with pytest.raises(LaunchError, match="train-worker-1 Failed"):
        await kube.launch(placement())
    assert not stored(k8s, PODS)
    assert not stored(k8s, COSCHED)
    await kube.delete(placement())  # idempotent: nothing left, 404s tolerated
    assert not stored(k8s, PODS)


async def test_pod_group_running_confirms(api: ApiClient, k8s: Emulator) -> None:
    async def scheduler(_: float) -> None:
        k8s.objects[COSCHED, NS, "train"].patch({"status": {"phase": "Running"}})

    await launcher(api, k8s, sleep=scheduler).launch(placement())
    # confirmed by the PodGroup alone: no kubelet ever ran a pod
    assert all(p["status"] == {"phase": "Pending"} for p in stored(k8s, PODS).values())


async def test_429_then_success_is_retried(api: ApiClient, k8s: Emulator) -> None:
    k8s["post"][PODS][:1] << 429 << {"kind": "Status", "code": 429, "reason": "TooManyRequests"}
    await launcher(api, k8s, mode="pin").launch(placement())
    # kmock stores a POSTed object even when a reaction answers, so the retry meets our own
    # pod (409 with our labels): adopted, as a lost response from a real server would be.
    assert len(creates(k8s)) == 3
    assert sorted(stored(k8s, PODS)) == ["train-worker-0", "train-worker-1"]


async def test_500s_beyond_the_bound_give_a_clear_error(
    api: ApiClient, k8s: Emulator, caplog: pytest.LogCaptureFixture
) -> None:
    # kmock answers a repeated create with its own 409 before any reaction, so the 500s are
    # scripted on reads: the confirmation's pod list fails every time.
    k8s["list"][PODS] << 500 << {"kind": "Status", "code": 500, "reason": "InternalError"}
    with caplog.at_level(logging.DEBUG), pytest.raises(KubeLaunchError) as caught:
        await launcher(api, k8s, attempts=3).launch(placement())
    assert str(caught.value) == "list pods: HTTP 500 InternalError after 3 attempts"
    assert len(k8s["list"][PODS]) == 6  # 3 by the confirmation, 3 by the rollback
    assert "retrying" in caplog.text
    assert "rollback of acme/train incomplete" in caplog.text


async def test_cancel_and_gc_leave_nothing_of_ours(api: ApiClient, k8s: Emulator) -> None:
    foreign = {"metadata": {"name": "theirs", "namespace": NS, "labels": {"app": "x"}}}
    k8s.objects[PODS, NS, "theirs"] = {**foreign, "spec": {"containers": [{"name": "c"}]}}
    k8s.objects[COSCHED, NS, "theirs"] = foreign
    kube = launcher(api, k8s)
    for job in ("a", "b", "c"):
        await kube.launch(placement(job))
    await kube.delete(placement("a"))
    assert sorted(stored(k8s, PODS)) == [
        "b-worker-0",
        "b-worker-1",
        "c-worker-0",
        "c-worker-1",
        "theirs",
    ]
    deleted = await kube.collect_garbage({"acme/c"})
    # Issue 14: each gang's rendezvous Service goes with it (a's with the delete, b's here).
    assert sorted(deleted) == [
        f"Pod/{NS}/b-worker-0", f"Pod/{NS}/b-worker-1", f"PodGroup/{NS}/b", f"Service/{NS}/rdzv-b"
    ]  # fmt: skip
    assert sorted(stored(k8s, PODS)) == ["c-worker-0", "c-worker-1", "theirs"]
    assert sorted(stored(k8s, COSCHED)) == ["c", "theirs"]
    await kube.collect_garbage(set())
    assert sorted(stored(k8s, PODS)) == ["theirs"]
    assert sorted(stored(k8s, COSCHED)) == ["theirs"]


async def test_read_back_returns_bound_pods(api: ApiClient, k8s: Emulator) -> None:
    kube = launcher(api, k8s, mode="pin")
    await kube.launch(placement("a", pods=2))
    await kube.launch(placement("b", pods=1))
    k8s.objects[PODS, NS, "theirs"] = {
        "metadata": {"name": "theirs", "namespace": NS},
        "spec": {"nodeName": "node-x", "containers": [{"name": "c"}]},
    }
    back = await kube.read_back()
    assert sorted(back) == ["acme/a", "acme/b"]
    assert sorted(back["acme/a"], key=lambda e: e.pod) == [
        PodBound("east", "acme.a-worker-0", "node-x", GPU, (0, 1, 2, 3)),
        PodBound("east", "acme.a-worker-1", "node-x", GPU, (0, 1, 2, 3)),
    ]


async def test_read_back_keys_a_delegated_workloads_pods_as_the_watcher_does(
    api: ApiClient, k8s: Emulator
) -> None:
    """A pod a delegated workload's controller made carries our labels and its index, not
    the ledger's name: read back under that name (as the watcher counts it); one without
    an index takes the lowest index of its pod set no other pod holds; never its bare name."""
    ours = {"fedbroker.io/origin": "fedbroker", "fedbroker.io/tenant": "acme",
            "fedbroker.io/job": "train", "fedbroker.io/pod-set": "worker"}  # fmt: skip
    for name, extra in (("train-worker-1", {"training.kubeflow.org/replica-index": "1"}),
                        ("train-worker-zz", {})):  # fmt: skip
        k8s.objects[PODS, NS, name] = {
            "metadata": {"name": name, "namespace": NS, "labels": {**ours, **extra}},
            "spec": {"nodeName": "node-y", "containers": [{"name": "c"}]},
            "status": {"phase": "Running"},
        }
    back = await launcher(api, k8s).read_back()
    assert sorted(p.pod for p in back["acme/train"]) == [
        "acme.train-worker-0", "acme.train-worker-1"
    ]  # fmt: skip


async def test_canary_token_never_logged_nor_in_errors(
    api: ApiClient, k8s: Emulator, caplog: pytest.LogCaptureFixture
) -> None:
    k8s["list"][PODS] << 503 << {"kind": "Status", "code": 503, "reason": "ServiceUnavailable"}
    texts: list[str] = []
    with caplog.at_level(logging.DEBUG):
        kube = launcher(api, k8s, attempts=2)
        with pytest.raises(KubeLaunchError) as caught:
            await kube.launch(placement())
        texts.append(str(caught.value))
        texts.append(repr(caught.value.__cause__))
        with pytest.raises(KubeLaunchError) as again:
            await kube.collect_garbage(set())
        texts.append(str(again.value))
    # the token did go over the wire...
    assert any(CANARY in r.headers.get("Authorization", "") for r in k8s["post"][PODS])
    # ...but never into logs or errors
    assert caplog.records
    for record in caplog.records:
        texts.append(record.getMessage())
        texts.append(logging.Formatter().format(record))
    assert not [t for t in texts if CANARY in t]


@pytest.mark.parametrize("mode", ["delegate", "pin"])
async def test_another_tenants_job_of_the_same_name_is_refused_and_left_alone(
    api: ApiClient, k8s: Emulator, mode: Mode
) -> None:
    """With a pattern without ``{tenant}`` (one namespace for all: the adapter allows it,
    the config does not), the labels still keep one tenant from adopting another's pods."""
    await launcher(api, k8s, mode=mode, pattern=NS).launch(placement())  # acme/train runs
    before = stored(k8s, PODS), stored(k8s, COSCHED)
    other = KubeLauncher(
        api,
        LaunchSettings(NS, mode, cluster="east", retry_wait=wait_none()),
        kinds=INTEGRATIONS,
        sleep=kubelet(k8s),
        spec_for=lambda p: LaunchSpec(tenant="other", job="train"),
    )
    theirs = Placement(
        "other/train", "east", (PodPlacement("other.train-worker-0", "node-0", (0,), GPU),)
    )
    with pytest.raises(LaunchError, match="does not belong to other/train"):
        await other.launch(theirs)  # its rollback must not delete acme's objects
    await other.delete(theirs)
    assert (stored(k8s, PODS), stored(k8s, COSCHED)) == before
    assert sorted(before[0]) == ["train-worker-0", "train-worker-1"]


async def test_a_pod_list_that_is_not_a_list_object_is_a_clear_error(
    api: ApiClient, k8s: Emulator
) -> None:
    """Our pods are read as the JSON the server sent (no client models): an answer that is
    not a JSON object is the launcher's error naming the call, not a decoding traceback."""
    k8s["list"][PODS] << 200 << b"[1, 2"
    with pytest.raises(KubeLaunchError) as caught:
        await launcher(api, k8s).read_back()
    assert str(caught.value) == "list pods: HTTP 200 the pod list is not a JSON object"
