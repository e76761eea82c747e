"""Every registered workload kind in every launch mode (pin, delegate with coscheduling,
delegate with Volcano), through the real Service on a kmock member whose controllers,
gang schedulers and kubelet are played as upstream runs them (``controllers``): submitted,
Running, then Succeeded or Failed by the controller's own status; cancel leaves nothing; a
broker restart while some pods have finished and successors wait keeps the run (no index
made twice, no Queued); in delegate mode the GPUs the ledger counts are the pods' GPUs; a
RayJob's retries are KubeRay's; 60 workloads at once by two tenants are none rolled back,
and two tenants' jobs of the same names (their pods named alike) run apart.

Waits are on conditions counted in the member's steps (``settle``), gang timeouts on the
broker's injected clock: a slow machine makes a case slower, never failed."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from controllers import CONTROLLERS, RESOURCES, Member, Mode
from controllers.base import PODS, Obj, labels_of, phase
from controllers.batchjob import INDEX as COMPLETION_INDEX
from controllers.mpijob import is_launcher
from controllers.pytorchjob import LABEL as TRAINING
from controllers.ray import RAY_JOBS
from kmock_namespaces import NamespacedEmulator
from kube_admission import CRD_FILES
from kube_schema import crd_schema
from workload_matrix import (
    MODES,
    RUNTIME,
    SERVED,
    WORKLOADS,
    broker,
    enders,
    launched,
    ledger_gpus,
    leftovers,
    made_twice,
    manifest,
    member_of,
    ours,
    pod_template,
    pods_gpus,
    running_pods,
    settle,
    state_of,
)

from broker.manifest.workloads.trainjob import CLUSTER_RUNTIME
from broker.service.facade import Service

pytestmark = pytest.mark.kmock(cls=NamespacedEmulator)
KINDS = tuple(CONTROLLERS)
# a RayCluster and a LeaderWorkerSet serve until cancelled
SERVING = ("RayCluster", "LeaderWorkerSet")
ENDING = tuple(k for k in KINDS if k not in SERVING)
DELEGATE: tuple[Mode, ...] = ("coscheduling", "volcano")
# kind -> (reason of success, reason of failure) the controller writes
REASONS = {
    "Job": ("CompletionsReached", "BackoffLimitExceeded"),
    "JobSet": ("AllJobsCompleted", "FailedJobs"),
    "PyTorchJob": ("PyTorchJobSucceeded", "PyTorchJobFailed"),
    "RayJob": ("SUCCEEDED", "AppFailed"),
    "TrainJob": ("AllJobsCompleted", "FailedJobs"),
    "MPIJob": ("MPIJobSucceeded", "BackoffLimitExceeded"),
}
KEY = "team-a/train"
RUN = ["Queued", "Placed", "Running"]


def cases(kinds: tuple[str, ...], modes: tuple[Mode, ...] = MODES) -> list[object]:
    """kind x mode parameters."""
    return [pytest.param(k, m, id=f"{k}-{m}") for k in kinds for m in modes]


# The ends of every kind x mode
ENDS = cases(ENDING)


@pytest.fixture(scope="module", autouse=True)
def _schemas() -> None:
    """The members' CRD schemas parsed before any test's event loop runs (a parse inside
    one holds up its member and broker alike)."""
    for served in SERVED:
        group, version, plural = served.rsplit("/", 2) if served.count("/") == 2 else ("", "", "")
        if (group, plural) in CRD_FILES:
            crd_schema(CRD_FILES[group, plural], version)


async def run(service: Service, member: Member, kind: str, name: str = "train") -> None:
    """Submit ``name`` (a TrainJob once the broker's cache of the member's runtimes has it)
    and wait until it runs."""
    if kind == "TrainJob":
        cache = service.kube.members["east"].runtimes
        found = await settle(member, lambda: cache.lookup(CLUSTER_RUNTIME, "", RUNTIME) is not None)
        assert found, "the broker never listed the member's runtime"
    _, created = await service.submit("team-a", manifest(kind, name))
    assert created
    await service.schedule_once()
    assert (await service.get("team-a", name)).state == "Placed"
    await launched(service, member, ("team-a", name))
    record = await service.get("team-a", name)
    assert record.state == "Running", (record.reason, state_of(member))
    assert ours(member, RESOURCES[kind])


async def end_all(service: Service, member: Member, kind: str, to: str = "Succeeded") -> None:
    """The kubelet ends the pods that end the workload, as they run, until the broker has
    followed it to its end."""
    while service.lifecycle.get(KEY) is not None:
        found = await settle(
            member, lambda: bool(enders(member, kind)) or service.lifecycle.get(KEY) is None
        )
        assert found, ("nothing left to end and the run not over", state_of(member))
        await member.schedulers.end(enders(member, kind), to)
    await service.runs_done()


async def history(service: Service, name: str = "train", tenant: str = "team-a") -> list[str]:
    return [t.state for t in await service.store.history(tenant, name)]


@pytest.mark.parametrize(("kind", "mode"), ENDS)
async def test_runs_and_succeeds_by_its_controllers_status(
    kmock: NamespacedEmulator, tmp_path: Path, kind: str, mode: Mode
) -> None:
    member = member_of(kmock, mode)
    async with member.running(), broker(kmock, tmp_path, mode) as service:
        await run(service, member, kind)
        await end_all(service, member, kind)
        record = await service.get("team-a", "train")
        assert record.state == "Succeeded", record.reason
        assert record.reason.startswith(REASONS[kind][0])
        assert await history(service) == [*RUN, "Succeeded"]
        assert not service.ledger.reservations()
        assert made_twice(member) == []


@pytest.mark.parametrize(("kind", "mode"), ENDS)
async def test_runs_and_fails_by_its_controllers_status(
    kmock: NamespacedEmulator, tmp_path: Path, kind: str, mode: Mode
) -> None:
    member = member_of(kmock, mode)
    async with member.running(), broker(kmock, tmp_path, mode) as service:
        await run(service, member, kind)
        await end_all(service, member, kind, to="Failed")
        record = await service.get("team-a", "train")
        assert record.state == "Failed", record.reason
        assert record.reason.startswith(REASONS[kind][1]), record.reason
        assert await history(service) == [*RUN, "Failed"]
        assert not service.ledger.reservations()


@pytest.mark.parametrize(
    ("kind", "mode"),
    cases(KINDS),
)
async def test_cancel_while_running_leaves_nothing(
    kmock: NamespacedEmulator, tmp_path: Path, kind: str, mode: Mode
) -> None:
    member = member_of(kmock, mode)
    async with member.running(), broker(kmock, tmp_path, mode) as service:
        await run(service, member, kind)
        assert (await service.cancel("team-a", "train")).state == "Cancelled"
        # the workload and all it made (a RayJob's RayCluster too), its PodGroup, Services
        gone = await settle(member, lambda: not leftovers(member) and not ledger_gpus(service))
        assert gone, (leftovers(member), ledger_gpus(service))
        assert not service.ledger.reservations()
        assert await history(service) == [*RUN, "Cancelled"]


def finishing(member: Member, kind: str) -> list[Obj]:
    """The pods a restart is to find finished: a Job's and a JobSet's running pods (their
    successors then made, gated), a PyTorchJob's workers (its master runs on), a TrainJob's
    first node (its other runs on); none of a RayJob's or a RayCluster's (nothing of theirs
    ends before the Ray job), an MPIJob's (its workers serve ``mpirun``) or a
    LeaderWorkerSet's (it serves)."""
    pods = running_pods(member)
    if kind in ("Job", "JobSet"):
        return pods
    if kind == "PyTorchJob":
        return [p for p in pods if labels_of(p).get(TRAINING + "replica-type") == "worker"]
    if kind == "TrainJob":
        return [p for p in pods if labels_of(p).get(COMPLETION_INDEX) == "0"]
    return []


@pytest.mark.parametrize(
    ("kind", "mode"),
    cases(KINDS),
)
async def test_a_restart_while_running_keeps_the_run(
    kmock: NamespacedEmulator, tmp_path: Path, kind: str, mode: Mode
) -> None:
    member = member_of(kmock, mode)
    async with member.running():
        async with broker(kmock, tmp_path, mode) as service:
            await run(service, member, kind)
        # The broker down: some pods finish, their controllers make the successors (gated)
        await member.schedulers.end(finishing(member, kind), "Succeeded")
        await settle(member, lambda: False)
        async with broker(kmock, tmp_path, mode) as service:
            if kind in SERVING:
                await settle(member, lambda: False)
                assert (await service.get("team-a", "train")).state == "Running"
                await service.cancel("team-a", "train")
                assert await settle(member, lambda: not leftovers(member)), state_of(member)
            else:
                await end_all(service, member, kind)
                record = await service.get("team-a", "train")
                assert record.state == "Succeeded", record.reason
            assert made_twice(member) == []
            assert "Queued" not in (await history(service))[1:]


@pytest.mark.parametrize(
    ("kind", "mode"),
    cases(KINDS, DELEGATE),
)
async def test_delegated_gpus_counted_are_the_pods_gpus(
    kmock: NamespacedEmulator, tmp_path: Path, kind: str, mode: Mode
) -> None:
    member = member_of(kmock, mode)
    async with member.running(), broker(kmock, tmp_path, mode) as service:
        await run(service, member, kind)
        assert await settle(member, lambda: ledger_gpus(service) == pods_gpus(member)), (
            ledger_gpus(service),
            pods_gpus(member),
        )
        assert await history(service) == RUN


RETRIED = {**WORKLOADS["RayJob"], "spec": {**WORKLOADS["RayJob"]["spec"], "backoffLimit": 1}}


@pytest.mark.parametrize(("kind", "mode"), cases(("RayJob",)))
async def test_a_rayjob_is_retried_by_kuberay_then_fails(
    kmock: NamespacedEmulator, tmp_path: Path, kind: str, mode: Mode
) -> None:
    member = member_of(kmock, mode)
    async with member.running(), broker(kmock, tmp_path, mode) as service:
        _, created = await service.submit("team-a", manifest(kind, workload=RETRIED))
        assert created
        await service.schedule_once()
        await launched(service, member, ("team-a", "train"))
        assert (await service.get("team-a", "train")).state == "Running"
        await end_all(service, member, kind, to="Failed")
        record = await service.get("team-a", "train")
        assert (record.state, record.reason[: len("AppFailed")]) == ("Failed", "AppFailed")
        [rayjob] = ours(member, RAY_JOBS).values()
        assert rayjob["status"]["failed"] == 2  # both attempts KubeRay made
        # A submitter Job per attempt (the Job's own pod retries are the same attempt's).
        attempts = {labels_of(p).get("controller-uid") for p in member.c.made
                    if "batch.kubernetes.io/job-name" in labels_of(p)}  # fmt: skip
        assert len(attempts) == 2
        assert await history(service) == [*RUN, "Failed"]


MPI = WORKLOADS["MPIJob"]
WAITING = {**MPI, "spec": {**MPI["spec"], "launcherCreationPolicy": "WaitForWorkersReady"}}


@pytest.mark.parametrize(("kind", "mode"), cases(("MPIJob",)))
async def test_an_mpijobs_launcher_made_once_its_workers_are_ready_ends_it(
    kmock: NamespacedEmulator, tmp_path: Path, kind: str, mode: Mode
) -> None:
    """The launcher a late pod set: the job runs on its workers alone, the operator then
    makes the launcher (its pod granted or gang-scheduled after the others), whose end
    ends the job."""
    member = member_of(kmock, mode)
    early: list[str] = []  # a launcher pod seen beside a worker not yet running

    class Observer:
        async def reconcile(self) -> None:
            pods = list(ours(member, PODS).values())
            launcher = [p for p in pods if is_launcher(p)]
            if launcher and any(phase(p) != "Running" for p in pods if not is_launcher(p)):
                early.append(launcher[0]["metadata"]["name"])

    member.controllers.append(Observer())
    async with member.running(), broker(kmock, tmp_path, mode) as service:
        _, created = await service.submit("team-a", manifest(kind, workload=WAITING))
        assert created
        await service.schedule_once()
        await launched(service, member, ("team-a", "train"))
        assert (await service.get("team-a", "train")).state == "Running"
        await end_all(service, member, kind)
        record = await service.get("team-a", "train")
        assert (record.state, record.reason[: len("MPIJobSucceeded")]) == (
            "Succeeded", "MPIJobSucceeded")  # fmt: skip
        roles = [labels_of(p).get("training.kubeflow.org/job-role") for p in member.c.made]
        assert roles == ["worker", "worker", "launcher"]
        assert early == []
        assert await history(service) == [*RUN, "Succeeded"]
        assert not service.ledger.reservations()


SMALL = {"apiVersion": "batch/v1", "kind": "Job", "spec": {
    "completions": 1, "parallelism": 1, "backoffLimit": 0, "template": pod_template()}}  # fmt: skip


@pytest.mark.parametrize(
    ("mode", "same", "each"),
    [
        # Own names: test_concurrent_workloads.py. The same names in both tenants here, in
        # pin mode and with a gang scheduler (each delegated launch asks whether its
        # PodGroup runs: one shared listing for all), Volcano's fewer for the suite's time.
        pytest.param("pin", True, 30, id="pin-same-names"),
        pytest.param("coscheduling", True, 30, id="coscheduling-same-names"),
        pytest.param("volcano", True, 8, id="volcano-same-names"),
    ],
)
async def test_sixty_workloads_at_once_by_two_tenants_none_rolled_back(
    kmock: NamespacedEmulator, tmp_path: Path, mode: Mode, same: bool, each: int
) -> None:
    """``each`` workloads per tenant at once; two tenants' jobs are apart by their tenant,
    under the same names too (each tenant's namespace is its own, its PodGroups named
    after its jobs there)."""
    member = member_of(kmock, mode, nodes=16)
    jobs = [(f"team-{t}", f"w{i}" if same else f"{t}{i}") for i in range(each) for t in "ab"]
    async with member.running(), broker(kmock, tmp_path, mode) as service:
        made = await asyncio.gather(
            *(service.submit(t, manifest("Job", n, workload=SMALL)) for t, n in jobs)
        )
        assert all(created for _, created in made)
        await service.schedule_once()
        await launched(service, member, *jobs)
        records = [await service.get(t, n) for t, n in jobs]
        states = {f"{r.tenant}/{r.name}": (r.state, r.reason) for r in records}
        assert {state for state, _ in states.values()} == {"Running"}, states
        everyone = [p for p in member.c.live(PODS) if phase(p) == "Running"]
        await member.schedulers.end(everyone, "Succeeded")
        await service.runs_done()
        for tenant, name in jobs:
            assert await history(service, name, tenant) == [*RUN, "Succeeded"]


@pytest.mark.parametrize("mode", MODES)
async def test_two_tenants_same_named_jobs_pods_of_the_same_names_run_apart(
    kmock: NamespacedEmulator, tmp_path: Path, mode: Mode
) -> None:
    """A PyTorchJob's pods are named after it (``train-master-0``): two tenants' jobs
    ``train`` make pods of the same names, each in its tenant's namespace; each job runs on
    its own pods, counted once each, and ends by its own."""
    member = member_of(kmock, mode)
    jobs = [("team-a", "train"), ("team-b", "train")]
    async with member.running(), broker(kmock, tmp_path, mode) as service:
        for tenant, name in jobs:
            assert (await service.submit(tenant, manifest("PyTorchJob", name)))[1]
        await service.schedule_once()
        await launched(service, member, *jobs)
        for tenant, name in jobs:
            record = await service.get(tenant, name)
            assert record.state == "Running", (record.reason, state_of(member))
        names = {f"{p['metadata']['namespace']}/{p['metadata']['name']}"
                 for p in member.c.live(PODS)}  # fmt: skip
        replicas = ("train-master-0", "train-worker-0", "train-worker-1")
        assert names == {f"fedbroker-{t}/{r}" for t, _ in jobs for r in replicas}

        def counted_once() -> bool:
            return ledger_gpus(service) == pods_gpus(member, everywhere=True)

        assert await settle(member, counted_once), (ledger_gpus(service), pods_gpus(member, True))
        assert sum(ledger_gpus(service).values()) == 6
        await member.schedulers.end([p for p in member.c.live(PODS)], "Succeeded")
        await service.runs_done()
        for tenant, name in jobs:
            assert await history(service, name, tenant) == [*RUN, "Succeeded"]
