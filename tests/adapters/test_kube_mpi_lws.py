"""MPIJob v2beta1 and LeaderWorkerSet run end to end in a Kubernetes member (kmock over real
HTTP, the real ``kubernetes.aio`` client), their controllers played as upstream names,
labels and reports pods (tests/adapters/workload_players.py), in pin mode and both delegate
modes: an MPIJob runs to its own Succeeded or Failed, the launcher made at once or once its
workers are Ready; a LeaderWorkerSet's groups all run (it never ends) and a cancel leaves
nothing. In pin mode each pod holds the slot of its own index, as the kind's module reads
it from its controller's labels."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import kubernetes_validate  # type: ignore[import-untyped]
import pytest
from crds import schema_problems
from hypothesis import given, settings
from hypothesis import strategies as st
from kmock_namespaces import NamespacedEmulator
from kubernetes.aio.client import ApiClient
from test_kube_workload_pins import assert_pinned, split
from test_workloads import CPU, GPU8, INIT, lws, mpijob
from workload_cluster import (
    COSCHED,
    CRD_FILES,
    JOB,
    KIND_RES,
    LABELLED,
    NS,
    PODS,
    VOLCANO,
    WORKLOADS,
    Cluster,
    Emulator,
    admitted,
    cluster,
    launcher,
    stored,
    workload,
)
from workload_players import JOBS

from adapters.kube.objects import LABEL_POD_SET, Flavor, Mode, pod_set_of
from adapters.kube.translate import ANNOTATION_POD
from adapters.kube.workloads import late_pods
from broker.manifest.workloads import INTEGRATIONS, derive, leaderworkerset
from broker.manifest.workloads import mpijob as mpi_kind
from broker.model import Placement
from broker.ports import RunEnd

pytestmark = pytest.mark.kmock(cls=NamespacedEmulator)

Obj = dict[str, Any]
MODES: list[tuple[Mode, Flavor]] = [
    ("pin", "coscheduling"), ("delegate", "coscheduling"), ("delegate", "volcano")]  # fmt: skip
IDS = [f"{m}-{f}" for m, f in MODES]
PodIndex = Callable[[Mapping[str, Any], Mapping[str, Any]], "int | None"]


def _t(template: Obj) -> Obj:
    return {**template, **LABELLED}


def _with_workload(monkeypatch: pytest.MonkeyPatch, kind: str, body: Obj) -> None:
    """The member's job of ``kind`` is ``body`` for this test (``admitted`` reads it)."""
    monkeypatch.setitem(WORKLOADS, kind, body)


def assert_own_index(member: Cluster, pod_index: PodIndex) -> None:
    """Every granted pod holds the slot of the index its kind's module reads from its
    controller's labels (the adapter reads it through the same kind)."""
    obj = member.workload()
    assert obj is not None
    for name, pod in split(member.pods())[0].items():
        index = pod_index(obj, pod)
        assert index is not None, name
        slot = pod["metadata"]["annotations"][ANNOTATION_POD]
        pod_set = pod["metadata"]["labels"][LABEL_POD_SET]
        assert slot == f"acme.{JOB}-{pod_set}-{index}", name


def _written_as_the_crd_says(member: Cluster) -> None:
    """The status the played controller wrote is one its CRD takes, the launcher Job's one
    the Job API takes."""
    obj = member.workload()
    assert obj is not None and obj.get("status")
    assert schema_problems(obj, CRD_FILES[member.kind]) == []
    for job in member.stored(JOBS).values():
        kubernetes_validate.validate(job, "1.31", strict=True)


async def _run(api: ApiClient, member: Cluster, placement: Placement, mode: Mode,
               flavor: Flavor, then: Callable[[], bool]) -> RunEnd:  # fmt: skip
    """Launch the job, check it started as planned, then poll to its end, ``then`` played
    at each poll until it says it played (the kubelet ending a pod once it is there)."""
    kube = launcher(api, member.step, mode, flavor)
    await kube.launch(placement, member.spec)
    pods = member.pods()
    # Pods of late pod sets (a launcher made once the workers are ready) may come after.
    kind = next(i for i in INTEGRATIONS if i.kind == member.kind)
    early = len(placement.pods) - late_pods(kind, placement, member.spec)
    assert len(pods) in {early, len(placement.pods)}
    assert {p["status"]["phase"] for p in pods.values()} == {"Running"}
    if mode == "pin":  # the slots of the pods made so far
        made = {p["metadata"]["labels"][LABEL_POD_SET] for p in pods.values()}
        here = [p for p in placement.pods if pod_set_of(p.pod[len("acme.") :], member.spec) in made]
        assert_pinned(member, dataclasses.replace(placement, pods=tuple(here)), split(pods)[0])
    else:
        assert list(stored(member.k8s, COSCHED if flavor == "coscheduling" else VOLCANO)) == [JOB]
    played: list[int] = []

    async def poll(_: float) -> None:
        if not played and then():
            played.append(1)
        await member.step(0)

    kube.pause = poll
    end = await kube.finished(placement, member.spec)
    _written_as_the_crd_says(member)
    await kube.delete(placement, member.spec)
    member.control()  # the controller and the garbage collector see the workload gone
    assert workload(member.k8s, member.kind) is None
    assert member.pods() == {}
    assert stored(member.k8s, JOBS) == {}
    assert stored(member.k8s, COSCHED) == stored(member.k8s, VOLCANO) == {}
    return end


# The launcher made late is out of a delegated PodGroup's minMember (the kind's
# late_pod_sets), so every mode runs with either policy.
MPI_CASES = [(*m, p) for m in MODES for p in ("AtStartup", "WaitForWorkersReady")]


@pytest.mark.parametrize(("mode", "flavor", "policy"), MPI_CASES,
                         ids=[f"{m}-{f}-{p}" for m, f, p in MPI_CASES])  # fmt: skip
@pytest.mark.parametrize("succeeds", [True, False], ids=["Succeeded", "Failed"])
async def test_an_mpijob_runs_to_its_own_end(
    api: ApiClient, k8s: Emulator, monkeypatch: pytest.MonkeyPatch,
    mode: Mode, flavor: Flavor, policy: str, succeeds: bool,
) -> None:  # fmt: skip
    body = mpijob(3, _t(GPU8), _t(CPU), launcherCreationPolicy=policy,
                  runPolicy={"backoffLimit": 0, "cleanPodPolicy": "Running"})  # fmt: skip
    _with_workload(monkeypatch, "MPIJob", body)
    placement, spec = admitted("MPIJob")
    member = cluster(k8s, "MPIJob", placement, spec)
    launcher_pod = f"{JOB}-launcher-00001"

    def exit_launcher() -> bool:  # the kubelet: mpirun exits (once the launcher was made)
        if launcher_pod not in member.pods():
            return False
        phase = {"phase": "Succeeded"} if succeeds else {
            "phase": "Failed", "reason": "Error", "message": "exit code 1"}  # fmt: skip
        k8s.objects[PODS, NS, launcher_pod].patch({"status": phase})
        return True

    end = await _run(api, member, placement, mode, flavor, exit_launcher)
    if succeeds:
        assert end == RunEnd(True, "MPIJobSucceeded", f"MPIJob {NS}/{JOB} successfully completed.")
    else:
        message = "Job has reached the specified backoff limit: exit code 1"
        assert end == RunEnd(False, "BackoffLimitExceeded/Error", message)


@pytest.mark.parametrize(("mode", "flavor"), MODES, ids=IDS)
@pytest.mark.parametrize("leader", [True, False], ids=["leaderTemplate", "one template"])
async def test_a_leaderworkerset_runs_every_group_until_cancelled(
    api: ApiClient, k8s: Emulator, monkeypatch: pytest.MonkeyPatch,
    mode: Mode, flavor: Flavor, leader: bool,
) -> None:  # fmt: skip
    body = lws(3, 3, _t(CPU) if leader else None, _t(INIT))
    _with_workload(monkeypatch, "LeaderWorkerSet", body)
    placement, spec = admitted("LeaderWorkerSet")
    member = cluster(k8s, "LeaderWorkerSet", placement, spec)
    kube = launcher(api, member.step, mode, flavor)
    await kube.launch(placement, spec)
    pods = member.pods()
    assert sorted(pods) == sorted(
        [f"{JOB}-{g}" for g in range(3)] + [f"{JOB}-{g}-{w}" for g in range(3) for w in (1, 2)]
    )
    assert {p["status"]["phase"] for p in pods.values()} == {"Running"}
    if mode == "pin":  # the slots of the pods made so far
        made = {p["metadata"]["labels"][LABEL_POD_SET] for p in pods.values()}
        here = [p for p in placement.pods if pod_set_of(p.pod[len("acme.") :], member.spec) in made]
        assert_pinned(member, dataclasses.replace(placement, pods=tuple(here)), split(pods)[0])
        assert_own_index(member, leaderworkerset.pod_index)
    member.control()  # LWS sees its pods run
    obj = workload(k8s, "LeaderWorkerSet")
    assert obj is not None and obj["status"]["readyReplicas"] == 3
    _written_as_the_crd_says(member)

    polls: list[int] = []

    async def poll(_: float) -> None:  # it serves on: cancelled after a few polls
        polls.append(1)
        await member.step(0)
        if len(polls) == 3:
            await kube.delete(placement, spec)

    kube.pause = poll
    end = await kube.finished(placement, spec)
    assert end.reason == "WorkloadDeleted" and len(polls) == 3
    member.control()
    assert workload(k8s, "LeaderWorkerSet") is None
    assert member.pods() == {}
    assert stored(k8s, COSCHED) == stored(k8s, VOLCANO) == {}


async def test_an_mpijobs_workers_hold_the_slots_of_their_replica_index(
    api: ApiClient, k8s: Emulator
) -> None:
    placement, spec = admitted("MPIJob")
    member = cluster(k8s, "MPIJob", placement, spec)
    await launcher(api, member.step).launch(placement, spec)
    assert_own_index(member, mpi_kind.pod_index)
    member.control()  # the operator sees its pods run
    status = k8s.objects[KIND_RES["MPIJob"], NS, JOB].raw["status"]
    assert [c["type"] for c in status["conditions"]] == ["Created", "Running"]


@settings(max_examples=60, deadline=None)
@given(groups=st.integers(1, 8), size=st.integers(1, 8), leader=st.booleans())
def test_lws_pods_take_each_index_of_their_pod_set_once(
    groups: int, size: int, leader: bool
) -> None:
    """Whatever the groups and their size, the pods LWS makes (labelled as its controller
    and webhook label them) map one to one onto the indexes of the pod sets admission
    derived, as the kind's module reads them (and the adapter through it)."""
    body = lws(groups, size, CPU if leader else None, GPU8)
    counts = {ps.name: ps.count for ps in derive(body)}
    seen: dict[str, list[int]] = {}
    for g in range(groups):
        for w in range(size):
            pod_set = "main" if not leader else "leader" if w == 0 else "worker"
            pod = {"metadata": {
                "labels": {LABEL_POD_SET: pod_set, leaderworkerset.GROUP_LABEL: str(g),
                           leaderworkerset.WORKER_LABEL: str(w)},
                "annotations": {"leaderworkerset.sigs.k8s.io/size": str(size)}}}  # fmt: skip
            index = leaderworkerset.pod_index(body, pod)
            assert index is not None
            seen.setdefault(pod_set, []).append(index)
    assert {name: sorted(found) for name, found in seen.items()} == {
        name: list(range(n)) for name, n in counts.items()
    }
