"""The plan a pin-mode launcher records on a workload, and what a restarted broker reads back
from a member (kmock over real HTTP, the real ``kubernetes.aio`` client): the workload,
its recorded plan, its end by its own status, its pods as they stand (slotted under the
ledger's pod names, gated, finished), and the plan's encoding itself (every placement
read back as written; one past the size bound not recorded)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st
from kmock_namespaces import NamespacedEmulator
from kubernetes.aio.client import ApiClient
from workload_cluster import (
    JOB,
    KIND_RES,
    NS,
    PODS,
    Emulator,
    admitted,
    cluster,
    launcher,
    workload,
)

from adapters.kube.plan import ANNOTATION_PLAN, PLAN_LIMIT, plan_annotation, read_plan
from broker.model import Placement, PodPlacement, Resources
from broker.ports import LaunchSpec, PlannedSlot, RunEnd, WorkloadFound

pytestmark = pytest.mark.kmock(cls=NamespacedEmulator)

INDEX = "batch.kubernetes.io/job-completion-index"
names = st.from_regex(r"[a-z]([a-z0-9-]{0,20}[a-z0-9])?", fullmatch=True)


@given(
    job=names,
    slots=st.lists(
        st.tuples(names, st.integers(0, 999), names, st.lists(st.integers(0, 15), max_size=8)),
        min_size=1, max_size=40, unique_by=lambda s: (s[0], s[1]),
    ),
)  # fmt: skip
def test_every_plan_reads_back_as_it_was_placed(
    job: str, slots: list[tuple[str, int, str, list[int]]]
) -> None:
    spec = LaunchSpec(tenant="acme", job=job)
    pods = tuple(
        PodPlacement(f"acme.{job}-{s}-{i}", node, tuple(gpus), Resources())
        for s, i, node, gpus in slots
    )
    text = plan_annotation(Placement(f"acme/{job}", "east", pods), spec)
    assert text is not None
    read = read_plan({"metadata": {"annotations": {ANNOTATION_PLAN: text}}})
    assert read == tuple(PlannedSlot(p.pod, p.node, p.gpus) for p in pods)


def test_a_plan_past_the_bound_is_not_recorded() -> None:
    spec = LaunchSpec(tenant="acme", job="big")
    node = "n" * 60
    pods = tuple(
        PodPlacement(f"acme.big-worker-{i}", node, (0, 1, 2, 3, 4, 5, 6, 7), Resources())
        for i in range(2000)
    )
    assert len(json.dumps([p.node for p in pods])) > PLAN_LIMIT
    assert plan_annotation(Placement("acme/big", "east", pods), spec) is None
    assert plan_annotation(Placement("acme/big", "east", pods[:100]), spec) is not None


@pytest.mark.parametrize(
    "text", ["{not json", '{"pod": "acme.t-", "slots": [["main-0"]]}', '{"slots": []}',
             '{"pod": "acme.t-", "slots": [["main-0", "", []]]}']
)  # fmt: skip
def test_an_unreadable_plan_is_said_so(text: str) -> None:
    with pytest.raises(ValueError, match=ANNOTATION_PLAN):
        read_plan({"metadata": {"annotations": {ANNOTATION_PLAN: text}}})
    assert read_plan({"metadata": {}}) is None


async def test_a_running_job_is_read_back_with_its_plan_and_its_pods_as_they_stand(
    api: ApiClient, k8s: Emulator
) -> None:
    placement, spec = admitted("Job")  # 3 indexes at a time, pinned
    member = cluster(k8s, "Job", placement, spec)
    kube = launcher(api, member.step)
    await kube.launch(placement, spec)
    obj = workload(k8s, "Job")
    assert obj is not None
    plan = read_plan(obj)
    assert plan == tuple(PlannedSlot(p.pod, p.node, p.gpus) for p in placement.pods)
    # Index 0 finishes and the controller makes index 3, gated; index 1 finishes too.
    by_index = {p["metadata"]["labels"][INDEX]: n for n, p in member.pods().items()}
    for index in ("0", "1"):
        k8s.objects[PODS, NS, by_index[index]].patch({"status": {"phase": "Succeeded"}})
    member.make("main", JOB, {INDEX: "3"})
    found = await launcher(api, member.step).read_back_workloads()  # a restarted broker
    assert list(found) == [f"acme/{JOB}"]
    [job] = found.values()
    assert (job.plan, job.end, job.plan_error) == (plan, None, "")
    assert (job.gated, job.finished) == (1, 2)
    [running] = job.slotted
    slot_2 = next(p for p in placement.pods if p.pod.endswith("-2"))
    assert (running.pod, running.node, running.gpus) == (slot_2.pod, slot_2.node, slot_2.gpus)
    # It ends while the broker is away: read back with its end.
    k8s.objects[KIND_RES["Job"], NS, JOB].patch({"status": {"conditions": [
        {"type": "Complete", "status": "True", "reason": "CompletionsReached"}]}})  # fmt: skip
    [job] = (await launcher(api, member.step).read_back_workloads()).values()
    assert job.end == RunEnd(True, "CompletionsReached", "")
    # Delegate mode records no plan (the gang scheduler placed the pods): only its end.
    delegated = await launcher(api, member.step, mode="delegate").read_back_workloads()
    assert delegated == {f"acme/{JOB}": WorkloadFound(None, job.end, delegated=True)}


async def test_an_unreadable_plan_costs_only_its_own_job(api: ApiClient, k8s: Emulator) -> None:
    for job in ("one", "two"):
        placement, spec = admitted("Job", job=job, nodes=job)
        await launcher(api, cluster(k8s, "Job", placement, spec).step).launch(placement, spec)
    k8s.objects[KIND_RES["Job"], NS, "one"].patch(
        {"metadata": {"annotations": {ANNOTATION_PLAN: "[]"}}}
    )
    found = await launcher(api, lambda _: _never()).read_back_workloads()
    assert "unreadable" in found["acme/one"].plan_error
    assert found["acme/two"].plan_error == "" and found["acme/two"].plan is not None
    assert len(found["acme/two"].slotted) == 3


async def _never() -> None:
    raise AssertionError("reading back does not poll")
