"""The trace readers against the published inventories' own totals (traces/README.md)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest

from broker.sim.traces import TraceError, read_nodes, read_openb_pods


@pytest.mark.parametrize(
    ("relative", "nodes", "gpus"),
    [
        ("alibaba-gpu-v2023/openb_node_list_gpu_node.csv", 1213, 6212),
        ("alibaba-gpu-v2023/openb_node_list_all_node.csv", 1523, 6212),
        ("alibaba-spot-gpu-v2026/node_info_df.csv", 4278, 10412),
    ],
)
def test_inventories_match_their_published_totals(
    relative: str, nodes: int, gpus: int, trace_file: Callable[[str], Path]
) -> None:
    read = read_nodes(trace_file(relative))
    assert len(read) == nodes
    assert sum(n.allocatable.gpus for n in read) == gpus
    assert len({n.name for n in read}) == nodes


def test_pai_machine_spec_has_its_gpus_and_types(trace_file: Callable[[str], Path]) -> None:
    read = read_nodes(trace_file("alibaba-pai-v2020/pai_machine_spec.csv"))
    assert sum(n.allocatable.gpus for n in read) == 6742
    types = {n.gpu_type for n in read if n.allocatable.gpus}
    assert {"P100", "T4", "V100M32"} <= {str(t) for t in types}
    assert all(n.gpu_type is None for n in read if not n.allocatable.gpus)


def test_openb_node_mix(trace_file: Callable[[str], Path]) -> None:
    read = read_nodes(trace_file("alibaba-gpu-v2023/openb_node_list_gpu_node.csv"))
    mix = Counter((str(n.gpu_type), n.allocatable.gpus) for n in read)
    assert mix[("G2", 8)] == 549
    assert mix[("T4", 2)] == 387
    assert mix[("G3", 8)] == 39
    assert mix[("V100M32", 8)] == 21


def test_openb_pods_shares_and_whole_gpus(trace_file: Callable[[str], Path]) -> None:
    pods = read_openb_pods(trace_file("alibaba-gpu-v2023/openb_pod_list_default.csv"))
    assert len(pods) == 8152
    shared = [p for p in pods if p.resources.shared]
    assert shared and all(0 < p.resources.gpu_milli < 1000 for p in shared)
    assert max(p.resources.gpus for p in pods) == 8
    # The default list starts at 98 % of the cluster's 6,212 GPUs (traces/README.md).
    load = sum(p.resources.gpu_request_milli for p in pods) / 6_212_000
    assert 0.975 <= load <= 0.985


def test_unknown_file_shape_is_named(tmp_path: Path) -> None:
    odd = tmp_path / "odd.csv"
    odd.write_text("a,b\n1,2\n")
    with pytest.raises(TraceError, match=r"odd\.csv: not a node list"):
        read_nodes(odd)


def test_negative_value_is_named(tmp_path: Path) -> None:
    bad = tmp_path / "nodes.csv"
    bad.write_text("sn,cpu_milli,memory_mib,gpu,model\nn1,-4,1,1,A\n")
    with pytest.raises(TraceError, match=r"nodes\.csv:2: column cpu_milli is negative"):
        read_nodes(bad)
