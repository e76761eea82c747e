"""Many workload launches at once in one member (kmock over real HTTP, the real
``kubernetes.aio`` client): 60 batch Jobs of two tenants launched together by one pin-mode
launcher, each polling through the listings it shares with the others. None may take a
listing that began before its own create for its workload being gone: every launch
returns with its Job running, none rolled back.

The member answers a LIST of Jobs as of the moment it arrives but holds the answer until
every create of the test has been answered (``HeldListings``), as a busy API server's
slow LIST does: the first launch to poll begins a listing that the other 59 creates
overtake, so a launch that joined it would find no Job of its own there."""

from __future__ import annotations

import asyncio
import json
from typing import Any, cast

import aiohttp.web
import pytest
from kmock_namespaces import NamespacedEmulator
from kubernetes.aio.client import ApiClient
from test_workloads import INIT, batch_job
from workload_cluster import KIND_RES, PODS, Emulator, launcher, node_of

from adapters.kube.slots import gated
from broker.manifest import admit_templates, parse_manifest, to_job, workload_of
from broker.model import Placement, PodPlacement
from broker.ports import LaunchSpec


class HeldListings(NamespacedEmulator):
    """kmock with Namespaces whose LIST of Jobs across namespaces is read when it arrives
    and answered once ``expected`` Job creates have been (see the module's docstring)."""

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        self.expected = 0
        self.created = 0
        self.lists = 0
        self.reads = 0  # GETs of one Job
        self.all_created = asyncio.Event()
        self.all_created.set()  # nothing held until a test says how many creates to await

    def hold_until(self, creates: int) -> None:
        """Hold each LIST of Jobs from now until ``creates`` more Job creates are answered."""
        self.expected = self.created + creates
        self.all_created.clear()

    async def __call__(self, raw_request: aiohttp.web.BaseRequest) -> aiohttp.web.StreamResponse:
        listing = raw_request.method == "GET" and raw_request.path == "/apis/batch/v1/jobs"
        response = await super().__call__(raw_request)  # the listing as of its arrival
        if listing:
            self.lists += 1
            await self.all_created.wait()
        elif raw_request.method == "GET" and "/jobs/" in raw_request.path:
            self.reads += 1
        elif raw_request.method == "POST" and raw_request.path.endswith("/jobs"):
            self.created += response.status < 300
            if self.created >= self.expected:
                self.all_created.set()
        return response


pytestmark = pytest.mark.kmock(cls=HeldListings)

TENANTS = ("acme", "zeta")
PER_TENANT = 30
JOB = batch_job({**INIT, "spec": {**INIT["spec"], "restartPolicy": "Never"}})


def admitted(tenant: str, job: str, node: str) -> tuple[Placement, LaunchSpec]:
    """A one-pod batch Job of ``tenant`` admitted as the service does, placed on ``node``."""
    manifest = {"apiVersion": "fedbroker.io/v1alpha1", "kind": "FederatedJob",
                "metadata": {"name": job}, "spec": {"workload": JOB}}  # fmt: skip
    parsed = admit_templates(
        parse_manifest(json.dumps(manifest).encode(), None), "baseline", ["default"]
    )
    derived = to_job(parsed, tenant, "training")
    [pod_set] = derived.pod_sets
    spec = LaunchSpec(
        tenant=tenant, job=job, queue="training", pod_sets=(pod_set.name,),
        workload=workload_of(parsed.wire()),
    )  # fmt: skip
    slot = PodPlacement(f"{tenant}.{job}-{pod_set.name}-0", node, (0,), pod_set.resources)
    return Placement(f"{tenant}/{job}", "east", (slot,)), spec


class Member:
    """The Job controller, scheduler and kubelet of the member, played at every poll
    pause of any launch: a pod for each Job that has none (from its stored template,
    named and labelled as the Job controller does), every ungated pod bound where it
    was pinned and run."""

    def __init__(self, k8s: Emulator) -> None:
        self.k8s = k8s
        self.pauses = 0

    async def step(self, pause: float) -> None:
        self.pauses += 1
        assert self.pauses < 100 * PER_TENANT, "the launches never all ran"
        objects = [(key, o) for key, o in list(self.k8s.objects.items()) if not o.deleted]
        made = {(ns, o.raw["metadata"]["labels"]["job-name"]) for (r, ns, _), o in objects
                if r == PODS}  # fmt: skip
        for (res, namespace, name), obj in objects:
            if res == KIND_RES["Job"] and (namespace, name) not in made:
                self.make(str(namespace), obj.raw)
        for (res, _ns, _name), obj in objects:
            if res != PODS or gated(obj.raw) or obj.raw["spec"].get("nodeName"):
                continue
            obj.patch({"spec": {"nodeName": node_of(obj.raw)}, "status": {"phase": "Running"}})
        await asyncio.sleep(0)

    def make(self, namespace: str, job: dict[str, Any]) -> None:
        name = job["metadata"]["name"]
        template = job["spec"]["template"]
        labels = {**template["metadata"].get("labels", {}), "job-name": name,
                  "batch.kubernetes.io/job-name": name,
                  "batch.kubernetes.io/job-completion-index": "0"}  # fmt: skip
        self.k8s.controller_create(PODS, namespace, {
            "apiVersion": "v1", "kind": "Pod", "spec": template["spec"],
            "metadata": {**template["metadata"], "name": f"{name}-0-x7k2q",
                         "namespace": namespace, "uid": f"uid-{namespace}-{name}",
                         "labels": labels},
        })  # fmt: skip


async def test_sixty_launches_at_once_by_two_tenants_all_run(k8s: Emulator, api: ApiClient) -> None:
    member = Member(k8s)
    kube = launcher(api, member.step, poll_seconds=0)
    jobs = [
        admitted(tenant, f"train-{i}", f"node-{t * PER_TENANT + i}")
        for t, tenant in enumerate(TENANTS)
        for i in range(PER_TENANT)
    ]
    cast(HeldListings, k8s).hold_until(len(jobs))
    results = await asyncio.gather(
        *(kube.launch(placement, spec) for placement, spec in jobs), return_exceptions=True
    )
    failures = [f"{spec.key}: {r}" for (_, spec), r in zip(jobs, results, strict=True) if r]
    assert failures == []
    live = [(res, ns, name) for (res, ns, name), o in k8s.objects.items() if not o.deleted]
    workloads = {(ns, name) for res, ns, name in live if res == KIND_RES["Job"]}
    assert workloads == {(f"team-{s.tenant}", s.job) for _, s in jobs}  # none rolled back
    running = [
        (ns, o.raw["metadata"]["labels"]["job-name"])
        for (res, ns, _), o in k8s.objects.items()
        if res == PODS and not o.deleted and o.raw["status"].get("phase") == "Running"
    ]
    assert sorted(running) == sorted(workloads)
    assert cast(HeldListings, k8s).lists > 1  # polls did list, and not only once
    # Every launch found its Job in a listing begun after its create: none had to be
    # read once more to be told apart from a Job gone.
    assert cast(HeldListings, k8s).reads == 0
