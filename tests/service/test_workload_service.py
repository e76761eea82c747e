"""The Service running ``spec.workload`` jobs on a Kubernetes member served by kmock (real
HTTP, the real ``kubernetes.aio`` client from a kubeconfig file; Namespaces served by
``tests/kmock_namespaces.py``), in pin mode. The test plays the workload's controller (it
makes the pods from the stored object's template, gated, named as the controller names
them), the scheduler and kubelet (binds them where the broker pinned them, sets their
phases) and the controller's status writes; the broker creates the workload, grants slots,
follows its status, rolls it back with backoff (on the injected clock) and deletes it.

The launcher polls the member every ``podPollSeconds`` (0.02 here): the tests wait on
conditions (``until``), never on a number of polls."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any, cast

import kmock
import kmock as kmocklib
import pytest
from builders import Clock, until
from kmock_namespaces import NamespacedEmulator

from broker.config import Config, parse_config
from broker.manifest import parse_manifest
from broker.service.facade import Service

NODES = kmock.resource("", "v1", "nodes")
PODS = kmock.resource("", "v1", "pods")
JOBS = kmock.resource("batch", "v1", "jobs")
JOBSETS = kmock.resource("jobset.x-k8s.io", "v1alpha2", "jobsets")
NS = "fedbroker-team-a"  # team-a's namespace under the default pattern fedbroker-{tenant}
GATE = "fedbroker.io/placement"
OURS = {"fedbroker.io/origin": "fedbroker", "fedbroker.io/tenant": "team-a"}
T0 = 1_000.0

CONFIG = """
store: {{url: "sqlite:///{db}"}}
clusters:
- name: east
  source:
    kube: {{kubeconfig: "{kubeconfig}", context: east, launchMode: pin, podPollSeconds: 0.02}}
queues:
- {{name: training, policy: gang, reclaimable: true}}
tenants:
- {{name: team-a, defaultQueue: training, token: {{value: tok-a-00000000000000000000000000}}}}
"""

# Each pod: 4 GPUs, a whole node of the member.
POD_TEMPLATE = {
    "metadata": {"labels": {"app": "trainer"}},
    "spec": {
        "restartPolicy": "Never",
        "containers": [{
            "name": "main", "image": "trainer:1.0",
            "resources": {"limits": {"nvidia.com/gpu": 4, "cpu": "8", "memory": "32Gi"}},
        }],
    },
}  # fmt: skip
INDEXED = {"completionMode": "Indexed", "completions": 2, "parallelism": 2, "backoffLimit": 0}
WORKLOADS: dict[str, dict[str, Any]] = {
    "Job": {"apiVersion": "batch/v1", "kind": "Job", "spec": {**INDEXED, "template": POD_TEMPLATE}},
    "JobSet": {
        "apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
        "spec": {"replicatedJobs": [{
            "name": "workers", "replicas": 1,
            "template": {"spec": {**INDEXED, "template": POD_TEMPLATE}},
        }]},
    },
}  # fmt: skip
RESOURCES = {"Job": JOBS, "JobSet": JOBSETS}


def node_obj(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {"nvidia.com/gpu.product": "A100"}},
        "spec": {},
        "status": {
            "allocatable": {"nvidia.com/gpu": "4", "cpu": "64", "memory": "256Gi"},
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }


def make_config(tmp_path: Path, server: str) -> Config:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "east",
        "contexts": [{"name": "east", "context": {"cluster": "c-east", "user": "u"}}],
        "clusters": [{"name": "c-east", "cluster": {"server": server}}],
        "users": [{"name": "u", "user": {"token": "not-a-real-token"}}],
    }))  # fmt: skip
    return parse_config(CONFIG.format(db=tmp_path / "jobs.db", kubeconfig=kubeconfig), "test")


def manifest(name: str, kind: str, priority: int = 0) -> Any:
    body = {
        "apiVersion": "fedbroker.io/v1alpha1",
        "kind": "FederatedJob",
        "metadata": {"name": name},
        "spec": {"workload": WORKLOADS[kind], "priority": priority},
    }
    return parse_manifest(json.dumps(body).encode(), "application/json")


pytestmark = pytest.mark.kmock(cls=NamespacedEmulator)


@pytest.fixture
def k8s(kmock: kmock.KubernetesEmulator) -> kmock.KubernetesEmulator:
    kmock.resources["v1/pods"] = kmocklib.ResourceInfo(namespaced=True)
    kmock.resources["v1/nodes"] = kmocklib.ResourceInfo(namespaced=False)
    kmock.resources["v1/services"] = kmocklib.ResourceInfo(namespaced=True)
    kmock.resources["batch/v1/jobs"] = kmocklib.ResourceInfo(namespaced=True)
    kmock.resources["jobset.x-k8s.io/v1alpha2/jobsets"] = kmocklib.ResourceInfo(namespaced=True)
    for name in ("n1", "n2"):
        kmock.objects[NODES, None, name] = node_obj(name)
    return kmock


def live(k8s: kmock.KubernetesEmulator, resource: Any) -> dict[str, Any]:
    """Name -> stored object of ``resource`` in the tenant's namespace, deleted ones left out."""
    return {
        name: obj
        for (res, ns, name), obj in list(k8s.objects.items())
        if res == resource and ns == NS and not obj.deleted
    }


def controller_pods(k8s: kmock.KubernetesEmulator, kind: str, job: str, attempt: int) -> list[str]:
    """Play the workload's controller: its 2 pods from the stored object's pod template
    (labels, scheduling gate and all), named and labelled as the Job / JobSet controller
    does (``attempt`` stands for the random suffix)."""
    obj = live(k8s, RESOURCES[kind])[job].raw
    if kind == "Job":
        template = obj["spec"]["template"]
        prefix, extra = f"{job}-", {"batch.kubernetes.io/job-name": job, "job-name": job}
    else:
        template = obj["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]
        prefix = f"{job}-workers-0-"
        extra = {"jobset.sigs.k8s.io/jobset-name": job, "jobset.sigs.k8s.io/job-index": "0",
                 "jobset.sigs.k8s.io/replicatedjob-name": "workers"}  # fmt: skip
    names = []
    for index in range(2):
        name = f"{prefix}{index}-a{attempt}x{index}q"
        labels = {**template["metadata"]["labels"], **extra,
                  "batch.kubernetes.io/job-completion-index": str(index)}  # fmt: skip
        # through the member's rules, as the controller's create goes
        cast(NamespacedEmulator, k8s).controller_create(PODS, NS, {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": name, "namespace": NS, "labels": labels, "uid": f"uid-{name}",
                "creationTimestamp": "2026-01-01T00:00:00Z",
                "ownerReferences": [{"apiVersion": obj["apiVersion"], "kind": kind,
                                     "name": job, "uid": f"uid-{job}", "controller": True}],
            },
            "spec": copy.deepcopy(template["spec"]),
        })  # fmt: skip
        names.append(name)
    return names


def pinned_node(pod: dict[str, Any]) -> str | None:
    """The node the broker pinned an ungated pod to (None while it is gated)."""
    spec = pod["spec"]
    if any(g.get("name") == GATE for g in spec.get("schedulingGates") or ()):
        return None
    required = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    [term] = required["nodeSelectorTerms"]
    [field] = term["matchFields"]
    assert field["key"] == "metadata.name"
    [node] = field["values"]
    return str(node)


async def granted(k8s: kmock.KubernetesEmulator, names: list[str]) -> dict[str, str]:
    """Wait until the broker has ungated and pinned every pod of ``names``: pod -> node."""
    await until(lambda: all(pinned_node(live(k8s, PODS)[n].raw) for n in names))
    return {n: str(pinned_node(live(k8s, PODS)[n].raw)) for n in names}


def kubelet(k8s: kmock.KubernetesEmulator, name: str, node: str, phase: str) -> None:
    """Play the scheduler and kubelet: the pod bound where it was pinned, in ``phase``."""
    live(k8s, PODS)[name].patch({"spec": {"nodeName": node}, "status": {"phase": phase}})


async def running(service: Service, k8s: kmock.KubernetesEmulator, kind: str) -> list[str]:
    """Submit ``train`` (a ``kind`` workload of 2 pods), place it, and play the controller
    and kubelet until it runs; returns its pods' names."""
    _, created = await service.submit("team-a", manifest("train", kind))
    assert created
    await service.schedule_once()
    assert (await service.get("team-a", "train")).state == "Placed"
    await until(lambda: "train" in live(k8s, RESOURCES[kind]))
    [workload] = live(k8s, RESOURCES[kind]).values()
    labels = workload.raw["metadata"]["labels"]
    assert labels == {**OURS, "fedbroker.io/job": "train"}
    assert list(live(k8s, RESOURCES[kind])) == ["train"]
    names = controller_pods(k8s, kind, "train", attempt=1)
    nodes = await granted(k8s, names)
    assert sorted(nodes.values()) == ["n1", "n2"]  # one whole node each
    for name in names:
        pod = live(k8s, PODS)[name].raw
        assert pod["metadata"]["labels"]["app"] == "trainer"  # the tenant's template
        assert pod["metadata"]["annotations"]["fedbroker.io/gpus"] == "0,1,2,3"
    for name, node in nodes.items():
        assert (await service.get("team-a", "train")).state == "Placed"  # not all running
        kubelet(k8s, name, node, "Running")
    await service.launches_done(timeout=10)
    assert (await service.get("team-a", "train")).state == "Running"
    return names


@pytest.fixture
async def service(k8s: kmock.KubernetesEmulator, tmp_path: Path, clock: Clock) -> Any:
    service = Service(make_config(tmp_path, str(k8s.url).rstrip("/")), clock=clock)
    await service.start()
    assert service.ready and not service.ledger.snapshot().clusters["east"].stale
    try:
        yield service
    finally:
        await service.close()


@pytest.fixture
def clock() -> Clock:
    return Clock(T0)


ENDS = [
    pytest.param("Job", "Complete", "CompletionsReached",
                 "Reached expected number of succeeded pods", "Succeeded", id="Job-complete"),
    pytest.param("Job", "Failed", "BackoffLimitExceeded",
                 "Job has reached the specified backoff limit", "Failed", id="Job-failed"),
    pytest.param("JobSet", "Completed", "AllJobsCompleted", "jobset completed successfully",
                 "Succeeded", id="JobSet-completed"),
]  # fmt: skip


@pytest.mark.parametrize(("kind", "condition", "reason", "message", "state"), ENDS)
async def test_a_workload_job_runs_and_ends_by_its_controllers_status(
    service: Service, k8s: kmock.KubernetesEmulator, clock: Clock,
    kind: str, condition: str, reason: str, message: str, state: str,
) -> None:  # fmt: skip
    names = await running(service, k8s, kind)
    clock.now += 30
    # The pods end, then the controller says how the workload did: that decides.
    phase = "Succeeded" if state == "Succeeded" else "Failed"
    for name in names:
        live(k8s, PODS)[name].patch({"status": {"phase": phase}})
    live(k8s, RESOURCES[kind])["train"].patch({"status": {"conditions": [
        {"type": condition, "status": "True", "reason": reason, "message": message},
    ]}})  # fmt: skip
    await service.runs_done(timeout=10)
    record = await service.get("team-a", "train")
    assert record.state == state
    last = (await service.store.history("team-a", "train"))[-1]
    assert (last.state, last.reason, last.at) == (state, f"{reason}: {message} after 30s", T0 + 30)
    assert not service.ledger.reservations()


async def test_a_pod_failed_before_the_gang_ran_requeues_with_backoff(
    service: Service, k8s: kmock.KubernetesEmulator, clock: Clock
) -> None:
    await service.submit("team-a", manifest("train", "Job"))
    placed_at = T0
    for attempt, backoff in ((1, 60), (2, 120)):
        clock.now = placed_at
        await service.schedule_once()
        assert (await service.get("team-a", "train")).state == "Placed"
        await until(lambda: "train" in live(k8s, JOBS))
        names = controller_pods(k8s, "Job", "train", attempt)
        nodes = await granted(k8s, names)
        clock.now = failed_at = placed_at + 5
        kubelet(k8s, names[0], nodes[names[0]], "Failed")  # the other stays Pending
        await service.launches_done(timeout=10)
        record = await service.get("team-a", "train")
        assert (record.state, record.attempts) == ("Queued", attempt)
        assert record.not_before == failed_at + backoff
        assert f"pod {names[0]} Failed before the gang ran" in record.reason
        # The workload and its pods are gone; nothing is reserved until the backoff ends.
        assert live(k8s, JOBS) == {} and live(k8s, PODS) == {}
        assert not service.ledger.reservations()
        clock.now = failed_at + backoff - 1
        await service.schedule_once()
        assert (await service.get("team-a", "train")).state == "Queued"
        placed_at = failed_at + backoff  # the backoff over: placed again
    history = [(t.state, t.at) for t in await service.store.history("team-a", "train")]
    assert history == [
        ("Queued", T0), ("Placed", T0), ("Queued", T0 + 5),
        ("Placed", T0 + 65), ("Queued", T0 + 70),
    ]  # fmt: skip


@pytest.mark.parametrize("kind", ["Job", "JobSet"])
async def test_cancel_of_a_running_workload_job_deletes_its_workload(
    service: Service, k8s: kmock.KubernetesEmulator, kind: str
) -> None:
    await running(service, k8s, kind)
    await service.cancel("team-a", "train")
    assert (await service.get("team-a", "train")).state == "Cancelled"
    assert live(k8s, RESOURCES[kind]) == {}
    assert live(k8s, PODS) == {}
    assert not service.ledger.reservations()


async def test_a_preempted_workload_job_has_its_workload_deleted(
    service: Service, k8s: kmock.KubernetesEmulator
) -> None:
    await running(service, k8s, "Job")
    await service.submit("team-a", manifest("urgent", "Job", priority=100))
    await service.schedule_once()  # train (reclaimable, priority 0) makes room, whole
    train = await service.get("team-a", "train")
    assert train.state == "Queued" and "preempted" in train.reason
    assert (await service.get("team-a", "urgent")).state == "Placed"
    assert "train" not in live(k8s, JOBS)
    assert not any(n.startswith("train-") for n in live(k8s, PODS))
