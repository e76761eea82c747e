"""The Kubernetes capacity adapter against kmock: real HTTP, the real kubernetes.aio client."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Callable
from fractions import Fraction
from pathlib import Path
from typing import Any

import kmock
import kmock as kmocklib
import pytest
from kmock import resource

from adapters.kube.translate import (
    GpuConfig,
    effective_requests,
    pod_resources,
    translate_node,
    translate_pod,
)
from adapters.kube.watch import Backoff, ClusterWatcher, Gone, StaleTracker, is_stale, watch_events
from adapters.kubeapi.kubeconfig import load_clients
from adapters.kubeapi.quantity import parse_quantity
from broker.bench.watch import bench_ledger_updates
from broker.cli.main import main
from broker.core.ledger import Ledger
from broker.model import CapacityEvent, Cluster, GpuType, PodBound, PodDeleted, Resources
from broker.ports import KubeconfigError, WatchError

NODES = resource("", "v1", "nodes")
PODS = resource("", "v1", "pods")
CANARY = "canary-token-7f3a9c1d"
A100 = GpuType("A100")


def node_obj(name: str, gpus: int = 4, **spec: Any) -> dict[str, Any]:
    ready = spec.pop("ready", True)
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {"nvidia.com/gpu.product": "A100"}},
        "spec": spec,
        "status": {
            "allocatable": {"nvidia.com/gpu": str(gpus), "cpu": "64", "memory": "256Gi"},
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        },
    }


def pod_obj(name: str, node: str | None, gpus: int = 1, phase: str = "Running") -> dict[str, Any]:
    spec: dict[str, Any] = {
        "containers": [{"name": "c", "resources": {"requests": {"nvidia.com/gpu": str(gpus)}}}]
    }
    if node:
        spec["nodeName"] = node
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "ml"},
        "spec": spec,
        "status": {"phase": phase},
    }


def write_kubeconfig(path: Path, servers: dict[str, str]) -> Path:
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": next(iter(servers)),
        "contexts": [{"name": n, "context": {"cluster": f"c-{n}", "user": "u"}} for n in servers],
        "clusters": [{"name": f"c-{n}", "cluster": {"server": s}} for n, s in servers.items()],
        "users": [{"name": "u", "user": {"token": CANARY}}],
    }
    path.write_text(json.dumps(doc))
    return path


class Sink:
    """emit() target: applies events to a ledger and wakes waiters (no sleeps)."""

    def __init__(self) -> None:
        self.ledger = Ledger()
        self.ledger.add_cluster(Cluster("a"))
        self.changed = asyncio.Event()

    def __call__(self, events: list[CapacityEvent]) -> None:
        for ev in events:
            self.ledger.apply(ev)
        self.changed.set()

    async def until(self, predicate: Callable[[], bool]) -> None:
        async with asyncio.timeout(20):  # a deadline for failing, generous for a busy CI
            while not predicate():
                self.changed.clear()
                await self.changed.wait()

    def used(self, node: str) -> int:
        state = self.ledger.snapshot().clusters["a"].nodes.get(node)
        return -1 if state is None else sum(1 for f in state.gpu_free if f < 1000)

    def nodes(self) -> set[str]:
        return set(self.ledger.snapshot().clusters["a"].nodes)

    def untainted_gpus(self) -> int:
        return self.ledger.snapshot().clusters["a"].gpus_total((A100, frozenset()))


async def watching(km: kmock.KubernetesEmulator) -> None:
    """Wait until both watch streams are subscribed to kmock's event bus (yields only)."""
    async with asyncio.timeout(5):
        while not (km._buses[NODES].consumer_count and km._buses[PODS].consumer_count):
            await asyncio.sleep(0)


class Harness:
    def __init__(self, km: kmock.KubernetesEmulator, watcher: ClusterWatcher, sink: Sink) -> None:
        self.km, self.watcher, self.sink = km, watcher, sink
        self.delays: list[float] = []


@pytest.fixture
async def harness(kmock: kmock.KubernetesEmulator, tmp_path: Path) -> AsyncIterator[Harness]:
    kmock.objects[NODES, None, "n1"] = node_obj("n1")
    kmock.objects[PODS, "ml", "p1"] = pod_obj("p1", "n1", gpus=2)
    kc = write_kubeconfig(tmp_path / "kubeconfig", {"a": str(kmock.url)})
    clients, _ = await load_clients(kc)
    sink = Sink()
    delays: list[float] = []

    async def sleep(delay: float) -> None:
        delays.append(delay)
        await asyncio.sleep(0)

    import random

    watcher = ClusterWatcher(
        "a", clients["a"], sink, sleep=sleep, backoff=Backoff(rng=random.Random(1))
    )
    h = Harness(kmock, watcher, sink)
    h.delays = delays
    task = asyncio.create_task(watcher.run())
    try:
        yield h
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await clients["a"].close()  # type: ignore[no-untyped-call]


async def test_initial_list_and_watch_events(harness: Harness) -> None:
    km, sink = harness.km, harness.sink
    await sink.until(lambda: sink.used("n1") == 2)
    await watching(km)
    await km.post("/api/v1/nodes", json=node_obj("n2", gpus=8))
    await sink.until(lambda: "n2" in sink.nodes())
    await km.post("/api/v1/namespaces/ml/pods", json=pod_obj("p2", "n2", gpus=3))
    await sink.until(lambda: sink.used("n2") == 3)
    await km.patch("/api/v1/namespaces/ml/pods/p2", json={"status": {"phase": "Succeeded"}})
    await sink.until(lambda: sink.used("n2") == 0)
    await km.request("DELETE", "/api/v1/namespaces/ml/pods/p1")
    await sink.until(lambda: sink.used("n1") == 0)
    await km.patch("/api/v1/nodes/n2", json=node_obj("n2", gpus=6))
    await sink.until(lambda: sink.ledger.snapshot().clusters["a"].gpus_total() == 10)
    await km.request("DELETE", "/api/v1/nodes/n1")
    await sink.until(lambda: sink.nodes() == {"n2"})


async def test_relist_after_410_misses_no_change(
    kmock: kmock.KubernetesEmulator, tmp_path: Path
) -> None:
    kmock.objects[NODES, None, "n1"] = node_obj("n1")
    kmock.objects[PODS, "ml", "p1"] = pod_obj("p1", "n1", gpus=2)
    clients, _ = await load_clients(write_kubeconfig(tmp_path / "kc", {"a": str(kmock.url)}))
    watcher = ClusterWatcher("a", clients["a"], lambda _: None)
    try:
        first = await watcher.list_once()
        assert any(isinstance(e, PodBound) and e.pod == "ml/p1" for e in first)
        # While the watch was gone, p1 ended and p3 started: only a relist can tell.
        kmock.objects[PODS, "ml", "p1"].delete()
        kmock.objects[PODS, "ml", "p3"] = pod_obj("p3", "n1", gpus=1)
        second = await watcher.list_once()
        assert PodDeleted("a", "ml/p1") in second
        assert any(isinstance(e, PodBound) and e.pod == "ml/p3" for e in second)
    finally:
        await clients["a"].close()  # type: ignore[no-untyped-call]


class _Content:
    def __init__(self, chunks: list[bytes]) -> None:
        self._chunks = chunks

    async def readany(self) -> bytes:
        return self._chunks.pop(0) if self._chunks else b""


class _Response:
    """What ``watch_events`` reads of a watch response: a status and a stream of lines."""

    def __init__(self, status: int, events: list[Any]) -> None:
        self.status = status
        self.content = _Content([json.dumps(e).encode() + b"\n" for e in events])
        self.released = False

    def release(self) -> None:
        self.released = True


ADDED = {"type": "ADDED", "object": {"metadata": {"name": "p1", "resourceVersion": "7"}}}


@pytest.mark.parametrize(
    ("status", "event", "error", "message"),
    [
        (200, {"type": "ERROR", "object": {"kind": "Status", "code": 410}}, Gone, "410 Gone"),
        (200, {"type": "ERROR", "object": {"kind": "Status", "code": 500}}, WatchError,
         "error event 500"),
        (200, ["not", "an", "object"], WatchError, "an event that is not an object"),
        (410, None, Gone, "410 Gone"),
        (500, None, WatchError, "HTTP 500"),
    ],
)  # fmt: skip
async def test_a_410_means_relist_and_other_errors_reconnect(
    status: int, event: Any, error: type[Exception], message: str
) -> None:
    # run() relists on Gone and reconnects with backoff on other WatchErrors.
    resp = _Response(status, [ADDED] if event is None else [ADDED, event])

    async def open_watch() -> Any:
        return resp

    seen: list[Any] = []
    with pytest.raises(error, match=f"^cluster a: pods watch: {message}$"):
        async for one in watch_events(open_watch, "cluster a: pods watch", 5.0):
            seen.append(one)
    assert seen == ([] if event is None else [ADDED])
    assert resp.released


async def test_a_stream_the_server_ends_ends_the_events() -> None:
    resp = _Response(200, [ADDED, {"type": "BOOKMARK", "object": {"metadata": {}}}])

    async def open_watch() -> Any:
        return resp

    seen = [one["type"] async for one in watch_events(open_watch, "cluster a: pods watch", 5.0)]
    assert seen == ["ADDED", "BOOKMARK"] and resp.released


async def test_dropped_connection_reconnects_with_backoff(
    kmock: kmock.KubernetesEmulator, tmp_path: Path
) -> None:
    kmock.objects[NODES, None, "n1"] = node_obj("n1")
    kmock.resources["v1/pods"] = kmocklib.ResourceInfo(namespaced=True)  # known, no pods yet
    kmock["list", NODES][:3] << 503  # the API server is away for three attempts
    clients, _ = await load_clients(write_kubeconfig(tmp_path / "kc", {"a": str(kmock.url)}))
    sink = Sink()
    delays: list[float] = []
    statuses: list[bool] = []

    async def sleep(delay: float) -> None:
        delays.append(delay)
        await asyncio.sleep(0)

    import random

    watcher = ClusterWatcher(
        "a",
        clients["a"],
        sink,
        sleep=sleep,
        backoff=Backoff(rng=random.Random(3)),
        on_status=lambda _, up: statuses.append(up),
    )
    task = asyncio.create_task(watcher.run())
    try:
        await sink.until(lambda: sink.nodes() == {"n1"})
        assert len(delays) == 3
        for got, nominal in zip(delays, (0.8, 1.6, 3.2), strict=True):
            assert nominal * 0.8 <= got <= nominal * 1.2
        assert statuses == [True]  # never connected before: no flapping reports
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await clients["a"].close()  # type: ignore[no-untyped-call]


def test_backoff_caps_at_30s() -> None:
    b = Backoff()
    assert all(b.delay(n) <= 30.0 for n in range(100))
    assert b.delay(40) >= 24.0


async def test_taints_cordon_notready_remove_capacity(harness: Harness) -> None:
    km, sink = harness.km, harness.sink
    await sink.until(lambda: sink.untainted_gpus() == 4)
    await watching(km)
    taint = {"key": "dedicated", "value": "x", "effect": "NoSchedule"}
    await km.patch("/api/v1/nodes/n1", json={"spec": {"taints": [taint]}})
    await sink.until(lambda: sink.untainted_gpus() == 0)
    await km.patch("/api/v1/nodes/n1", json={"spec": {"taints": []}})
    await sink.until(lambda: sink.untainted_gpus() == 4)
    await km.patch("/api/v1/nodes/n1", json={"spec": {"unschedulable": True}})
    await sink.until(lambda: sink.untainted_gpus() == 0)
    await km.patch("/api/v1/nodes/n1", json={"spec": {"unschedulable": False}})
    await sink.until(lambda: sink.untainted_gpus() == 4)
    await km.patch("/api/v1/nodes/n1", json=node_obj("n1", ready=False))
    await sink.until(lambda: sink.untainted_gpus() == 0)
    assert sink.used("n1") == 2  # the bound pod is still counted


def test_stale_decision_with_injected_clock() -> None:
    now = [100.0]
    tracker = StaleTracker(stale_after=30, clock=lambda: now[0])
    tracker.track("a")
    assert not tracker.is_stale("a")
    now[0] = 131.0
    assert tracker.is_stale("a")  # never connected
    tracker.on_status("a", True)
    assert not tracker.is_stale("a")
    tracker.on_status("a", False)
    now[0] = 150.0
    assert not tracker.is_stale("a")
    now[0] = 161.0
    assert tracker.is_stale("a")
    assert not is_stale(None, 1e9, 30)


def test_stale_cluster_takes_no_placements_marker() -> None:
    ledger = Ledger()
    ledger.add_cluster(Cluster("a"))
    ledger.set_stale("a", True)
    assert ledger.snapshot().clusters["a"].stale


async def test_inspect_json(kmock: kmock.KubernetesEmulator, tmp_path: Path, capsys: Any) -> None:
    kmock.objects[NODES, None, "n1"] = node_obj("n1", gpus=4)
    kmock.objects[NODES, None, "n2"] = node_obj("n2", gpus=2, unschedulable=True)
    kmock.objects[PODS, "ml", "p1"] = pod_obj("p1", "n1", gpus=3)
    kmock.objects[PODS, "ml", "done"] = pod_obj("done", "n1", gpus=1, phase="Succeeded")
    kmock.objects[PODS, "ml", "pending"] = pod_obj("pending", None, gpus=1)
    kc = write_kubeconfig(tmp_path / "kc", {"live": str(kmock.url), "down": "http://127.0.0.1:9"})
    argv = ["inspect", "--kubeconfig", str(kc), "--json", "--timeout", "2"]
    code = await asyncio.to_thread(main, argv)
    assert code == 0
    doc = json.loads(capsys.readouterr().out)
    by = {c["name"]: c for c in doc["clusters"]}
    assert by["down"] == {"name": "down", "stale": True, "nodes": []}
    assert by["live"]["stale"] is False
    assert by["live"]["nodes"] == [
        {
            "name": "n1",
            "gpu_type": "A100",
            "gpus_allocatable": 4,
            "gpus_used": 3,
            "schedulable": True,
        },
        {
            "name": "n2",
            "gpu_type": "A100",
            "gpus_allocatable": 2,
            "gpus_used": 0,
            "schedulable": False,
        },
    ]


def test_inspect_bad_kubeconfig_is_one_line_exit_2(tmp_path: Path, capsys: Any) -> None:
    assert main(["inspect", "--kubeconfig", str(tmp_path / "missing")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "missing" in err


async def test_secrets_never_in_logs_or_errors(
    kmock: kmock.KubernetesEmulator, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    kmock.resources["v1/pods"] = kmocklib.ResourceInfo(namespaced=True)  # known, no pods yet
    kmock.resources["v1/nodes"] = kmocklib.ResourceInfo(namespaced=False)
    kmock["list", NODES][:2] << 401
    kc = write_kubeconfig(tmp_path / "kc", {"a": str(kmock.url)})
    messages: list[str] = []
    clients, secrets = await load_clients(kc)
    assert CANARY not in secrets.scrub(f"Bearer {CANARY}")
    sink = Sink()
    delays: list[float] = []

    async def sleep(delay: float) -> None:
        delays.append(delay)
        await asyncio.sleep(0)

    watcher = ClusterWatcher("a", clients["a"], sink, sleep=sleep)
    try:
        try:
            await watcher.list_once()
        except Exception as exc:
            messages.extend([str(exc), repr(exc)])
        task = asyncio.create_task(watcher.run())
        await sink.until(lambda: len(delays) >= 1 and watcher.connected)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    finally:
        await clients["a"].close()  # type: ignore[no-untyped-call]
    # A broken context: the library's own error must come out scrubbed.
    bad = json.loads(kc.read_text())
    bad["users"][0]["user"] = {"client-certificate-data": "x", "client-key-data": CANARY}
    bad["clusters"][0]["cluster"]["server"] = "https://127.0.0.1:9"
    kc.write_text(json.dumps(bad))
    try:
        await load_clients(kc, ["a"])
    except KubeconfigError as exc:
        messages.extend([str(exc), repr(exc)])
    ours = [r for r in caplog.records if not r.name.startswith("kmock")]
    text = "\n".join([r.getMessage() for r in ours] + messages)
    assert messages and ours
    assert CANARY not in text


def test_quantities_and_effective_requests() -> None:
    assert parse_quantity("500m") == Fraction(1, 2)
    assert parse_quantity("16Gi") == 16 * 2**30
    assert parse_quantity("1e3") == 1000
    assert parse_quantity("1.5k") == 1500
    assert parse_quantity(4) == 4
    with pytest.raises(ValueError):
        parse_quantity("12 apples")
    spec = {
        "containers": [
            {"resources": {"requests": {"cpu": "1", "memory": "1Gi"}}},
            {"resources": {"limits": {"nvidia.com/gpu": "2"}, "requests": {"cpu": "250m"}}},
        ],
        "initContainers": [
            {"resources": {"requests": {"cpu": "4"}}},
            {"restartPolicy": "Always", "resources": {"requests": {"memory": "512Mi"}}},
        ],
        "overhead": {"cpu": "100m"},
    }
    req = effective_requests(spec)
    assert req["cpu"] == Fraction(41, 10)  # max(1.25 sum, 4 init) + 0.1 overhead
    assert pod_resources(spec) == Resources(gpus=2, cpu_milli=4100, memory_mib=1536)


def test_translate_node_and_pod() -> None:
    obj = node_obj("n1", gpus=8, taints=[{"key": "k", "effect": "NoExecute"}])
    obj["metadata"]["labels"]["gpu-type"] = "H100"
    obj["status"]["allocatable"]["amd.com/gpu"] = "2"
    node = translate_node(obj, GpuConfig(type_label="gpu-type"))
    assert node.gpu_type == "H100" and node.allocatable.gpus == 10
    assert node.allocatable.memory_mib == 256 * 1024 and node.allocatable.cpu_milli == 64000
    assert node.taints[0].blocks and node.ready and node.schedulable
    assert isinstance(translate_pod("a", pod_obj("p", "n1")), PodBound)
    assert translate_pod("a", pod_obj("p", None)) == PodDeleted("a", "ml/p")
    assert translate_pod("a", pod_obj("p", "n1", phase="Failed")) == PodDeleted("a", "ml/p")


@pytest.mark.parametrize(
    ("annotations", "gpus"),
    [
        ({"fedbroker.io/pod": "t.j-w-0", "fedbroker.io/gpus": "2,3"}, (2, 3)),
        ({"fedbroker.io/pod": "t.j-w-0", "fedbroker.io/gpus": ""}, ()),
        ({"fedbroker.io/pod": "t.j-w-0"}, None),
        ({"fedbroker.io/pod": "t.j-w-0", "fedbroker.io/gpus": "x,1"}, None),
        ({"fedbroker.io/gpus": "2,3"}, None),  # not one of the broker's pods
        ({}, None),
    ],
)
def test_the_broker_pods_gpu_indexes_are_read_back(
    annotations: dict[str, str], gpus: tuple[int, ...] | None
) -> None:
    obj = pod_obj("p", "n1", gpus=2)
    obj["metadata"]["annotations"] = annotations
    event = translate_pod("a", obj)
    assert isinstance(event, PodBound) and event.gpus == gpus


def test_bench_runs() -> None:
    assert bench_ledger_updates(nodes=20, pods=2000) > 0


PLAN_GANG = """apiVersion: fedbroker.io/v1alpha1
kind: FederatedJob
metadata: {{name: {name}}}
spec:
  podSets:
  - name: worker
    count: {pods}
    resources: {{nvidia.com/gpu: {gpus}, cpu: "1", memory: 1Gi}}
"""


async def test_plan_names_cluster_and_nodes_and_creates_nothing(
    kmock: kmock.KubernetesEmulator, tmp_path: Path, capsys: Any
) -> None:
    kmock.objects[NODES, None, "n1"] = node_obj("n1", gpus=4)
    kmock.objects[NODES, None, "n2"] = node_obj("n2", gpus=4)
    kmock.objects[PODS, "ml", "p1"] = pod_obj("p1", "n1", gpus=3)
    kc = write_kubeconfig(tmp_path / "kc", {"live": str(kmock.url)})
    job = tmp_path / "job.yaml"
    job.write_text(PLAN_GANG.format(name="pair", pods=2, gpus=2))
    argv = ["plan", "-f", str(job), "--kubeconfig", str(kc), "--json", "--timeout", "2"]
    assert await asyncio.to_thread(main, argv) == 0
    doc = json.loads(capsys.readouterr().out)
    # n1 has 1 GPU free, n2 has 4: both 2-GPU pods fit only on n2, node by node.
    assert doc["fits"] is True and doc["cluster"] == "live"
    assert [p["node"] for p in doc["pods"]] == ["n2", "n2"]
    assert not [r for r in kmock if r.method.value != "GET"]  # a dry run: only reads


async def test_plan_says_per_cluster_why_not(
    kmock: kmock.KubernetesEmulator, tmp_path: Path, capsys: Any
) -> None:
    # 9 GPUs free in all (3 + 4 + 2), but only n2 has 4 on one node: 1 pod of the 2.
    kmock.objects[NODES, None, "n1"] = node_obj("n1", gpus=4)
    kmock.objects[NODES, None, "n2"] = node_obj("n2", gpus=4)
    kmock.objects[NODES, None, "n3"] = node_obj("n3", gpus=2)
    kmock.objects[PODS, "ml", "p1"] = pod_obj("p1", "n1", gpus=1)
    kc = write_kubeconfig(tmp_path / "kc", {"live": str(kmock.url)})
    job = tmp_path / "job.yaml"
    job.write_text(PLAN_GANG.format(name="big", pods=2, gpus=4))
    argv = ["plan", "-f", str(job), "--kubeconfig", str(kc), "--json", "--timeout", "2"]
    assert await asyncio.to_thread(main, argv) == 3  # read, and fits nowhere now
    doc = json.loads(capsys.readouterr().out)
    assert doc["fits"] is False
    (live,) = doc["clusters"]
    assert live["cluster"] == "live" and live["largestFit"] == 1
    assert live["reasons"] and "only 1 such pods" in live["reasons"][0]["message"]


def test_plan_bad_manifest_is_one_line_exit_2(tmp_path: Path, capsys: Any) -> None:
    job = tmp_path / "job.yaml"
    job.write_text("apiVersion: fedbroker.io/v1alpha1\nkind: FederatedJob\nmetadata: {}\n")
    kc = write_kubeconfig(tmp_path / "kc", {"live": "http://127.0.0.1:9"})
    assert main(["plan", "-f", str(job), "--kubeconfig", str(kc)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "job.yaml" in err and "metadata" in err


@pytest.mark.parametrize(
    "expired",
    [410, {"type": "ERROR", "object": {"kind": "Status", "code": 410, "reason": "Expired"}}],
    ids=["http-410", "error-event-410"],
)
async def test_scripted_410_relists_and_misses_no_change(
    kmock: kmock.KubernetesEmulator, tmp_path: Path, expired: Any
) -> None:
    """The first pods watch answers 410 Gone (as an HTTP status, or as an ERROR event in the
    stream). Between the list and that watch, p1 ended and p3 started; no watch event will
    ever tell, so only the relist the 410 forces can."""
    kmock.objects[NODES, None, "n1"] = node_obj("n1")
    kmock.objects[PODS, "ml", "p1"] = pod_obj("p1", "n1", gpus=2)
    kmock["watch", PODS][:1] << expired
    clients, _ = await load_clients(write_kubeconfig(tmp_path / "kc", {"a": str(kmock.url)}))
    sink = Sink()
    first = True

    def emit(events: list[CapacityEvent]) -> None:
        nonlocal first
        if first:  # after the first list, before any watch: changed behind the watch's back
            first = False
            kmock.objects[PODS, "ml", "p1"].delete()
            kmock.objects[PODS, "ml", "p3"] = pod_obj("p3", "n1", gpus=1)
        sink(events)

    watcher = ClusterWatcher("a", clients["a"], emit)
    task = asyncio.create_task(watcher.run())
    try:
        await sink.until(lambda: sink.used("n1") == 1)  # p1's 2 GPUs gone, p3's 1 taken
        assert watcher.lists == 2  # the 410 relisted instead of re-watching
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await clients["a"].close()  # type: ignore[no-untyped-call]


# -- delegate mode: a workload's pods keyed as the ledger keys them ---------------------------

OUR_LABELS = {"fedbroker.io/origin": "fedbroker", "fedbroker.io/tenant": "acme",
              "fedbroker.io/job": "train", "fedbroker.io/pod-set": "worker"}  # fmt: skip


def delegated(name: str, node: str | None, index: str | None, gpus: int = 8) -> dict[str, Any]:
    """A pod a delegated PyTorchJob's operator made from our template: our labels, its
    replica index, no annotation of ours (the template is every pod's)."""
    obj = pod_obj(name, node, gpus)
    labels = dict(OUR_LABELS)
    if index is not None:
        labels["training.kubeflow.org/replica-index"] = index
    obj["metadata"]["labels"] = labels
    return obj


@pytest.mark.parametrize(
    ("labels", "annotations", "key"),
    [
        # Alone, a delegated pod is its own name: no controller's labels are read (the
        # cluster's PodKeys gives it a free index of its pod set).
        ({}, {}, "ml/p"),
        ({"training.kubeflow.org/replica-index": None}, {}, "ml/p"),
        ({"fedbroker.io/origin": None}, {}, "ml/p"),  # not ours
        ({}, {"fedbroker.io/pod": "acme.train-worker-0"}, "acme.train-worker-0"),  # a slot
        ({"fedbroker.io/origin": None}, {"fedbroker.io/pod": "acme.train-worker-2"},
         "acme.train-worker-2"),
    ],
)  # fmt: skip
def test_a_pod_is_keyed_by_the_ledger_name_it_carries_else_its_own(
    labels: dict[str, str | None], annotations: dict[str, str], key: str
) -> None:
    obj = delegated("p", "n1", "1")
    for k, v in labels.items():
        if v is None:
            obj["metadata"]["labels"].pop(k, None)
        else:
            obj["metadata"]["labels"][k] = v
    obj["metadata"]["annotations"] = annotations
    event = translate_pod("a", obj)
    assert isinstance(event, PodBound) and event.pod == key
    assert translate_pod("a", obj, deleted=True) == PodDeleted("a", key)


async def test_pods_sharing_a_ledger_name_are_each_counted_and_each_freed(
    kmock: kmock.KubernetesEmulator, tmp_path: Path
) -> None:
    # A replacement made while its predecessor still runs carries the same controller
    # index; each takes its own free index of the pod set, and the GPUs of both count.
    kmock.objects[NODES, None, "n1"] = node_obj("n1", gpus=8)
    kmock.objects[PODS, "ml", "old"] = delegated("old", "n1", "0", gpus=2)
    kmock.objects[PODS, "ml", "new"] = delegated("new", "n1", "0", gpus=3)
    clients, _ = await load_clients(write_kubeconfig(tmp_path / "kc", {"a": str(kmock.url)}))
    sink = Sink()
    watcher = ClusterWatcher("a", clients["a"], sink)
    try:
        events = await watcher.list_once()
        sink(events)
        keys = sorted(e.pod for e in events if isinstance(e, PodBound))
        assert keys == ["acme.train-worker-0", "acme.train-worker-1"]
        assert sink.used("n1") == 5
        kmock.objects[PODS, "ml", "old"].delete()
        sink(await watcher.list_once())
        assert sink.used("n1") == 3  # the old one's GPUs only; the new one counted still
        kmock.objects[PODS, "ml", "new"].delete()
        sink(await watcher.list_once())
        assert sink.used("n1") == 0
    finally:
        await clients["a"].close()  # type: ignore[no-untyped-call]


async def test_a_delegated_pod_counted_by_the_watch_under_its_ledger_name(
    harness: Harness,
) -> None:
    """Through the watch: bound, then its replacement beside it, then each deleted."""
    km, sink = harness.km, harness.sink
    await sink.until(lambda: sink.used("n1") == 2)  # p1 of the fixture
    await watching(km)
    await km.post("/api/v1/namespaces/ml/pods", json=delegated("w0", "n1", "0", gpus=1))
    await sink.until(lambda: sink.used("n1") == 3)
    await km.post("/api/v1/namespaces/ml/pods", json=delegated("w0-again", "n1", "0", gpus=1))
    await sink.until(lambda: sink.used("n1") == 4)
    await km.request("DELETE", "/api/v1/namespaces/ml/pods/w0")
    await sink.until(lambda: sink.used("n1") == 3)
    # Changed: it now takes the name the first one left (counted once all along).
    await km.patch("/api/v1/namespaces/ml/pods/w0-again", json={"metadata": {"labels": {"x": "y"}}})
    await km.request("DELETE", "/api/v1/namespaces/ml/pods/w0-again")
    await sink.until(lambda: sink.used("n1") == 2)


async def test_pods_without_an_index_take_the_lowest_free_one_of_their_pod_set(
    kmock: kmock.KubernetesEmulator, tmp_path: Path
) -> None:
    """A RayCluster's workers carry no index: each takes the lowest index of its pod set no
    live pod holds, keeps it while it lives, and a replacement takes the one freed."""
    kmock.objects[NODES, None, "n1"] = node_obj("n1", gpus=8)
    for name in ("ray-gpu-worker-aaaaa", "ray-gpu-worker-bbbbb"):
        kmock.objects[PODS, "ml", name] = delegated(name, "n1", None, gpus=2)
    clients, _ = await load_clients(write_kubeconfig(tmp_path / "kc", {"a": str(kmock.url)}))
    watcher = ClusterWatcher("a", clients["a"], lambda _: None)

    try:
        first = [e.pod for e in await watcher.list_once() if isinstance(e, PodBound)]
        assert sorted(first) == ["acme.train-worker-0", "acme.train-worker-1"]
        held = dict(zip(("ray-gpu-worker-aaaaa", "ray-gpu-worker-bbbbb"), first, strict=True))
        kmock.objects[PODS, "ml", "ray-gpu-worker-aaaaa"].delete()
        kmock.objects[PODS, "ml", "ray-gpu-worker-ccccc"] = delegated(
            "ray-gpu-worker-ccccc", "n1", None, gpus=2
        )
        events = await watcher.list_once()
        assert PodDeleted("a", held["ray-gpu-worker-aaaaa"]) in events
        now = sorted(e.pod for e in events if isinstance(e, PodBound))
        assert now == ["acme.train-worker-0", "acme.train-worker-1"]  # b kept its own
        assert [e for e in events if isinstance(e, PodDeleted)] == [
            PodDeleted("a", held["ray-gpu-worker-aaaaa"])
        ]
    finally:
        await clients["a"].close()  # type: ignore[no-untyped-call]
