"""PNG plots of the simulator's results: the fill protocol's allocation curve and the
replay's GPU utilisation over time, one line per policy.

This module owns only the drawing. It takes the same row dictionaries the CLI prints as
JSON, so a plot always shows exactly the reported figures. It builds a ``Figure`` directly
instead of going through ``pyplot``, and saving as PNG renders with Agg: no display or GUI
backend is ever needed, and no global pyplot state leaks between plots or tests.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from matplotlib.figure import Figure

Row = Mapping[str, object]

_SIZE_INCHES = (8.0, 5.0)
_DPI = 110


def plot_fill(rows: Sequence[Row], path: Path) -> None:
    """GPU allocation (%) against arrived load (%), one line per policy.

    ``rows`` are dicts with ``policy``, ``load_pct`` and ``gpu_alloc_pct``. The dashed line
    is the ideal (every arrived GPU allocated, capped at 100 %), so the gap to it is what
    fragmentation cost each policy.
    """
    series: dict[str, list[tuple[float, float]]] = {}
    for row in rows:
        point = (_number(row, "load_pct"), _number(row, "gpu_alloc_pct"))
        series.setdefault(str(row["policy"]), []).append(point)
    fig = _figure()
    ax = fig.add_subplot()
    loads = sorted({x for points in series.values() for x, _ in points})
    if loads:
        ax.plot(loads, [min(x, 100.0) for x in loads], "k--", linewidth=1, label="ideal")
    for policy, points in series.items():
        points.sort()
        ax.plot([x for x, _ in points], [y for _, y in points], marker="o", label=policy)
    ax.set_title("Fill protocol: GPU allocation vs arrived load")
    ax.set_xlabel("arrived GPU load (% of federation GPUs)")
    ax.set_ylabel("GPU allocation (% of federation GPUs)")
    ax.grid(True, alpha=0.3)
    ax.legend()
    _save(fig, path)


def plot_replay(rows: Sequence[Row], path: Path, title: str = "") -> None:
    """GPU utilisation (%) over simulated time, one line per policy.

    ``rows`` are dicts with ``policy``, ``util_series`` (``[[t_seconds, pct], ...]``) and,
    optionally, ``mean_gpu_util_pct`` (shown in the legend). Time is drawn in simulated
    hours because replays span days of compressed trace time.
    """
    fig = _figure()
    ax = fig.add_subplot()
    for row in rows:
        points = row["util_series"]
        if not isinstance(points, Sequence):
            raise TypeError(f"util_series of {row['policy']} is not a sequence")
        hours = [float(p[0]) / 3600.0 for p in points]
        pct = [float(p[1]) for p in points]
        ax.step(hours, pct, where="post", label=replay_label(row))
    ax.set_title(title or "Replay: GPU utilisation over time")
    ax.set_xlabel("simulated time (hours)")
    ax.set_ylabel("GPU utilisation (% of federation GPUs)")
    ax.set_ylim(0, 105)
    ax.grid(True, alpha=0.3)
    ax.legend()
    _save(fig, path)


def replay_label(row: Row) -> str:
    """A replay line's legend: the policy and its mean. The line is the GPUs bound to pods,
    which for kube-default includes those held by gangs still missing pods; when that part
    is not zero the legend names both means, so the plot does not overstate the GPUs that
    run work."""
    label = str(row["policy"])
    if "mean_gpu_util_pct" not in row:
        return label
    allocated = _number(row, "mean_gpu_util_pct")
    running = _number(row, "gpu_util_pct") if "gpu_util_pct" in row else allocated
    if round(running, 1) == round(allocated, 1):
        return f"{label} (mean {allocated:.1f} %)"
    return f"{label} (mean {allocated:.1f} % allocated, {running:.1f} % running)"


def _figure() -> Figure:
    return Figure(figsize=_SIZE_INCHES, dpi=_DPI)


def _save(fig: Figure, path: Path) -> None:
    fig.tight_layout()
    # An explicit format: the PNG is written by Agg whatever the file is called.
    fig.savefig(path, format="png")


def _number(row: Row, key: str) -> float:
    value = row[key]
    if not isinstance(value, int | float):
        raise TypeError(f"{key} must be a number, not {value!r}")
    return float(value)
