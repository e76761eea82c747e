"""Devices and scheduling through the HTTP API, one row per way a tenant reached GPUs or
held capacity without being counted: each a one-line 4xx naming the exact field from the
manifest's root, nothing stored, the dry run answering alike; and what stays allowed
(a pod-level request counted and stored, a runtime class of the tenant's, a toleration
that only steers)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from served import Client, bearer, federation, served

CONFIG = federation("a", "k: runtimeClassNames: [kata]", cpu="600")
A = bearer("a")
K = bearer("k")
T = "spec.podSets[0].template.spec"
CONTROL = "node-role.kubernetes.io/control-plane"


@pytest.fixture
async def api(tmp_path: Path) -> AsyncIterator[Client]:
    async with served(CONFIG, tmp_path) as (client, _):
        yield client


def main(**extra: Any) -> dict[str, Any]:
    return {"name": "main", "image": "trainer:1.0",
            "resources": {"requests": {"cpu": "100m"}}, **extra}  # fmt: skip


def pods(spec: dict[str, Any], resources: dict[str, Any] | None = None) -> dict[str, Any]:
    pod_set: dict[str, Any] = {"name": "worker", "count": 1, "template": {"spec": spec}}
    if resources is not None:
        pod_set["resources"] = resources
    return {"podSets": [pod_set]}


def manifest(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "fedbroker.io/v1alpha1", "kind": "FederatedJob",
            "metadata": {"name": name}, "spec": spec}  # fmt: skip


def batch_job(pod_spec: dict[str, Any]) -> dict[str, Any]:
    return {"workload": {"apiVersion": "batch/v1", "kind": "Job", "spec": {
        "template": {"spec": {"restartPolicy": "Never", **pod_spec}}}}}  # fmt: skip


NVIDIA_ALL = [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]
EIGHT = {"limits": {"nvidia.com/gpu": 8}}
# (id, job spec, headers, status, field path from the manifest's root)
REFUSED: list[tuple[str, dict[str, Any], dict[str, str], int, str]] = [
    ("NVIDIA_VISIBLE_DEVICES=all with 0 GPUs", pods({"containers": [main(env=NVIDIA_ALL)]}), A,
     403, f"{T}.containers[0].env[0].name"),
    ("NVIDIA_DRIVER_CAPABILITIES in a sidecar", pods({"containers": [main()], "initContainers": [
        main(name="side", restartPolicy="Always",
             env=[{"name": "NVIDIA_DRIVER_CAPABILITIES", "value": "all"}])]}), A,
     403, f"{T}.initContainers[0].env[0].name"),
    ("a workload's pod template", batch_job({"containers": [main(env=NVIDIA_ALL)]}), A, 403,
     "spec.workload.spec.template.spec.containers[0].env[0].name"),
    ("ephemeral containers asking 8 GPUs", pods({"containers": [main()], "ephemeralContainers": [
        main(name="debug", resources=EIGHT)]}), A, 403, f"{T}.ephemeralContainers"),
    ("GPUs for the whole pod", pods({"containers": [main()], "resources": EIGHT}), A, 400,
     f"{T}.resources.limits.nvidia.com/gpu"),
    ("500 CPUs for the whole pod, the pod set saying 100m", pods(
        {"containers": [main()], "resources": {"requests": {"cpu": "500"}}}, {"cpu": "100m"}),
     A, 400, f"{T}.resources.requests.cpu"),
    ("a runtime class the tenant was not given", pods(
        {"containers": [main()], "runtimeClassName": "nvidia"}), K, 403, f"{T}.runtimeClassName"),
    ("a keyless Exists toleration", pods({"containers": [main()], "tolerations": [
        {"operator": "Exists"}]}), A, 403, f"{T}.tolerations[0].operator"),
    ("tolerating the control plane", pods({"containers": [main()], "tolerations": [
        {"key": CONTROL, "operator": "Exists", "effect": "NoSchedule"}]}), A, 403,
     f"{T}.tolerations[0].key"),
    ("the template's own scheduling gate", pods({"containers": [main()], "schedulingGates": [
        {"name": "example.com/hold"}]}), A, 403, f"{T}.schedulingGates"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("spec", "headers", "status", "path"), [r[1:] for r in REFUSED], ids=[r[0] for r in REFUSED]
)
async def test_a_way_to_devices_or_held_capacity_is_refused_and_nothing_is_stored(
    api: Client, spec: dict[str, Any], headers: dict[str, str], status: int, path: str
) -> None:
    response = await api.post("/v1/jobs", json=manifest("evil", spec), headers=headers)
    assert response.status == status
    error = (await response.json())["error"]
    assert error.startswith(f"{path}: "), error
    assert "\n" not in error
    assert (await (await api.get("/v1/jobs", headers=headers)).json())["items"] == []
    assert (await api.get("/v1/jobs/evil", headers=headers)).status == 404
    dry_run = await api.post("/v1/plan", json=manifest("evil", spec), headers=headers)
    assert dry_run.status == status


async def test_a_pod_level_request_is_counted_and_stored(api: Client) -> None:
    """The issue's 500 CPUs, placed as 100m before: now the pod set asks what the pod does."""
    spec = {"containers": [main()], "resources": {"requests": {"cpu": "500"}}}
    response = await api.post("/v1/jobs", json=manifest("big", pods(spec)), headers=A)
    assert response.status == 201, await response.text()
    stored = await (await api.get("/v1/jobs/big", headers=A)).json()
    assert stored["spec"]["podSets"][0]["resources"] == {"cpu": "500"}
    assert stored["spec"]["podSets"][0]["template"] == {"spec": spec}


ALLOWED: list[tuple[str, dict[str, Any], dict[str, str]]] = [
    ("a runtime class of the tenant's", {"containers": [main()], "runtimeClassName": "kata"}, K),
    ("CUDA_VISIBLE_DEVICES", {"containers": [main(env=[
        {"name": "CUDA_VISIBLE_DEVICES", "value": "0"}])]}, A),
    ("a keyless Exists for PreferNoSchedule", {"containers": [main()], "tolerations": [
        {"operator": "Exists", "effect": "PreferNoSchedule"}]}, A),
    ("a toleration of a taint nobody reserved", {"containers": [main()], "tolerations": [
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]}, A),
]  # fmt: skip


@pytest.mark.parametrize(("spec", "headers"), [r[1:] for r in ALLOWED], ids=[r[0] for r in ALLOWED])
async def test_what_stays_allowed_is_admitted(
    api: Client, spec: dict[str, Any], headers: dict[str, str]
) -> None:
    response = await api.post("/v1/jobs", json=manifest("fine", pods(spec)), headers=headers)
    assert response.status == 201, await response.text()
