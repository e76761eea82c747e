"""The terminal view of a running broker, shared by ``fedbroker demo`` and ``fedbroker top``.

Typed rows (``Snapshot``: clusters and their GPU types, queues, burst pools, the last job
events) are read from the API's JSON bodies (``snapshot_from_json``: ``/v1/clusters``,
``/v1/queues``, ``/v1/pools`` and the job events of ``/v1/events``), so the demo, which
takes those bodies from its own service, and ``top``, which fetches them over HTTP, draw
the same thing. ``render`` is one pure function from a snapshot (and the banner above it)
to a rich renderable: no clock, no I/O; ages are counted from ``Snapshot.at``.
A cluster's topology domains are drawn by ``broker.cli.view_topology``.
``status_line`` is the compact one-line form for a non-terminal (``--plain``).
"""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TextIO

from rich import box
from rich.columns import Columns
from rich.console import Group, RenderableType
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from broker.cli.view_topology import DomainLines, LevelView, levels_from_json
from broker.figures import ALLOCATED, FREE, LARGEST_GANG, RESERVED, TOTAL, gang

BAR_WIDTH = 24
EVENTS_SHOWN = 8
USED, RESERVED_CELL, FREE_CELL = "█", "▒", "░"
USED_STYLE, RESERVED_STYLE, FREE_STYLE = "green", "yellow", "grey50"
_STATE_STYLES = {
    "Queued": "cyan", "Placed": "yellow", "Running": "green", "Succeeded": "bold green",
    "Failed": "bold red", "Cancelled": "magenta",
}  # fmt: skip


@dataclass(frozen=True, slots=True)
class GpuRow:
    """One GPU type of a cluster, in GPUs; ``largest_gang``: pods of ``gang_gpus`` whole
    GPUs each that could be placed there now."""

    gpu_type: str
    total: int
    allocated: float
    reserved: float
    free: float
    largest_gang: int
    gang_gpus: int = 8


@dataclass(frozen=True, slots=True)
class ClusterRow:
    name: str
    kind: str
    stale: bool
    connected: bool | None
    gpus: tuple[GpuRow, ...]
    topology: tuple[LevelView, ...] = ()  # its declared levels' domains, widest first


@dataclass(frozen=True, slots=True)
class QueueRow:
    name: str
    policy: str
    pending: int
    oldest_wait: float  # seconds its longest-waiting pending job has waited (0: none)
    usage: Mapping[str, float] = field(default_factory=dict)  # GPUs held per type


@dataclass(frozen=True, slots=True)
class PoolRow:
    pool: str
    cluster: str
    gpu_type: str
    ready: int
    coming: int
    max_nodes: int
    failing: bool
    cost_per_node_hour: float
    cost: float  # spent so far

    @property
    def cost_per_hour(self) -> float:
        """What it costs now: every node asked for is billed from its scale-up on."""
        return (self.ready + self.coming) * self.cost_per_node_hour


@dataclass(frozen=True, slots=True)
class EventRow:
    at: float  # wall-clock seconds
    job: str  # tenant/name
    queue: str
    state: str
    cluster: str | None
    reason: str


@dataclass(frozen=True, slots=True)
class Snapshot:
    """What the view shows at wall-clock time ``at``; ``error``: why it may be stale."""

    at: float
    clusters: tuple[ClusterRow, ...] = ()
    queues: tuple[QueueRow, ...] = ()
    pools: tuple[PoolRow, ...] = ()
    events: tuple[EventRow, ...] = ()
    source: str = ""
    error: str | None = None


# --- from the API's bodies -------------------------------------------------------------


def _num(doc: Mapping[str, Any], key: str, default: float = 0.0) -> float:
    value = doc.get(key, default)
    return float(value) if isinstance(value, int | float) else default


def _int(doc: Mapping[str, Any], key: str) -> int:
    return int(_num(doc, key))


def clusters_from_json(doc: Mapping[str, Any]) -> tuple[ClusterRow, ...]:
    """``/v1/clusters``' body as rows."""
    rows = []
    for c in doc.get("clusters", ()):
        gpus = tuple(
            GpuRow(
                str(t.get("gpuType", "")), _int(t, "total"), _num(t, "allocated"),
                _num(t, "reserved"), _num(t, "free"), _int(t, "largestGang"),
                _int(t, "gangGpusPerPod") or 8,
            )
            for t in c.get("gpuTypes", ())
        )  # fmt: skip
        connected = c.get("connected")
        rows.append(ClusterRow(
            str(c.get("cluster", "")), str(c.get("kind", "")), bool(c.get("stale")),
            connected if isinstance(connected, bool) else None, gpus,
            levels_from_json(c.get("topology")),
        ))  # fmt: skip
    return tuple(rows)


def queues_from_json(doc: Mapping[str, Any]) -> tuple[QueueRow, ...]:
    """``/v1/queues``' body as rows."""
    return tuple(
        QueueRow(
            str(q.get("name", "")), str(q.get("policy", "")), _int(q, "pending"),
            _num(q, "oldestWaitSeconds"),
            {str(k): float(v) for k, v in (q.get("usage") or {}).items()},
        )
        for q in doc.get("queues", ())
    )  # fmt: skip


def pools_from_json(doc: Mapping[str, Any]) -> tuple[PoolRow, ...]:
    """``/v1/pools``' body as rows (its pools; the requests and per-job costs aside)."""
    return tuple(
        PoolRow(
            str(p.get("pool", "")), str(p.get("cluster", "")), str(p.get("gpuType", "")),
            _int(p, "ready"), _int(p, "coming"), _int(p, "maxNodes"), bool(p.get("failing")),
            _num(p, "costPerNodeHour"), _num(p, "cost"),
        )
        for p in doc.get("pools", ())
    )  # fmt: skip


def event_from_json(data: Mapping[str, Any]) -> EventRow:
    """A job event of ``/v1/events`` (``event: job``) as a row."""
    cluster = data.get("cluster")
    return EventRow(
        _num(data, "at"), f"{data.get('tenant', '')}/{data.get('name', '')}",
        str(data.get("queue", "")), str(data.get("state", "")),
        str(cluster) if cluster else None, str(data.get("reason") or ""),
    )  # fmt: skip


def snapshot_from_json(
    at: float,
    clusters: Mapping[str, Any],
    queues: Mapping[str, Any],
    pools: Mapping[str, Any],
    events: Iterable[Mapping[str, Any]] = (),
    *,
    source: str = "",
    error: str | None = None,
) -> Snapshot:
    return Snapshot(
        at, clusters_from_json(clusters), queues_from_json(queues), pools_from_json(pools),
        tuple(event_from_json(e) for e in events), source, error,
    )  # fmt: skip


# --- drawing ---------------------------------------------------------------------------


def gpus(value: float) -> str:
    """A GPU amount: whole GPUs as integers, fractions with one decimal."""
    return f"{value:.0f}" if float(value).is_integer() else f"{value:.1f}"


def duration(seconds: float) -> str:
    """``45s``, ``3m05s``, ``2h07m``; ``-`` for none."""
    if seconds <= 0:
        return "-"
    s = int(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def bar(used: float, reserved: float, total: float, width: int = BAR_WIDTH) -> Text:
    """Allocated (``used``), reserved and free GPUs as one bar of ``width`` cells; any use
    shows at least one cell, and the cells always add up to ``width``."""
    if total <= 0 or width <= 0:
        return Text(" " * max(width, 0))

    def cells(value: float) -> int:
        share = max(0.0, min(1.0, value / total))
        return 0 if share == 0 else max(1, round(share * width))

    n_used = cells(used)
    n_reserved = min(cells(reserved), width - n_used)
    n_free = width - n_used - n_reserved
    text = Text()
    text.append(USED * n_used, USED_STYLE)
    text.append(RESERVED_CELL * n_reserved, RESERVED_STYLE)
    text.append(FREE_CELL * n_free, FREE_STYLE)
    return text


def _clusters_table(clusters: Sequence[ClusterRow], source: str) -> Table:
    table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, title_justify="left",
                  title=_legend(source))  # fmt: skip
    # The columns and their order are those of ``fedbroker clusters`` (broker.figures).
    for name, justify in (("CLUSTER", "left"), ("GPU", "left"), ("", "left"),
                          (TOTAL.column, "right"), (ALLOCATED.column, "right"),
                          (RESERVED.column, "right"), (FREE.column, "right"),
                          (LARGEST_GANG.column, "left")):  # fmt: skip
        table.add_column(name, justify=justify, no_wrap=True)  # type: ignore[arg-type]
    for c in clusters:
        label = Text(c.name, style="bold")
        if c.kind == "cloud":
            label.append(" cloud", style="cyan")
        if c.stale or c.connected is False:
            label.append(" stale" if c.stale else " disconnected", style="bold red")
        if not c.gpus:
            none = Text(gang(0, 0), style="grey50")
            table.add_row(label, Text("no GPU nodes", style="grey50"), "", "0", "", "", "", none)
        for i, g in enumerate(c.gpus):
            largest = Text(gang(g.largest_gang, g.gang_gpus),
                           style="" if g.largest_gang else "grey50")  # fmt: skip
            table.add_row(
                label if i == 0 else "", g.gpu_type, bar(g.allocated, g.reserved, g.total),
                str(g.total), gpus(g.allocated), gpus(g.reserved), gpus(g.free), largest,
            )  # fmt: skip
    return table


def _queues_table(queues: Sequence[QueueRow]) -> Table:
    table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, title_justify="left",
                  title=Text("Queues", style="bold"))  # fmt: skip
    for name, justify in (("QUEUE", "left"), ("POLICY", "left"), ("PENDING", "right"),
                          ("OLDEST WAIT", "right"), ("GPUS HELD", "left")):  # fmt: skip
        table.add_column(name, justify=justify, no_wrap=True)  # type: ignore[arg-type]
    for q in queues:
        held = ", ".join(f"{t} {gpus(v)}" for t, v in sorted(q.usage.items()) if v > 0)
        pending = Text(str(q.pending), style="bold yellow" if q.pending else "")
        table.add_row(q.name, q.policy, pending, duration(q.oldest_wait), held or "-")
    return table


def _pools_table(pools: Sequence[PoolRow]) -> Table:
    table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, title_justify="left",
                  title=Text("Burst pools", style="bold"))  # fmt: skip
    for name, justify in (("POOL", "left"), ("CLUSTER", "left"), ("GPU", "left"),
                          ("READY", "right"), ("COMING", "right"), ("MAX", "right"),
                          ("$/HOUR", "right"), ("SPENT", "right")):  # fmt: skip
        table.add_column(name, justify=justify, no_wrap=True)  # type: ignore[arg-type]
    for p in pools:
        pool = Text(p.pool)
        if p.failing:
            pool.append(" failing", style="bold red")
        table.add_row(
            pool, p.cluster, p.gpu_type, str(p.ready),
            Text(str(p.coming), style="yellow" if p.coming else ""), str(p.max_nodes),
            f"{p.cost_per_hour:.2f}", f"{p.cost:.2f}",
        )  # fmt: skip
    return table


def _events_table(events: Sequence[EventRow], at: float) -> Table:
    table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, title_justify="left",
                  title=Text("Last job events", style="bold"))  # fmt: skip
    for name, justify in (("AGO", "right"), ("JOB", "left"), ("QUEUE", "left"),
                          ("STATE", "left"), ("CLUSTER", "left"), ("REASON", "left")):  # fmt: skip
        table.add_column(name, justify=justify, no_wrap=True, overflow="ellipsis")  # type: ignore[arg-type]
    for e in list(events)[-EVENTS_SHOWN:][::-1]:  # newest first
        ago = "now" if at - e.at < 1 else duration(at - e.at)
        state = Text(e.state, style=_STATE_STYLES.get(e.state, ""))
        table.add_row(ago, e.job, e.queue, state, e.cluster or "-", e.reason[:40])
    if not events:
        table.add_row("", Text("none yet", style="grey50"), "", "", "", "")
    return table


def render(snapshot: Snapshot, banner: RenderableType | None = None) -> RenderableType:
    """The whole view: ``banner`` (if any) on top, then clusters (a bar per GPU type:
    allocated, reserved, free; its largest placeable gang), a line per cluster and topology
    level (its domains' whole free nodes, the largest gang inside one domain), queues
    (pending, oldest wait), burst pools (nodes ready and coming, cost per hour) and the
    last job events."""
    parts: list[RenderableType] = []
    if banner is not None:
        parts.append(banner)
    if snapshot.error:
        parts.append(Text(f"! {snapshot.error}", style="bold red"))
    parts.append(_clusters_table(snapshot.clusters, snapshot.source))
    levels = [(c.name, level) for c in snapshot.clusters for level in c.topology]
    if levels:
        parts.append(Text("Topology", style="bold").append(
            "   whole free nodes / nodes per domain", style="grey50"))  # fmt: skip
        parts.append(DomainLines(levels))
    middle: list[RenderableType] = [_queues_table(snapshot.queues)]
    if snapshot.pools:
        middle.append(_pools_table(snapshot.pools))
    parts.append(Text(""))
    parts.append(Columns(middle, padding=(1, 6)))  # side by side when the width allows
    parts.append(Text(""))
    parts.append(_events_table(snapshot.events, snapshot.at))
    return Group(*parts)


def _legend(source: str) -> Text:
    text = Text("Clusters", style="bold").append("   ")
    text.append(USED, USED_STYLE).append(f" {ALLOCATED.field}  ")
    text.append(RESERVED_CELL, RESERVED_STYLE).append(f" {RESERVED.field}  ")
    text.append(FREE_CELL, FREE_STYLE).append(f" {FREE.field}")
    if source:
        text.append(f"   {source}", style="grey50")
    return text


def banner_panel(lines: Sequence[Text | str], title: str) -> Panel:
    """Lines in a box, for the top of the view."""
    body = Text("\n").join(Text(x) if isinstance(x, str) else x for x in lines)
    return Panel(body, title=Text(title, style="bold"), title_align="left", box=box.ROUNDED,
                 expand=False)  # fmt: skip


def status_line(snapshot: Snapshot) -> str:
    """One line for a log or a pipe: GPUs in use, pending jobs and their oldest wait, burst
    nodes and their cost per hour."""
    total = sum(g.total for c in snapshot.clusters for g in c.gpus)
    busy = sum(g.allocated + g.reserved for c in snapshot.clusters for g in c.gpus)
    pending = sum(q.pending for q in snapshot.queues)
    oldest = max((q.oldest_wait for q in snapshot.queues), default=0.0)
    ready = sum(p.ready for p in snapshot.pools)
    coming = sum(p.coming for p in snapshot.pools)
    rate = sum(p.cost_per_hour for p in snapshot.pools)
    queues = " ".join(f"{q.name}={q.pending}" for q in snapshot.queues)
    line = (
        f"status: GPUs {gpus(busy)}/{total} in use; pending {pending} ({queues}), "
        f"oldest wait {duration(oldest)}; burst nodes {ready} up, {coming} coming, "
        f"{rate:.2f}/h"
    )
    return line + (f"; {snapshot.error}" if snapshot.error else "")


# --- where to draw ---------------------------------------------------------------------


def use_plain(plain: bool, out: TextIO, environ: Mapping[str, str] | None = None) -> bool:
    """Whether to print status lines instead of the live view: asked for (``--plain``),
    or ``out`` is not a terminal, or the terminal cannot draw (``TERM=dumb``)."""
    environ = os.environ if environ is None else environ
    if plain:
        return True
    try:
        tty = out.isatty()
    except (AttributeError, ValueError):  # closed or not a real stream
        return True
    return not tty or environ.get("TERM") == "dumb"


def positive_seconds(text: str) -> float:
    """An argparse type: a finite number of seconds above zero."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number of seconds, not {text!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"must be above 0, not {text}")
    return value


__all__ = [
    "ClusterRow",
    "EventRow",
    "GpuRow",
    "PoolRow",
    "QueueRow",
    "Snapshot",
    "banner_panel",
    "bar",
    "clusters_from_json",
    "duration",
    "event_from_json",
    "positive_seconds",
    "queues_from_json",
    "render",
    "snapshot_from_json",
    "status_line",
    "use_plain",
]
