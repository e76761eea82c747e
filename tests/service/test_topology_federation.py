"""Topology-aware gangs across two Kubernetes members: the real Service on two kmock
members, east and west, whose nodes (4 GPUs each) sit in racks of blocks, both declaring
``topologyLevels: [block, rack, hostname]``; each member's Job controller, pin-mode
scheduler and kubelet played (``controllers.Member``). Another user's 2-GPU pods make some
nodes half used.

Each test lays the free capacity out so that its assertion is decisive: the same gang
without its request is placed otherwise (dry run, ``without``): across racks, across
blocks, or with a slice across racks. A required rack is never spanned (a Kueue-annotated
batch Job, run through west), a preferred rack falls back to a block and then to the whole
cluster, slices each land in one rack (run through east), and a gang larger than every
rack waits, explain naming the level and each cluster's largest rack."""

from __future__ import annotations

import contextlib
import json
from collections import Counter
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

import kmock as kmocklib
import pytest
from builders import Clock
from controllers import Member
from controllers.base import PODS, Obj
from controllers.schedulers import NODES
from kmock_namespaces import NamespacedEmulator
from workload_matrix import T0, launched, ours, pod_template, serve
from workload_matrix import manifest as workload_manifest

from broker.config import parse_config
from broker.core.queue import Pending
from broker.manifest import parse_manifest
from broker.model import Decision, Placement, Unplaceable
from broker.service.facade import Service

pytestmark = pytest.mark.kmock(cls=NamespacedEmulator)
BLOCK = "cloud.provider.com/topology-block"
RACK = "cloud.provider.com/topology-rack"
CLUSTER = """
- name: {name}
  topologyLevels: [{block}, {rack}, kubernetes.io/hostname]
  source:
    kube: {{kubeconfig: "{kubeconfig}", context: {name}, podPollSeconds: 0.01, launchMode: pin}}
"""
CONFIG = """
store: {{url: "sqlite:///{db}"}}
clusters:{clusters}
queues:
- {{name: training, policy: gang}}
tenants:
- {{name: team-a, defaultQueue: training, token: {{value: tok-a-00000000000000000000000000}}}}
"""
# node -> (block, rack, GPUs another user's pod takes there)
Layout = Mapping[str, tuple[str, str, int]]


def node_obj(name: str, block: str, rack: str) -> Obj:
    labels = {"nvidia.com/gpu.product": "A100", BLOCK: block, RACK: rack,
              "kubernetes.io/hostname": name}  # fmt: skip
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels},
            "spec": {}, "status": {
                "allocatable": {"nvidia.com/gpu": "4", "cpu": "64", "memory": "256Gi"},
                "conditions": [{"type": "Ready", "status": "True"}]}}  # fmt: skip


def foreign_pod(node: str, gpus: int) -> Obj:
    """Another user's running pod on ``node``."""
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"other-{node}", "namespace": "ml"},
            "spec": {"nodeName": node, "containers": [{"name": "c", "image": "x:1",
                     "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}]},
            "status": {"phase": "Running"}}  # fmt: skip


def racked(k8s: NamespacedEmulator, layout: Layout) -> Member:
    member = Member(serve(k8s, "pin", nodes=0), "pin")
    for name, (block, rack, used) in layout.items():
        k8s.objects[NODES, None, name] = node_obj(name, block, rack)
        if used:
            k8s.objects[PODS, "ml", f"other-{name}"] = foreign_pod(name, used)
    return member


def kubeconfig(servers: Mapping[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "v1", "kind": "Config", "current-context": "east",
        "contexts": [{"name": n, "context": {"cluster": f"c-{n}", "user": "u"}} for n in servers],
        "clusters": [{"name": f"c-{n}", "cluster": {"server": s}} for n, s in servers.items()],
        "users": [{"name": "u", "user": {"token": "not-a-real-token"}}],
    }  # fmt: skip


@contextlib.asynccontextmanager
async def federation(
    east: NamespacedEmulator, tmp_path: Path, layouts: Mapping[str, Layout]
) -> AsyncIterator[tuple[Service, dict[str, Member]]]:
    """The broker on east (the test's kmock) and west (a second kmock), both members'
    controllers running."""
    async with NamespacedEmulator() as west, kmocklib.Server(west):
        k8s = {"east": east, "west": west}
        members = {name: racked(k8s[name], layouts[name]) for name in k8s}
        path = tmp_path / "kubeconfig"
        path.write_text(json.dumps(kubeconfig({n: str(s.url).rstrip("/") for n, s in k8s.items()})))
        clusters = "".join(
            CLUSTER.format(name=name, block=BLOCK, rack=RACK, kubeconfig=path) for name in k8s
        )
        text = CONFIG.format(db=tmp_path / "jobs.db", clusters=clusters)
        service = Service(parse_config(text, "test"), clock=Clock(T0))
        async with members["east"].running(), members["west"].running():
            await service.start()
            try:
                yield service, members
            finally:
                await service.close()


def gang(name: str, count: int, gpus: int, topology: Obj | None = None) -> Any:
    """A FederatedJob of one pod set ``worker``, with ``topology`` as its request."""
    pod_set: Obj = {"name": "worker", "count": count,
                    "resources": {"nvidia.com/gpu": gpus, "cpu": "1", "memory": "1Gi"}}  # fmt: skip
    if topology is not None:
        pod_set["topology"] = topology
    body = {"apiVersion": "fedbroker.io/v1alpha1", "kind": "FederatedJob",
            "metadata": {"name": name}, "spec": {"podSets": [pod_set]}}  # fmt: skip
    return parse_manifest(json.dumps(body).encode(), "application/json")


def batch_job(rack: bool) -> Any:
    """An Indexed batch Job of four 2-GPU pods; ``rack``: its template carries Kueue's
    required-topology annotation for one rack."""
    template = pod_template(gpus=2)
    if rack:
        template["metadata"]["annotations"] = {"kueue.x-k8s.io/podset-required-topology": RACK}
    spec = {"completionMode": "Indexed", "backoffLimit": 0, "completions": 4,
            "parallelism": 4, "template": template}  # fmt: skip
    return workload_manifest(
        "Job", "train", {"apiVersion": "batch/v1", "kind": "Job", "spec": spec}
    )


def without(service: Service, body: Any) -> Decision:
    """Where ``body`` would go now (a dry run: nothing is reserved)."""
    job = service.admission.job_for("team-a", body)
    policy = service.shared.policies.fresh(Pending(job, 0, 0.0))
    return policy.decide(job, service.ledger.snapshot())


def placed(decision: Decision | None) -> Placement:
    assert isinstance(decision, Placement), decision
    return decision


def domains(service: Service, placement: Placement, key: str) -> list[str]:
    """The value of label ``key`` on each pod's node, as the broker read the member's nodes."""
    nodes = service.ledger.snapshot().clusters[placement.cluster].nodes
    return [nodes[pod.node].node.labels[key] for pod in placement.pods]


REQUIRED = {  # east's free GPUs take four 2-GPU pods exactly, but one per rack
    "east": {"e1": ("b1", "r1", 2), "e2": ("b1", "r2", 2),
             "e3": ("b2", "r3", 2), "e4": ("b2", "r4", 2)},
    "west": {"w1": ("b1", "r1", 0), "w2": ("b1", "r1", 0), "w3": ("b1", "r2", 0)},
}  # fmt: skip


async def test_a_required_rack_gang_runs_inside_one_rack_of_the_cluster_that_has_one(
    kmock: NamespacedEmulator, tmp_path: Path
) -> None:
    async with federation(kmock, tmp_path, REQUIRED) as (service, members):
        spread = placed(without(service, batch_job(rack=False)))
        assert spread.cluster == "east" and len(set(domains(service, spread, RACK))) == 4

        await service.submit("team-a", batch_job(rack=True))
        await service.schedule_once()
        placement = service.ledger.reservations()["team-a/train"]
        assert placement.cluster == "west", placement
        assert set(domains(service, placement, RACK)) == {"r1"}, placement
        await launched(service, members["west"], ("team-a", "train"))
        record = await service.get("team-a", "train")
        assert record.state == "Running", record.reason
        bound = [p["spec"].get("nodeName") for p in ours(members["west"], PODS).values()]
        assert Counter(bound) == Counter(p.node for p in placement.pods)
        assert not ours(members["east"], PODS)


PREFERRED = {  # no rack takes six 2-GPU pods; east's block b1 does; west's blocks are nodes
    "east": {"e1": ("b1", "r1", 0), "e2": ("b1", "r1", 0),
             "e3": ("b1", "r2", 0), "e4": ("b1", "r2", 0),
             "e5": ("b2", "r3", 2), "e6": ("b2", "r4", 2)},
    "west": {"w1": ("b1", "r1", 0), "w2": ("b2", "r2", 0), "w3": ("b3", "r3", 0)},
}  # fmt: skip


async def test_a_preferred_rack_falls_back_to_a_block_then_to_the_whole_cluster(
    kmock: NamespacedEmulator, tmp_path: Path
) -> None:
    async with federation(kmock, tmp_path, PREFERRED) as (service, _):
        # Six 2-GPU pods: without the preference they fill west's three blocks exactly.
        spread = placed(without(service, gang("block", 6, 2)))
        assert len(set(domains(service, spread, BLOCK))) > 1, spread
        await service.submit("team-a", gang("block", 6, 2, {"preferred": RACK}))
        await service.schedule_once()
        block = service.ledger.reservations()["team-a/block"]
        assert block.cluster == "east", block
        assert set(domains(service, block, BLOCK)) == {"b1"}, block
        assert len(set(domains(service, block, RACK))) == 2  # no one rack had room

        # Three whole nodes: east has one left, west's three are in three blocks.
        assert isinstance(without(service, gang("cluster", 3, 4, {"required": BLOCK})), Unplaceable)
        await service.submit("team-a", gang("cluster", 3, 4, {"preferred": RACK}))
        await service.schedule_once()
        whole = service.ledger.reservations()["team-a/cluster"]
        assert whole.cluster == "west", whole
        assert sorted(domains(service, whole, BLOCK)) == ["b1", "b2", "b3"]


SLICES = {  # no rack has room for four 2-GPU pods; each has room for three
    "east": {"e1": ("b1", "r1", 2), "e2": ("b1", "r2", 2),
             "e3": ("b1", "r1", 0), "e4": ("b1", "r2", 0)},
    "west": {"w1": ("b1", "r1", 0)},
}  # fmt: skip


def index(pod: str) -> int:
    """A gang pod's index: its name's last part (the member's ``<job>-worker-<i>``)."""
    return int(pod.rsplit("-", 1)[1])


def slice_racks(service: Service, placement: Placement, size: int) -> list[set[str]]:
    """The racks of each slice (pods ``k*size .. k*size+size-1``)."""
    racks = dict(
        zip((p.pod for p in placement.pods), domains(service, placement, RACK), strict=True)
    )
    slices: dict[int, set[str]] = {}
    for name, rack in racks.items():
        slices.setdefault(index(name) // size, set()).add(rack)
    return [slices[k] for k in sorted(slices)]


async def test_each_slice_of_a_gang_runs_inside_one_rack(
    kmock: NamespacedEmulator, tmp_path: Path
) -> None:
    async with federation(kmock, tmp_path, SLICES) as (service, members):
        spread = placed(without(service, gang("sliced", 4, 2)))
        assert any(len(racks) > 1 for racks in slice_racks(service, spread, 2)), spread
        assert isinstance(without(service, gang("sliced", 4, 2, {"required": RACK})), Unplaceable)

        topology = {"sliceSize": 2, "sliceRequired": RACK}
        await service.submit("team-a", gang("sliced", 4, 2, topology))
        await service.schedule_once()
        placement = service.ledger.reservations()["team-a/sliced"]
        assert placement.cluster == "east", placement
        assert slice_racks(service, placement, 2) in ([{"r1"}, {"r2"}], [{"r2"}, {"r1"}])
        await launched(service, members["east"], ("team-a", "sliced"))
        record = await service.get("team-a", "sliced")
        assert record.state == "Running", record.reason
        pods = ours(members["east"], PODS)
        bound = {index(name): pod["spec"].get("nodeName") for name, pod in pods.items()}
        assert bound == {index(p.pod): p.node for p in placement.pods}


TOO_BIG = {  # five whole nodes in each cluster, but at most four in a rack
    "east": {**{f"e{i}": ("b1", "r1", 0) for i in range(1, 5)}, "e5": ("b1", "r2", 0)},
    "west": {**{f"w{i}": ("b1", "r1", 0) for i in range(1, 4)},
             "w4": ("b2", "r2", 0), "w5": ("b2", "r2", 0)},
}  # fmt: skip


async def test_a_gang_larger_than_every_rack_waits_and_explain_names_the_level(
    kmock: NamespacedEmulator, tmp_path: Path
) -> None:
    async with federation(kmock, tmp_path, TOO_BIG) as (service, _):
        placed(without(service, gang("big", 5, 4)))  # without the request it would run
        await service.submit("team-a", gang("big", 5, 4, {"required": RACK}))
        await service.schedule_once()
        record = await service.get("team-a", "big")
        assert record.state == "Queued" and not service.ledger.reservations(), record
        doc = await service.explain("team-a", "big")
        said = "pod set worker: no rack (cloud.provider.com/topology-rack) in {} has room for "
        said += "5 pods of 4 GPUs; the largest has room for {} (r1)"
        code = "NoTopologyDomainFits"
        assert doc["clusters"] == [
            {"cluster": "east", "fits": False, "largestFit": 4,
             "reasons": [{"code": code, "message": said.format("east", 4)}]},
            {"cluster": "west", "fits": False, "largestFit": 3,
             "reasons": [{"code": code, "message": said.format("west", 3)}]},
        ]  # fmt: skip
        # the one line a list shows: no rack of any cluster could take it even empty
        assert service.waiting("team-a", "big") == (
            "never fits: no cluster could take 5 pods of 4 GPUs in one rack "
            "(cloud.provider.com/topology-rack) even empty; the largest, east, could take 4"
        )
