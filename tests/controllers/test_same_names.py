"""The controller players key what they reconcile as the real ones do, by namespace and
name: two tenants' namespaces may each hold a workload of the same name (the broker names
a workload after its job, and two tenants may name their jobs alike), and each gets its
own children; two pods of the same name in two namespaces are two pods to the scheduler
and the kubelet (a PyTorchJob's ``<job>-master-0``, say)."""

from __future__ import annotations

from typing import Any

import pytest
from kmock_namespaces import NamespacedEmulator
from workload_matrix import WORKLOADS, member_of, pod_template

from controllers import CONTROLLERS, RESOURCES, Member
from controllers.base import PODS, Obj, path_of, phase

pytestmark = pytest.mark.kmock(cls=NamespacedEmulator)
SPACES = ("fedbroker-team-a", "fedbroker-team-b")
STEPS = 4  # enough for every player to make all it makes of a workload whose pods wait


async def post(k8s: NamespacedEmulator, resource: Any, body: Obj) -> None:
    """A create through the member's API, as a client makes it."""
    path = path_of(resource, body["metadata"]).rpartition("/")[0]
    async with k8s.post(path, json=body) as r:
        assert r.status < 300, f"POST {path}: {r.status} {await r.text()}"


async def namespaces(k8s: NamespacedEmulator) -> None:
    for name in SPACES:
        body = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}
        async with k8s.post("/api/v1/namespaces", json=body) as r:
            assert r.status < 300, await r.text()


def pods_in(member: Member, namespace: str) -> dict[str, Obj]:
    return member.c.stored(PODS, namespace)


@pytest.mark.parametrize("kind", tuple(CONTROLLERS))
async def test_same_named_workloads_in_two_namespaces_each_get_their_pods(
    kmock: NamespacedEmulator, kind: str
) -> None:
    member = member_of(kmock, "pin")  # no pod pinned: every pod waits, unbound
    await namespaces(kmock)
    for namespace in SPACES:
        meta = {"name": "w0", "namespace": namespace}
        await post(kmock, RESOURCES[kind], {**WORKLOADS[kind], "metadata": meta})
    for _ in range(STEPS):
        await member.step()
    made = {ns: len(pods_in(member, ns)) for ns in SPACES}
    assert made[SPACES[0]] > 0
    assert made[SPACES[0]] == made[SPACES[1]], made


def pinned_pod(namespace: str, node: str) -> Obj:
    template = pod_template()
    affinity = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchFields": [
            {"key": "metadata.name", "operator": "In", "values": [node]}]}]}}}  # fmt: skip
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "w0-master-0", "namespace": namespace},
            "spec": {**template["spec"], "affinity": affinity}}  # fmt: skip


async def test_same_named_pods_in_two_namespaces_are_two_pods_bound_and_counted(
    kmock: NamespacedEmulator,
) -> None:
    member = member_of(kmock, "pin")
    await namespaces(kmock)
    for namespace, node in zip(SPACES, ("n1", "n2"), strict=True):
        await post(kmock, PODS, pinned_pod(namespace, node))
    for _ in range(2):  # bound, then run
        await member.step()
    where = {ns: [(p["spec"].get("nodeName"), phase(p)) for p in pods_in(member, ns).values()]
             for ns in SPACES}  # fmt: skip
    assert where == {SPACES[0]: [("n1", "Running")], SPACES[1]: [("n2", "Running")]}
    assert member.schedulers.used() == {"n1": 1, "n2": 1}
