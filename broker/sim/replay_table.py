"""The replay's table: one row per policy, as ``simulate --protocol replay`` prints it
without ``--json``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from broker.sim.arrivals import Workload

if TYPE_CHECKING:
    from broker.sim.replay import ReplayConfig


_COLUMNS = (
    ("placed", "placements"),
    ("util%", "mean_gpu_util_pct"),
    ("late util%", "late_gpu_util_pct"),
    ("run util%", "gpu_util_pct"),
    ("partial h", "partial_gang_gpu_hours"),
    ("gang p50", "gang_wait_p50_s"),
    ("gang p95", "gang_wait_p95_s"),
    ("gang p99", "gang_wait_p99_s"),
    ("job p50", "job_wait_p50_s"),
    ("unstarted", "unstarted"),
    ("bursts", "burst_scale_ups"),
    ("burst h", "burst_node_hours"),
    ("idle h", "idle_burst_node_hours"),
    ("cost $", "burst_cost"),
)


def print_table(
    rows: Sequence[dict[str, object]],
    workload: Workload,
    nodes: int,
    gpus: int,
    config: ReplayConfig,
) -> None:
    print(
        f"replay protocol: {nodes} nodes, {gpus} GPUs, {config.clusters} cluster(s), "
        f"seed {config.seed}; {workload.trace_jobs} trace pods + {workload.generated_jobs} "
        f"generated jobs over {workload.horizon / 3600:.1f} simulated hours "
        f"(time scale {config.time_scale:g}, gang load {config.gang_load_pct:g} %)"
    )
    if config.burst is None:
        print("no burst pool")
    else:
        pool = config.burst.pool
        print(
            f"burst pool {pool.name}: up to {pool.max_nodes} x {pool.node.gpus} {pool.gpu_type}"
            f" nodes at {pool.cost_per_node_hour:g}/h, up {pool.provision_seconds:g} s after"
            " a scale-up; utilisation counts on-prem GPUs only"
        )
    print("waits in simulated seconds; unstarted jobs count with their wait so far")
    width = max([10, *(len(str(row["policy"])) + 1 for row in rows)])
    print(f"{'policy':<{width}}" + "".join(f"{head:>11}" for head, _ in _COLUMNS))
    for row in rows:
        cells = "".join(f"{_cell(row[key]):>11}" for _, key in _COLUMNS)
        print(f"{row['policy']!s:<{width}}{cells}")


def _cell(value: object) -> str:
    if isinstance(value, float):
        return f"{value:.1f}"
    return "-" if value is None else str(value)
