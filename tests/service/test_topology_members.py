"""A topology request through a Kubernetes member, end to end: the real Service on a kmock
member whose nodes sit in racks of two blocks (the cluster's ``topologyLevels`` in the
config), the Job controller, the scheduler of one mode and the kubelet played
(``controllers.Member``), every object validated by the member as the API server does.

The free capacity is laid out so that a gang of four 2-GPU pods without a request spans
two racks (the half-used nodes n1 and n2, of racks r1 and r2, are the fullest), while a
rack-required gang fits only in r3 (n3 and n4 whole). In pin mode the broker's pins keep
it there; in coscheduling mode the member's gang scheduler, whose own choice is the
fullest nodes, is kept there by the rack's node selector the launch adds (Volcano's pods
get the same selector: its PodGroup's networkTopology speaks of HyperNode tiers, not
label keys)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from controllers import Member, Mode
from controllers.base import JOBS, PODS, Obj
from controllers.schedulers import COSCHED, NODES
from kmock_namespaces import NamespacedEmulator
from test_topology_federation import foreign_pod, node_obj
from workload_matrix import broker as matrix_broker
from workload_matrix import launched, manifest, ours, pod_template, serve

from broker.service.facade import Service

pytestmark = pytest.mark.kmock(cls=NamespacedEmulator)
BLOCK = "cloud.provider.com/topology-block"
RACK = "cloud.provider.com/topology-rack"
LEVELS = f"  topologyLevels: [{BLOCK}, {RACK}, kubernetes.io/hostname]\n"
# node -> (block, rack)
RACKS = {"n1": ("b1", "r1"), "n2": ("b1", "r2"), "n3": ("b2", "r3"), "n4": ("b2", "r3")}


def racked(k8s: NamespacedEmulator, mode: Mode) -> Member:
    member = Member(serve(k8s, mode), mode)
    for name, (block, rack) in RACKS.items():
        k8s.objects[NODES, None, name] = node_obj(name, block, rack)
    for name in ("n1", "n2"):  # half of r1 and of r2 taken
        k8s.objects[PODS, "ml", f"other-{name}"] = foreign_pod(name, 2)
    return member


def broker(k8s: NamespacedEmulator, tmp_path: Path, mode: Mode) -> Any:
    """The broker on the member, the member's cluster declaring the levels."""
    return matrix_broker(k8s, tmp_path, mode, LEVELS)


def job(rack: bool, selector: dict[str, str] | None = None) -> Any:
    """An Indexed Job of four 2-GPU pods; ``rack``: its template asks for one rack as
    Kueue's annotation says it; ``selector``: the tenant's own nodeSelector."""
    template = pod_template(gpus=2)
    if selector:
        template["spec"]["nodeSelector"] = selector
    if rack:
        template["metadata"]["annotations"] = {"kueue.x-k8s.io/podset-required-topology": RACK}
    spec = {"completionMode": "Indexed", "backoffLimit": 0, "completions": 4,
            "parallelism": 4, "template": template}  # fmt: skip
    name = "train" if rack else "spread"
    return manifest("Job", name, {"apiVersion": "batch/v1", "kind": "Job", "spec": spec})


def racks_of(nodes: list[str]) -> set[str]:
    return {RACKS[n][1] for n in nodes}


async def spans_without_a_request(service: Service) -> None:
    """The same Job without the annotation is placed across racks (then cancelled)."""
    await service.submit("team-a", job(rack=False))
    await service.schedule_once()
    placement = service.ledger.reservations()["team-a/spread"]
    assert len(racks_of([p.node for p in placement.pods])) > 1, placement
    await service.cancel("team-a", "spread")
    assert not service.ledger.reservations()


async def runs_in_one_rack(service: Service, member: Member) -> list[Obj]:
    """The rack-required Job placed, launched and running; its pods as the member holds them."""
    await service.submit("team-a", job(rack=True))
    await service.schedule_once()
    placement = service.ledger.reservations()["team-a/train"]
    assert racks_of([p.node for p in placement.pods]) == {"r3"}
    await launched(service, member, ("team-a", "train"))
    record = await service.get("team-a", "train")
    assert record.state == "Running", record.reason
    pods = [p for p in ours(member, PODS).values() if p["spec"].get("nodeName")]
    assert len(pods) == 4
    assert racks_of([p["spec"]["nodeName"] for p in pods]) == {"r3"}
    return pods


@pytest.mark.parametrize("mode", ["pin", "coscheduling", "volcano"])
async def test_a_kueue_rack_required_job_runs_inside_one_rack(
    kmock: NamespacedEmulator, tmp_path: Path, mode: Mode
) -> None:
    member = racked(kmock, mode)
    async with member.running(), broker(kmock, tmp_path, mode) as service:
        await spans_without_a_request(service)
        pods = await runs_in_one_rack(service, member)
        for pod in pods:
            selector = pod["spec"].get("nodeSelector") or {}
            # pinned by the broker, or kept in the rack by its selector for the gang scheduler
            assert selector == ({} if mode == "pin" else {RACK: "r3"})


async def test_a_tenant_node_selector_naming_another_rack_is_refused_for_good(
    kmock: NamespacedEmulator, tmp_path: Path
) -> None:
    member = racked(kmock, "coscheduling")
    async with member.running(), broker(kmock, tmp_path, "coscheduling") as service:
        await service.submit("team-a", job(rack=True, selector={RACK: "r1"}))
        await service.schedule_once()
        await launched(service, member, ("team-a", "train"))
        record = await service.get("team-a", "train")
        assert record.state == "Queued" and record.attempts == 1  # backed off
        assert f"spec.nodeSelector[{RACK}] is 'r1'" in record.reason, record.reason
        assert "placed in cloud.provider.com/topology-rack=r3" in record.reason
        assert not ours(member, PODS) and not ours(member, COSCHED) and not ours(member, JOBS)
        assert not service.ledger.reservations()
