"""Explain says what happens next, through the live service, the API and the CLI's table
(issue 16, acceptance 5): a gang of A100s (none on-prem) that may burst is told its place in
the queue and the pool that will be grown for it, by how many nodes, how long they take to
come up and what they cost, and when it may burst; then the controller does just that. One
that may not burst is told why."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer
from builders import Clock
from test_burst_service import BURST_AFTER, PROVISION, TOKEN_A, cycle, gang, make_config

from broker.cli.render import render
from broker.core.burst_option import NOT_ALLOWED, BurstOption, PoolRefusal
from broker.http.app import make_app
from broker.service.explain import with_unavailable
from broker.service.facade import Service
from broker.service.pool_reading import Availability

A = {"Authorization": f"Bearer {TOKEN_A}"}


async def explain(client: TestClient[Any, Any], name: str) -> dict[str, Any]:
    resp = await client.get(f"/v1/jobs/{name}/explain", headers=A)
    assert resp.status == 200
    doc: dict[str, Any] = await resp.json()
    return doc


async def test_a_gang_that_may_burst_is_told_pool_nodes_provisioning_cost_and_when(
    tmp_path: Path,
) -> None:
    clock = Clock(1_000.0)
    config = make_config(tmp_path)
    service = Service(config, clock=clock)
    await service.start()
    client = TestClient(TestServer(make_app(service, config)))
    await client.start_server()
    try:
        await service.submit("team-a", gang("big", pods=3))
        await service.submit("team-a", gang("next", pods=2))
        await cycle(service, clock)  # both wait: the controller counts from this cycle
        since = clock.now
        doc = await explain(client, "big")
        assert [c["fits"] for c in doc["clusters"]] == [False, False]  # nowhere on-prem
        assert doc["position"] == {
            "queue": "training", "position": 1, "waiting": 2, "inQueue": 1,
            "queueWaiting": 2, "sameGpuTypeAhead": 0, "backoffUntil": None,
        }  # fmt: skip
        burst = doc["burst"]
        assert {k: burst[k] for k in ("status", "pool", "cluster", "nodes", "newNodes")} == {
            "status": "planned", "pool": "a100", "cluster": "cloud", "nodes": 3, "newNodes": 3,
        }  # fmt: skip
        assert (burst["provisionSeconds"], burst["costPerNodeHour"]) == (PROVISION, 32.77)
        assert burst["costPerHour"] == pytest.approx(3 * 32.77)
        assert (burst["waitingSince"], burst["eligibleAt"]) == (since, since + BURST_AFTER)
        text = render("explain", doc)
        assert "QUEUE  1st of 2 waiting (1st of 2 in queue training)" in text
        assert "BURST  pool a100 (cluster cloud) grows by +3 nodes, up ~2m after" in text
        assert "$98.31/h ($32.77/node-h)" in text and "burstAfterSeconds 30" in text
        behind = await explain(client, "next")
        assert (behind["position"]["position"], behind["position"]["sameGpuTypeAhead"]) == (2, 1)

        while clock.now < since + BURST_AFTER:  # the controller grows that pool by that much
            await cycle(service, clock)
        [pool] = service.pools.rows()
        assert (pool.pool, pool.scale_ups, pool.replicas) == ("a100", 2, 5)  # and 2 for next
        requested = (await explain(client, "big"))["burst"]
        assert (requested["status"], requested["pool"], requested["nodes"]) == (
            "requested", "a100", 3,
        )  # fmt: skip
        assert "3 nodes requested from pool a100 (cluster cloud), 0 up" in render(
            "explain", await explain(client, "big")
        )
    finally:
        await client.close()
        await service.close()


async def test_a_gang_that_may_not_burst_is_told_why(tmp_path: Path) -> None:
    clock = Clock(1_000.0)
    config = make_config(tmp_path)
    service = Service(config, clock=clock)
    await service.start()
    client = TestClient(TestServer(make_app(service, config)))
    await client.start_server()
    try:
        await service.submit("team-a", gang("local", allow_burst=False))
        await cycle(service, clock)
        doc = await explain(client, "local")
        assert doc["burst"]["status"] == "none" and doc["burst"]["pool"] is None
        assert [(r["pool"], r["code"]) for r in doc["burst"]["refusals"]] == [("", "not-allowed")]
        text = render("explain", doc)
        assert "BURST  no pool can take it:" in text and "allowBurst" in text
        assert "[not-allowed]" in text
    finally:
        await client.close()
        await service.close()


async def test_a_job_not_waiting_has_nothing_next(tmp_path: Path) -> None:
    clock = Clock(1_000.0)
    config = make_config(tmp_path)
    service = Service(config, clock=clock)
    await service.start()
    try:
        await service.submit("team-a", gang("gone"))
        await service.cancel("team-a", "gone")
        doc = await service.explain("team-a", "gone")
        assert (doc["position"], doc["burst"], doc["clusters"]) == (None, None, [])
        assert "QUEUE" not in render("explain", doc) and "BURST" not in render("explain", doc)
    finally:
        await service.close()


DOWN = Availability("b-pool", False, "HTTP 503", 900.0, 2, 1_020.0)
PLANNED = BurstOption("planned", "a100", "cloud", 3, 3)
NO_POOLS = BurstOption("none", refusals=(PoolRefusal("", "no-pools", "no burst pools"),))
FULL = BurstOption("none", refusals=(PoolRefusal("a100", "maximum", "at its maxNodes"),))
UNREAD = PoolRefusal(
    "b-pool", "unavailable", "the pool cannot be read on its management cluster (HTTP 503); "
    "it is read again with backoff and takes part once it can be", 1_020.0,
)  # fmt: skip


@pytest.mark.parametrize(
    ("option", "unavailable", "refusals"),
    [
        (NO_POOLS, [DOWN], (UNREAD,)),  # there are pools: one not read yet
        (FULL, [DOWN], (*FULL.refusals, UNREAD)),
        (PLANNED, [DOWN], (UNREAD,)),  # it may be cheaper once it can be read
        (BurstOption("requested", "a100", "cloud", 3, 3), [DOWN], ()),  # nodes coming
        (BurstOption("none", refusals=(NOT_ALLOWED,)), [DOWN], (NOT_ALLOWED,)),
        (FULL, [], FULL.refusals),
    ],
    ids=["no pool read yet", "others refuse", "planned", "requested", "may not burst", "all read"],
)
def test_a_pool_not_read_yet_is_named_in_the_burst_option(
    option: BurstOption, unavailable: list[Availability], refusals: tuple[PoolRefusal, ...]
) -> None:
    told = with_unavailable(option, unavailable)
    assert told.refusals == refusals
    assert (told.status, told.pool, told.nodes) == (option.status, option.pool, option.nodes)
