"""A pod's own ``spec.resources`` (KEP-2837) counted alike by admission and by the member
watch: a template admitted (its resources derived), placed, made into a pod by the
launcher's own code and created in a member served by kmock over real HTTP is counted by
the ClusterWatcher as admission counted it; and, over random pods, the two counts agree."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from fractions import Fraction
from pathlib import Path
from typing import Any

import kmock
import pytest
from hypothesis import given
from hypothesis import strategies as st

from adapters.kube.objects import GangObjects
from adapters.kube.translate import effective_requests
from adapters.kube.watch import ClusterWatcher
from adapters.kubeapi.kubeconfig import load_clients
from broker.manifest import FederatedJob, admit_templates, pod_requests, to_job
from broker.model import CapacityEvent, PodBound, PodPlacement, Resources
from broker.ports import LaunchSpec

NODES = kmock.resource("", "v1", "nodes")
NS = "team-acme"


def container(name: str, requests: dict[str, Any] | None = None,
              limits: dict[str, Any] | None = None, **extra: Any) -> dict[str, Any]:  # fmt: skip
    resources = {k: v for k, v in (("requests", requests), ("limits", limits)) if v}
    return {"name": name, "image": "trainer:1.0", "resources": resources, **extra}


GPU2 = {"nvidia.com/gpu": 2}
# (id, pod spec): each gives the pod's own resources some way Kubernetes counts.
CASES: list[tuple[str, dict[str, Any]]] = [
    ("the issue's 500 CPUs over a 100m container", {
        "resources": {"requests": {"cpu": "500"}},
        "containers": [container("main", {"cpu": "100m"}, GPU2)]}),
    ("a pod-level limit alone: its request", {
        "resources": {"limits": {"cpu": "6", "memory": "12Gi"}},
        "containers": [container("main", limits=GPU2), container("side")]}),
    # No overhead: a pod's comes from its RuntimeClass, and one set by the pod is refused.
    ("decimal memory for the whole pod, cpu from the container", {
        "resources": {"requests": {"memory": "1G"}},
        "containers": [container("main", {"cpu": "250m", "memory": "100M"}, GPU2)]}),
    ("init containers and a sidecar under a pod-level request", {
        "resources": {"requests": {"cpu": "12"}, "limits": {"cpu": "16"}},
        "initContainers": [container("init", {"cpu": "8"}),
                           container("proxy", {"cpu": "2"}, restartPolicy="Always")],
        "containers": [container("main", {"cpu": "1", "memory": "2Gi"}, GPU2)]}),
    ("decimal memory for the pod alone: no container memory added by the launcher", {
        "resources": {"requests": {"memory": "1G", "cpu": "2"}},
        "containers": [container("main", limits=GPU2)]}),
    ("cpu for the pod, memory from the containers", {
        "resources": {"requests": {"cpu": "3"}, "limits": {"hugepages-2Mi": "4Mi"}},
        "containers": [container("main", {"memory": "3Gi"}, GPU2)]}),
]  # fmt: skip


def admitted(spec: dict[str, Any]) -> Resources:
    """What one pod of this template asks, as admission counts it (resources derived)."""
    manifest = FederatedJob.model_validate({
        "apiVersion": "fedbroker.io/v1alpha1", "kind": "FederatedJob",
        "metadata": {"name": "train"},
        "spec": {"podSets": [{"name": "worker", "count": 1, "template": {"spec": spec}}]},
    })  # fmt: skip
    job = to_job(admit_templates(manifest, "baseline", ["default"]), "acme", "training")
    return job.pod_sets[0].resources


def launched(spec: dict[str, Any], resources: Resources) -> dict[str, Any]:
    """The pod the launcher makes for one placed pod of the template, bound and running."""
    objects = GangObjects(
        "team-{tenant}", "pin", "coscheduling", "fedbroker", cluster="a",
        gpu_resource="nvidia.com/gpu", shared_gpu_resource=None, scheduler_name=None,
        default_image="busybox",
    )  # fmt: skip
    placed = PodPlacement("acme.train-worker-0", "n1", tuple(range(resources.gpus)), resources)
    launch = LaunchSpec(tenant="acme", job="train", pod_templates={"worker": {"spec": spec}})
    body = objects.pod_body(placed, launch)
    body["spec"]["nodeName"] = "n1"
    body["status"] = {"phase": "Running"}
    return body


class Bound:
    """The watcher's emit(): every PodBound by pod, and an event when one arrives."""

    def __init__(self) -> None:
        self.pods: dict[str, PodBound] = {}
        self.changed = asyncio.Event()

    def __call__(self, events: list[CapacityEvent]) -> None:
        self.pods.update((e.pod, e) for e in events if isinstance(e, PodBound))
        self.changed.set()

    async def pod(self, key: str) -> PodBound:
        async with asyncio.timeout(20):  # a deadline for failing, generous for a busy CI
            while key not in self.pods:
                self.changed.clear()
                await self.changed.wait()
        return self.pods[key]


@pytest.fixture
async def watched(
    kmock: kmock.KubernetesEmulator, tmp_path: Path
) -> AsyncIterator[tuple[kmock.KubernetesEmulator, Bound]]:
    kmock.objects[NODES, None, "n1"] = {
        "apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1"},
        "status": {"allocatable": {"nvidia.com/gpu": "8", "cpu": "600", "memory": "2Ti"},
                   "conditions": [{"type": "Ready", "status": "True"}]},
    }  # fmt: skip
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "a",
        "contexts": [{"name": "a", "context": {"cluster": "a", "user": "u"}}],
        "clusters": [{"name": "a", "cluster": {"server": str(kmock.url)}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
    }))  # fmt: skip
    clients, _ = await load_clients(kubeconfig)
    bound = Bound()
    task = asyncio.create_task(ClusterWatcher("a", clients["a"], bound).run())
    try:
        yield kmock, bound
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await clients["a"].close()  # type: ignore[no-untyped-call]


@pytest.mark.parametrize("spec", [c[1] for c in CASES], ids=[c[0] for c in CASES])
async def test_a_placed_pod_is_counted_by_the_watch_as_admission_counted_it(
    watched: tuple[kmock.KubernetesEmulator, Bound], spec: dict[str, Any]
) -> None:
    km, bound = watched
    resources = admitted(spec)
    pod = launched(spec, resources)
    # What the launcher sends keeps the API server's pod-level rules (no container asking
    # more than the pod, rounded up to MiB or millicores by the broker's own count).
    assert pod_requests(pod["spec"], ())[1] == []
    await km.post(f"/api/v1/namespaces/{NS}/pods", json=pod)
    seen = await bound.pod("acme.train-worker-0")
    assert seen.node == "n1"
    assert seen.resources == resources
    assert seen.gpus == tuple(range(resources.gpus))


def test_the_issue_500_cpus_are_counted_as_500() -> None:
    resources = admitted(CASES[0][1])
    assert resources == Resources(gpus=2, cpu_milli=500_000)


# Random pods the API server would accept: pod-level amounts at least what the containers ask.
amounts = st.integers(min_value=0, max_value=8)
asks = st.lists(st.fixed_dictionaries({}, optional={"cpu": amounts, "memory": amounts}), max_size=3)


def quantities(ask: dict[str, int]) -> dict[str, str]:
    return {name: f"{n}Gi" if name == "memory" else str(n) for name, n in ask.items()}


@given(asks, asks, st.sampled_from(["", "cpu", "memory"]), amounts, st.booleans(),
       st.fixed_dictionaries({}, optional={"cpu": amounts}))  # fmt: skip
def test_admission_and_the_watch_count_a_pod_alike(
    regular: list[dict[str, int]],
    init: list[dict[str, int]],
    pod_level: str,
    extra: int,
    as_limit: bool,
    overhead: dict[str, int],
) -> None:
    spec: dict[str, Any] = {
        "containers": [container(f"c{i}", quantities(r)) for i, r in enumerate(regular)],
        "initContainers": [container(f"i{i}", quantities(r)) for i, r in enumerate(init)],
        "overhead": quantities(overhead),
    }
    if pod_level:
        containers_only, _ = pod_requests({**spec, "overhead": {}}, ())
        least = containers_only.effective.get(pod_level, Fraction(0))
        amount = max(least, Fraction(extra)) if as_limit else least + extra
        spec["resources"] = {"limits" if as_limit else "requests": {pod_level: str(amount)}}
    admission, problems = pod_requests(spec, ())
    assert problems == []
    watch = effective_requests(spec)
    for name in ("cpu", "memory"):
        assert admission.effective.get(name, Fraction(0)) == watch.get(name, Fraction(0))
