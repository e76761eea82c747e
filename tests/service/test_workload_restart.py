"""Progress survives a restart (pin mode): a running workload job whose first pods finished
while the broker was away, their successors made and gated, is restored as it was, from
what the member shows (the plan recorded on its workload, its pods as they stand): no
Queued in its history, its workload never deleted, no index made twice, the successors
granted the finished pods' slots, the ledger agreeing with the pods throughout, and it
ends Succeeded by its controller's status. Played against kmock over real HTTP (the API
server's rules, ``tests/kmock_namespaces.py``), the Job and JobSet controllers naming and
labelling pods as upstream does; the broker is closed and a second one started on the
same store, as a restart is."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any, cast

import kmock
import pytest
from builders import Clock, until
from kmock_namespaces import NamespacedEmulator
from launch_faults import books
from test_workload_service import (
    JOBS,
    JOBSETS,
    NS,
    PODS,
    RESOURCES,
    T0,
    clock,
    granted,
    k8s,
    live,
    make_config,
)

from adapters.kube.plan import ANNOTATION_PLAN
from broker.manifest import parse_manifest
from broker.service.facade import Service

__all__ = ["clock", "k8s"]  # fixtures, from the workload service tests
pytestmark = pytest.mark.kmock(cls=NamespacedEmulator)

TEMPLATE = {
    "metadata": {"labels": {"app": "trainer"}},
    "spec": {
        "restartPolicy": "Never",
        "containers": [{
            "name": "main", "image": "trainer:1.0",
            "resources": {"limits": {"nvidia.com/gpu": 1, "cpu": "2", "memory": "4Gi"}},
        }],
    },
}  # fmt: skip
INDEXED_JOB = {  # 6 indexes, 3 at a time: the broker places 3 pods
    "apiVersion": "batch/v1", "kind": "Job",
    "spec": {"completionMode": "Indexed", "completions": 6, "parallelism": 3,
             "backoffLimit": 0, "template": TEMPLATE},
}  # fmt: skip
JOBSET = {  # a driver and 4 workers
    "apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
    "spec": {"replicatedJobs": [
        {"name": "driver", "replicas": 1, "template": {"spec": {"template": TEMPLATE}}},
        {"name": "workers", "replicas": 1, "template": {"spec": {
            "completionMode": "Indexed", "completions": 4, "parallelism": 4,
            "template": TEMPLATE}}},
    ]},
}  # fmt: skip


def submission(workload: dict[str, Any]) -> Any:
    body = {"apiVersion": "fedbroker.io/v1alpha1", "kind": "FederatedJob",
            "metadata": {"name": "train"}, "spec": {"workload": workload}}  # fmt: skip
    return parse_manifest(json.dumps(body).encode(), "application/json")


async def started(k8s: kmock.KubernetesEmulator, tmp_path: Path, clock: Clock) -> Service:
    service = Service(make_config(tmp_path, str(k8s.url).rstrip("/")), clock=clock)
    await service.start()
    return service


def make_pod(
    k8s: kmock.KubernetesEmulator, kind: str, template: dict[str, Any], name: str,
    labels: dict[str, str],
) -> str:  # fmt: skip
    """Play the controller: one pod from the stored workload's ``template`` (its gate and
    all), named and labelled as the controller does, through the member's rules."""
    owner = live(k8s, RESOURCES[kind])["train"].raw
    return cast(NamespacedEmulator, k8s).controller_create(PODS, NS, {
        "apiVersion": "v1", "kind": "Pod", "spec": copy.deepcopy(template["spec"]),
        "metadata": {
            "name": name, "namespace": NS, "uid": f"uid-{name}",
            "labels": {**template["metadata"]["labels"], **labels},
            "creationTimestamp": "2026-01-01T00:00:00Z",
            "ownerReferences": [{"apiVersion": owner["apiVersion"], "kind": kind,
                                 "name": "train", "uid": "uid-train", "controller": True}],
        },
    })  # fmt: skip


def job_index(k8s: kmock.KubernetesEmulator, index: int) -> str:
    """The batch Job controller (1.31+) makes index ``index``: ``<job>-<index>-<random>``."""
    template = live(k8s, JOBS)["train"].raw["spec"]["template"]
    labels = {"batch.kubernetes.io/job-name": "train", "job-name": "train",
              "batch.kubernetes.io/job-completion-index": str(index)}  # fmt: skip
    return make_pod(k8s, "Job", template, f"train-{index}-r{index}x7q", labels)


def jobset_pod(k8s: kmock.KubernetesEmulator, replicated: int, index: int) -> str:
    """The JobSet controller's child Job ``train-<replicated job>-0`` makes pod ``index``."""
    rj = live(k8s, JOBSETS)["train"].raw["spec"]["replicatedJobs"][replicated]
    name = rj["name"]
    labels = {"jobset.sigs.k8s.io/jobset-name": "train",
              "jobset.sigs.k8s.io/replicatedjob-name": name, "jobset.sigs.k8s.io/job-index": "0",
              "batch.kubernetes.io/job-completion-index": str(index)}  # fmt: skip
    template = rj["template"]["spec"]["template"]
    return make_pod(k8s, "JobSet", template, f"train-{name}-0-{index}-q{index}z4k", labels)


async def run_pods(service: Service, k8s: kmock.KubernetesEmulator, names: list[str]) -> None:
    """The broker grants the gated ``names`` their slots; the scheduler and kubelet run them
    (through the API: the broker hears its pods by a watch)."""
    for name, node in (await granted(k8s, names)).items():
        await cast(NamespacedEmulator, k8s).patch_pod(
            NS, name, {"spec": {"nodeName": node}, "status": {"phase": "Running"}}
        )
    await until(lambda: not books(service, k8s))


async def phase(k8s: kmock.KubernetesEmulator, names: list[str], value: str) -> None:
    """The kubelet reports ``names`` in phase ``value``."""
    for name in names:
        await cast(NamespacedEmulator, k8s).patch_pod(NS, name, {"status": {"phase": value}})


async def states(service: Service) -> list[str]:
    return [t.state for t in await service.store.history("team-a", "train")]


async def test_an_indexed_job_whose_first_indexes_finished_meanwhile_goes_on(
    k8s: kmock.KubernetesEmulator, tmp_path: Path, clock: Clock
) -> None:
    first = await started(k8s, tmp_path, clock)
    try:
        await first.submit("team-a", submission(INDEXED_JOB))
        await first.schedule_once()
        await until(lambda: "train" in live(k8s, JOBS))
        made = [job_index(k8s, i) for i in range(3)]
        await run_pods(first, k8s, made)
        await first.launches_done(timeout=10)
        assert (await first.get("team-a", "train")).state == "Running"
        recorded = json.loads(
            live(k8s, JOBS)["train"].raw["metadata"]["annotations"][ANNOTATION_PLAN]
        )
        assert sorted(s[0] for s in recorded["slots"]) == ["main-0", "main-1", "main-2"]
        uid = live(k8s, JOBS)["train"].raw["metadata"]["uid"]
    finally:
        await first.close()
    # While the broker is away: indexes 0-2 finish, the controller makes 3-5, gated.
    await phase(k8s, made, "Succeeded")
    successors = [job_index(k8s, i) for i in range(3, 6)]
    clock.now = T0 + 60
    second = await started(k8s, tmp_path, clock)
    try:
        launch = second.lifecycle.get("team-a/train")
        assert launch is not None and launch.running  # restored, followed
        assert await states(second) == ["Queued", "Placed", "Running"]
        assert not books(second, k8s)  # nothing runs: nothing held
        await run_pods(second, k8s, successors)  # the finished pods' slots, granted
        slots = {live(k8s, PODS)[n].raw["metadata"]["annotations"]["fedbroker.io/pod"]
                 for n in successors}  # fmt: skip
        assert slots == {"team-a.train-main-0", "team-a.train-main-1", "team-a.train-main-2"}
        await phase(k8s, successors, "Succeeded")
        live(k8s, JOBS)["train"].patch({"status": {"conditions": [
            {"type": "Complete", "status": "True", "reason": "CompletionsReached",
             "message": "Reached expected number of succeeded pods"}]}})  # fmt: skip
        await second.runs_done(timeout=10)
        assert await states(second) == ["Queued", "Placed", "Running", "Succeeded"]
        assert live(k8s, JOBS)["train"].raw["metadata"]["uid"] == uid  # never deleted
        indexes = sorted(
            int(p.raw["metadata"]["labels"]["batch.kubernetes.io/job-completion-index"])
            for p in live(k8s, PODS).values()
        )
        assert indexes == [0, 1, 2, 3, 4, 5]  # each made once, none deleted
        assert not second.ledger.reservations() and not books(second, k8s)
    finally:
        await second.close()


async def test_a_jobset_whose_driver_finished_meanwhile_keeps_its_workers(
    k8s: kmock.KubernetesEmulator, tmp_path: Path, clock: Clock
) -> None:
    first = await started(k8s, tmp_path, clock)
    try:
        await first.submit("team-a", submission(JOBSET))
        await first.schedule_once()
        await until(lambda: "train" in live(k8s, JOBSETS))
        driver = jobset_pod(k8s, 0, 0)
        workers = [jobset_pod(k8s, 1, i) for i in range(4)]
        await run_pods(first, k8s, [driver, *workers])
        await first.launches_done(timeout=10)
        assert (await first.get("team-a", "train")).state == "Running"
    finally:
        await first.close()
    await phase(k8s, [driver], "Succeeded")
    second = await started(k8s, tmp_path, clock)
    try:
        launch = second.lifecycle.get("team-a/train")
        assert launch is not None and launch.running
        assert len(launch.placement.pods) == 5  # the reservation is the whole plan
        assert not books(second, k8s)  # the 4 workers held, the driver's slot free
        held = sum(
            4000 - n.free_milli for n in second.ledger.snapshot().clusters["east"].nodes.values()
        )
        assert held == 4 * 1000
        await phase(k8s, workers, "Succeeded")
        live(k8s, JOBSETS)["train"].patch({"status": {"conditions": [
            {"type": "Completed", "status": "True", "reason": "AllJobsCompleted",
             "message": "jobset completed successfully"}]}})  # fmt: skip
        await second.runs_done(timeout=10)
        assert await states(second) == ["Queued", "Placed", "Running", "Succeeded"]
        assert sorted(live(k8s, PODS)) == sorted([driver, *workers])  # none made again
        assert not books(second, k8s)
    finally:
        await second.close()


async def test_a_job_still_starting_is_adopted_and_its_gated_pods_granted(
    k8s: kmock.KubernetesEmulator, tmp_path: Path, clock: Clock
) -> None:
    first = await started(k8s, tmp_path, clock)
    try:
        await first.submit("team-a", submission(INDEXED_JOB))
        await first.schedule_once()
        await until(lambda: "train" in live(k8s, JOBS))
        made = [job_index(k8s, 0)]  # the controller is slow: 1 pod of 3 so far
        await run_pods(first, k8s, made)
        assert (await first.get("team-a", "train")).state == "Placed"
    finally:
        await first.close()
    later = [job_index(k8s, i) for i in (1, 2)]  # made, gated, while the broker is away
    second = await started(k8s, tmp_path, clock)
    try:
        launch = second.lifecycle.get("team-a/train")
        assert launch is not None and not launch.running  # adopted, still starting
        await run_pods(second, k8s, later)
        await second.launches_done(timeout=10)
        assert await states(second) == ["Queued", "Placed", "Running"]
        slots = {live(k8s, PODS)[n].raw["metadata"]["annotations"]["fedbroker.io/pod"]
                 for n in [*made, *later]}  # fmt: skip
        assert slots == {"team-a.train-main-0", "team-a.train-main-1", "team-a.train-main-2"}
        assert not books(second, k8s)
    finally:
        await second.close()


async def test_a_workload_that_ended_while_the_broker_was_away_is_recorded_so(
    k8s: kmock.KubernetesEmulator, tmp_path: Path, clock: Clock
) -> None:
    first = await started(k8s, tmp_path, clock)
    try:
        await first.submit("team-a", submission(INDEXED_JOB))
        await first.schedule_once()
        await until(lambda: "train" in live(k8s, JOBS))
        made = [job_index(k8s, i) for i in range(3)]
        await run_pods(first, k8s, made)
        await first.launches_done(timeout=10)
    finally:
        await first.close()
    await phase(k8s, made, "Failed")
    live(k8s, JOBS)["train"].patch({"status": {"conditions": [
        {"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded",
         "message": "Job has reached the specified backoff limit"}]}})  # fmt: skip
    second = await started(k8s, tmp_path, clock)
    try:
        await second.runs_done(timeout=10)
        record = await second.get("team-a", "train")
        assert record.state == "Failed" and "BackoffLimitExceeded" in record.reason
        assert await states(second) == ["Queued", "Placed", "Running", "Failed"]
        assert not second.ledger.reservations() and not books(second, k8s)
    finally:
        await second.close()


async def running_indexed_job(k8s: kmock.KubernetesEmulator, tmp_path: Path, clock: Clock) -> None:
    """A broker runs the Indexed Job's first 3 indexes, then stops."""
    first = await started(k8s, tmp_path, clock)
    try:
        await first.submit("team-a", submission(INDEXED_JOB))
        await first.schedule_once()
        await until(lambda: "train" in live(k8s, JOBS))
        await run_pods(first, k8s, [job_index(k8s, i) for i in range(3)])
        await first.launches_done(timeout=10)
    finally:
        await first.close()


async def test_a_workload_recording_no_plan_is_restored_from_the_stored_placement(
    k8s: kmock.KubernetesEmulator, tmp_path: Path, clock: Clock
) -> None:
    # Made by a broker that recorded no plan (one too large to record, or an older one).
    await running_indexed_job(k8s, tmp_path, clock)
    live(k8s, JOBS)["train"].patch({"metadata": {"annotations": {ANNOTATION_PLAN: None}}})
    assert ANNOTATION_PLAN not in live(k8s, JOBS)["train"].raw["metadata"]["annotations"]
    second = await started(k8s, tmp_path, clock)
    try:
        launch = second.lifecycle.get("team-a/train")
        assert launch is not None and launch.running
        assert await states(second) == ["Queued", "Placed", "Running"]
        assert not books(second, k8s)
    finally:
        await second.close()


def on_other_nodes(k8s: kmock.KubernetesEmulator) -> str:
    """The Job's recorded plan with every slot on the other node of the two."""
    plan = json.loads(live(k8s, JOBS)["train"].raw["metadata"]["annotations"][ANNOTATION_PLAN])
    for slot in plan["slots"]:
        slot[1] = {"n1": "n2", "n2": "n1"}[slot[1]]
    return json.dumps(plan)


@pytest.mark.parametrize("plan", ["unreadable", "another"])
async def test_a_workload_whose_plan_is_unreadable_or_another_is_requeued(
    k8s: kmock.KubernetesEmulator, tmp_path: Path, clock: Clock, plan: str
) -> None:
    await running_indexed_job(k8s, tmp_path, clock)
    text = "{not json" if plan == "unreadable" else on_other_nodes(k8s)
    live(k8s, JOBS)["train"].patch({"metadata": {"annotations": {ANNOTATION_PLAN: text}}})
    second = await started(k8s, tmp_path, clock)
    try:
        record = await second.get("team-a", "train")
        assert (record.state, record.reason) == ("Queued", "requeued after broker restart")
        assert "train" not in live(k8s, JOBS)  # its leftovers collected
    finally:
        await second.close()
