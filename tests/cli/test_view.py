"""The terminal view (``broker.cli.view``): its rows read from the API's bodies, the pure
renderer drawn into a recording console (table-tested), the bars, the status line, the
choice of ``--plain``, and ``top``'s reading of the event stream."""

from __future__ import annotations

import argparse
import io
import sys
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console, RenderableType

from broker.cli.main import build_parser
from broker.cli.top import Broker, interval_of
from broker.cli.view import (
    ClusterRow,
    EventRow,
    GpuRow,
    PoolRow,
    QueueRow,
    Snapshot,
    banner_panel,
    bar,
    duration,
    positive_seconds,
    render,
    snapshot_from_json,
    status_line,
    use_plain,
)

NOW = 1_700_000_000.0
CLUSTERS = {
    "clusters": [
        {"cluster": "onprem-a", "kind": "onprem", "stale": False, "connected": True,
         "gpuTypes": [
             {"gpuType": "G2", "total": 216, "allocated": 100.0, "reserved": 16.0,
              "free": 100.0, "largestGang": 5, "gangGpusPerPod": 8},
             {"gpuType": "T4", "total": 38, "allocated": 6.25, "reserved": 0.0, "free": 31.75,
              "largestGang": 0, "gangGpusPerPod": 8},
         ]},
        {"cluster": "cloud-burst", "kind": "cloud", "stale": True, "gpuTypes": []},
    ]
}  # fmt: skip
QUEUES = {
    "queues": [
        {"name": "training", "policy": "gang", "pending": 3, "oldestWaitSeconds": 125.4,
         "usage": {"G2": 100.0}},
        {"name": "inference", "policy": "binpack", "pending": 0, "oldestWaitSeconds": 0,
         "usage": {}},
    ]
}  # fmt: skip
POOLS = {
    "pools": [
        {"pool": "cloud-a100", "cluster": "cloud-burst", "gpuType": "A100", "ready": 2,
         "coming": 1, "maxNodes": 16, "failing": False, "costPerNodeHour": 32.77,
         "cost": 12.5},
    ],
    "requests": [], "jobs": [],
}  # fmt: skip
EVENTS: list[dict[str, Any]] = [
    {"tenant": "team-a", "name": "gang-1", "queue": "training", "state": "Queued",
     "cluster": None, "reason": "Submitted", "at": NOW - 90},
    {"tenant": "team-a", "name": "gang-1", "queue": "training", "state": "Running",
     "cluster": "onprem-a", "reason": "all 4 pods running", "at": NOW - 0.2},
]  # fmt: skip


def text_of(renderable: RenderableType, width: int = 140) -> str:
    console = Console(file=io.StringIO(), width=width, record=True, color_system=None)
    console.print(renderable)
    return console.export_text()


def snapshot(**changes: Any) -> Snapshot:
    base = snapshot_from_json(NOW, CLUSTERS, QUEUES, POOLS, EVENTS, source="test")
    fields = {f: getattr(base, f) for f in base.__slots__}
    return Snapshot(**{**fields, **changes})


def test_rows_from_the_api_bodies() -> None:
    snap = snapshot()
    [a, cloud] = snap.clusters
    assert a.gpus[0] == GpuRow("G2", 216, 100.0, 16.0, 100.0, 5, 8)
    assert cloud == ClusterRow("cloud-burst", "cloud", True, None, ())
    assert snap.queues[0] == QueueRow("training", "gang", 3, 125.4, {"G2": 100.0})
    assert snap.pools[0].cost_per_hour == pytest.approx(3 * 32.77)
    assert snap.events[1] == EventRow(
        NOW - 0.2, "team-a/gang-1", "training", "Running", "onprem-a", "all 4 pods running"
    )


def test_rows_tolerate_missing_fields() -> None:
    snap = snapshot_from_json(NOW, {"clusters": [{"cluster": "x", "gpuTypes": [{}]}]},
                              {"queues": [{"name": "q"}]}, {})  # fmt: skip
    assert snap.clusters[0].gpus[0] == GpuRow("", 0, 0.0, 0.0, 0.0, 0, 8)
    assert snap.queues[0] == QueueRow("q", "", 0, 0.0, {})
    assert snap.pools == ()


# Each case: a snapshot, what its drawing must show and what it must not.
RENDER_CASES: list[tuple[str, Snapshot, list[str], list[str]]] = [
    ("full", snapshot(),
     ["Clusters", "onprem-a", "cloud-burst cloud stale", "G2", "100", "16", "216",
      "5 x 8", "ALLOCATED", "LARGEST GANG", "T4", "6.2", "31.8", "no GPU nodes", "Queues",
      "training", "gang", "3",
      "2m05s", "G2 100", "inference", "Burst pools", "cloud-a100", "A100", "98.31", "12.50",
      "Last job events", "now", "team-a/gang-1", "Running", "1m30s", "Submitted"],
     ["none yet", "!", "USED"]),
    ("empty", Snapshot(NOW), ["Clusters", "Queues", "Last job events", "none yet"],
     ["Burst pools", "onprem-a"]),
    ("error over the last data", snapshot(error="cannot reach the broker"),
     ["! cannot reach the broker", "onprem-a", "training"], []),
    ("disconnected", snapshot(clusters=(ClusterRow("edge", "onprem", False, False, ()),)),
     ["edge disconnected"], ["stale"]),
    ("failing pool", snapshot(pools=(PoolRow("p", "c", "A100", 0, 2, 4, True, 10.0, 0.0),)),
     ["p failing", "20.00"], []),
]  # fmt: skip


@pytest.mark.parametrize(
    ("snap", "shown", "hidden"), [c[1:] for c in RENDER_CASES], ids=[c[0] for c in RENDER_CASES]
)
def test_render(snap: Snapshot, shown: list[str], hidden: list[str]) -> None:
    text = text_of(render(snap))
    for want in shown:
        assert want in text, want
    for unwanted in hidden:
        assert unwanted not in text, unwanted


def test_render_is_pure_and_puts_the_banner_on_top() -> None:
    top = banner_panel(["API http://x", "stop Ctrl-C"], "fedbroker demo")
    first, again = text_of(render(snapshot(), top)), text_of(render(snapshot(), top))
    assert first == again
    assert first.index("fedbroker demo") < first.index("API http://x") < first.index("Clusters")


def test_events_newest_first_and_bounded() -> None:
    many = tuple(EventRow(NOW - i, f"t/j{i}", "q", "Queued", None, "") for i in range(20))
    text = text_of(render(snapshot(events=many[::-1])))  # oldest first, as they came
    assert text.index("t/j0 ") < text.index("t/j1 ")
    assert "t/j8 " not in text  # only the last EVENTS_SHOWN (8)


@pytest.mark.parametrize(
    ("used", "reserved", "total", "cells"),
    [
        (0, 0, 10, (0, 0, 10)),
        (5, 0, 10, (5, 0, 5)),
        (5, 5, 10, (5, 5, 0)),
        (0.01, 0, 10, (1, 0, 9)),  # any use shows
        (10, 3, 10, (10, 0, 0)),  # never more cells than the bar
        (3, 3, 0, (0, 0, 0)),  # nothing there: blank
    ],
)
def test_bar(used: float, reserved: float, total: float, cells: tuple[int, int, int]) -> None:
    plain = bar(used, reserved, total, width=10).plain
    assert len(plain) == 10
    assert (plain.count("█"), plain.count("▒"), plain.count("░")) == cells


@pytest.mark.parametrize(
    ("seconds", "shown"),
    [(0, "-"), (-3, "-"), (7.9, "7s"), (60, "1m00s"), (125, "2m05s"), (7260, "2h01m")],
)
def test_duration(seconds: float, shown: str) -> None:
    assert duration(seconds) == shown


def test_status_line() -> None:
    line = status_line(snapshot())
    assert line == (
        "status: GPUs 122.2/254 in use; pending 3 (training=3 inference=0), oldest wait "
        "2m05s; burst nodes 2 up, 1 coming, 98.31/h"
    )
    assert status_line(Snapshot(NOW, error="down")).endswith("; down")
    assert "\n" not in line


class FakeOut(io.StringIO):
    def __init__(self, tty: bool) -> None:
        super().__init__()
        self.tty = tty

    def isatty(self) -> bool:
        return self.tty


@pytest.mark.parametrize(
    ("asked", "tty", "term", "plain"),
    [
        (False, True, "xterm", False),
        (True, True, "xterm", True),  # --plain
        (False, False, "xterm", True),  # a pipe or a file
        (False, True, "dumb", True),  # a terminal that cannot draw
        (True, False, "xterm", True),
    ],
)
def test_plain_is_chosen_when_stdout_is_not_a_terminal(
    asked: bool, tty: bool, term: str, plain: bool
) -> None:
    assert use_plain(asked, FakeOut(tty), {"TERM": term}) is plain


def test_plain_for_a_closed_stream() -> None:
    out = io.StringIO()
    out.close()
    assert use_plain(False, out, {}) is True


def test_interval_defaults_and_flags() -> None:
    args = build_parser().parse_args(["top"])
    assert args.interval is None and not args.plain and not args.once
    assert interval_of(args, is_plain=False) == 2.0
    assert interval_of(args, is_plain=True) == 10.0
    assert interval_of(argparse.Namespace(interval=0.5), is_plain=True) == 0.5
    demo = build_parser().parse_args(["demo", "--plain", "--log-stderr", "--interval", "3"])
    assert demo.plain and demo.log_stderr and demo.interval == 3.0
    with pytest.raises(argparse.ArgumentTypeError):
        positive_seconds("0")
    with pytest.raises(argparse.ArgumentTypeError):
        positive_seconds("nan")


@pytest.mark.parametrize("command", ["demo", "top"])
def test_every_flag_says_its_default(command: str) -> None:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for action in sub.choices[command]._actions:
        if action.option_strings and action.dest != "help":
            assert action.help and "default" in action.help, action.option_strings


def test_top_reads_job_events_from_the_stream() -> None:
    broker = Broker(None, "http://x/", "")  # type: ignore[arg-type]
    broker._take("event: capacity\ndata: {}")
    broker._take(": keepalive")
    broker._take('id: 3\nevent: job\ndata: {"tenant": "a", "name": "j", "state": "Queued"}')
    broker._take("event: job\ndata: not json")
    assert [e["name"] for e in broker.events] == ["j"]
    assert broker.base == "http://x"


def test_the_banner_names_the_cli_as_it_can_be_typed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``make run`` starts ``.venv/bin/fedbroker``, not on PATH: the banner says that path;
    on PATH it says ``fedbroker``; started as a module, the module."""
    from broker.cli.demo import invoked_as

    script = tmp_path / "bin" / "fedbroker"
    script.parent.mkdir()
    script.write_text("#!/bin/sh\n")
    script.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path / "elsewhere"))
    monkeypatch.setattr(sys, "argv", [str(script), "demo"])
    assert invoked_as() == str(script)
    monkeypatch.setenv("PATH", str(script.parent))
    assert invoked_as() == "fedbroker"
    monkeypatch.setenv("PATH", str(tmp_path / "elsewhere"))
    monkeypatch.setattr(sys, "argv", [str(tmp_path / "__main__.py"), "demo"])
    monkeypatch.setattr(sys, "executable", str(script.parent / "python"))
    assert invoked_as() == str(script)  # as a module: the script beside the interpreter
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python"))
    assert invoked_as().endswith("-m broker.cli")
