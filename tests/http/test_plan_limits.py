"""One tenant cannot slow the others with dry runs (issue 33, acceptance 4): four concurrent
maximum-size ``POST /v1/plan`` from a read-only token are bounded (two admitted, two
refused with 429 and Retry-After), and another tenant's reads are answered while the
admitted ones are in flight; a plan over its time budget is a 429 too, explain's dry run
counts against the caller's tenant, and a plan larger than ``api.plans.maxPods`` is a 400.

"In flight" is made certain with the budget's injected clock: the worker thread calls it
for every pod the policy places, and the test's clock holds the worker there, in the
middle of the first plan's decision, until the test lets it go. Were the plan computed on
the event loop, the held clock would hold the loop too and the other tenant's reads would
not be answered before the plans (the ordering asserted below)."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp import ClientResponse
from aiohttp.test_utils import TestClient, TestServer

from broker.bench.plans import plan_body
from broker.config import parse_config
from broker.http.app import make_app
from broker.service.facade import Service

READ_ONLY = "plans-read-only-token-0123456789abcdef"
OTHER = "other-tenant-token-0123456789abcdef012"
ADMIN = "admin-tenant-token-0123456789abcdef012"
RO = {"Authorization": f"Bearer {READ_ONLY}", "Content-Type": "application/json"}
B = {"Authorization": f"Bearer {OTHER}"}
OPS = {"Authorization": f"Bearer {ADMIN}"}
CONFIG = f"""
store: {{url: "sqlite:///{{db}}"}}
api: {{plans: {{budgetSeconds: 5, perTenant: 2, maxWaiting: 4, maxPods: {{max_pods}}}}}}
clusters:
- name: one
  source:
    simulated: {{shapes: [{{gpuType: A100, gpus: 8, cpu: "96", memory: 1024Gi, count: 40}}]}}
queues: [{{name: training, policy: binpack}}]
tenants:
- {{name: planners, defaultQueue: training,
   tokens: [{{name: ro, value: {READ_ONLY}, roles: [read]}}]}}
- {{name: team-b, defaultQueue: training, token: {{value: {OTHER}}}}}
- {{name: ops, defaultQueue: training, admin: true, token: {{value: {ADMIN}}}}}
"""
# A bound so a broken test fails instead of hanging; nothing waits this long when it works.
GATE_SECONDS = 30.0

Client = TestClient[Any, Any]


class HoldingClock:
    """The budgets' clock (never moving) that, on its ``hold_at``-th call, says so and
    waits for ``go``: the worker is then in the middle of a policy's decision."""

    def __init__(self, hold_at: int = 50) -> None:
        self.calls = 0
        self.hold_at = hold_at
        self.holding = threading.Event()
        self.go = threading.Event()

    def __call__(self) -> float:
        self.calls += 1
        if self.calls == self.hold_at:
            self.holding.set()
            assert self.go.wait(GATE_SECONDS)
        return 0.0

    async def held(self) -> None:
        assert await asyncio.to_thread(self.holding.wait, GATE_SECONDS)


class Stepping:
    """A budget clock that moves a tenth of a second on every call: fifty checks fit in
    the budget of 5 s."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self) -> float:
        self.calls += 1
        return self.calls / 10


async def started(
    tmp_path: Path, clock: Callable[[], float], max_pods: int = 4096
) -> tuple[Client, Service]:
    text = CONFIG.replace("{db}", str(tmp_path / "jobs.db")).replace("{max_pods}", str(max_pods))
    config = parse_config(text, "test config")
    service = Service(config, plan_clock=clock)
    await service.start()
    client: Client = TestClient(TestServer(make_app(service, config)))
    await client.start_server()
    return client, service


@pytest.fixture
async def holding(tmp_path: Path) -> AsyncIterator[tuple[Client, Service, HoldingClock]]:
    clock = HoldingClock()
    client, service = await started(tmp_path, clock)
    try:
        yield client, service, clock
    finally:
        clock.go.set()
        await client.close()
        await service.close()


async def _status(answer: asyncio.Task[ClientResponse]) -> tuple[int, dict[str, Any], str | None]:
    resp = await answer
    return resp.status, await resp.json(), resp.headers.get("Retry-After")


async def test_four_maximum_plans_are_bounded_and_another_tenant_is_answered(
    holding: tuple[Client, Service, HoldingClock],
) -> None:
    client, service, clock = holding
    body = plan_body()  # four pod sets of 1,024 one-GPU pods: it fits nowhere
    plans = [asyncio.create_task(client.post("/v1/plan", data=body, headers=RO)) for _ in range(4)]
    await clock.held()  # the first admitted plan is mid-decision in the worker
    refused: list[asyncio.Task[ClientResponse]] = []
    while len(refused) < 2:
        done, _ = await asyncio.wait([p for p in plans if p not in refused],
                                     return_when=asyncio.FIRST_COMPLETED)  # fmt: skip
        refused.extend(done)
    admitted = [p for p in plans if p not in refused]
    for task in refused:
        status, doc, retry_after = await _status(task)
        assert status == 429 and retry_after == "1", doc
        assert doc["error"] == (
            "plan: tenant 'planners' has 2 dry runs (plan, explain) under way, its limit "
            "(api.plans.perTenant); retry after 1 s"
        )
    assert service.planner.admitted == 2

    # Another tenant's reads, answered while both admitted plans are in flight.
    for path in ("/v1/clusters", "/v1/queues", "/v1/jobs", "/v1/pools"):
        resp = await client.get(path, headers=B)
        assert resp.status == 200, path
    assert not any(p.done() for p in admitted)

    clock.go.set()
    for task in admitted:
        status, doc, _ = await _status(task)
        assert status == 200, doc
        # 320 free GPUs: each pod set alone could have them all (explain's estimate)
        assert doc["fits"] is False and doc["clusters"][0]["largestFit"] == 4 * 320
    assert service.planner.admitted == 0


async def test_a_plan_over_its_budget_is_429_and_frees_its_slot(tmp_path: Path) -> None:
    client, service = await started(tmp_path, Stepping())
    try:
        resp = await client.post("/v1/plan", data=plan_body(), headers=RO)
        assert resp.status == 429
        assert resp.headers["Retry-After"] == "5"
        assert (await resp.json())["error"] == (
            "plan: stopped after its budget of 5 s (api.plans.budgetSeconds); narrow the job "
            "(fewer pods, placement.gpuTypes or clusterSelector) or retry later"
        )
        assert service.planner.admitted == 0
        small = json.loads(plan_body())
        small["spec"]["podSets"] = [{"name": "w", "count": 1, "resources": {"nvidia.com/gpu": 1}}]
        resp = await client.post("/v1/plan", json=small, headers=RO)
        assert resp.status == 200, await resp.text()  # a few checks: within the budget
        assert (await resp.json())["fits"] is True
    finally:
        await client.close()
        await service.close()


async def test_explains_dry_run_counts_against_the_callers_tenant(
    holding: tuple[Client, Service, HoldingClock],
) -> None:
    client, service, clock = holding
    job = json.loads(plan_body())
    job["metadata"]["name"] = "waits"
    assert (await client.post("/v1/jobs", json=job, headers=B)).status == 201
    mine = [asyncio.create_task(client.post("/v1/plan", data=plan_body(), headers={
        **OPS, "Content-Type": "application/json"})) for _ in range(2)]  # fmt: skip
    await clock.held()
    # The admin's two slots are taken: its explain of team-b's job is refused ...
    resp = await client.get("/v1/jobs/waits/explain?tenant=team-b", headers=OPS)
    assert resp.status == 429
    assert "tenant 'ops' has 2 dry runs" in (await resp.json())["error"]
    # ... while team-b's own explain is admitted, and answered once the worker is free.
    theirs = asyncio.create_task(client.get("/v1/jobs/waits/explain", headers=B))
    clock.go.set()
    for task in mine:
        assert (await task).status == 200
    resp = await theirs
    assert resp.status == 200
    doc = await resp.json()
    assert doc["clusters"][0]["cluster"] == "one" and doc["position"] is not None
    assert service.planner.admitted == 0


async def test_a_plan_larger_than_max_pods_is_400_and_runs_nothing(tmp_path: Path) -> None:
    clock = Stepping()
    client, service = await started(tmp_path, clock, max_pods=1024)
    try:
        resp = await client.post("/v1/plan", data=plan_body(), headers=RO)
        assert resp.status == 400
        assert (await resp.json())["error"] == (
            "spec: 4096 pods, more than a dry run may ask (1024, api.plans.maxPods)"
        )
        assert clock.calls == 0  # no budget was started: nothing ran
    finally:
        await client.close()
        await service.close()
