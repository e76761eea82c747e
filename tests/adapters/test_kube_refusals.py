"""How the Kubernetes launcher reads a member's failures (``adapters.kubeapi.calls``,
``adapters.kube.launch``/``tenancy``/``namespace``/``run_watch``/``our_pods``), against
kmock over real HTTP (``tests/launch_faults.py``'s member that fails on cue): a create
refused with 400/403/404/409/422 is a permanent ``KubeLaunchError`` (the 404 only once the
namespace was ensured again; a 409 only for an object that is not this job's), 5xx, 429
and unreadable answers are transient, a body the client's model refuses is never sent and
is permanent, naming the field; a gang's run watch outlives an unexpected exception of its
list+watch and a decision that raises ends only that gang's follow, with the error."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any, cast

import aiohttp
import kmock as kmocklib
import pytest
from builders import until
from kubernetes.aio.client import ApiClient, Configuration
from kubernetes.aio.client.exceptions import ApiException
from launch_faults import REFUSAL, FaultyMember
from tenacity import wait_none

from adapters.kube.launch import KubeLauncher
from adapters.kube.objects import KubeLaunchError
from adapters.kube.settings import LaunchSettings
from adapters.kubeapi.calls import UnreadableAnswer, describe, refused, transient
from broker.manifest.workloads import INTEGRATIONS
from broker.model import Placement, PodPlacement, Resources
from broker.ports import LaunchSpec, RunEnd

pytestmark = pytest.mark.kmock(cls=FaultyMember)

NS = "team-acme"
PODS = kmocklib.resource("", "v1", "pods")
GPU = Resources(gpus=1, cpu_milli=1000, memory_mib=1024)


@pytest.fixture
async def member(kmock: Any) -> FaultyMember:
    k8s = cast(FaultyMember, kmock)
    for name in ("v1/pods", "v1/services", "scheduling.x-k8s.io/v1alpha1/podgroups"):
        k8s.resources[name] = kmocklib.ResourceInfo(namespaced=True)
    return k8s


@pytest.fixture
async def api(member: FaultyMember) -> AsyncIterator[ApiClient]:
    async with ApiClient(Configuration(host=str(member.url).rstrip("/"))) as client:
        yield client


def placement(job: str = "train") -> Placement:
    pod = PodPlacement(f"acme.{job}-worker-0", "node-0", (0,), GPU)
    return Placement(f"acme/{job}", "east", (pod,))


def launcher(api: ApiClient, member: FaultyMember, template: dict[str, Any] | None = None) -> Any:
    """A pin-mode launcher of ``acme``'s jobs; its poll pause runs our pods (the kubelet)."""

    async def kubelet(_: float) -> None:
        await member.run_pods("node-0", "Running")

    templates = {"worker": template} if template is not None else {}
    return KubeLauncher(
        api, LaunchSettings("team-{tenant}", "pin", cluster="east", attempts=2,
                            retry_wait=wait_none(), request_timeout=5),
        kinds=INTEGRATIONS, sleep=kubelet,
        spec_for=lambda p: LaunchSpec(tenant="acme", job=p.job.split("/")[1],
                                      pod_templates=templates),
    )  # fmt: skip


# The pure reading of an answer: (status, a create's refusal for good, worth a retry).
STATUSES = [
    (400, True, False), (403, True, False), (404, True, False), (409, True, False),
    (422, True, False), (401, False, False), (429, False, True), (500, False, True),
    (503, False, True), (504, False, True),
]  # fmt: skip


@pytest.mark.parametrize(("status", "refusal", "retried"), STATUSES)
def test_each_status_is_read_as_the_api_conventions_say(
    status: int, refusal: bool, retried: bool
) -> None:
    exc = ApiException(status=status, reason="x")
    assert (refused(exc), transient(exc)) == (refusal, retried)


@pytest.mark.parametrize(
    ("exc", "retried"),
    [
        (aiohttp.ServerDisconnectedError(), True),
        (aiohttp.ClientPayloadError("cut short"), True),
        (TimeoutError(), True),
        (UnreadableAnswer("ValidationError"), True),
        (ValueError("ours"), False),
    ],
)
def test_connection_problems_and_unreadable_answers_are_retried(
    exc: BaseException, retried: bool
) -> None:
    assert transient(exc) is retried and not refused(exc)


def test_an_unreadable_answer_is_described_by_its_type_only() -> None:
    assert describe(UnreadableAnswer("ValidationError")) == "unreadable answer (ValidationError)"


# (the step failing, its status) -> whether the launch's error is a refusal for good.
CREATES = [
    ("namespace", 403, True), ("namespace", 422, True), ("namespace", 503, False),
    ("create", 400, True), ("create", 403, True), ("create", 404, True),
    ("create", 422, True), ("create", 429, False), ("create", 500, False),
]  # fmt: skip


@pytest.mark.parametrize(("step", "status", "permanent"), CREATES)
async def test_a_create_refused_for_good_is_permanent(
    api: ApiClient, member: FaultyMember, step: Any, status: int, permanent: bool
) -> None:
    member.inject(step, "refused", status)
    with pytest.raises(KubeLaunchError) as caught:
        await launcher(api, member).launch(placement())
    assert caught.value.permanent is permanent
    assert f"HTTP {status}" in str(caught.value)
    if permanent:
        assert REFUSAL in str(caught.value)  # the member's own message
    else:
        assert str(caught.value).endswith("after 2 attempts")  # retried first
    if step == "create" and status == 404:  # the namespace was ensured again, in between
        assert member.hits["create"] == 2 and member.calls("GET").count(NS) == 2


async def test_an_object_of_that_name_that_is_not_ours_is_a_permanent_refusal(
    api: ApiClient, member: FaultyMember
) -> None:
    member.objects[PODS, NS, "train-worker-0"] = {
        "metadata": {"name": "train-worker-0", "namespace": NS, "labels": {"app": "other"}}
    }
    with pytest.raises(KubeLaunchError, match="does not belong to acme/train") as caught:
        await launcher(api, member).launch(placement())
    assert caught.value.permanent


async def test_an_answer_the_client_cannot_read_is_retried_then_transient(
    api: ApiClient, member: FaultyMember
) -> None:
    member.inject("create", "garbage")
    with pytest.raises(KubeLaunchError) as caught:
        await launcher(api, member).launch(placement())
    assert not caught.value.permanent
    assert str(caught.value) == (
        "create service team-acme/rdzv-train: unreadable answer (ValidationError) after 2 attempts"
    )


@pytest.mark.parametrize(
    ("field", "value", "where"),
    [
        ("terminationGracePeriodSeconds", "30", "V1PodSpec.terminationGracePeriodSeconds"),
        ("containers", [{"name": "c", "image": "i", "resources": {"limits": {"cpu": 1}}}],
         "V1ResourceRequirements.limits.cpu"),
    ],
)  # fmt: skip
async def test_a_pod_the_clients_model_refuses_is_never_sent(
    api: ApiClient, member: FaultyMember, field: str, value: Any, where: str
) -> None:
    template = {"spec": {"containers": [{"name": "c", "image": "i"}], field: value}}
    with pytest.raises(KubeLaunchError) as caught:
        await launcher(api, member, template).launch(placement())
    assert caught.value.permanent
    assert str(caught.value).startswith(
        f"create pod {NS}/train-worker-0: the client refuses {where}"
    )
    assert len(member["post"][PODS]) == 0  # nothing sent


async def test_a_followed_gang_outlives_an_unreadable_watch_event(
    api: ApiClient, member: FaultyMember
) -> None:
    kube = launcher(api, member)
    await kube.launch(placement())
    ended: asyncio.Future[RunEnd] = asyncio.get_running_loop().create_future()
    handle = kube.watch(placement(), ended.set_result)
    try:
        member.inject("watch", "garbage")  # the next watch of our pods: an unreadable event
        await until(lambda: member.hits["watch"] > 0, timeout=30)
        assert kube.runs.following  # the list+watch goes on, relisting after a backoff
        member.recover()
        await member.run_pods("node-0", "Succeeded")
        async with asyncio.timeout(30):
            assert await ended == RunEnd(True)
    finally:
        handle.cancel()


async def test_a_decision_that_raises_ends_that_gangs_follow_with_the_error(
    api: ApiClient, member: FaultyMember
) -> None:
    kube = launcher(api, member)
    await kube.launch(placement())
    ends: list[RunEnd] = []

    def on_end(end: RunEnd) -> None:
        ends.append(end)
        if end.error is None:
            raise RuntimeError("the handler of a normal end failed")

    kube.watch(placement(), on_end)
    await member.run_pods("node-0", "Failed")
    await until(lambda: len(ends) == 2, timeout=30)
    first, second = ends
    assert first == RunEnd(False, "PodFailed", "pod train-worker-0 failed")
    assert isinstance(second.error, RuntimeError) and not second.succeeded
    assert not kube.runs.following  # its follow is over: nothing else was followed
