"""The template policy end to end: hostile pod templates submitted through the HTTP API are
refused with a one-line JSON error naming the field path, and nothing is stored; the same
template passes or not by the submitting tenant's Pod Security level."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from served import Client, bearer, federation, served

CONFIG = federation(
    "a",
    "r: podSecurity: restricted",
    "p: podSecurity: privileged, serviceAccounts: [default, trainer]",
)
A = bearer("a")
R = bearer("r")
P = bearer("p")
ROOT = "spec.podSets[0].template.spec"


@pytest.fixture
async def api(tmp_path: Path) -> AsyncIterator[Client]:
    async with served(CONFIG, tmp_path) as (client, _):
        yield client


def job(name: str, spec: dict[str, Any], resources: dict[str, Any] | None = None) -> dict[str, Any]:
    pod_set: dict[str, Any] = {"name": "worker", "count": 1, "template": {"spec": spec}}
    if resources is not None:
        pod_set["resources"] = resources
    return {"apiVersion": "fedbroker.io/v1alpha1", "kind": "FederatedJob",
            "metadata": {"name": name}, "spec": {"podSets": [pod_set]}}  # fmt: skip


def main(**extra: Any) -> dict[str, Any]:
    return {"name": "main", "image": "trainer:1.0", **extra}


GPU1 = {"nvidia.com/gpu": 1}
# (id, pod spec, pod set resources, tenant, status, field path under ROOT)
REFUSED: list[tuple[str, dict[str, Any], dict[str, Any], dict[str, str], int, str]] = [
    ("hostPath /", {"containers": [main()], "volumes": [{"name": "r", "hostPath": {"path": "/"}}]},
     GPU1, P, 403, "volumes[0].hostPath"),
    ("privileged", {"containers": [main(securityContext={"privileged": True})]}, GPU1, A, 403,
     "containers[0].securityContext.privileged"),
    ("hostNetwork", {"hostNetwork": True, "containers": [main()]}, GPU1, A, 403, "hostNetwork"),
    ("the broker's account", {"serviceAccountName": "fedbroker-broker",
                              "automountServiceAccountToken": True, "containers": [main()]},
     GPU1, P, 403, "serviceAccountName"),
    ("nodeName", {"nodeName": "node-1", "containers": [main()]}, GPU1, P, 403, "nodeName"),
    ("second container asks 8 GPUs", {"containers": [
        main(), main(name="side", resources={"limits": {"nvidia.com/gpu": 8}})]},
     GPU1, A, 400, "containers[1].resources.limits.nvidia.com/gpu"),
    ("runAsNonRoot missing under restricted", {"containers": [main(securityContext={
        "allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"}})]},
     GPU1, R, 403, "containers[0].securityContext.runAsNonRoot"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("spec", "resources", "headers", "status", "path"),
    [r[1:] for r in REFUSED], ids=[r[0] for r in REFUSED],
)  # fmt: skip
async def test_hostile_template_is_refused_naming_the_field_and_nothing_is_stored(
    api: Client,
    spec: dict[str, Any],
    resources: dict[str, Any],
    headers: dict[str, str],
    status: int,
    path: str,
) -> None:
    response = await api.post("/v1/jobs", json=job("evil", spec, resources), headers=headers)
    assert response.status == status
    body = await response.json()
    assert body["error"].startswith(f"{ROOT}.{path}: ")
    assert "\n" not in body["error"]
    listed = await api.get("/v1/jobs", headers=headers)
    assert (await listed.json())["items"] == []
    assert (await api.get("/v1/jobs/evil", headers=headers)).status == 404
    dry_run = await api.post("/v1/plan", json=job("evil", spec, resources), headers=headers)
    assert dry_run.status == status  # the dry run answers as the submission would


async def test_the_tenants_level_decides(api: Client) -> None:
    """runAsNonRoot missing: baseline admits it, restricted refuses it."""
    spec = {"containers": [main()]}
    refused = await api.post("/v1/jobs", json=job("j", spec, GPU1), headers=R)
    assert refused.status == 403
    admitted = await api.post("/v1/jobs", json=job("j", spec, GPU1), headers=A)
    assert admitted.status == 201


async def test_resources_left_out_are_derived_from_the_template_and_stored(api: Client) -> None:
    gpus = main(resources={"limits": {"nvidia.com/gpu": 2, "cpu": "4"}})
    spec = {"containers": [gpus, main(name="log", resources={"requests": {"memory": "1Gi"}})]}
    response = await api.post("/v1/jobs", json=job("derived", spec), headers=A)
    assert response.status == 201, await response.text()
    stored = await (await api.get("/v1/jobs/derived", headers=A)).json()
    resources = stored["spec"]["podSets"][0]["resources"]
    assert resources == {"nvidia.com/gpu": 2, "cpu": "4", "memory": "1Gi"}
    # Stored as sent, its quantities as Kubernetes writes them (the number 2 as "2").
    gpus["resources"]["limits"]["nvidia.com/gpu"] = "2"
    assert stored["spec"]["podSets"][0]["template"] == {"spec": spec}
