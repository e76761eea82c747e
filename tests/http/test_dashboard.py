"""The live dashboard (``/``) and ``GET /v1/nodes``.

``/v1/nodes`` is checked in-process against the ledger (aiohttp TestClient over a Service,
as tests/http/test_api.py). The page is checked end to end: ``fedbroker demo`` (with its
workload) in a subprocess, the page in headless Chromium through Playwright. Chromium is
Debian's (``/usr/bin/chromium``, or FEDBROKER_CHROMIUM); without it the browser test skips,
or fails under FEDBROKER_REQUIRE_SERVICES=1. FEDBROKER_SCREENSHOT=docs/dashboard.png also
writes the screenshot there (for docs/observability.md).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Page, expect, sync_playwright
from test_api import ADMIN, A, B, manifest, running, settle, submit
from test_runtime import ROOT, TOKENS, Demo, http_get

from adapters.simulated import SimulatedLauncher
from broker.core.burst import POOL_LABEL
from broker.model import MILLI_PER_GPU, GpuType, Node, NodeUpdated, Resources

WAIT_MS = 15_000  # for the page: well below the page's 30 s fallback refresh
BURST_WAIT_MS = 150_000


# --- /v1/nodes against a Service ---------------------------------------------------------


async def test_nodes_needs_a_token(tmp_path: Path) -> None:
    async with running(tmp_path) as (client, _, _):
        resp = await client.get("/v1/nodes")
        assert resp.status == 401
        assert resp.headers["WWW-Authenticate"] == "Bearer"
        assert "Authorization" in (await resp.json())["error"]
        resp = await client.get("/v1/nodes", headers={"Authorization": "Bearer nope"})
        assert resp.status == 401


class Gate:
    """A launcher's sleep that lasts until ``open()``: a placement stays reserved."""

    def __init__(self) -> None:
        self.event = asyncio.Event()

    async def sleep(self, seconds: float) -> None:
        await self.event.wait()

    def open(self) -> None:
        self.event.set()


async def test_nodes_match_the_ledger_and_name_only_own_jobs(tmp_path: Path) -> None:
    gate = Gate()
    launcher = SimulatedLauncher(launch_delay_seconds=1.0, sleep=gate.sleep)
    async with running(tmp_path, launcher) as (client, service, clock):
        resp = await submit(client, manifest("train", pods=2, gpus=4), A)
        assert resp.status == 201
        await service.schedule_once(clock.now)  # reserved (assumed); the launch waits
        [placement] = service.ledger.reservations().values()
        assert placement.job == "team-a/train"

        views = {name: await (await client.get("/v1/nodes", headers=h)).json()
                 for name, h in (("a", A), ("b", B), ("admin", ADMIN))}  # fmt: skip
        body = views["admin"]
        snapshot = service.ledger.snapshot()
        assert [c["cluster"] for c in body["clusters"]] == sorted(snapshot.clusters)
        held_nodes = {pod.node for pod in placement.pods}
        for cluster in body["clusters"]:
            view = snapshot.clusters[cluster["cluster"]]
            assert [n["name"] for n in cluster["nodes"]] == sorted(view.nodes)
            for row in cluster["nodes"]:
                state = view.nodes[row["name"]]
                assert row["gpus"] == len(state.gpu_free)
                assert row["free"] == state.free_milli / MILLI_PER_GPU
                reserved = sum(
                    p.resources.gpu_request_milli for p in placement.pods if p.node == row["name"]
                ) if cluster["cluster"] == placement.cluster else 0  # fmt: skip
                assert row["reserved"] == reserved / MILLI_PER_GPU
                assert row["used"] == 0  # nothing runs yet
                assert row["used"] + row["reserved"] + row["free"] == row["gpus"]
                assert row["burst"] is False
                mine = cluster["cluster"] == placement.cluster and row["name"] in held_nodes
                assert row["reservedFor"] == (["team-a/train"] if mine else [])

        # Occupancy is everyone's to see; who holds the reservation is not.
        def holders(view: dict[str, Any]) -> list[str]:
            return [j for c in view["clusters"] for n in c["nodes"] for j in n["reservedFor"]]

        def occupancy(view: dict[str, Any]) -> list[tuple[Any, ...]]:
            return [(n["name"], n["used"], n["reserved"], n["free"])
                    for c in view["clusters"] for n in c["nodes"]]  # fmt: skip

        assert occupancy(views["a"]) == occupancy(views["b"]) == occupancy(body)
        assert holders(views["a"]) == ["train"] * len(held_nodes)
        assert holders(views["b"]) == []

        # Once running, the reservation is bound usage, and the totals agree with /v1/clusters.
        gate.open()
        await settle(service)
        assert service.ledger.reservations() == {}
        resp = await client.get("/v1/nodes", headers=B)
        running_rows = {n["name"]: n for c in (await resp.json())["clusters"] for n in c["nodes"]}
        for node in held_nodes:
            on_node = [p for p in placement.pods if p.node == node]
            assert running_rows[node]["used"] == 4 * len(on_node)
            assert running_rows[node]["reserved"] == 0
            assert running_rows[node]["reservedFor"] == []
        for cluster in service.clusters():
            rows = [n for n in running_rows.values() if n["name"] in snapshot.clusters[
                cluster["cluster"]].nodes]  # fmt: skip
            for t in cluster["gpuTypes"]:
                of_type = [n for n in rows if n["gpuType"] == t["gpuType"]]
                assert sum(n["used"] for n in of_type) == t["allocated"]
                assert sum(n["free"] for n in of_type) == t["free"]


async def test_nodes_marks_burst_nodes(tmp_path: Path) -> None:
    async with running(tmp_path) as (client, service, _):
        node = Node(
            "cloud-0", GpuType("A100"), Resources(gpus=8, cpu_milli=96_000, memory_mib=2**20),
            labels={POOL_LABEL: "cloud-a100"},
        )  # fmt: skip
        service.ledger.apply(NodeUpdated("small-b", node))
        resp = await client.get("/v1/nodes", headers=B)
        rows = {n["name"]: n for c in (await resp.json())["clusters"] for n in c["nodes"]}
        assert rows["cloud-0"]["burst"] is True
        assert rows["cloud-0"]["free"] == 8
        assert [n for n, row in rows.items() if row["burst"]] == ["cloud-0"]


async def test_page_is_public_and_holds_no_data(tmp_path: Path) -> None:
    async with running(tmp_path) as (client, _, _):
        resp = await client.get("/")
        assert resp.status == 200
        assert resp.content_type == "text/html"
        assert "script-src 'self'" in resp.headers["Content-Security-Policy"]
        assert '<script src="/static/dashboard.js"' in await resp.text()
        resp = await client.get("/static/dashboard.js")
        assert resp.status == 200
        assert resp.content_type == "text/javascript"
        assert (await client.get("/static/dashboard.css")).status == 200
        for path in ("/static/nope.js", "/static/..%2Fdashboard.py", "/static/"):
            assert (await client.get(path)).status == 404, path


# --- the page in a browser ---------------------------------------------------------------


def chromium() -> str:
    path = os.environ.get("FEDBROKER_CHROMIUM", "/usr/bin/chromium")
    if os.path.isfile(path) and os.access(path, os.X_OK):
        return path
    reason = f"Chromium not found at {path} (set FEDBROKER_CHROMIUM)"
    if os.environ.get("FEDBROKER_REQUIRE_SERVICES") == "1":
        pytest.fail(f"{reason} (FEDBROKER_REQUIRE_SERVICES=1)")
    pytest.skip(reason)


@pytest.fixture
def demo(tmp_path: Path) -> Iterator[Demo]:
    started = Demo(tmp_path / "data")  # with its workload: the page under real churn
    try:
        started.ready()
        yield started
    finally:
        started.kill()


@pytest.fixture
def page() -> Iterator[Page]:
    executable = chromium()  # before the demo starts (the test asks for the page first)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=executable, args=["--no-sandbox"])
        try:
            yield browser.new_page(viewport={"width": 1400, "height": 1000})
        finally:
            browser.close()


def post_job(demo: Demo, body: dict[str, Any], token: str) -> int:
    request = urllib.request.Request(
        demo.url + "/v1/jobs", data=json.dumps(body).encode(), method="POST",
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )  # fmt: skip
    with urllib.request.urlopen(request, timeout=5) as resp:
        return int(resp.status)


def node_counts(demo: Demo) -> dict[str, int]:
    status, body = http_get(demo.url + "/v1/nodes", TOKENS["admin"])
    assert status == 200
    return {c["cluster"]: len(c["nodes"]) for c in body["clusters"]}


def test_dashboard_shows_the_federation_live(page: Page, demo: Demo, tmp_path: Path) -> None:
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    # Public page, no data without a token: a wrong one is refused, with a message.
    page.goto(demo.url + "/")
    expect(page.locator("#main")).to_be_hidden()
    page.fill("#token", "not-a-token")
    page.click("#login button[type=submit]")
    expect(page.locator("#error")).to_contain_text("refused", timeout=WAIT_MS)
    expect(page.locator("#login")).to_be_visible()
    page.goto(f"{demo.url}/#token={TOKENS['admin']}")
    expect(page.locator("#status")).to_have_attribute("data-live", "live", timeout=WAIT_MS)
    assert "token" not in page.url  # taken from the fragment and wiped

    # A panel per cluster of /v1/clusters, and a cell per node of /v1/nodes.
    status, body = http_get(demo.url + "/v1/clusters", TOKENS["admin"])
    assert status == 200
    names = [c["cluster"] for c in body["clusters"]]
    assert names == ["cloud-burst", "onprem-a", "onprem-b"]
    for name in names:
        expect(page.locator(f'article.cluster[data-cluster="{name}"]')).to_have_count(1)
    # Burst nodes may come or go meanwhile: the page must catch up with a fresh count.
    for _ in range(5):
        counts = node_counts(demo)
        try:
            for name, count in counts.items():
                cells = page.locator(f'article.cluster[data-cluster="{name}"] li.node')
                expect(cells).to_have_count(count, timeout=WAIT_MS)
            break
        except AssertionError:
            if counts == node_counts(demo):
                raise  # nothing changed: the page is wrong, not late
    else:
        raise AssertionError("the node cells never matched /v1/nodes")
    assert counts["onprem-a"] == 47 and counts["onprem-b"] == 30
    titled = page.locator("li.node").first.get_attribute("title") or ""
    assert " GPUs: " in titled and " allocated, " in titled and " free" in titled

    # onprem-a's blocks and racks: a line per level, its domains as /v1/clusters names
    # them (their free counts change with the workload: the page's own, not compared).
    [onprem_a] = [c for c in body["clusters"] if c["cluster"] == "onprem-a"]
    assert [level["name"] for level in onprem_a["topology"]] == ["block", "rack"]
    lines = page.locator('article.cluster[data-cluster="onprem-a"] ul.topology li')
    expect(lines).to_have_count(2)
    for level in onprem_a["topology"]:
        line = lines.locator(f'xpath=self::*[@data-level="{level["level"]}"]')
        expect(line.locator(".level")).to_have_text(level["name"])
        expect(line.locator(".domains")).to_contain_text(f"{level['domains'][0]['domain']} ")
        expect(line.locator(".domains")).to_contain_text(" free")
        expect(line.locator(".gang")).to_contain_text(re.compile(r"^largest \d+ x 8 |fits one"))
    expect(page.locator('article.cluster[data-cluster="onprem-b"] ul.topology')).to_have_count(0)

    # A job submitted through the API shows up without a reload: no H100 anywhere, and
    # not allowed to burst, so it waits in its queue for good.
    page.evaluate("window.__sameDocument = true")
    name = f"dash-{uuid.uuid4().hex[:8]}"
    job = manifest(name, pods=2, gpus=8, queue="training",
                   placement={"gpuTypes": ["H100"]})  # fmt: skip
    assert post_job(demo, job, TOKENS["team-a"]) == 201
    button = page.locator(f'button.pending-job[data-job="{name}"][data-tenant="team-a"]')
    expect(button).to_be_visible(timeout=WAIT_MS)
    expect(page.locator(f'#events li[data-job="{name}"]').first).to_contain_text(
        "Queued", timeout=WAIT_MS
    )
    assert page.evaluate("window.__sameDocument") is True

    # Clicking it explains, per cluster, why it waits.
    button.click()
    explain = page.locator("#explain")
    expect(explain).to_have_attribute("data-job", f"team-a/{name}", timeout=WAIT_MS)
    expect(button).to_have_attribute("aria-pressed", "true")
    rows = explain.locator("tbody tr")
    expect(rows).to_have_count(len(names))
    for name_ in names:
        row = explain.locator(f'tbody tr[data-cluster="{name_}"]')
        expect(row).to_contain_text("does not fit")
        expect(row.locator(".reasons li").first).to_be_visible()
    # And what happens next: its place in the queues, and why no pool can take it.
    expect(explain.locator(".explain-position")).to_contain_text(" waiting (")
    refusal = explain.locator('.explain-burst[data-status="none"] li[data-code="not-allowed"]')
    expect(refusal).to_contain_text("allowBurst")

    # Burst pools render, with their cost.
    expect(page.locator('#pools tr[data-pool="cloud-a100"]')).to_contain_text("$")

    # The workload is running: some node shows GPUs in use before the picture is taken.
    page.wait_for_function(
        "[...document.querySelectorAll('li.node')].some(n => Number(n.dataset.used) > 0)",
        timeout=WAIT_MS,
    )
    target = os.environ.get("FEDBROKER_SCREENSHOT")
    if target:
        # The README's picture: wait for a gang of A100s (only the cloud pool has them) to
        # get burst nodes (the demo bursts after 30 s; nodes take 20 s to come up).
        gang = manifest(f"burst-{name}", pods=2, gpus=8, queue="training",
                        placement={"gpuTypes": ["A100"], "allowBurst": True})  # fmt: skip
        assert post_job(demo, gang, TOKENS["team-a"]) == 201
        expect(page.locator("li.node.burst").first).to_be_visible(timeout=BURST_WAIT_MS)
    # Quiet: no refresh due or running, so the picture shows what the API says now.
    expect(page.locator("body")).to_have_attribute("data-busy", "false", timeout=WAIT_MS)
    shot = tmp_path / "dashboard.png"
    page.screenshot(path=str(shot), full_page=True)
    data = shot.read_bytes()
    assert data.startswith(b"\x89PNG\r\n\x1a\n")
    assert len(data) > 30_000  # a rendered page, not a blank one
    if target:
        out = Path(target) if Path(target).is_absolute() else ROOT / target
        shutil.copyfile(shot, out)
        assert out.read_bytes() == data
    assert errors == []
