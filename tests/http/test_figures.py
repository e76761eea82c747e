"""One federation read through every view gives the same figures under the same names.

One broker in process on simulated clusters (tests/http/test_api.py's federation), a job
running and a gang waiting, so that every figure of ``broker.figures`` has a value of its
own; then its capacity as ``fedbroker clusters -o json`` and its table print it (the CLI's
client over real HTTP), as ``fedbroker top --once`` draws it, as the dashboard reads it
(``/v1/clusters``, ``/v1/nodes`` and the words of its table) and as ``/metrics`` exposes it
(parsed with prometheus_client's parser). Each figure is compared per cluster and GPU type
under the glossary's field, column and metric.
"""

from __future__ import annotations

import io
import re
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from test_api import ADMIN, A, manifest, running, settle, submit

from broker.cli.client import call
from broker.cli.main import build_parser
from broker.cli.render import render
from broker.cli.top import top
from broker.figures import (
    ALLOCATED,
    FIGURES,
    FREE,
    LARGEST_GANG,
    RESERVED,
    STRANDED,
    TOTAL,
    Figure,
    gang,
)

ADMIN_TOKEN = ADMIN["Authorization"].removeprefix("Bearer ")
DASHBOARD_JS = Path(__file__).resolve().parents[2] / "broker" / "http" / "static" / "dashboard.js"
Key = tuple[str, str]  # (cluster, GPU type)


def amount(value: float) -> str:
    """A GPU amount as the text views write it."""
    return f"{value:.0f}" if float(value).is_integer() else f"{value:.1f}"


def by_type(doc: dict[str, Any]) -> dict[Key, dict[str, Any]]:
    return {(c["cluster"], t["gpuType"]): t for c in doc["clusters"] for t in c["gpuTypes"]}


def metric_values(text: str) -> dict[tuple[str, str, str, str], float]:
    """(metric, cluster, GPU type, state or '') -> value, for the per-type families."""
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if "cluster" in s.labels and "gpu_type" in s.labels and "level" not in s.labels:
                key = (s.name, s.labels["cluster"], s.labels["gpu_type"], s.labels.get("state", ""))
                out[key] = s.value
    return out


def in_metric(figure: Figure, row: dict[str, Any]) -> float:
    """What ``/metrics`` must say for ``figure`` of a ``/v1/clusters`` row (GPUs)."""
    value = float(row[figure.field])
    return value * row[figure.per_unit] if figure.per_unit else value


def table_rows(text: str, first_column: str) -> tuple[list[str], dict[Key, list[str]]]:
    """A text table's header words and its rows by (cluster, GPU type): cells split on two
    spaces or more (the bar of ``top``, a run of block characters, dropped)."""
    lines = text.splitlines()
    at = next(i for i, line in enumerate(lines) if line.split()[:1] == [first_column])
    header = re.split(r"\s{2,}", lines[at].strip())
    rows = {}
    for line in lines[at + 1 :]:
        if not line.strip():
            break
        if set(line.strip()) <= set("─- "):
            continue
        cells = [c for c in re.split(r"\s{2,}", line.strip()) if not set(c) <= set("█▒░")]
        rows[(cells[0], cells[1])] = cells[2:]
    return header, rows


@pytest.fixture
def wide(monkeypatch: pytest.MonkeyPatch) -> None:
    # top --once prints to a file at the terminal width rich finds; wide enough for every
    # column (the narrow terminal is another test's matter).
    monkeypatch.setenv("COLUMNS", "200")


async def test_every_view_says_the_same_figures(tmp_path: Path, wide: None) -> None:
    async with running(tmp_path) as (client, service, clock):
        assert (await submit(client, manifest("train", pods=1, gpus=8), A)).status == 201
        await service.schedule_once(clock.now)
        await settle(service)
        # Needs both A100 nodes whole: waits, and strands the T4s' free GPUs.
        assert (await submit(client, manifest("pair", pods=2, gpus=8), A)).status == 201
        await service.schedule_once(clock.now)

        server = str(client.make_url("")).rstrip("/")
        argv = ["--server", server, "--token", ADMIN_TOKEN]
        parser = build_parser()
        cli_json = await call(parser.parse_args(["clusters", "-o", "json", *argv]))
        cli_table = render("clusters", cli_json)
        out = io.StringIO()
        assert await top(parser.parse_args(["top", "--once", *argv]), out) == 0
        top_text = out.getvalue()
        dashboard = await (await client.get("/v1/clusters", headers=ADMIN)).json()
        nodes = await (await client.get("/v1/nodes", headers=ADMIN)).json()
        metrics = metric_values(await (await client.get("/metrics")).text())

    rows = by_type(cli_json)
    assert rows == by_type(dashboard)
    assert set(rows) == {("small-a", "A100"), ("small-b", "T4")}
    a100, t4 = rows["small-a", "A100"], rows["small-b", "T4"]
    # The federation gives each figure a value of its own, so a swap would show.
    assert (a100["total"], a100["allocated"], a100["free"], a100["largestGang"]) == (16, 8, 8, 1)
    assert (t4["stranded"], a100["stranded"]) == (4, 0)

    # /metrics: each figure under its metric (and state), in GPUs.
    for key, row in rows.items():
        for figure in FIGURES:
            labels = (figure.metric, *key, figure.state or "")
            assert metrics[labels] == in_metric(figure, row), (figure.field, key)

    # fedbroker clusters: the glossary's columns, in its order, with the same figures.
    header, table = table_rows(cli_table, "CLUSTER")
    shown: tuple[Figure, ...] = (TOTAL, ALLOCATED, RESERVED, FREE, STRANDED)
    assert header == ["CLUSTER", "GPU", *(f.column for f in shown), LARGEST_GANG.column]
    for key, row in rows.items():
        gang_text = gang(row["largestGang"], row["gangGpusPerPod"])
        assert table[key] == [*(amount(row[f.field]) for f in shown), gang_text]

    # fedbroker top --once: the same columns (but stranded) and figures.
    header, drawn = table_rows(top_text, "CLUSTER")
    shown = (TOTAL, ALLOCATED, RESERVED, FREE)
    assert header == ["CLUSTER", "GPU", *(f.column for f in shown), LARGEST_GANG.column]
    for key, row in rows.items():
        gang_text = gang(row["largestGang"], row["gangGpusPerPod"])
        assert drawn[key] == [*(amount(row[f.field]) for f in shown), gang_text]

    # The dashboard: its nodes add up to the same figures, and its table uses the words.
    for c in nodes["clusters"]:
        for key, row in rows.items():
            if key[0] == c["cluster"]:
                of_type = [n for n in c["nodes"] if n["gpuType"] == key[1]]
                assert sum(n["used"] for n in of_type) == row["allocated"]
                assert sum(n["free"] for n in of_type) == row["free"]
                assert sum(n["gpus"] for n in of_type) == row["total"]
    words = ", ".join(f'"{f.label}"' for f in (*shown, STRANDED, LARGEST_GANG))
    assert f'["GPU", {words}]' in DASHBOARD_JS.read_text()


def test_the_glossary_in_the_docs_is_the_one_in_the_code() -> None:
    docs = (DASHBOARD_JS.parents[3] / "docs" / "observability.md").read_text()
    rows = [line for line in docs.splitlines() if line.startswith("| ") and "`fedbroker_" in line]
    for figure in FIGURES:
        row = next((r for r in rows if r.split("|")[2].strip().startswith(f"`{figure.field}`")), "")
        assert f"`{figure.column}`" in row, figure.field
        metric = f"`{figure.metric}" + (f'{{state="{figure.state}"}}`' if figure.state else "`")
        assert metric in row, figure.field
        assert figure.meaning.lower().rstrip(")") in row.lower() or figure.per_unit, figure.field
