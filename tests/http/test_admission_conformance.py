"""Manifests as their member's API server and controllers take them, end to end through the
HTTP API: what a real server, webhook or controller would refuse is a 400 naming the field
path with nothing stored (one row per case, the cases the issue found first); quantities
written as numbers (as in most manifests) are accepted and stored as Kubernetes writes
them; the plan route answers as the submission would."""

from __future__ import annotations

import copy
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from served import Client, bearer, federation, served

CONFIG = federation("a")
A = bearer("a")
Obj = dict[str, Any]


@pytest.fixture
async def api(tmp_path: Path) -> AsyncIterator[Client]:
    async with served(CONFIG, tmp_path) as (client, _):
        yield client


def main(**extra: Any) -> Obj:
    limits = {"nvidia.com/gpu": 1, "cpu": 2, "memory": "8Gi"}
    return {"name": "main", "image": "trainer:1.0", "resources": {"limits": limits}, **extra}


POD: Obj = {"spec": {"containers": [main()]}}


def pod_sets(name: str = "train", template: Obj = POD) -> Obj:
    spec = {"podSets": [{"name": "worker", "count": 1, "template": template}]}
    return {"apiVersion": "fedbroker.io/v1alpha1", "kind": "FederatedJob",
            "metadata": {"name": name}, "spec": spec}  # fmt: skip


def workload(kind_spec: tuple[str, str, Obj], name: str = "train") -> Obj:
    api_version, kind, spec = kind_spec
    obj = {"apiVersion": api_version, "kind": kind, "spec": spec}
    return {"apiVersion": "fedbroker.io/v1alpha1", "kind": "FederatedJob",
            "metadata": {"name": name}, "spec": {"workload": obj}}  # fmt: skip


def job_spec(**extra: Any) -> tuple[str, str, Obj]:
    template = {"spec": {"restartPolicy": "Never", "containers": [main()]}}
    return "batch/v1", "Job", {"template": template, **extra}


def jobset_spec(rj_name: str = "workers", **job: Any) -> tuple[str, str, Obj]:
    template = {"spec": {"containers": [main()]}}
    rj = {"name": rj_name, "replicas": 2, "template": {"spec": {"template": template, **job}}}
    return "jobset.x-k8s.io/v1alpha2", "JobSet", {"replicatedJobs": [rj]}


def pytorch_spec(master: Obj | None = None, container: str = "pytorch") -> tuple[str, str, Obj]:
    template = {"spec": {"containers": [main(name=container)]}}
    replicas = {"Master": {"replicas": 1, "template": template, **(master or {})},
                "Worker": {"replicas": 2, "template": template}}  # fmt: skip
    return "kubeflow.org/v1", "PyTorchJob", {"pytorchReplicaSpecs": replicas}


def ray_job_spec() -> tuple[str, str, Obj]:
    head = {"spec": {"containers": [main(name="ray-head", resources={})]}}
    worker = {"groupName": "gpu", "replicas": 1, "minReplicas": 1, "maxReplicas": 1,
              "template": {"spec": {"containers": [main(name="ray-worker")]}}}  # fmt: skip
    spec = {
        "entrypoint": "python train.py",
        "submissionMode": "HTTPMode",
        "rayClusterSpec": {"headGroupSpec": {"template": head}, "workerGroupSpecs": [worker]},
    }
    return "ray.io/v1", "RayJob", spec


def edited(base: Obj, change: Callable[[Obj], None]) -> Obj:
    out = copy.deepcopy(base)
    change(out)
    return out


def c0(body: Obj) -> Obj:
    container: Obj = body["spec"]["podSets"][0]["template"]["spec"]["containers"][0]
    return container


NAMED_PORT = {"containerPort": "x"}
T = "spec.podSets[0].template"
C0 = f"{T}.spec.containers[0]"
W = "spec.workload.spec"
# (id, manifest, field path of the refusal, fragment of the message)
REFUSED: list[tuple[str, Obj, str, str]] = [
    ("terminationGracePeriodSeconds as text", edited(pod_sets(), lambda b: b["spec"]["podSets"][0][
        "template"]["spec"].update(terminationGracePeriodSeconds="30")),
     f"{T}.spec.terminationGracePeriodSeconds", "must be an integer"),
    ("containerPort named", edited(pod_sets(), lambda b: c0(b).update(
        ports=[{"containerPort": "http"}])), f"{C0}.ports[0].containerPort", "must be an integer"),
    ("a probe's port as a fraction", edited(pod_sets(), lambda b: c0(b).update(
        livenessProbe={"httpGet": {"port": 1.5}})),
     f"{C0}.livenessProbe.httpGet.port", "must be an integer or a string"),
    ("a misspelt field", edited(pod_sets(), lambda b: c0(b).update(resorces={})),
     f"{C0}.resorces", "unknown field"),
    ("int32 overflow", edited(pod_sets(), lambda b: c0(b).update(
        ports=[{"containerPort": 2**31}])), f"{C0}.ports[0].containerPort", "<= 2147483647"),
    ("a quantity that is none", edited(pod_sets(), lambda b: c0(b)["resources"].update(
        limits={"nvidia.com/gpu": 1, "ephemeral-storage": "lots"})),
     f"{C0}.resources.limits.ephemeral-storage", "is not a quantity"),
    ("device requests below limits", edited(pod_sets(), lambda b: c0(b)["resources"].update(
        requests={"nvidia.com/gpu": 0})),
     f"{C0}.resources.requests.nvidia.com/gpu", "must equal limits"),
    ("cpu requests above limits", edited(pod_sets(), lambda b: c0(b)["resources"].update(
        requests={"cpu": "4"})), f"{C0}.resources.requests.cpu", "<= limits.cpu"),
    ("an image left out", edited(pod_sets(), lambda b: c0(b).pop("image")),
     f"{C0}.image", "required"),
    ("a container name in capitals", edited(pod_sets(), lambda b: c0(b).update(name="Main")),
     f"{C0}.name", "DNS-1123 label"),
    ("two containers of one name", edited(pod_sets(), lambda b: b["spec"]["podSets"][0][
        "template"]["spec"].update(initContainers=[{"name": "main", "image": "x"}])),
     f"{C0}.name", "used twice"),
    ("an env name with =", edited(pod_sets(), lambda b: c0(b).update(
        env=[{"name": "A=B", "value": "1"}])), f"{C0}.env[0].name", "environment variable name"),
    ("a mount of no volume", edited(pod_sets(), lambda b: c0(b).update(
        volumeMounts=[{"name": "data", "mountPath": "/d"}])),
     f"{C0}.volumeMounts[0].name", "no volume named"),
    ("a label key that is none", edited(pod_sets(), lambda b: b["spec"]["podSets"][0][
        "template"].update(metadata={"labels": {"bad key": "x"}})),
     f'{T}.metadata.labels["bad key"]', "qualified name"),
    ("a label value too long", edited(pod_sets(), lambda b: b["spec"]["podSets"][0][
        "template"].update(metadata={"labels": {"team": "v" * 64}})),
     f"{T}.metadata.labels.team", "label value"),
    ("restartPolicy of a container", edited(pod_sets(), lambda b: c0(b).update(
        restartPolicy="Always")), f"{C0}.restartPolicy", "init container"),
    ("dnsPolicy unknown", edited(pod_sets(), lambda b: b["spec"]["podSets"][0]["template"][
        "spec"].update(dnsPolicy="Foo")), f"{T}.spec.dnsPolicy", "is not one of"),
    ("an overhead of the pod's own", edited(pod_sets(), lambda b: b["spec"]["podSets"][0][
        "template"]["spec"].update(overhead={"cpu": "250m"})),
     f"{T}.spec.overhead", "RuntimeClass admission"),
    ("an alpha toleration operator", edited(pod_sets(), lambda b: b["spec"]["podSets"][0][
        "template"]["spec"].update(tolerations=[{"key": "k", "operator": "Gt", "value": "1"}])),
     f"{T}.spec.tolerations[0].operator", "is not Equal or Exists"),
    ("a toleration's unknown effect", edited(pod_sets(), lambda b: b["spec"]["podSets"][0][
        "template"]["spec"].update(tolerations=[{"key": "k", "effect": "NoPlace"}])),
     f"{T}.spec.tolerations[0].effect", "is not one of"),
    ("Exists with a value", edited(pod_sets(), lambda b: b["spec"]["podSets"][0]["template"][
        "spec"].update(tolerations=[{"key": "k", "operator": "Exists", "value": "v"}])),
     f"{T}.spec.tolerations[0].value", "must be empty"),
    ("a Job restarting Always by default", workload(("batch/v1", "Job", {
        "template": {"spec": {"containers": [main()]}}})),
     f"{W}.template.spec.restartPolicy", "OnFailure or Never"),
    ("a Job restarting Always", workload(("batch/v1", "Job", {
        "template": {"spec": {"restartPolicy": "Always", "containers": [main()]}}})),
     f"{W}.template.spec.restartPolicy", "is not OnFailure or Never"),
    ("Indexed without completions", workload(job_spec(completionMode="Indexed")),
     f"{W}.completions", "required when completionMode is Indexed"),
    ("maxFailedIndexes without backoffLimitPerIndex", workload(job_spec(
        completionMode="Indexed", completions=2, maxFailedIndexes=1)),
     f"{W}.maxFailedIndexes", "requires backoffLimitPerIndex"),
    ("a Job's backoffLimit beyond int32", workload(job_spec(backoffLimit=2**31)),
     f"{W}.backoffLimit", "<= 2147483647"),
    ("a JobSet field that is none", edited(workload(jobset_spec()),
     lambda b: b["spec"]["workload"]["spec"].update(bogus=1)), f"{W}.bogus", "unknown field"),
    ("JobSet replicas as text", edited(workload(jobset_spec()), lambda b: b["spec"]["workload"][
        "spec"]["replicatedJobs"][0].update(replicas="2")),
     f"{W}.replicatedJobs[0].replicas", "must be an integer"),
    ("a JobSet's Job restarting Always", workload(jobset_spec(template={"spec": {
        "restartPolicy": "Always", "containers": [main()]}})),
     f"{W}.replicatedJobs[0].template.spec.template.spec.restartPolicy", "OnFailure or Never"),
    ("a PyTorchJob without its pytorch container", workload(pytorch_spec(container="trainer")),
     f"{W}.pytorchReplicaSpecs.Master.template.spec.containers", "named 'pytorch'"),
    ("a PyTorchJob Master without replicas", edited(workload(pytorch_spec()), lambda b: b[
        "spec"]["workload"]["spec"]["pytorchReplicaSpecs"]["Master"].pop("replicas")),
     f"{W}.pytorchReplicaSpecs.Master.replicas", "must be given as 1"),
    ("a PyTorchJob named with a digit first", workload(pytorch_spec(), name="1train"),
     "metadata.name", "DNS-1035"),
    ("a Ray worker group of no pods, still created", edited(workload(ray_job_spec()), lambda b: b[
        "spec"]["workload"]["spec"]["rayClusterSpec"]["workerGroupSpecs"].append({
            "groupName": "idle", "replicas": 0, "minReplicas": 0, "maxReplicas": 0,
            "template": {"spec": {"containers": [main(name="w", ports=[NAMED_PORT])]}}})),
     f"{W}.rayClusterSpec.workerGroupSpecs[1].template.spec.containers[0].ports[0].containerPort",
     "must be an integer"),
    ("a RayJob name too long for KubeRay", workload(ray_job_spec(), name="r" * 48),
     "metadata.name", "longer than 47"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("body", "path", "fragment"), [r[1:] for r in REFUSED], ids=[r[0] for r in REFUSED]
)
async def test_what_a_member_would_refuse_is_a_400_naming_the_field_and_stores_nothing(
    api: Client, body: Obj, path: str, fragment: str
) -> None:
    response = await api.post("/v1/jobs", json=body, headers=A)
    error = (await response.json())["error"]
    assert response.status == 400, error
    assert error.startswith(f"{path}: "), error
    assert fragment in error
    assert "\n" not in error
    assert (await (await api.get("/v1/jobs", headers=A)).json())["items"] == []
    plan = await api.post("/v1/plan", json=body, headers=A)
    assert plan.status == 400  # the dry run answers as the submission would


def test_the_table_has_a_row_per_case() -> None:
    assert len(REFUSED) >= 28
    assert len({r[0] for r in REFUSED}) == len(REFUSED)


JOBSET_NAMES = workload(jobset_spec("w" * 40), name="j" * 30)


async def test_a_jobsets_job_names_must_fit_its_webhook(api: Client) -> None:
    response = await api.post("/v1/jobs", json=JOBSET_NAMES, headers=A)
    error = (await response.json())["error"]
    assert response.status == 400
    assert error.startswith(f"{W}.replicatedJobs[0].name: JobSet names its Jobs"), error
    assert "longer than 63" in error


NUMBERS = edited(pod_sets(), lambda b: b["spec"]["podSets"][0].update(resources={"cpu": 2}))


async def test_quantities_given_as_numbers_are_stored_as_kubernetes_writes_them(
    api: Client,
) -> None:
    limits = {"nvidia.com/gpu": 1, "cpu": 2, "memory": 8 * 10**9, "ephemeral-storage": 0.5}
    body = edited(NUMBERS, lambda b: c0(b)["resources"].update(limits=limits))
    response = await api.post("/v1/jobs", json=body, headers=A)
    assert response.status == 201, await response.text()
    stored = await (await api.get("/v1/jobs/train", headers=A)).json()
    pod_set = stored["spec"]["podSets"][0]
    assert pod_set["resources"] == {"nvidia.com/gpu": 1, "cpu": "2", "memory": "7812500Ki"}
    limits = pod_set["template"]["spec"]["containers"][0]["resources"]["limits"]
    # A number is decimal to Kubernetes: 8 * 10**9 bytes is "8G" (and 8 * 2**30 "8589934592").
    assert limits == {"nvidia.com/gpu": "1", "cpu": "2", "memory": "8G",
                      "ephemeral-storage": "500m"}  # fmt: skip


async def test_a_workloads_quantities_are_stored_as_kubernetes_writes_them(api: Client) -> None:
    response = await api.post("/v1/jobs", json=workload(pytorch_spec()), headers=A)
    assert response.status == 201, await response.text()
    stored = await (await api.get("/v1/jobs/train", headers=A)).json()
    for replica in stored["spec"]["workload"]["spec"]["pytorchReplicaSpecs"].values():
        limits = replica["template"]["spec"]["containers"][0]["resources"]["limits"]
        assert limits == {"nvidia.com/gpu": "1", "cpu": "2", "memory": "8Gi"}
