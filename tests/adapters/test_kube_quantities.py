"""Quantities written as numbers (``nvidia.com/gpu: 1``, ``cpu: 0.5``, as most manifests
write them) are admitted and reach a member as the canonical strings Kubernetes itself
writes: a podSets gang's pods and every workload kind's object, created through the real
client into kmock, carry no number where a quantity goes (the client's models, and a CRD's
int-or-string quantity, refuse a float such as 0.5)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from kmock_namespaces import NamespacedEmulator
from kubernetes.aio.client import ApiClient
from workload_cluster import (
    PODS,
    Emulator,
    launcher,
    stored,
    workload,
)

from broker.manifest import admit_templates, parse_manifest, to_job, workload_of
from broker.manifest.workloads import INTEGRATIONS
from broker.model import Placement, PodPlacement
from broker.ports import LaunchSpec
from broker.quantity import canonical

pytestmark = pytest.mark.kmock(cls=NamespacedEmulator)

Obj = dict[str, Any]
NUMBERS = {"nvidia.com/gpu": 1, "cpu": 0.5, "memory": 1073741824}
WANT = {"nvidia.com/gpu": "1", "cpu": "500m", "memory": "1073741824"}


def pod(container: str = "main") -> Obj:
    return {"spec": {"restartPolicy": "Never", "containers": [
        {"name": container, "image": "t:1", "resources": {"limits": dict(NUMBERS)}}]}}  # fmt: skip


WORKLOAD_SPECS: dict[str, Obj] = {
    "Job": {"apiVersion": "batch/v1", "kind": "Job", "spec": {"template": pod()}},
    "JobSet": {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "spec": {
        "replicatedJobs": [{"name": "w", "template": {"spec": {"template": pod()}}}]}},
    "PyTorchJob": {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "spec": {
        "pytorchReplicaSpecs": {"Master": {"replicas": 1, "template": pod("pytorch")}}}},
    "RayCluster": {"apiVersion": "ray.io/v1", "kind": "RayCluster", "spec": {
        "headGroupSpec": {"template": pod("head")}}},
    "RayJob": {"apiVersion": "ray.io/v1", "kind": "RayJob", "spec": {
        "entrypoint": "python x.py", "submissionMode": "HTTPMode",
        "rayClusterSpec": {"headGroupSpec": {"template": pod("head")}}}},
}  # fmt: skip


def admitted(spec: Obj) -> tuple[Placement, LaunchSpec]:
    manifest = {"apiVersion": "fedbroker.io/v1alpha1", "kind": "FederatedJob",
                "metadata": {"name": "train"}, "spec": spec}  # fmt: skip
    parsed = admit_templates(
        parse_manifest(json.dumps(manifest).encode(), None), "baseline", ["default"]
    )
    job = to_job(parsed, "acme", "training")
    wire = parsed.wire()
    pod_sets = wire["spec"].get("podSets") or []
    launch = LaunchSpec(
        tenant="acme", job="train", queue="training", pod_sets=tuple(p.name for p in job.pod_sets),
        pod_templates={p["name"]: p["template"] for p in pod_sets if p.get("template")},
        workload=workload_of(wire),
    )  # fmt: skip
    pods = tuple(
        PodPlacement(f"acme.train-{ps.name}-{i}", "node-0", (i,), ps.resources)
        for ps in job.pod_sets
        for i in range(ps.count)
    )
    return Placement("acme/train", "east", pods), launch


def quantities(obj: object, path: str = "") -> Iterator[tuple[str, object]]:
    """Every value under a ``limits``, ``requests`` or ``overhead`` map of ``obj``."""
    if isinstance(obj, dict):
        for key, value in obj.items():
            if key in ("limits", "requests", "overhead") and isinstance(value, dict):
                yield from ((f"{path}.{key}.{k}", v) for k, v in value.items())
            else:
                yield from quantities(value, f"{path}.{key}")
    elif isinstance(obj, list):
        for i, item in enumerate(obj):
            yield from quantities(item, f"{path}[{i}]")


def assert_canonical_strings(obj: object) -> list[tuple[str, object]]:
    found = list(quantities(obj))
    for path, value in found:
        assert isinstance(value, str), f"{path} is {value!r}, not a string"
        assert canonical(value) == value, f"{path}: {value!r} is not canonical"
    return found


async def test_a_podsets_gangs_pods_carry_canonical_strings(api: ApiClient, k8s: Emulator) -> None:
    placement, spec = admitted({"podSets": [{"name": "worker", "count": 2, "template": pod()}]})
    await launcher(api, _never).create(placement, spec)
    pods = stored(k8s, PODS)
    assert len(pods) == 2
    for body in pods.values():
        limits = body["spec"]["containers"][0]["resources"]["limits"]
        assert limits == WANT
        assert_canonical_strings(body)


@pytest.mark.parametrize("kind", sorted(WORKLOAD_SPECS))
async def test_each_workload_kind_is_created_with_canonical_strings(
    api: ApiClient, k8s: Emulator, kind: str
) -> None:
    assert kind in {i.kind for i in INTEGRATIONS}
    placement, spec = admitted({"workload": WORKLOAD_SPECS[kind]})
    await launcher(api, _never).workloads.create(placement, spec)
    obj = workload(k8s, kind, "train")
    assert obj is not None
    found = assert_canonical_strings(obj)
    assert {v for _, v in found} >= set(WANT.values())


async def _never(_: float) -> None:
    raise AssertionError("create does not poll")
