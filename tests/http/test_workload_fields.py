"""A workload's own fields, every one of its pod templates and what its controller adds,
through the HTTP API: one row per field a hostile tenant was found to slip past admission
(a blocklist missed them), each a one-line 403 naming the exact path, nothing stored, the
dry run answering alike; and what an operator injects refused by the tenant's level, with
why and what to use instead."""

from __future__ import annotations

import copy
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from served import Client, bearer, federation, served

CONFIG = federation("a", "r: podSecurity: restricted", "p: podSecurity: privileged")
A = bearer("a")  # baseline
R = bearer("r")  # restricted
P = bearer("p")  # privileged
Obj = dict[str, Any]
W = "spec.workload.spec"

RESTRICTED = {
    "runAsNonRoot": True,
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
    "seccompProfile": {"type": "RuntimeDefault"},
}
POD: Obj = {
    "spec": {
        "restartPolicy": "Never",
        "containers": [
            {
                "name": "pytorch",
                "image": "t:1",
                "securityContext": RESTRICTED,
                "resources": {"limits": {"nvidia.com/gpu": 1, "cpu": "4", "memory": "16Gi"}},
            }
        ],
    }
}
CPU_POD: Obj = {
    "spec": {
        "containers": [{"name": "head", "image": "ray:2", "resources": {"requests": {"cpu": "2"}}}]
    }
}
PRIVILEGED: Obj = {
    "spec": {"containers": [{"name": "m", "image": "t:1", "securityContext": {"privileged": True}}]}
}
HOST_PID: Obj = {"spec": {"hostPID": True, "containers": [{"name": "m", "image": "t:1"}]}}
HOST_ROOT: Obj = {
    "spec": {
        "containers": [{"name": "m", "image": "t:1"}],
        "volumes": [{"name": "root", "hostPath": {"path": "/"}}],
    }
}
PVC_LABELS: Obj = {
    "spec": {
        "restartPolicy": "Never",
        "containers": [{"name": "m", "image": "t:1"}],
        "volumes": [
            {
                "name": "scratch",
                "ephemeral": {
                    "volumeClaimTemplate": {
                        "metadata": {"labels": {"fedbroker.io/job": "theirs"}},
                        "spec": {
                            "accessModes": ["ReadWriteOnce"],
                            "resources": {"requests": {"storage": "1Gi"}},
                        },
                    }
                },
            }
        ],
    }
}
# the pod templates' metadata a tenant might try (each refused, named)
NAMED: list[tuple[str, Any]] = [("finalizers", ["x/y"]), ("name", "mine"),
                                ("namespace", "team-b"),
                                ("ownerReferences", [{"apiVersion": "v1", "kind": "Pod",
                                                      "name": "p", "uid": "u"}])]  # fmt: skip


def batch_job(template: Obj = POD, **spec: Any) -> Obj:
    return {"apiVersion": "batch/v1", "kind": "Job", "spec": {"template": template, **spec}}


def jobset(**spec: Any) -> Obj:
    replicated = {"name": "w", "replicas": 2, "template": {"spec": {"template": POD}}}
    return {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
            "spec": {"replicatedJobs": [replicated], **spec}}  # fmt: skip


def pytorch(master: bool = True, **spec: Any) -> Obj:
    replicas: Obj = {"Worker": {"replicas": 2, "restartPolicy": "OnFailure", "template": POD}}
    if master:
        replicas["Master"] = {"replicas": 1, "restartPolicy": "OnFailure", "template": POD}
    return {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
            "spec": {"pytorchReplicaSpecs": replicas, **spec}}  # fmt: skip


def cluster(head: Obj | None = None, **extra: Any) -> Obj:
    workers = [{"groupName": "gpu", "replicas": 1, "minReplicas": 1, "maxReplicas": 1,
                "rayStartParams": {}, "template": POD}]  # fmt: skip
    head_group = {"rayStartParams": {}, "template": CPU_POD, **(head or {})}
    return {"headGroupSpec": head_group, "workerGroupSpecs": workers, **extra}


def ray_cluster(**extra: Any) -> Obj:
    return {"apiVersion": "ray.io/v1", "kind": "RayCluster", "spec": cluster(**extra)}


def ray_job(head: Obj | None = None, **spec: Any) -> Obj:
    return {"apiVersion": "ray.io/v1", "kind": "RayJob", "spec": {
        "entrypoint": "python train.py", "rayClusterSpec": cluster(head), **spec}}  # fmt: skip


def idle_group(template: Obj) -> Obj:
    """A RayCluster with a second worker group of no pods (not a pod set) and ``template``."""
    out = ray_cluster()
    out["spec"]["workerGroupSpecs"].append(
        {"groupName": "idle", "replicas": 0, "minReplicas": 0, "maxReplicas": 0,
         "rayStartParams": {}, "template": template})  # fmt: skip
    return out


def with_meta(workload: Obj, key: str, value: Any) -> Obj:
    out = copy.deepcopy(workload)
    out["spec"]["template"]["metadata"] = {key: value}
    return out


def child_labels(labels: Obj) -> Obj:
    out = jobset()
    out["spec"]["replicatedJobs"][0]["template"]["metadata"] = {"labels": labels}
    return out


WGS1 = f"{W}.workerGroupSpecs[1].template.spec"
HEAD = f"{W}.rayClusterSpec.headGroupSpec"
# (id, spec.workload, tenant, the exact path of the 403)
REFUSED: list[tuple[str, Obj, dict[str, str], str]] = [
    ("Job managedBy", batch_job(managedBy="kueue.x-k8s.io/multikueue"), A, f"{W}.managedBy"),
    ("JobSet managedBy", jobset(managedBy="kueue.x-k8s.io/multikueue"), A, f"{W}.managedBy"),
    ("PyTorchJob runPolicy.managedBy", pytorch(runPolicy={"managedBy": "x.io/other"}), A,
     f"{W}.runPolicy.managedBy"),
    ("Ray enableIngress", ray_job({"enableIngress": True}), A, f"{HEAD}.enableIngress"),
    ("Ray serviceType LoadBalancer", ray_job({"serviceType": "LoadBalancer"}), A,
     f"{HEAD}.serviceType"),
    ("Ray serviceType NodePort", ray_cluster(headGroupSpec={
        "rayStartParams": {}, "template": CPU_POD, "serviceType": "NodePort"}), A,
     f"{W}.headGroupSpec.serviceType"),
    ("Ray headService externalIPs", ray_job({"headService": {"spec": {
        "externalIPs": ["203.0.113.7"]}}}), A, f"{HEAD}.headService"),
    ("Ray headServiceAnnotations", ray_cluster(headServiceAnnotations={
        "service.beta.kubernetes.io/aws-load-balancer-scheme": "internet-facing"}), A,
     f"{W}.headServiceAnnotations"),
    ("Ray autoscalerOptions privileged", ray_cluster(autoscalerOptions={
        "securityContext": {"privileged": True}}), A, f"{W}.autoscalerOptions"),
    ("RayJob clusterSelector beside rayClusterSpec", ray_job(clusterSelector={
        "ray.io/cluster": "team-b-shared"}), A, f"{W}.clusterSelector"),
    ("PyTorchJob priorityClass", pytorch(runPolicy={"schedulingPolicy": {
        "priorityClass": "system-node-critical"}}), A,
     f"{W}.runPolicy.schedulingPolicy.priorityClass"),
    ("PyTorchJob queue", pytorch(runPolicy={"schedulingPolicy": {"queue": "team-b"}}), A,
     f"{W}.runPolicy.schedulingPolicy.queue"),
    ("PyTorchJob elasticPolicy", pytorch(elasticPolicy={"minReplicas": 1, "maxReplicas": 64}),
     A, f"{W}.elasticPolicy"),
    ("JobSet child labels tenant", child_labels({"fedbroker.io/tenant": "team-b"}), A,
     f"{W}.replicatedJobs[0].template.metadata.labels.fedbroker.io/tenant"),
    ("JobSet child labels job", child_labels({"fedbroker.io/job": "their-job"}), A,
     f"{W}.replicatedJobs[0].template.metadata.labels.fedbroker.io/job"),
    ("Job suspend", batch_job(suspend=True), A, f"{W}.suspend"),
    ("Job ttlSecondsAfterFinished 0", batch_job(ttlSecondsAfterFinished=0), A,
     f"{W}.ttlSecondsAfterFinished"),
    ("Job backoffLimit int32 max", batch_job(backoffLimit=2147483647), A, f"{W}.backoffLimit"),
    ("JobSet network.subdomain", jobset(network={"subdomain": "fedbroker-rendezvous"}), A,
     f"{W}.network.subdomain"),
    ("JobSet failurePolicy maxRestarts", jobset(failurePolicy={"maxRestarts": 2147483647}),
     A, f"{W}.failurePolicy.maxRestarts"),
    ("JobSet failurePolicy unbounded action", jobset(failurePolicy={"rules": [
        {"name": "r", "action": "RestartJobSetAndIgnoreMaxRestarts"}]}), A,
     f"{W}.failurePolicy.rules[0].action"),
    ("JobSet startupPolicy", jobset(startupPolicy={"startupPolicyOrder": "InOrder"}), A,
     f"{W}.startupPolicy"),
    ("JobSet suspend", jobset(suspend=True), A, f"{W}.suspend"),
    ("Ray group of 0 pods privileged", idle_group(PRIVILEGED), A,
     f"{WGS1}.containers[0].securityContext.privileged"),
    ("Ray group of 0 pods hostPID", idle_group(HOST_PID), A, f"{WGS1}.hostPID"),
    ("Ray group of 0 pods hostPath /", idle_group(HOST_ROOT), P, f"{WGS1}.volumes[0].hostPath"),
    ("submitter in HTTPMode", ray_job(submissionMode="HTTPMode",
                                      submitterPodTemplate=PRIVILEGED), A,
     f"{W}.submitterPodTemplate.spec.containers[0].securityContext.privileged"),
    ("submitter in a mode spelled otherwise", ray_job(submissionMode="k8sJobMode",
                                                      submitterPodTemplate=PRIVILEGED), A,
     f"{W}.submissionMode"),
    *((f"pod template metadata.{key}", with_meta(batch_job(), key, value), A,
       f"{W}.template.metadata.{key}") for key, value in NAMED),
    ("Ray group labels of the broker's", ray_job({"labels": {"fedbroker.io/tenant": "b"}}), A,
     f"{HEAD}.labels.fedbroker.io/tenant"),
    ("broker label in a volume claim template", batch_job(PVC_LABELS), A,
     f"{W}.template.spec.volumes[0].ephemeral.volumeClaimTemplate.metadata.labels"
     ".fedbroker.io/job"),
]  # fmt: skip


@pytest.fixture
async def api(tmp_path: Path) -> AsyncIterator[Client]:
    async with served(CONFIG, tmp_path) as (client, _):
        yield client


def job(name: str, workload: Obj) -> Obj:
    return {"apiVersion": "fedbroker.io/v1alpha1", "kind": "FederatedJob",
            "metadata": {"name": name}, "spec": {"workload": workload}}  # fmt: skip


async def refused_and_nothing_stored(api: Client, body: Obj, headers: dict[str, str]) -> str:
    """The one-line 403 error of ``body``, after checking nothing was stored and the dry
    run answers alike."""
    response = await api.post("/v1/jobs", json=body, headers=headers)
    error = (await response.json())["error"]
    assert response.status == 403, error
    assert "\n" not in error
    assert (await (await api.get("/v1/jobs", headers=headers)).json())["items"] == []
    name = body["metadata"]["name"]
    assert (await api.get(f"/v1/jobs/{name}", headers=headers)).status == 404
    dry_run = await api.post("/v1/plan", json=body, headers=headers)
    assert dry_run.status == 403
    assert (await dry_run.json())["error"] == error
    return str(error)


@pytest.mark.parametrize(("workload", "headers", "path"), [r[1:] for r in REFUSED],
                         ids=[r[0] for r in REFUSED])  # fmt: skip
async def test_a_field_past_the_allowlist_is_403_naming_it_and_stores_nothing(
    api: Client, workload: Obj, headers: dict[str, str], path: str
) -> None:
    error = await refused_and_nothing_stored(api, job("evil", workload), headers)
    assert error.startswith(f"{path}: "), error


@pytest.mark.parametrize(
    "workload",
    [batch_job(backoffLimit=6, ttlSecondsAfterFinished=86400, suspend=False),
     jobset(failurePolicy={"maxRestarts": 3, "rules": [{"name": "r", "action": "RestartJob"}]},
            network={"enableDNSHostnames": True}),
     pytorch(runPolicy={"backoffLimit": 3, "cleanPodPolicy": "Running"}),
     ray_job({"serviceType": "ClusterIP", "enableIngress": False},
             submissionMode="HTTPMode", shutdownAfterJobFinishes=True)],
    ids=["Job", "JobSet", "PyTorchJob", "RayJob"],
)  # fmt: skip
async def test_the_same_fields_within_their_bounds_are_admitted(api: Client, workload: Obj) -> None:
    response = await api.post("/v1/jobs", json=job("ok", workload), headers=A)
    assert response.status == 201, await response.text()


INIT = f"{W}.pytorchReplicaSpecs.Worker.template.spec.initContainers"


async def test_a_restricted_tenants_pytorchjob_with_a_master_is_refused_for_init_pytorch(
    api: Client,
) -> None:
    """The training operator adds init-pytorch (no securityContext) to every worker when a
    Master is there: the worker would never exist in a restricted namespace."""
    error = await refused_and_nothing_stored(api, job("ddp", pytorch()), R)
    assert error.startswith(f"{INIT}: "), error
    for words in ('"init-pytorch"', "Pod Security restricted", "JobSet", "podSets", "baseline"):
        assert words in error, (words, error)


@pytest.mark.parametrize(
    ("workload", "headers"),
    [(pytorch(), A), (pytorch(master=False), R)],
    ids=["baseline allows init-pytorch", "no Master: nothing is added"],
)
async def test_where_the_added_container_is_allowed_the_pytorchjob_is_admitted(
    api: Client, workload: Obj, headers: dict[str, str]
) -> None:
    response = await api.post("/v1/jobs", json=job("ddp", workload), headers=headers)
    assert response.status == 201, await response.text()


@pytest.mark.parametrize(("key", "value"), NAMED, ids=[n[0] for n in NAMED])
async def test_a_pod_sets_template_metadata_is_labels_and_annotations_only(
    api: Client, key: str, value: Any
) -> None:
    pod_set = {"name": "w", "count": 1, "template": {"metadata": {key: value}, **POD}}
    body = {"apiVersion": "fedbroker.io/v1alpha1", "kind": "FederatedJob",
            "metadata": {"name": "evil"}, "spec": {"podSets": [pod_set]}}  # fmt: skip
    error = await refused_and_nothing_stored(api, body, A)
    assert error.startswith(f"spec.podSets[0].template.metadata.{key}: "), error
