"""spec.workload through the HTTP API: bad objects are a one-line 4xx naming the field and
store nothing; a good JobSet is stored as sent, planned from its derived pod sets, and its
launch spec carries the object and each pod set's template path."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from served import Client, bearer, federation, served

from broker.manifest import workload_spec
from broker.service.facade import Service

CONFIG = federation("a")
A = bearer("a")
POD = {"spec": {"containers": [{"name": "m", "image": "t:1", "resources": {
    "limits": {"nvidia.com/gpu": 2, "cpu": "8", "memory": "32Gi"}}}]}}  # fmt: skip
WORKERS = {"name": "workers", "replicas": 2,
           "template": {"spec": {"parallelism": 2, "template": POD}}}  # fmt: skip
JOBSET = {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
          "spec": {"replicatedJobs": [WORKERS]}}  # fmt: skip
# As stored and launched: the quantities as Kubernetes writes them (the number 2 as "2").
STORED = json.loads(json.dumps(JOBSET).replace('"nvidia.com/gpu": 2', '"nvidia.com/gpu": "2"'))


@pytest.fixture
async def served_api(tmp_path: Path) -> AsyncIterator[tuple[Client, Service]]:
    async with served(CONFIG, tmp_path) as both:
        yield both


def job(name: str, workload: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "fedbroker.io/v1alpha1", "kind": "FederatedJob",
            "metadata": {"name": name}, "spec": {"workload": workload}}  # fmt: skip


PRIV = {"spec": {"containers": [{"name": "m", "image": "t:1",
                                 "securityContext": {"privileged": True}}]}}  # fmt: skip
BAD: list[tuple[str, dict[str, Any], int, str]] = [
    ("Deployment", {"apiVersion": "apps/v1", "kind": "Deployment", "spec": {}}, 400,
     "spec.workload.kind"),
    ("no containers", {"apiVersion": "batch/v1", "kind": "Job",
                       "spec": {"template": {"spec": {"containers": []}}}}, 400,
     "spec.workload.spec.template.spec.containers"),
    ("privileged JobSet pod", {**JOBSET, "spec": {"replicatedJobs": [
        {"name": "w", "template": {"spec": {"template": PRIV}}}]}}, 403,
     "spec.workload.spec.replicatedJobs[0].template.spec.template.spec.containers[0]"
     ".securityContext.privileged"),
    ("Ray autoscaling", {"apiVersion": "ray.io/v1", "kind": "RayCluster", "spec": {
        "enableInTreeAutoscaling": True, "headGroupSpec": {"template": POD}}}, 400,
     "spec.workload.spec.enableInTreeAutoscaling"),
]  # fmt: skip


@pytest.mark.parametrize(("workload", "status", "path"), [b[1:] for b in BAD],
                         ids=[b[0] for b in BAD])  # fmt: skip
async def test_a_bad_workload_is_refused_naming_the_field_and_nothing_is_stored(
    served_api: tuple[Client, Service], workload: dict[str, Any], status: int, path: str
) -> None:
    api, _ = served_api
    response = await api.post("/v1/jobs", json=job("bad", workload), headers=A)
    assert response.status == status
    error = (await response.json())["error"]
    assert error.startswith(f"{path}: "), error
    assert "\n" not in error
    assert (await (await api.get("/v1/jobs", headers=A)).json())["items"] == []
    assert (await api.get("/v1/jobs/bad", headers=A)).status == 404


async def test_a_jobset_is_stored_placed_as_its_pod_sets_and_launched_as_itself(
    served_api: tuple[Client, Service],
) -> None:
    api, service = served_api
    response = await api.post("/v1/jobs", json=job("js", JOBSET), headers=A)
    assert response.status == 201, await response.text()
    stored = await (await api.get("/v1/jobs/js", headers=A)).json()
    assert stored["spec"]["workload"] == STORED
    pending = service.shared.queue.get("team-a/js")
    assert pending is not None
    (pod_set,) = pending.job.pod_sets
    assert (pod_set.name, pod_set.count, pod_set.resources.gpus) == ("workers", 4, 2)
    assert pending.workload == STORED
    assert pending.workload is not None
    spec = workload_spec(pending.workload)  # what binding.launch_spec hands the launcher
    assert spec.pod_sets == (
        ("workers", ("spec", "replicatedJobs", 0, "template", "spec", "template")),
    )
