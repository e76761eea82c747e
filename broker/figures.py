"""The glossary of capacity figures: one name per figure, whatever view shows it.

A figure is counted per cluster and GPU type. ``field`` is its key in the rows of
``/v1/clusters``' ``gpuTypes`` (what ``fedbroker clusters -o json`` prints and the dashboard
reads); ``column`` its header in ``fedbroker clusters`` and ``fedbroker top`` (the dashboard
writes the same words in title case); ``metric`` the Prometheus family that carries it, with
``state`` the value of its ``state`` label where the family splits GPUs by state. Metrics
count in GPUs, the base unit; where the JSON counts something else (the largest gang is
counted in pods of ``gangGpusPerPod`` GPUs each), ``per_unit`` names the row's field that
turns one unit of the field into GPUs. ``meaning`` is the metric's HELP text and the
glossary's line in docs/observability.md.

The views, the metric names and their HELP read from here; tests/http/test_figures.py reads
one federation through every view and checks that each figure agrees.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Figure:
    field: str
    column: str
    metric: str
    meaning: str
    state: str | None = None
    per_unit: str | None = None

    @property
    def label(self) -> str:
        """The dashboard's words for the column: ``LARGEST GANG`` -> ``Largest gang``."""
        return self.column.capitalize()


TOTAL = Figure("total", "TOTAL", "fedbroker_cluster_gpus", "GPUs on schedulable nodes")
ALLOCATED = Figure(
    "allocated", "ALLOCATED", "fedbroker_gpus", "GPUs held by pods bound to a node",
    state="allocated",
)  # fmt: skip
RESERVED = Figure(
    "reserved", "RESERVED", "fedbroker_gpus",
    "GPUs the broker placed a job on whose pods are not bound yet", state="reserved",
)  # fmt: skip
FREE = Figure("free", "FREE", "fedbroker_gpus", "GPUs neither allocated nor reserved", "free")
LARGEST_GANG = Figure(
    "largestGang", "LARGEST GANG", "fedbroker_largest_gang_gpus",
    "GPUs of the largest gang of 8-GPU pods that could be placed now",
    per_unit="gangGpusPerPod",
)  # fmt: skip
STRANDED = Figure(
    "stranded", "STRANDED", "fedbroker_stranded_gpus",
    "Free GPUs on nodes where no pod of any pending job fits (0 while nothing waits)",
)  # fmt: skip

FIGURES = (TOTAL, ALLOCATED, RESERVED, FREE, LARGEST_GANG, STRANDED)
GPU_STATES = (ALLOCATED, RESERVED, FREE)  # the states of ``fedbroker_gpus``


def gang(pods: int, gpus_per_pod: int) -> str:
    """A largest gang as every text view writes it: ``2 x 8`` (pods x GPUs each), or
    ``none`` when not one pod fits."""
    return f"{pods} x {gpus_per_pod}" if pods > 0 else "none"


__all__ = [
    "ALLOCATED",
    "FIGURES",
    "FREE",
    "GPU_STATES",
    "LARGEST_GANG",
    "RESERVED",
    "STRANDED",
    "TOTAL",
    "Figure",
    "gang",
]


def span(seconds: float) -> str:
    """A span of time as every answer writes it: ``45s``, ``2m``, ``2m30s``, ``1h5m``
    (the live view's columns keep their own fixed width: ``broker.cli.view.duration``)."""
    s = max(0, round(seconds))
    if s >= 3600:
        h, m = divmod(s // 60, 60)
        return f"{h}h{m}m" if m else f"{h}h"
    if s >= 60:
        m, r = divmod(s, 60)
        return f"{m}m{r}s" if r else f"{m}m"
    return f"{s}s"
