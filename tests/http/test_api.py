"""The HTTP API over a real Service: SQLite store, simulated clusters, zero launch delay.

The scheduler is driven with ``service.schedule_once(now)`` on a fake clock (no sleeps,
no background loop); launches run as tasks that finish on the next event-loop turns.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer
from builders import Clock

from adapters.simulated import SimulatedLauncher
from broker.config import Config, parse_config
from broker.http.app import make_app
from broker.service.facade import Service

TOKENS = {
    "team-a": "tok-a-00000000000000000000000000",
    "team-b": "tok-b-00000000000000000000000000",
    "admin": "tok-admin-0000000000000000000000",
}
A = {"Authorization": "Bearer tok-a-00000000000000000000000000"}
B = {"Authorization": "Bearer tok-b-00000000000000000000000000"}
ADMIN = {"Authorization": "Bearer tok-admin-0000000000000000000000"}

CONFIG = """
store: {{url: "sqlite:///{db}"}}
api: {{bodyLimitBytes: 4096}}
clusters:
- name: small-a
  labels: {{region: eu}}
  source:
    simulated: {{shapes: [{{gpuType: A100, gpus: 8, cpu: "96", memory: 1024Gi, count: 2}}]}}
- name: small-b
  labels: {{region: us}}
  source:
    simulated: {{shapes: [{{gpuType: T4, gpus: 2, cpu: "32", memory: 128Gi, count: 2}}]}}
queues:
- {{name: training, policy: gang}}
- {{name: inference, policy: binpack}}
tenants:
- {{name: team-a, defaultQueue: training, token: {{value: tok-a-00000000000000000000000000}}}}
- {{name: team-b, defaultQueue: inference, token: {{value: tok-b-00000000000000000000000000}}}}
- {{name: admin, defaultQueue: training, queues: [inference], admin: true,
   token: {{value: tok-admin-0000000000000000000000}}}}
"""


def manifest(name: str, pods: int = 1, gpus: int = 8, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "fedbroker.io/v1alpha1",
        "kind": "FederatedJob",
        "metadata": {"name": name},
        "spec": {
            **spec,
            "podSets": [
                {"name": "worker", "count": pods,
                 "resources": {"nvidia.com/gpu": gpus, "cpu": "8", "memory": "32Gi"}}
            ],
        },
    }  # fmt: skip


Harness = tuple[TestClient[Any, Any], Service, Clock]
Factory = Callable[..., Any]


def make_config(tmp_path: Path) -> Config:
    return parse_config(CONFIG.format(db=tmp_path / "jobs.db"), "test config")


async def settle(service: Service) -> None:
    """Let the launch tasks (zero delay) run to their end."""
    await service.launches_done(timeout=10)


@pytest.fixture
async def harness(tmp_path: Path) -> AsyncIterator[Harness]:
    async with running(tmp_path) as h:
        yield h


class running:
    """A started Service with its API on a test server; closed on exit."""

    def __init__(self, tmp_path: Path, launcher: SimulatedLauncher | None = None) -> None:
        self.config = make_config(tmp_path)
        self.clock = Clock()
        self.service = Service(self.config, launcher=launcher, clock=self.clock)
        self.client: TestClient[Any, Any] | None = None

    async def __aenter__(self) -> Harness:
        await self.service.start()
        self.client = TestClient(TestServer(make_app(self.service, self.config)))
        await self.client.start_server()
        return self.client, self.service, self.clock

    async def __aexit__(self, *exc: object) -> None:
        assert self.client is not None
        await self.client.close()
        await self.service.close()


async def submit(
    client: TestClient[Any, Any], body: dict[str, Any], headers: dict[str, str]
) -> Any:
    return await client.post("/v1/jobs", json=body, headers=headers)


def free_gpus(service: Service, cluster: str, gpu_type: str) -> float:
    for c in service.clusters():
        if c["cluster"] == cluster:
            for row in c["gpuTypes"]:
                if row["gpuType"] == gpu_type:
                    return float(row["free"])
    raise AssertionError(f"no {gpu_type} in {cluster}")


async def test_submit_is_placed_and_runs(harness: Harness) -> None:
    client, service, clock = harness
    resp = await submit(client, manifest("train", pods=2), A)
    assert resp.status == 201
    body = await resp.json()
    assert body["status"]["state"] == "Queued"
    assert body["metadata"] == {"name": "train", "namespace": "team-a"}
    await service.schedule_once(clock.now)
    await settle(service)
    resp = await client.get("/v1/jobs/train", headers=A)
    body = await resp.json()
    assert resp.status == 200
    assert body["status"]["state"] == "Running"
    assert body["status"]["cluster"] == "small-a"
    states = [h["state"] for h in body["status"]["history"]]
    assert states == ["Queued", "Placed", "Running"]
    assert free_gpus(service, "small-a", "A100") == 0


async def test_yaml_body_and_idempotent_resubmit(harness: Harness) -> None:
    client, _, _ = harness
    text = (
        "apiVersion: fedbroker.io/v1alpha1\nkind: FederatedJob\nmetadata: {name: y}\n"
        "spec:\n  podSets:\n  - {name: w, count: 1, resources: {nvidia.com/gpu: 1}}\n"
    )
    yaml_headers = {**A, "Content-Type": "application/yaml"}
    first = await client.post("/v1/jobs", data=text, headers=yaml_headers)
    assert first.status == 201
    again = await client.post("/v1/jobs", data=text, headers=yaml_headers)
    assert again.status == 200
    assert (await again.json())["metadata"]["name"] == "y"
    listed = await (await client.get("/v1/jobs", headers=A)).json()
    assert [j["metadata"]["name"] for j in listed["items"]] == ["y"]


async def test_tenant_isolation(harness: Harness) -> None:
    client, _, _ = harness
    assert (await submit(client, manifest("secret", pods=4), A)).status == 201
    for method, path in [
        ("GET", "/v1/jobs/secret"),
        ("GET", "/v1/jobs/secret/explain"),
        ("DELETE", "/v1/jobs/secret"),
    ]:
        resp = await client.request(method, path, headers=B)
        assert resp.status == 404, (method, path)
        assert "error" in await resp.json()
    listed = await (await client.get("/v1/jobs", headers=B)).json()
    assert listed["items"] == []
    # Still there, untouched, for its owner; and the admin sees it.
    assert (await (await client.get("/v1/jobs/secret", headers=A)).json())["status"][
        "state"
    ] == "Queued"
    everything = await (await client.get("/v1/jobs", headers=ADMIN)).json()
    assert [j["metadata"]["namespace"] for j in everything["items"]] == ["team-a"]


async def test_namespace_and_queue_must_be_the_tenants(harness: Harness) -> None:
    client, _, _ = harness
    body = manifest("x")
    body["metadata"]["namespace"] = "team-b"
    resp = await submit(client, body, A)
    assert resp.status == 403
    assert "metadata.namespace" in (await resp.json())["error"]
    resp = await submit(client, manifest("x", queue="inference"), A)
    assert resp.status == 403
    assert "spec.queue" in (await resp.json())["error"]


@pytest.mark.parametrize(
    ("mutate", "path"),
    [
        (lambda m: m["spec"]["podSets"][0].update(count=0), "spec.podSets[0].count"),
        (lambda m: m["spec"]["podSets"][0].update(count="2"), "spec.podSets[0].count"),
        (lambda m: m["metadata"].update(name="Bad_Name"), "metadata.name"),
        (lambda m: m["spec"].update(bogus=1), "spec.bogus"),
    ],
)
async def test_bad_manifest_is_400_with_field_path(
    harness: Harness, mutate: Callable[[dict[str, Any]], None], path: str
) -> None:
    client, _, _ = harness
    body = manifest("bad")
    mutate(body)
    resp = await submit(client, body, A)
    assert resp.status == 400
    assert path in (await resp.json())["error"]
    listed = await (await client.get("/v1/jobs", headers=A)).json()
    assert listed["items"] == []


async def test_garbage_bodies_are_400(harness: Harness) -> None:
    client, _, _ = harness
    for data in [b"", b"{not json", b"\xff\xfe", b"- a list"]:
        resp = await client.post(
            "/v1/jobs", data=data, headers={**A, "Content-Type": "application/json"}
        )
        assert resp.status == 400, data
        assert (await resp.json())["error"]


async def test_bad_list_params_are_400(harness: Harness) -> None:
    client, _, _ = harness
    for query in ["limit=0", "limit=x", "state=Sleeping", "continue=-1"]:
        resp = await client.get(f"/v1/jobs?{query}", headers=A)
        assert resp.status == 400, query
        assert (await resp.json())["error"]
    bounded = {
        "name=" + "*a" * 3800: "name: at most 128 characters (got 7600)",
        "selector=" + ",".join(["x"] * 33): "selector: at most 32 requirements (got 33)",
    }
    for query, message in bounded.items():
        resp = await client.get(f"/v1/jobs?{query}", headers=A)
        assert resp.status == 400 and (await resp.json())["error"] == message


async def test_401_without_or_with_bad_token(harness: Harness) -> None:
    client, _, _ = harness
    for headers in [{}, {"Authorization": "Bearer nope"}, {"Authorization": TOKENS["team-a"]}]:
        resp = await client.get("/v1/jobs", headers=headers)
        assert resp.status == 401
        assert (await resp.json())["error"]
        resp = await submit(client, manifest("x"), headers)
        assert resp.status == 401


async def test_413_answers_json(harness: Harness) -> None:
    client, _, _ = harness
    body = manifest("big")
    body["spec"]["podSets"][0]["template"] = {"pad": "x" * 8192}
    resp = await client.post("/v1/jobs", data=json.dumps(body), headers=A)
    assert resp.status == 413
    assert "limit" in (await resp.json())["error"]


async def test_explain_too_big_gang_names_each_cluster(harness: Harness) -> None:
    client, service, clock = harness
    assert (await submit(client, manifest("huge", pods=4), A)).status == 201
    await service.schedule_once(clock.now)
    resp = await client.get("/v1/jobs/huge/explain", headers=A)
    assert resp.status == 200
    body = await resp.json()
    assert body["state"] == "Queued"
    by_cluster = {c["cluster"]: c for c in body["clusters"]}
    assert set(by_cluster) == {"small-a", "small-b"}
    assert not any(c["fits"] for c in by_cluster.values())
    assert all(c["reasons"] and c["reasons"][0]["message"] for c in by_cluster.values())
    assert by_cluster["small-a"]["largestFit"] == 2
    assert by_cluster["small-b"]["largestFit"] == 0
    # plan agrees with the scheduler: a 2-pod gang goes to small-a.
    plan = await (await client.post("/v1/plan", json=manifest("p", pods=2), headers=A)).json()
    assert plan["fits"] and plan["cluster"] == "small-a"
    assert (await submit(client, manifest("p", pods=2), A)).status == 201
    await service.schedule_once(clock.now)
    got = await (await client.get("/v1/jobs/p", headers=A)).json()
    assert got["status"]["cluster"] == plan["cluster"]


async def test_plan_stores_nothing(harness: Harness) -> None:
    client, service, _ = harness
    resp = await client.post("/v1/plan", json=manifest("dry", pods=1), headers=A)
    assert resp.status == 200
    assert (await client.get("/v1/jobs/dry", headers=A)).status == 404
    assert free_gpus(service, "small-a", "A100") == 16


async def test_cancel_releases_capacity(harness: Harness) -> None:
    client, service, clock = harness
    assert (await submit(client, manifest("c", pods=2), A)).status == 201
    await service.schedule_once(clock.now)
    await settle(service)
    assert free_gpus(service, "small-a", "A100") == 0
    resp = await client.delete("/v1/jobs/c", headers=A)
    assert resp.status == 200
    assert (await resp.json())["status"]["state"] == "Cancelled"
    assert free_gpus(service, "small-a", "A100") == 16
    again = await client.delete("/v1/jobs/c", headers=A)
    assert (await again.json())["status"]["state"] == "Cancelled"


async def test_gang_timeout_rolls_back_and_requeues(tmp_path: Path) -> None:
    launcher = SimulatedLauncher(never_start={"stuck"})
    async with running(tmp_path, launcher) as (client, service, clock):
        body = manifest("stuck", pods=2, gang={"scheduleTimeoutSeconds": 30})
        assert (await submit(client, body, A)).status == 201
        await service.schedule_once(clock.now)
        await service.launches_done(timeout=0.05)  # it never finishes
        got = await (await client.get("/v1/jobs/stuck", headers=A)).json()
        assert got["status"]["state"] == "Placed"
        clock.now += 31
        await service.schedule_once(clock.now)
        got = await (await client.get("/v1/jobs/stuck", headers=A)).json()
        assert got["status"]["state"] == "Queued"
        assert "did not start within 30s" in got["status"]["reason"]
        assert got["status"]["notBefore"] == clock.now + 60
        assert got["status"]["attempts"] == 1
        assert list(launcher.deleted) == ["team-a/stuck"]
        assert free_gpus(service, "small-a", "A100") == 16


async def test_restart_keeps_every_job(tmp_path: Path) -> None:
    async with running(tmp_path) as (client, service, clock):
        for name in ("r1", "r2"):
            assert (await submit(client, manifest(name, pods=1), A)).status == 201
        assert (await submit(client, manifest("r3", pods=9), A)).status == 201
        await service.schedule_once(clock.now)
        await settle(service)
        await client.delete("/v1/jobs/r2", headers=A)
    async with running(tmp_path) as (client, service, clock):
        assert (await client.get("/readyz")).status == 200
        listed = await (await client.get("/v1/jobs", headers=A)).json()
        states = {j["metadata"]["name"]: j["status"]["state"] for j in listed["items"]}
        # r1 ran, but its simulated pods died with the old process: it is queued again.
        assert states == {"r1": "Queued", "r2": "Cancelled", "r3": "Queued"}
        await service.schedule_once(clock.now)
        await settle(service)
        got = await (await client.get("/v1/jobs/r1", headers=A)).json()
        assert got["status"]["state"] == "Running"


async def test_readyz_waits_for_rebuild(tmp_path: Path) -> None:
    config = make_config(tmp_path)
    service = Service(config)
    client = TestClient(TestServer(make_app(service, config)))
    await client.start_server()
    try:
        assert (await client.get("/readyz")).status == 503
        assert (await client.get("/healthz")).status == 200
        await service.start()
        assert (await client.get("/readyz")).status == 200
    finally:
        await client.close()
        await service.close()


async def test_pagination_and_filters(harness: Harness) -> None:
    client, service, clock = harness
    for i in range(5):
        assert (await submit(client, manifest(f"j{i}", pods=1, gpus=1), A)).status == 201
    await service.schedule_once(clock.now)
    await settle(service)
    names: list[str] = []
    cursor = None
    while True:
        query = "limit=2" + (f"&continue={cursor}" if cursor else "")
        page = await (await client.get(f"/v1/jobs?{query}", headers=A)).json()
        names += [j["metadata"]["name"] for j in page["items"]]
        cursor = page["continue"]
        if cursor is None:
            break
    assert names == [f"j{i}" for i in range(5)]
    running_jobs = await (await client.get("/v1/jobs?state=Running", headers=A)).json()
    assert len(running_jobs["items"]) == 5
    where = {j["metadata"]["name"]: j["status"]["cluster"] for j in running_jobs["items"]}
    for cluster in ("small-a", "small-b"):
        page = await (await client.get(f"/v1/jobs?cluster={cluster}", headers=A)).json()
        expected = sorted(n for n, c in where.items() if c == cluster)
        assert sorted(j["metadata"]["name"] for j in page["items"]) == expected
    assert (await (await client.get("/v1/jobs?queue=inference", headers=A)).json())["items"] == []


async def test_clusters_and_queues(harness: Harness) -> None:
    client, _, _ = harness
    clusters = (await (await client.get("/v1/clusters", headers=A)).json())["clusters"]
    a = next(c for c in clusters if c["cluster"] == "small-a")
    assert a["gpuTypes"][0] == {
        "gpuType": "A100", "total": 16, "free": 16.0, "reserved": 0.0, "allocated": 0.0,
        "largestGang": 2, "gangGpusPerPod": 8, "stranded": 0.0,
    }  # fmt: skip
    queues = (await (await client.get("/v1/queues", headers=B)).json())["queues"]
    assert {q["name"] for q in queues} == {"training", "inference"}
    assert (await client.get("/v1/nowhere", headers=A)).status == 404


async def test_launch_failure_requeues_with_reason(tmp_path: Path) -> None:
    launcher = SimulatedLauncher(failure_rate=1.0, seed=1)
    async with running(tmp_path, launcher) as (client, service, clock):
        assert (await submit(client, manifest("flaky", pods=1), A)).status == 201
        await service.schedule_once(clock.now)
        await settle(service)
        got = await (await client.get("/v1/jobs/flaky", headers=A)).json()
        assert got["status"]["state"] == "Queued"
        assert got["status"]["reason"].startswith("launch failed: simulated launch failure")
        assert [h["state"] for h in got["status"]["history"]] == ["Queued", "Placed", "Queued"]
        assert free_gpus(service, "small-a", "A100") == 16
        # Backoff: not retried before notBefore.
        await service.schedule_once(clock.now + 59)
        got = await (await client.get("/v1/jobs/flaky", headers=A)).json()
        assert got["status"]["state"] == "Queued"


async def test_same_name_in_two_tenants(harness: Harness) -> None:
    client, service, clock = harness
    assert (await submit(client, manifest("same", pods=1), A)).status == 201
    # Same cluster as A's job, so the pod names would meet in the ledger.
    body = manifest("same", pods=1, gpus=1, placement={"gpuTypes": ["A100"]})
    assert (await submit(client, body, B)).status == 201
    await service.schedule_once(clock.now)
    await settle(service)
    for headers in (A, B):
        got = await (await client.get("/v1/jobs/same", headers=headers)).json()
        assert got["status"]["state"] == "Running"
        assert got["status"]["cluster"] == "small-a"


async def test_close_cancels_the_loop_and_launches(tmp_path: Path) -> None:
    launcher = SimulatedLauncher(never_start={"hang"})
    runner = running(tmp_path, launcher)
    client, service, clock = await runner.__aenter__()
    service.spawn_loop()
    assert (await submit(client, manifest("hang", pods=1), A)).status == 201
    await service.schedule_once(clock.now)
    assert service.lifecycle.get("team-a/hang") is not None
    await runner.__aexit__(None, None, None)
    assert not service.ready


PREEMPT_CONFIG = """
store: {{url: "sqlite:///{db}"}}
clusters:
- name: only
  source:
    simulated: {{shapes: [{{gpuType: A100, gpus: 8, cpu: "96", memory: 1024Gi, count: 1}}]}}
queues:
- {{name: research, policy: binpack, reclaimable: true}}
- {{name: urgent, policy: gang, priority: 10}}
tenants:
- {{name: team-a, defaultQueue: research, queues: [research, urgent],
   token: {{value: tok-a-00000000000000000000000000}}}}
"""


async def test_a_higher_priority_job_preempts_a_whole_reclaimable_job(tmp_path: Path) -> None:
    config = parse_config(PREEMPT_CONFIG.format(db=tmp_path / "jobs.db"), "test config")
    clock = Clock()
    service = Service(config, clock=clock)
    await service.start()
    client = TestClient(TestServer(make_app(service, config)))
    await client.start_server()
    try:
        low = manifest("low", pods=2, gpus=4)
        assert (await submit(client, low, A)).status == 201
        await service.schedule_once(clock.now)
        await settle(service)
        vip = manifest("vip", pods=1, gpus=8, queue="urgent", priority=100)
        assert (await submit(client, vip, A)).status == 201
        clock.now += 5
        await service.schedule_once(clock.now)
        await settle(service)
        low_job = await (await client.get("/v1/jobs/low", headers=A)).json()
        vip_job = await (await client.get("/v1/jobs/vip", headers=A)).json()
        assert low_job["status"]["state"] == "Queued"
        assert "preempted by team-a/vip" in low_job["status"]["reason"]
        assert [h["state"] for h in low_job["status"]["history"]][-2:] == ["Running", "Queued"]
        assert vip_job["status"]["state"] == "Running"
        assert free_gpus(service, "only", "A100") == 0  # the whole gang went, vip holds all 8
    finally:
        await client.close()
        await service.close()
