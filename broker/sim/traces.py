"""Readers for the public Alibaba GPU traces (node inventories and the openb pod lists).

The files stay where they are (``FEDBROKER_TRACES``, default ``../shared/traces``); this
module only reads them into model values. Every problem with a file is a ``TraceError``
whose one-line message names the file and the row or column at fault.
"""

from __future__ import annotations

import csv
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from broker.model import MILLI_PER_GPU, GpuType, Node, Resources

MIB_PER_GIB = 1024


class TraceError(Exception):
    """A trace file is missing or malformed; the message names the file."""


def traces_dir() -> Path:
    return Path(os.environ.get("FEDBROKER_TRACES", "../shared/traces"))


@dataclass(frozen=True, slots=True)
class TracePod:
    """One pod of an openb pod list. Times are seconds from the trace start (None if unset)."""

    name: str
    resources: Resources
    gpu_types: frozenset[GpuType]
    creation_time: int | None = None
    deletion_time: int | None = None


def _rows(path: Path, required: tuple[str, ...]) -> Iterator[tuple[int, dict[str, str]]]:
    try:
        handle = path.open(newline="")
    except FileNotFoundError:
        raise TraceError(f"{path}: no such file") from None
    except OSError as exc:
        raise TraceError(f"{path}: cannot read ({exc.strerror})") from None
    with handle:
        reader = csv.DictReader(handle)
        missing = [c for c in required if c not in (reader.fieldnames or [])]
        if missing:
            raise TraceError(
                f"{path}: missing column(s) {', '.join(missing)} (need {', '.join(required)})"
            )
        yield from enumerate(reader, start=2)


def _int(
    path: Path, line: int, row: dict[str, str], column: str, default: int | None = None
) -> int:
    raw = (row.get(column) or "").strip()
    if not raw and default is not None:
        return default
    try:
        value = int(float(raw))
    except ValueError:
        raise TraceError(f"{path}:{line}: column {column} is not a number: {raw!r}") from None
    if value < 0:
        raise TraceError(f"{path}:{line}: column {column} is negative: {value}")
    return value


def read_openb_nodes(path: Path) -> list[Node]:
    """``sn,cpu_milli,memory_mib,gpu,model`` (openb_node_list_*.csv)."""
    nodes = []
    for line, row in _rows(path, ("sn", "cpu_milli", "memory_mib", "gpu", "model")):
        gpus = _int(path, line, row, "gpu")
        model = (row["model"] or "").strip()
        nodes.append(
            Node(
                row["sn"],
                GpuType(model) if gpus and model else None,
                Resources(
                    gpus=gpus,
                    cpu_milli=_int(path, line, row, "cpu_milli"),
                    memory_mib=_int(path, line, row, "memory_mib"),
                ),
            )
        )
    if not nodes:
        raise TraceError(f"{path}: no nodes")
    return nodes


def read_openb_pods(path: Path) -> list[TracePod]:
    """``name,cpu_milli,memory_mib,num_gpu,gpu_milli[,gpu_spec,...,creation_time,deletion_time]``.

    ``num_gpu`` 1 with ``gpu_milli`` below 1000 is a share of one GPU; otherwise whole GPUs.
    """
    pods = []
    for line, row in _rows(path, ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli")):
        num_gpu = _int(path, line, row, "num_gpu")
        milli = _int(path, line, row, "gpu_milli", default=0)
        if num_gpu == 1 and 0 < milli < MILLI_PER_GPU:
            res = Resources(gpu_milli=milli)
        else:
            res = Resources(gpus=num_gpu)
        res = Resources(
            res.gpus,
            res.gpu_milli,
            _int(path, line, row, "cpu_milli"),
            _int(path, line, row, "memory_mib"),
        )
        spec = (row.get("gpu_spec") or "").strip()
        created = (row.get("creation_time") or "").strip()
        deleted = (row.get("deletion_time") or "").strip()
        pods.append(
            TracePod(
                row["name"],
                res,
                frozenset(GpuType(s) for s in spec.split("|") if s),
                _int(path, line, row, "creation_time") if created else None,
                _int(path, line, row, "deletion_time") if deleted else None,
            )
        )
    if not pods:
        raise TraceError(f"{path}: no pods")
    return pods


def read_pai_machines(path: Path) -> list[Node]:
    """``machine,gpu_type,cap_cpu,cap_mem,cap_gpu`` without a header (cores, GiB, GPUs)."""
    nodes = []
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise TraceError(f"{path}: no such file") from None
    for line, fields in enumerate(csv.reader(text.splitlines()), start=1):
        if len(fields) != 5:
            raise TraceError(
                f"{path}:{line}: expected 5 columns machine,gpu_type,cap_cpu,cap_mem,cap_gpu"
            )
        row = dict(
            zip(("machine", "gpu_type", "cap_cpu", "cap_mem", "cap_gpu"), fields, strict=True)
        )
        gpus = _int(path, line, row, "cap_gpu")
        nodes.append(
            Node(
                row["machine"],
                GpuType(row["gpu_type"]) if gpus else None,
                Resources(
                    gpus=gpus,
                    cpu_milli=_int(path, line, row, "cap_cpu") * 1000,
                    memory_mib=_int(path, line, row, "cap_mem") * MIB_PER_GIB,
                ),
            )
        )
    return nodes


def read_spot_nodes(path: Path, memory_mib_per_cpu: int = 4 * MIB_PER_GIB) -> list[Node]:
    """``gpu_model,gpu_capacity_num,cpu_num,node_name``. The file has no memory column; nodes
    get ``memory_mib_per_cpu`` per core (4 GiB, a common cloud GPU ratio)."""
    nodes = []
    for line, row in _rows(path, ("gpu_model", "gpu_capacity_num", "cpu_num", "node_name")):
        gpus = _int(path, line, row, "gpu_capacity_num")
        cpus = _int(path, line, row, "cpu_num")
        nodes.append(
            Node(
                f"spot-{row['node_name']}",
                GpuType(row["gpu_model"]) if gpus else None,
                Resources(gpus=gpus, cpu_milli=cpus * 1000, memory_mib=cpus * memory_mib_per_cpu),
            )
        )
    return nodes


def read_nodes(path: Path) -> list[Node]:
    """Any of the three inventories, told apart by their first line."""
    try:
        with path.open(newline="") as handle:
            first = handle.readline()
    except FileNotFoundError:
        raise TraceError(f"{path}: no such file") from None
    except OSError as exc:
        raise TraceError(f"{path}: cannot read ({exc.strerror})") from None
    columns = [c.strip() for c in first.split(",")]
    if "sn" in columns:
        return read_openb_nodes(path)
    if "gpu_model" in columns:
        return read_spot_nodes(path)
    if len(columns) == 5 and not any(c in ("cpu_milli", "memory_mib") for c in columns):
        return read_pai_machines(path)
    raise TraceError(
        f"{path}: not a node list (need columns sn,cpu_milli,memory_mib,gpu,model, "
        "or gpu_model,gpu_capacity_num,cpu_num,node_name, or the PAI machine spec)"
    )
