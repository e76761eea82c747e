"""Topology domains in the terminal view (``broker.cli.view_topology``): rows read from
``/v1/clusters``' ``topology``, the line of one level cut to a width (table-tested), and the
lines in the whole view at the console's width."""

from __future__ import annotations

import io

import pytest
from rich.console import Console, RenderableType

from broker.cli.view import render, snapshot_from_json
from broker.cli.view_topology import DomainView, LevelView, domain_line, levels_from_json

RACKS = tuple(DomainView(f"b1-r{i}", 4, f) for i, f in ((1, 4), (2, 2), (10, 0)))
RACK = LevelView("rack", RACKS, 0, 2, 8, "A100", "b1-r1")
FULL = "dc rack: b1-r1 4/4 free, b1-r2 2/4, b1-r10 0/4; largest 2 x 8 A100 in b1-r1"

LINE_CASES: list[tuple[str, LevelView, int, str]] = [
    ("all fit", RACK, 200, FULL),
    ("exactly", RACK, len(FULL), FULL),
    ("one short: the last domain counted",
     RACK, len(FULL) - 1,
     "dc rack: b1-r1 4/4 free, b1-r2 2/4, +1 more; largest 2 x 8 A100 in b1-r1"),
    ("unlisted domains counted too", LevelView("rack", RACKS[:1], 5, 0), 200,
     "dc rack: b1-r1 4/4 free, +5 more; no 8-GPU pod fits one rack"),
    ("none listed fits: only the count",
     RACK, 50, "dc rack: 3 domains; largest 2 x 8 A100 in b1-r1"),
    ("too narrow even so: cut", RACK, 20, "dc rack: 3 domains;…"),
    ("no domains", LevelView("block", ()), 80, "dc block: no domains"),
    ("no width", RACK, 0, ""),
]  # fmt: skip


@pytest.mark.parametrize(
    ("level", "width", "line"), [c[1:] for c in LINE_CASES], ids=[c[0] for c in LINE_CASES]
)
def test_domain_line(level: LevelView, width: int, line: str) -> None:
    got = domain_line("dc", level, width)
    assert got == line
    assert len(got) <= max(width, 0)


TOPOLOGY = [
    {"level": "example.com/topology-block", "name": "block", "more": 0, "unlabelled": 0,
     "domains": [{"domain": "b1", "nodes": 8, "freeNodes": 6, "gpus": 64, "freeGpus": 50.0}],
     "largestGangs": [{"gpuType": "T4", "largestGang": 0, "domain": ""},
                      {"gpuType": "A100", "largestGang": 6, "domain": "b1"}],
     "gangGpusPerPod": 8},
    {"level": "example.com/topology-rack", "name": "rack", "more": 2,
     "domains": [{"domain": "b1-r1", "nodes": 4, "freeNodes": 4}, "junk", {"nodes": "x"}],
     "largestGangs": "junk"},
]  # fmt: skip


def test_levels_from_json_tolerate_junk() -> None:
    block, rack = levels_from_json(TOPOLOGY)
    assert block == LevelView("block", (DomainView("b1", 8, 6),), 0, 6, 8, "A100", "b1")
    assert rack == LevelView("rack", (DomainView("b1-r1", 4, 4),), 2)
    assert levels_from_json("junk") == () and levels_from_json(None) == ()


def text_of(renderable: RenderableType, width: int) -> str:
    console = Console(file=io.StringIO(), width=width, record=True, color_system=None)
    console.print(renderable)
    return console.export_text()


def test_the_view_draws_a_line_per_level_at_its_width() -> None:
    clusters = {"clusters": [
        {"cluster": "dc", "kind": "onprem", "gpuTypes": [], "topology": TOPOLOGY},
        {"cluster": "flat", "kind": "onprem", "gpuTypes": []},
    ]}  # fmt: skip
    snap = snapshot_from_json(0.0, clusters, {}, {})
    wide = text_of(render(snap), 120)
    assert "Topology" in wide
    assert "dc block: b1 6/8 free; largest 6 x 8 A100 in b1" in wide
    assert "dc rack: b1-r1 4/4 free, +2 more; no 8-GPU pod fits one rack" in wide
    assert "flat " not in wide.split("Topology", 1)[1].split("Queues", 1)[0]
    narrow = text_of(render(snap), 40)
    # Cut to the console's width (the line's own cases are above).
    assert "dc rack: 3 domains; no 8-GPU pod fits o…" in narrow
    assert "dc block: 1 domain; largest 6 x 8 A100" in narrow
    plain = snapshot_from_json(0.0, {"clusters": clusters["clusters"][1:]}, {}, {})
    assert "Topology" not in text_of(render(plain), 120)
