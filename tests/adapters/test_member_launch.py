"""The enforcing member catches what the broker sends: a launch whose workload a real
API server refuses is refused by the test member too, and the test fails for it
(tests/conftest.py, ``kmock_namespaces.member_problems``), while what the server accepts
goes through stored as the server stores it (numbers for quantities, canonical). The
launch spec is built past admission on purpose: this is about the member, not about what
admission lets through."""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import pytest
from kmock_namespaces import NamespacedEmulator, member_problems
from kubernetes.aio.client import ApiClient
from workload_cluster import JOB, Emulator, admitted, launcher, workload

from adapters.kube.objects import KubeLaunchError
from broker.ports import LaunchSpec

pytestmark = pytest.mark.kmock(cls=NamespacedEmulator)


def with_main_container(spec: LaunchSpec, **fields: Any) -> LaunchSpec:
    """``spec`` whose Job template's first container has ``fields`` too."""
    assert spec.workload is not None
    obj = copy.deepcopy(dict(spec.workload.object))
    obj["spec"]["template"]["spec"]["containers"][0].update(fields)
    return dataclasses.replace(spec, workload=dataclasses.replace(spec.workload, object=obj))


async def never(_: float) -> None:
    raise AssertionError("no poll expected")


async def test_numbers_for_quantities_are_accepted_and_stored_canonical(
    api: ApiClient, k8s: Emulator
) -> None:
    placement, spec = admitted("Job")
    limits = {"nvidia.com/gpu": 1, "cpu": 4, "memory": "8Gi"}
    spec = with_main_container(spec, resources={"limits": limits, "requests": {"cpu": 0.5}})
    await launcher(api, never).workloads.create(placement, spec)
    obj = workload(k8s, "Job", JOB)
    assert obj is not None
    resources = obj["spec"]["template"]["spec"]["containers"][0]["resources"]
    assert resources == {"limits": {"nvidia.com/gpu": "1", "cpu": "4", "memory": "8Gi"},
                         "requests": {"cpu": "500m"}}  # fmt: skip
    assert member_problems() == []


async def test_a_workload_the_server_refuses_fails_the_launch_and_the_test(
    api: ApiClient, k8s: Emulator
) -> None:
    placement, spec = admitted("Job")
    spec = with_main_container(spec, ports=[{"containerPort": "http"}])
    with pytest.raises(KubeLaunchError, match="400"):
        await launcher(api, never).workloads.create(placement, spec)
    assert workload(k8s, "Job", JOB) is None
    # what tests/conftest.py would fail this test with, had it not expected the refusal
    [problem] = member_problems()
    assert problem.startswith("POST /apis/batch/v1/namespaces/team-acme/jobs: 400")
    assert "spec.template.spec.containers.ports.containerPort of type int32" in problem
    [refusal] = k8s.take_refusals()
    assert refusal.status["reason"] == "BadRequest"
    assert member_problems() == []


async def test_a_field_the_server_drops_fails_the_test(api: ApiClient, k8s: Emulator) -> None:
    placement, spec = admitted("Job")
    spec = with_main_container(spec, colour="red")
    await launcher(api, never).workloads.create(placement, spec)
    assert member_problems() == [
        "pruned jobs team-acme/train: spec.template.spec.containers[0].colour"
    ]
    k8s.take_pruned()
