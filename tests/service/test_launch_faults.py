"""No launch strands capacity (DESIGN.md invariant 9), against a Kubernetes member that
fails on cue (``tests/launch_faults.py``: kmock over real HTTP, the real client from a
kubeconfig): each step of a launch (namespace, create, list, patch, delete) answered with
each class of fault (a response the client cannot handle, a dropped connection, a 4xx
refusal, a 503, a timeout), for a podSets gang and a ``spec.workload`` batch Job.

After every failure the books agree (the ledger holds the pods that exist plus the
reservations of jobs being launched, and nothing else); a create the member refuses for
good ends the job, Failed with the member's message, at the scheduler's
``launchRefusalLimit`` (3, the default); every other fault backs the job off (Kueue's
backoff, on the injected clock) and it launches once the member recovers. The member's
retries inside one request are not waited for (``member_retry_wait``); the background
cycle and the garbage collection run on short real periods, and the test waits on
conditions (``until``), never on a number of polls."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, cast

import kmock as kmocklib
import pytest
from builders import Clock, until
from launch_faults import FAULTS, PODS, REFUSAL, Fault, FaultyMember, Step, books
from tenacity import wait_none
from test_kube_service import manifest as gang_manifest
from test_workload_service import (
    JOBS,
    controller_pods,
    granted,
    kubelet,
    live,
    node_obj,
)
from test_workload_service import manifest as workload_manifest

from broker.config import parse_config
from broker.service.facade import Service

NODES = kmocklib.resource("", "v1", "nodes")
T0 = 1_000.0
JOB = "team-a/train"
LIMIT = 3  # scheduler.launchRefusalLimit's default
CONFIG = """
store: {{url: "sqlite:///{db}"}}
scheduler: {{cycleSeconds: 0.1, garbageCollectSeconds: 0.3}}
clusters:
- name: east
  source:
    kube: {{kubeconfig: "{kubeconfig}", context: east, launchMode: pin, podPollSeconds: 0.02,
           requestTimeoutSeconds: 0.3}}
queues:
- {{name: training, policy: gang}}
tenants:
- {{name: team-a, defaultQueue: training, token: {{value: tok-a-00000000000000000000000000}}}}
"""

pytestmark = pytest.mark.kmock(cls=FaultyMember)

# What each step is done by: a podSets gang, or a batch Job's (a workload) slot grants.
GANG_STEPS: tuple[Step, ...] = ("namespace", "create", "list", "delete")
WORKLOAD_STEPS: tuple[Step, ...] = ("create", "list", "patch", "delete")
TABLE = [
    pytest.param(kind, step, fault, id=f"{kind}-{step}-{fault}")
    for kind, steps in (("gang", GANG_STEPS), ("Job", WORKLOAD_STEPS))
    for step in steps
    for fault in FAULTS
]


def refused_for_good(step: Step, fault: Fault) -> bool:
    """A create the member refuses (422): the job fails at the limit; all else backs off."""
    return fault == "refused" and step in ("namespace", "create")


@pytest.fixture
def member(kmock: Any) -> FaultyMember:
    k8s = cast(FaultyMember, kmock)
    for name, namespaced in (("v1/pods", True), ("v1/nodes", False), ("v1/services", True),
                             ("v1/events", True), ("batch/v1/jobs", True)):  # fmt: skip
        k8s.resources[name] = kmocklib.ResourceInfo(namespaced=namespaced)
    for node in ("n1", "n2"):
        k8s.objects[NODES, None, node] = node_obj(node)
    return k8s


async def broker(member: FaultyMember, tmp_path: Path, clock: Clock) -> Service:
    """A started broker with the member ``east`` (its store in ``tmp_path``: a second one
    on the same path is the first restarted)."""
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "east",
        "contexts": [{"name": "east", "context": {"cluster": "c-east", "user": "u"}}],
        "clusters": [{"name": "c-east", "cluster": {"server": str(member.url).rstrip("/")}}],
        "users": [{"name": "u", "user": {"token": "not-a-real-token"}}],
    }))  # fmt: skip
    text = CONFIG.format(db=tmp_path / "jobs.db", kubeconfig=kubeconfig)
    service = Service(parse_config(text, "test"), clock=clock, member_retry_wait=wait_none())
    await service.start()
    return service


@pytest.fixture
async def service(member: FaultyMember, tmp_path: Path, clock: Clock) -> Any:
    service = await broker(member, tmp_path, clock)
    try:
        yield service
    finally:
        member.recover()  # answers held by a timeout are let go before the server stops
        await service.close()


@pytest.fixture
def clock() -> Clock:
    return Clock(T0)


def our_pods(member: FaultyMember) -> list[str]:
    return sorted(
        name for (res, _, name), obj in list(member.objects.items())
        if res == PODS and not obj.deleted
        and obj.raw["metadata"].get("labels", {}).get("fedbroker.io/job") == "train"
    )  # fmt: skip


def failures(service: Service, cause: str, stage: str = "launch") -> float:
    sample = service.metrics.registry.get_sample_value(
        "fedbroker_launch_failures_total", {"cluster": "east", "stage": stage, "cause": cause}
    )
    return sample or 0.0


async def placed(service: Service) -> None:
    await service.schedule_once()
    await until(lambda: service.lifecycle.get(JOB) is not None)


async def play_the_member(member: FaultyMember, kind: str, step: Step) -> None:
    """What the member's controllers do in a failing attempt: the Job's controller makes
    its gated pods (which the broker patches: slot grants), and before a delete a pod fails
    before the gang ran (the test's kubelet), which the rollback's delete follows."""
    if kind == "gang":
        if step == "delete":
            await until(lambda: bool(our_pods(member)))
            [pod] = our_pods(member)
            await member.run_pods("n1", "Failed", only=pod)
        return
    if step in ("patch", "delete"):
        await until(lambda: "train" in live(member, JOBS))
        names = controller_pods(member, "Job", "train", attempt=1)
        if step == "delete":
            nodes = await granted(member, names)
            kubelet(member, names[0], nodes[names[0]], "Failed")


async def run(service: Service, member: FaultyMember, kind: str, attempt: int) -> None:
    """The member healthy: the job placed again is played to Running."""
    await placed(service)
    if kind == "gang":
        await until(lambda: bool(our_pods(member)))
        [pod] = our_pods(member)
        [placement_pod] = service.ledger.reservations()[JOB].pods
        await member.run_pods(placement_pod.node, "Running", only=pod)
    else:
        await until(lambda: "train" in live(member, JOBS))
        names = controller_pods(member, "Job", "train", attempt=attempt)
        for name, node in (await granted(member, names)).items():
            kubelet(member, name, node, "Running")
    await until(lambda: bool((launch := service.lifecycle.get(JOB)) and launch.running))
    await service.launches_done(timeout=10)


async def one_attempt(service: Service, member: FaultyMember, kind: str, step: Step) -> Any:
    """Place the job, let the fault fail its launch; returns its record, the books checked."""
    await placed(service)
    await play_the_member(member, kind, step)
    await service.launches_done(timeout=30)
    assert member.hits[step] > 0, f"the {step} step was never reached"
    record = await service.get("team-a", "train")
    assert service.lifecycle.get(JOB) is None and not service.ledger.reservations()
    await until(lambda: not books(service, member))  # the watch tells deletions meanwhile
    return record


@pytest.mark.parametrize(("kind", "step", "fault"), TABLE)
async def test_a_fault_at_any_step_strands_nothing(
    service: Service, member: FaultyMember, clock: Clock, kind: str, step: Step, fault: Fault
) -> None:
    job = gang_manifest("train") if kind == "gang" else workload_manifest("train", "Job")
    await service.submit("team-a", job)
    member.inject(step, fault)
    if refused_for_good(step, fault):
        for attempt in range(1, LIMIT + 1):
            record = await one_attempt(service, member, kind, step)
            assert REFUSAL in record.reason, record.reason
            assert "launch refused by east" in record.reason
            if attempt < LIMIT:
                assert (record.state, record.attempts) == ("Queued", attempt)
                assert f"refusal {attempt} of {LIMIT}" in record.reason
                clock.now = record.not_before
        assert record.state == "Failed" and f"refused {LIMIT} times" in record.reason
        assert failures(service, "refused") == LIMIT
        assert not our_pods(member)
        return
    record = await one_attempt(service, member, kind, step)
    assert (record.state, record.attempts) == ("Queued", 1), record.reason
    assert record.reason.startswith("launch failed: ") and record.not_before == clock.now + 60
    assert failures(service, "transient") + failures(service, "error") == 1
    clock.now += 59
    await service.schedule_once()  # still backing off: nothing placed, nothing reserved
    assert service.lifecycle.get(JOB) is None and not service.ledger.reservations()
    member.recover()
    # What a failed delete left is garbage-collected (the job is not live meanwhile).
    await until(lambda: not our_pods(member) and "train" not in live(member, JOBS))
    clock.now = record.not_before
    await run(service, member, kind, attempt=2)
    assert (await service.get("team-a", "train")).state == "Running"
    assert not books(service, member)
