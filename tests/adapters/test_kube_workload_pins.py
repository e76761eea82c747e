"""Workload jobs launched end to end in a Kubernetes member (kmock over real HTTP, the real
``kubernetes.aio`` client). The test plays what the launcher leaves to others
(tests/adapters/workload_cluster.py): each kind's controller makes pods from the stored
workload, a scheduler and kubelet bind each ungated pod where its affinity says. Pin mode:
every planned pod gets a slot of its own pod set and no node more pods than its slots,
extra pods stay gated with one Event, a restarted launcher adopts the workload and keeps
the slots granted, a finished pod's slot goes to the controller's next pod. Any mode: a
failure before the gang ran rolls the workload back."""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from typing import Any

import pytest
from kmock_namespaces import NamespacedEmulator
from kubernetes.aio.client import ApiClient
from workload_cluster import (
    COSCHED,
    EVENTS,
    JOB,
    KIND_RES,
    KINDS,
    NS,
    PODS,
    VOLCANO,
    WORKLOADS,
    Cluster,
    Emulator,
    admitted,
    cluster,
    launcher,
    node_of,
    pod_set_label,
    stored,
    workload,
)

from adapters.kube.objects import Flavor, KubeLaunchError, Mode
from adapters.kube.pods import ANNOTATION_SLOT
from adapters.kube.slots import NO_SLOT_REASON, gated
from adapters.kube.translate import ANNOTATION_GPUS, ANNOTATION_POD
from adapters.kube.workloads import GATE
from broker.model import Placement
from broker.ports import LaunchError, RunEnd

pytestmark = pytest.mark.kmock(cls=NamespacedEmulator)

Obj = dict[str, Any]
INDEX = "batch.kubernetes.io/job-completion-index"


def assert_pinned(member: Cluster, placement: Placement, granted: dict[str, Obj]) -> None:
    """Each granted pod holds its own slot of its pod set, pinned to that slot's node; no
    slot is held twice and no node ever ran more pods than the placement gave it."""
    slots, job = {p.pod: p for p in placement.pods}, member.spec.job
    held = Counter(p["metadata"]["annotations"][ANNOTATION_POD] for p in granted.values())
    assert held == Counter(slots.keys()), "every slot held by exactly one pod"
    for name, pod in granted.items():
        notes = pod["metadata"]["annotations"]
        slot = slots[notes[ANNOTATION_POD]]
        assert slot.pod.startswith(f"acme.{job}-{pod_set_label(pod)}-"), name
        assert node_of(pod) == slot.node, name
        assert notes[ANNOTATION_GPUS] == ",".join(map(str, slot.gpus))
        assert notes[ANNOTATION_SLOT] == slot.pod.removeprefix(f"acme.{job}-")
        assert "schedulingGates" not in pod["spec"]
        assert member.spec.workload is not None
        index = KINDS[member.kind].pod_index(member.spec.workload.object, pod)
        if index is not None:  # a JobSet's: its global index, job-index x parallelism + own
            assert slot.pod.rpartition("-")[2] == str(index), f"{name}: the slot of its index"
    per_node = Counter(p.node for p in placement.pods)
    assert set(per_node) <= set(member.peak), "the scheduler ran pods on every node"
    assert all(member.peak[node] <= n for node, n in per_node.items()), member.peak


def split(pods: dict[str, Obj]) -> tuple[dict[str, Obj], dict[str, Obj]]:
    """The pods granted a slot, and those still gated."""
    return ({n: p for n, p in pods.items() if not gated(p)},
            {n: p for n, p in pods.items() if gated(p)})  # fmt: skip


@pytest.mark.parametrize("kind", sorted(WORKLOADS))
async def test_pin_mode_runs_the_planned_pods_on_their_slots_and_holds_extras(
    api: ApiClient, k8s: Emulator, kind: str
) -> None:
    placement, spec = admitted(kind)
    member = cluster(k8s, kind, placement, spec, extra=1)
    kube = launcher(api, member.step)
    await kube.launch(placement, spec)
    granted, held = split(member.pods())
    assert {p["status"]["phase"] for p in granted.values()} == {"Running"}
    assert_pinned(member, placement, granted)
    assert set(member.peak) == {p.node for p in placement.pods}
    [(extra, pod)] = held.items()  # the one pod more than planned waits, unpinned
    assert pod["spec"]["schedulingGates"] == [{"name": GATE}]
    assert node_of(pod) is None and "nodeName" not in pod["spec"]

    polled = 0

    async def run(_: float) -> None:  # more polls while it runs, then the workload goes
        nonlocal polled
        member.bounded()
        polled += 1
        if polled == 3:
            k8s.objects[KIND_RES[kind], NS, JOB].delete()

    kube.pause = run
    assert (await kube.finished(placement, spec)).reason == "WorkloadDeleted"
    events = list(stored(k8s, EVENTS).values())
    assert [(e["involvedObject"]["name"], e["reason"], e["type"]) for e in events] == [
        (extra, NO_SLOT_REASON, "Warning")
    ]
    assert len(k8s["post"][EVENTS]) == 1  # noted once, not at every poll
    assert split(member.pods())[1].keys() == {extra}


@pytest.mark.parametrize("flavor", ["coscheduling", "volcano"])
async def test_delegate_mode_leaves_placement_to_the_gang_scheduler(
    api: ApiClient, k8s: Emulator, flavor: Flavor
) -> None:
    placement, spec = admitted("JobSet")
    member = cluster(k8s, "JobSet", placement, spec)
    await launcher(api, member.step, "delegate", flavor).launch(placement, spec)
    pods = member.pods()
    assert len(pods) == len(placement.pods)
    assert {p["status"]["phase"] for p in pods.values()} == {"Running"}
    assert {node_of(p) for p in pods.values()} == {None}  # no pin, no gate, no grant
    assert not any(gated(p) for p in pods.values())
    assert not k8s["patch"][PODS]
    assert list(stored(k8s, COSCHED if flavor == "coscheduling" else VOLCANO)) == [JOB]


async def test_two_jobs_in_one_namespace_get_only_their_own_slots(
    api: ApiClient, k8s: Emulator
) -> None:
    """Launched at once by one launcher (their polls share listings), each job's pods get
    slots of its own placement only, on its own nodes."""
    jobs = {job: admitted("JobSet", job, nodes=f"{job}-node") for job in ("a", "b")}
    members = {job: cluster(k8s, "JobSet", *jobs[job]) for job in jobs}

    async def step(_: float) -> None:
        for member in members.values():
            await member.step(0)

    kube = launcher(api, step)
    await asyncio.gather(*(kube.launch(*jobs[job]) for job in jobs))
    for job, member in members.items():
        granted, held = split({n: p for n, p in member.pods().items() if n.startswith(f"{job}-")})
        assert len(granted) == 5 and not held
        assert_pinned(member, jobs[job][0], granted)
    assert not stored(k8s, EVENTS)


async def test_a_restarted_launcher_adopts_the_workload_and_keeps_granted_slots(
    api: ApiClient, k8s: Emulator
) -> None:
    placement, spec = admitted("JobSet")  # driver: 1 pod, workers: 2 jobs of 2 pods
    member = cluster(k8s, "JobSet", placement, spec, bind=False)
    parked = asyncio.Event()

    async def first(_: float) -> None:
        if member.made == 0:
            member.control(limit=3)  # the controller is slow: 3 pods of 5 so far
            return
        parked.set()
        await asyncio.Future()  # until the broker stops

    task = asyncio.create_task(launcher(api, first).launch(placement, spec))
    waiting_for = asyncio.create_task(parked.wait())
    await asyncio.wait([task, waiting_for], return_when=asyncio.FIRST_COMPLETED)
    waiting_for.cancel()
    assert parked.is_set(), task.exception()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    before, waiting = split(member.pods())
    assert len(before) == 3 and not waiting
    member.bind = True
    await launcher(api, member.step).launch(placement, spec)  # the new broker
    assert list(stored(k8s, KIND_RES["JobSet"])) == [JOB]
    assert len(k8s["post"][KIND_RES["JobSet"]]) == 2  # the second answered 409: adopted
    after, waiting = split(member.pods())
    assert len(after) == 5 and not waiting
    for name, pod in before.items():
        assert after[name]["metadata"]["annotations"] == pod["metadata"]["annotations"]
        assert node_of(after[name]) == after[name]["spec"]["nodeName"] == node_of(pod)
    assert_pinned(member, placement, after)
    patched = Counter(r.url.path.rpartition("/")[2] for r in k8s["patch"][PODS])
    assert patched == Counter(after.keys())  # each pod granted once, by one of the two


@pytest.mark.parametrize(("phase", "index"), [("Failed", "1"), ("Succeeded", "3")])
async def test_a_finished_pods_slot_goes_to_the_controllers_next_pod(
    api: ApiClient, k8s: Emulator, phase: str, index: str
) -> None:
    """A Job retries a Failed pod (same completion index) or starts its next index once
    one Succeeded: the new pod gets the slot the finished one held."""
    placement, spec = admitted("Job")
    member = cluster(k8s, "Job", placement, spec)
    kube = launcher(api, member.step)
    await kube.launch(placement, spec)
    index_of = {n: p["metadata"]["labels"][INDEX] for n, p in member.pods().items()}
    [ended] = [n for n, i in index_of.items() if i == "1"]
    slot = member.pods()[ended]["metadata"]["annotations"][ANNOTATION_POD]
    polled: list[str] = []
    done = {"type": "Complete", "status": "True", "reason": "CompletionsReached"}

    async def run(_: float) -> None:
        member.bounded()
        polled.append("")
        if len(polled) == 1:
            k8s.objects[PODS, NS, ended].patch({"status": {"phase": phase}})
            next_pod = member.make("main", JOB, {INDEX: index})
            polled[0] = next_pod
        elif len(polled) == 2:
            member.schedule()
        else:
            k8s.objects[KIND_RES["Job"], NS, JOB].patch({"status": {"conditions": [done]}})

    kube.pause = run
    assert await kube.finished(placement, spec) == RunEnd(True, "CompletionsReached", "")
    new = member.pods()[polled[0]]
    assert new["metadata"]["annotations"][ANNOTATION_POD] == slot
    assert new["spec"]["nodeName"] == member.pods()[ended]["spec"]["nodeName"]
    assert new["status"]["phase"] == "Running"
    assert not stored(k8s, EVENTS)


FAILURES = {
    "pod Failed": "pod train-worker-1-00002 Failed before the gang ran",
    "workload Failed": "PyTorchJob team-acme/train PyTorchJobFailed: 1 Worker replica failed",
    "workload deleted": "PyTorchJob team-acme/train disappeared",
}


@pytest.mark.parametrize(
    ("mode", "flavor"), [("pin", "coscheduling"), ("delegate", "coscheduling"),
                         ("delegate", "volcano")])  # fmt: skip
@pytest.mark.parametrize("how", sorted(FAILURES))
async def test_a_failure_before_the_gang_ran_rolls_the_workload_back(
    api: ApiClient, k8s: Emulator, mode: Mode, flavor: Flavor, how: str
) -> None:
    placement, spec = admitted("PyTorchJob")
    member = cluster(k8s, "PyTorchJob", placement, spec, bind=False)
    failed = {"type": "Failed", "status": "True", "reason": "PyTorchJobFailed",
              "message": "1 Worker replica failed"}  # fmt: skip

    async def step(_: float) -> None:
        member.bounded()
        if member.made:
            what = k8s.objects[KIND_RES["PyTorchJob"], NS, JOB]
            if how == "pod Failed":
                k8s.objects[PODS, NS, "train-worker-1-00002"].patch({"status": {"phase": "Failed"}})
            elif how == "workload Failed":
                what.patch({"status": {"conditions": [failed]}})
            else:
                what.delete()
        member.control()

    with pytest.raises(KubeLaunchError) as caught:
        await launcher(api, step, mode, flavor).launch(placement, spec)
    assert isinstance(caught.value, LaunchError)
    assert str(caught.value) == f"gang acme/train: {FAILURES[how]}"
    assert workload(k8s, "PyTorchJob") is None
    assert member.pods() == {}
    assert stored(k8s, COSCHED) == stored(k8s, VOLCANO) == {}
    if how != "workload deleted":
        [delete] = k8s["delete"][KIND_RES["PyTorchJob"]]
        assert delete.params.get("propagationPolicy") == "Background"
