"""TrainJob (Kubeflow Trainer v2) at service level: two Kubernetes members, each a kmock
emulator (real HTTP, the real client from a kubeconfig) serving the real trainer CRDs; the
ClusterTrainingRuntime the job names is in east only. The job is placed on east only and
explain names west as lacking it; it runs to Succeeded with the Trainer controller played
as upstream (a JobSet named as the TrainJob from the runtime's template, the TrainJob's
trainer overrides and the broker's runtime patch applied; the JobSet controller's pods named
and labelled as it names them; statuses written); a runtime made after start is followed
by the members' caches; a runtime no member has refuses the job at submission."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any, cast

import kmock as kmocklib
import pytest
from builders import until
from controllers.trainjob import jobset_spec
from kmock_namespaces import NamespacedEmulator
from kubernetes.aio.client import ApiClient, Configuration, CustomObjectsApi
from test_member_failover import kubeconfig
from test_workload_service import node_obj

from broker.config import parse_config
from broker.manifest import ManifestError, parse_manifest
from broker.service.facade import Service

G = "trainer.kubeflow.org"
NODES = kmocklib.resource("", "v1", "nodes")
PODS = kmocklib.resource("", "v1", "pods")
JOBSETS = kmocklib.resource("jobset.x-k8s.io", "v1alpha2", "jobsets")
TRAINJOBS = kmocklib.resource(G, "v1alpha1", "trainjobs")
CTRS = kmocklib.resource(G, "v1alpha1", "clustertrainingruntimes")
NS = "fedbroker-team-a"
GATE = "fedbroker.io/placement"
ANCESTOR = "trainer.kubeflow.org/trainjob-ancestor-step"

CONFIG = """
store: {{url: "sqlite:///{db}"}}
clusters:
- {{name: east, source: {{kube: {{kubeconfig: "{kubeconfig}", context: east, {kube}}}}}}}
- {{name: west, source: {{kube: {{kubeconfig: "{kubeconfig}", context: west, {kube}}}}}}}
queues:
- {{name: training, policy: gang}}
tenants:
- {{name: team-a, defaultQueue: training, token: {{value: tok-a-00000000000000000000000000}}}}
"""
KUBE = "launchMode: pin, podPollSeconds: 0.02, watchInactivitySeconds: 1"

pytestmark = pytest.mark.kmock(cls=NamespacedEmulator)


def runtime(name: str) -> dict[str, Any]:
    """A torch ClusterTrainingRuntime as Trainer's manifests ship one: one replicated job,
    the trainer node, its container ``node``."""
    pod = {"spec": {"restartPolicy": "Never", "containers": [{
        "name": "node", "image": "pytorch/pytorch:2.7.1", "command": ["torchrun", "train.py"],
    }]}}  # fmt: skip
    return {
        "apiVersion": f"{G}/v1alpha1", "kind": "ClusterTrainingRuntime",
        "metadata": {"name": name},
        "spec": {"mlPolicy": {"numNodes": 1, "torch": {}},
                 "template": {"spec": {"replicatedJobs": [{"name": "node", "template": {
                     "metadata": {"labels": {ANCESTOR: "trainer"}},
                     "spec": {"template": pod}}}]}}},
    }  # fmt: skip


def manifest(name: str, runtime_name: str = "torch-distributed") -> Any:
    workload = {"apiVersion": f"{G}/v1alpha1", "kind": "TrainJob", "spec": {
        "runtimeRef": {"name": runtime_name},
        "trainer": {"numNodes": 2, "image": "me/train:1", "resourcesPerNode": {
            "limits": {"nvidia.com/gpu": 4, "cpu": "8", "memory": "32Gi"}}},
    }}  # fmt: skip
    body = {"apiVersion": "fedbroker.io/v1alpha1", "kind": "FederatedJob",
            "metadata": {"name": name}, "spec": {"workload": workload}}  # fmt: skip
    return parse_manifest(json.dumps(body).encode(), "application/json")


def prepare(k8s: kmocklib.KubernetesEmulator, nodes: list[str]) -> None:
    for res, namespaced in (("v1/pods", True), ("v1/nodes", False), ("v1/services", True),
                            ("jobset.x-k8s.io/v1alpha2/jobsets", True),
                            (f"{G}/v1alpha1/trainjobs", True),
                            (f"{G}/v1alpha1/clustertrainingruntimes", False),
                            (f"{G}/v1alpha1/trainingruntimes", True)):  # fmt: skip
        k8s.resources[res] = kmocklib.ResourceInfo(namespaced=namespaced)
    for name in nodes:
        k8s.objects[NODES, None, name] = node_obj(name)


def live(k8s: kmocklib.KubernetesEmulator, resource: Any) -> dict[str, Any]:
    return {n: o.raw for (r, _, n), o in list(k8s.objects.items()) if r == resource
            and not o.deleted}  # fmt: skip


def play_trainer(k8s: kmocklib.KubernetesEmulator, name: str) -> dict[str, Any]:
    """The Trainer controller: the JobSet named as the TrainJob, from its runtime's template
    with the trainer's overrides and every runtime patch (``controllers.trainjob``, which
    the workload matrix plays)."""
    train = live(k8s, TRAINJOBS)[name]
    runtime = live(k8s, CTRS)[train["spec"]["runtimeRef"]["name"]]
    owner = {"apiVersion": f"{G}/v1alpha1", "kind": "TrainJob", "name": name,
             "uid": f"uid-{name}", "controller": True}  # fmt: skip
    body = {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
            "metadata": {"name": name, "namespace": NS, "ownerReferences": [owner],
                         "labels": {"trainer.kubeflow.org/trainjob-name": name}},
            "spec": jobset_spec(train, runtime["spec"])}  # fmt: skip
    cast(NamespacedEmulator, k8s).controller_create(JOBSETS, NS, body)
    return body


def play_jobset(k8s: kmocklib.KubernetesEmulator, jobset: dict[str, Any]) -> list[str]:
    """The JobSet (and Job) controllers: pods ``<jobset>-<rjob>-<job>-<index>-<x>`` labelled
    with the JobSet's names and indexes, from the replicated job's pod template."""
    name, names = jobset["metadata"]["name"], []
    for rj in jobset["spec"]["replicatedJobs"]:
        job = rj["template"]["spec"]
        for j in range(rj.get("replicas", 1)):
            for i in range(job.get("parallelism", 1)):
                pod_name = f"{name}-{rj['name']}-{j}-{i}-x{i}q"
                labels = {**job["template"]["metadata"]["labels"],
                          "jobset.sigs.k8s.io/jobset-name": name,
                          "jobset.sigs.k8s.io/replicatedjob-name": rj["name"],
                          "jobset.sigs.k8s.io/job-index": str(j),
                          "batch.kubernetes.io/job-completion-index": str(i)}  # fmt: skip
                cast(NamespacedEmulator, k8s).controller_create(PODS, NS, {
                    "apiVersion": "v1", "kind": "Pod",
                    "metadata": {"name": pod_name, "namespace": NS, "labels": labels,
                                 "annotations": job["template"]["metadata"].get("annotations")
                                 or {}, "uid": f"uid-{pod_name}"},
                    "spec": copy.deepcopy(job["template"]["spec"]),
                })  # fmt: skip
                names.append(pod_name)
    return names


def pinned(pod: dict[str, Any]) -> str | None:
    spec = pod["spec"]
    if any(g.get("name") == GATE for g in spec.get("schedulingGates") or ()):
        return None
    terms = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    return str(terms["nodeSelectorTerms"][0]["matchFields"][0]["values"][0])


@pytest.fixture
async def members(kmock: kmocklib.KubernetesEmulator, tmp_path: Path) -> Any:
    east = kmock
    prepare(east, ["e1", "e2"])
    east.objects[CTRS, None, "torch-distributed"] = runtime("torch-distributed")
    async with NamespacedEmulator() as west, kmocklib.Server(west):
        prepare(west, ["w1", "w2", "w3"])  # more room than east: chosen if it could be
        path = tmp_path / "kubeconfig"
        path.write_text(json.dumps(kubeconfig({"east": str(east.url), "west": str(west.url)})))
        text = CONFIG.format(db=tmp_path / "jobs.db", kubeconfig=path, kube=KUBE)
        service = Service(parse_config(text, "test config"))
        await service.start()
        for member in service.kube.members.values():  # both kinds listed in each
            await until(lambda m=member: m.runtimes.lists >= 2)  # type: ignore[misc]
        try:
            yield service, east, west
        finally:
            await service.close()


async def test_a_trainjob_goes_only_where_its_runtime_is_and_runs_to_succeeded(
    members: Any,
) -> None:
    service, east, west = members
    await service.submit("team-a", manifest("llm"))
    explained = await service.explain("team-a", "llm")
    rows = {row["cluster"]: row for row in explained["clusters"]}
    [reason] = rows["west"]["reasons"]
    assert reason["code"] == "ClusterLacksWorkloadDependency"
    assert "cluster west has no ClusterTrainingRuntime torch-distributed" in reason["message"]
    await service.schedule_once()
    assert (await service.get("team-a", "llm")).state == "Placed"
    await until(lambda: "llm" in live(east, TRAINJOBS))
    assert live(west, TRAINJOBS) == {}
    created = live(east, TRAINJOBS)["llm"]
    assert "runtime" not in created
    [patch] = created["spec"]["runtimePatches"]
    assert patch["manager"] == "fedbroker.io/broker"
    names = play_jobset(east, play_trainer(east, "llm"))
    assert names == ["llm-node-0-0-x0q", "llm-node-0-1-x1q"]
    await until(lambda: all(pinned(live(east, PODS)[n]) for n in names))
    nodes = {n: str(pinned(live(east, PODS)[n])) for n in names}
    assert sorted(nodes.values()) == ["e1", "e2"]
    for n, node in nodes.items():
        pod = live(east, PODS)[n]
        assert pod["metadata"]["labels"]["fedbroker.io/pod-set"] == "node"
        assert pod["spec"]["containers"][0]["image"] == "me/train:1"
        east.objects[PODS, NS, n].patch(
            {"spec": {"nodeName": node}, "status": {"phase": "Running"}}
        )
    await service.launches_done(timeout=10)
    assert (await service.get("team-a", "llm")).state == "Running"
    for n in names:
        east.objects[PODS, NS, n].patch({"status": {"phase": "Succeeded"}})
    east.objects[TRAINJOBS, NS, "llm"].patch({"status": {"conditions": [{
        "type": "Complete", "status": "True", "reason": "JobSetCompleted",
        "message": "jobset completed successfully",
        "lastTransitionTime": "2026-01-01T00:00:00Z"}]}})  # fmt: skip
    await service.runs_done(timeout=10)
    record = await service.get("team-a", "llm")
    assert record.state == "Succeeded" and "JobSetCompleted" in record.reason
    assert not service.ledger.reservations()


async def test_a_runtime_no_member_has_is_refused_at_submission_naming_the_field(
    members: Any,
) -> None:
    service, _, _ = members
    with pytest.raises(ManifestError) as info:
        await service.submit("team-a", manifest("llm", "jax-distributed"))
    message = str(info.value)
    assert message.startswith("spec.workload.spec.runtimeRef.name: no member has")
    assert "east: has no ClusterTrainingRuntime jax-distributed" in message
    assert await service.store.get_job("team-a", "llm") is None


async def test_the_members_caches_follow_a_runtime_made_after_start(members: Any) -> None:
    service, _, west = members
    with pytest.raises(ManifestError):
        await service.submit("team-a", manifest("early", "jax-distributed"))
    api = ApiClient(Configuration(host=str(west.url).rstrip("/")))
    try:  # the operator installs it in west, through the API
        await CustomObjectsApi(api).create_cluster_custom_object(
            G, "v1alpha1", "clustertrainingruntimes", runtime("jax-distributed")
        )
    finally:
        await api.close()  # type: ignore[no-untyped-call]
    cache = service.kube.members["west"].runtimes
    await until(lambda: cache.lookup("ClusterTrainingRuntime", "", "jax-distributed") is not None)
    record, created = await service.submit("team-a", manifest("late", "jax-distributed"))
    assert created
    stored = record.manifest["spec"]["workload"]["runtime"]
    assert (stored["name"], stored["clusters"]) == ("jax-distributed", ["west"])
