"""What the launcher reads through each registered kind (``broker.ports.WorkloadKind``),
against a kmock member with the kind's controller played as upstream does it: a RayJob
whose first attempt fails is retried by KubeRay (``jobDeploymentStatus: Retrying``, a new
Ray cluster and submitter) and only then ends Failed; ``ValidationFailed`` ends it at once
with KubeRay's reason; a RayJob's submitter, made only once the Ray cluster is ready, is
waited for neither by the gang's start nor by its PodGroup; a JobSet's pods take the slot
of their global index; an object another controller made with our labels (a RayJob's
RayCluster) is neither adopted nor garbage-collected."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from kmock_namespaces import NamespacedEmulator
from kubernetes.aio.client import ApiClient
from workload_cluster import (
    COSCHED,
    JOB,
    KIND_RES,
    NS,
    PODS,
    WORKLOADS,
    Emulator,
    admitted,
    cluster,
    launcher,
    stored,
    workload,
)

from adapters.kube.objects import KubeLaunchError, Mode
from adapters.kube.pods import ANNOTATION_SLOT
from broker.manifest.workloads import batchjob, jobset
from broker.ports import RunEnd

pytestmark = pytest.mark.kmock(cls=NamespacedEmulator)

Obj = dict[str, Any]
RAY_FAILED = "Job entrypoint command failed with exit code 1"
INVALID = "The RayJob spec is invalid: the RayClusterSpec must set headGroupSpec"
SUBMITTER = "submitter"


def ray_status(k8s: Emulator, **status: Any) -> None:
    """KubeRay writes the RayJob's status."""
    k8s.objects[KIND_RES["RayJob"], NS, JOB].patch({"status": status})


def ray_pods(k8s: Emulator) -> dict[str, Obj]:
    return {n: p for n, p in stored(k8s, PODS).items() if n.startswith(f"{JOB}-")}


async def test_a_rayjob_retried_by_kuberay_runs_on_and_fails_only_after_its_last_attempt(
    api: ApiClient, k8s: Emulator
) -> None:
    """``backoffLimit: 1``: the first attempt fails (jobStatus FAILED, Retrying), KubeRay
    deletes that Ray cluster and makes a new one and a new submitter, which take the
    freed slots; only the second failure (deployment Failed) ends the job."""
    WORKLOADS["RayJob"]["spec"]["backoffLimit"] = 1
    try:
        placement, spec = admitted("RayJob")
    finally:
        del WORKLOADS["RayJob"]["spec"]["backoffLimit"]
    assert spec.workload is not None and spec.workload.object["spec"]["backoffLimit"] == 1
    member = cluster(k8s, "RayJob", placement, spec)
    kube = launcher(api, member.step)
    await kube.launch(placement, spec)
    ray_status(k8s, jobStatus="RUNNING", jobDeploymentStatus="Running")
    first = set(ray_pods(k8s))
    assert len(first) == len(placement.pods)
    story: list[Callable[[], None]] = []
    seen: list[str] = []

    def attempt_fails() -> None:
        ray_status(k8s, jobStatus="FAILED", jobDeploymentStatus="Retrying", failed=1,
                   reason="AppFailed", message=RAY_FAILED)  # fmt: skip
        for name in first:  # the old Ray cluster and submitter are deleted
            k8s.objects[PODS, NS, name].delete()

    def second_attempt() -> None:
        ray_status(k8s, jobStatus="RUNNING", jobDeploymentStatus="Running", failed=1)
        member.made = 0  # the new Ray cluster and submitter: every pod made again

    def last_attempt_fails() -> None:
        ray_status(k8s, jobStatus="FAILED", jobDeploymentStatus="Failed", failed=2,
                   reason="AppFailed", message=RAY_FAILED)  # fmt: skip

    story += [attempt_fails, second_attempt, lambda: None, last_attempt_fails]

    async def kuberay(_: float) -> None:
        member.bounded()
        seen.append(str((workload(k8s, "RayJob") or {})["status"]["jobDeploymentStatus"]))
        story.pop(0)()
        member.control()
        member.schedule()

    kube.pause = kuberay
    end = await kube.finished(placement, spec)
    assert end == RunEnd(False, "AppFailed", RAY_FAILED)
    assert story == [] and seen == ["Running", "Retrying", "Running", "Running"]
    second = ray_pods(k8s)
    assert not set(second) & first and len(second) == len(placement.pods)
    # The second attempt's pods ran on the slots the first attempt's freed.
    slots = {p["metadata"]["annotations"][ANNOTATION_SLOT] for p in second.values()}
    assert slots == {p.pod.removeprefix(f"acme.{JOB}-") for p in placement.pods}
    assert {p["status"]["phase"] for p in second.values()} == {"Running"}


async def test_validation_failed_ends_a_launching_rayjob_at_once_with_kuberays_reason(
    api: ApiClient, k8s: Emulator
) -> None:
    """KubeRay refuses the spec before any pod: the launch fails on the next poll, naming
    KubeRay's reason and message, instead of waiting out the gang timeout, and as a refusal
    for good (the job fails at the refusal limit rather than retrying for ever)."""
    placement, spec = admitted("RayJob")
    member = cluster(k8s, "RayJob", placement, spec, bind=False)
    polls = 0

    async def step(_: float) -> None:
        nonlocal polls
        polls += 1
        ray_status(k8s, jobDeploymentStatus="ValidationFailed", reason="ValidationFailed",
                   message=INVALID)  # fmt: skip
        member.control()

    with pytest.raises(KubeLaunchError) as caught:
        await launcher(api, step).launch(placement, spec)
    assert str(caught.value) == f"gang acme/train: RayJob {NS}/{JOB} ValidationFailed: {INVALID}"
    assert caught.value.permanent
    assert polls == 1
    assert workload(k8s, "RayJob") is None  # rolled back


async def test_validation_failed_ends_a_running_rayjob_at_once_with_kuberays_reason(
    api: ApiClient, k8s: Emulator
) -> None:
    placement, spec = admitted("RayJob")
    member = cluster(k8s, "RayJob", placement, spec)
    kube = launcher(api, member.step)
    await kube.launch(placement, spec)
    ray_status(k8s, jobStatus="RUNNING", jobDeploymentStatus="Running")
    ray_status(k8s, jobDeploymentStatus="ValidationFailed", reason="ValidationFailed",
               message=INVALID)  # fmt: skip
    at = member.polls
    end = RunEnd(False, "ValidationFailed", INVALID, refused=True)
    assert await kube.finished(placement, spec) == end
    assert member.polls == at  # read at the first look, no poll more


@pytest.mark.parametrize("mode", ["pin", "delegate"])
async def test_a_rayjob_has_started_once_its_ray_cluster_runs_without_its_submitter(
    api: ApiClient, k8s: Emulator, mode: Mode
) -> None:
    """KubeRay makes the submitter only once the Ray cluster is ready: neither the start
    nor the PodGroup's minMember waits for it."""
    placement, spec = admitted("RayJob")
    member = cluster(k8s, "RayJob", placement, spec)
    early = sum(1 for p in placement.pods if f"-{SUBMITTER}-" not in p.pod)
    assert early == len(placement.pods) - 1
    kube = launcher(api, member.step, mode)

    async def without_submitter(_: float) -> None:
        member.bounded()
        member.control(limit=max(early - member.made, 0))  # pod sets in order: submitter last
        member.schedule()

    kube.pause = without_submitter
    await kube.launch(placement, spec)
    names = set(ray_pods(k8s))
    assert len(names) == early and not any(n == JOB for n in names)  # no submitter yet
    if mode == "delegate":
        assert stored(k8s, COSCHED)[JOB]["spec"]["minMember"] == early


async def test_jobset_pods_take_the_slot_of_their_global_index(
    api: ApiClient, k8s: Emulator
) -> None:
    """Workers: 2 Jobs of 2 pods, Job 1's pods made first: the pod of Job 1, completion
    index 0, is worker 2 (not worker 1, as its Job's index alone would say)."""
    placement, spec = admitted("JobSet")
    member = cluster(k8s, "JobSet", placement, spec)

    def make(pod_set: str, job: int, within: int) -> None:
        member.make(pod_set, f"{JOB}-{pod_set}-{job}-{within}", {
            jobset.REPLICATED_JOB: pod_set, jobset.JOB_INDEX: str(job),
            batchjob.COMPLETION_INDEX: str(within)})  # fmt: skip

    async def controller(_: float) -> None:  # JobSet makes Job 1's pods, then Job 0's
        member.bounded()
        if member.polls == 1:
            make("driver", 0, 0)
            make("workers", 1, 0)
            make("workers", 1, 1)
        elif member.polls == 2:
            make("workers", 0, 0)
            make("workers", 0, 1)
        member.schedule()

    await launcher(api, controller).launch(placement, spec)
    workers = {
        n: p for n, p in member.pods().items() if p["metadata"]["labels"].get(
            jobset.REPLICATED_JOB) == "workers"
    }  # fmt: skip
    assert len(workers) == 4
    for name, pod in workers.items():
        labels = pod["metadata"]["labels"]
        index = 2 * int(labels[jobset.JOB_INDEX]) + int(labels[batchjob.COMPLETION_INDEX])
        assert pod["metadata"]["annotations"][ANNOTATION_SLOT] == f"workers-{index}", name


def _controlled_by(owner: Obj) -> list[Obj]:
    meta = owner["metadata"]
    return [{"apiVersion": owner["apiVersion"], "kind": owner["kind"], "name": meta["name"],
             "uid": meta["uid"], "controller": True, "blockOwnerDeletion": True}]  # fmt: skip


async def test_the_ray_cluster_of_a_rayjob_is_not_collected_as_the_brokers_own(
    api: ApiClient, k8s: Emulator
) -> None:
    """KubeRay copies the RayJob's labels onto the RayCluster it makes: with the job gone,
    only the RayJob is deleted (the member's garbage collector takes its RayCluster)."""
    kube = launcher(api, lambda _: _never())
    await kube.workloads.create(*admitted("RayJob"))
    if not (workload(k8s, "RayJob") or {})["metadata"].get("uid"):
        k8s.objects[KIND_RES["RayJob"], NS, JOB].patch({"metadata": {"uid": "uid-rayjob"}})
    rayjob = workload(k8s, "RayJob")
    assert rayjob is not None
    name = f"{JOB}-x7k2p"
    made: Obj = {"apiVersion": "ray.io/v1", "kind": "RayCluster", "spec": {}, "metadata": {
        "name": name, "namespace": NS, "labels": dict(rayjob["metadata"]["labels"]),
        "ownerReferences": _controlled_by(rayjob)}}  # fmt: skip
    k8s.objects[KIND_RES["RayCluster"], NS, name] = made
    assert await kube.collect_garbage(set()) == [f"RayJob/{NS}/{JOB}"]
    assert not k8s["delete"][KIND_RES["RayCluster"]]


async def test_a_controlled_object_of_the_jobs_name_and_labels_is_not_adopted(
    api: ApiClient, k8s: Emulator
) -> None:
    placement, spec = admitted("RayCluster")
    owner = {"apiVersion": "ray.io/v1", "kind": "RayJob",
             "metadata": {"name": "theirs", "uid": "uid-theirs"}}  # fmt: skip
    labels = {"fedbroker.io/origin": "fedbroker", "fedbroker.io/tenant": "acme",
              "fedbroker.io/job": JOB}  # fmt: skip
    theirs = {"apiVersion": "ray.io/v1", "kind": "RayCluster", "spec": {}, "metadata": {
        "name": JOB, "namespace": NS, "labels": labels,
        "ownerReferences": _controlled_by(owner)}}  # fmt: skip
    k8s.objects[KIND_RES["RayCluster"], NS, JOB] = theirs
    kube = launcher(api, lambda _: _never())
    with pytest.raises(KubeLaunchError, match="does not belong to acme/train") as caught:
        await kube.launch(placement, spec)
    assert caught.value.permanent
    assert not k8s["delete"][KIND_RES["RayCluster"]]


async def _never() -> None:
    raise AssertionError("no poll expected")
