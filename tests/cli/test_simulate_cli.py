"""Bad input to ``fedbroker simulate`` ends in one clear line and a non-zero exit, never a
traceback; good input to the fill protocol gives the documented JSON."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

NODES = "sn,cpu_milli,memory_mib,gpu,model\n" + "".join(
    f"node-{i:02d},32000,131072,{g},{m}\n"
    for i, (g, m) in enumerate([(8, "A"), (2, "B"), (4, "A")] * 3)
)
PODS = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec\n" + "".join(
    f"pod-{i:03d},{1000 + 100 * (i % 7)},2048,{n},{m},{spec}\n"
    for i, (n, m, spec) in enumerate(
        [(1, 1000, ""), (1, 500, ""), (2, 1000, "A"), (0, 0, ""), (1, 250, "B")] * 8
    )
)


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "broker.cli", *args], capture_output=True, text=True, check=False
    )


@pytest.fixture
def traces(tmp_path: Path) -> tuple[Path, Path]:
    nodes, pods = tmp_path / "nodes.csv", tmp_path / "pods.csv"
    nodes.write_text(NODES)
    pods.write_text(PODS)
    return nodes, pods


def assert_one_line_error(proc: subprocess.CompletedProcess[str], *needles: str) -> None:
    assert proc.returncode != 0
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]


def test_missing_file_names_the_file(tmp_path: Path, traces: tuple[Path, Path]) -> None:
    missing = tmp_path / "nope.csv"
    proc = run_cli("simulate", "--nodes", str(missing), "--pods", str(traces[1]))
    assert_one_line_error(proc, str(missing), "no such file")


def test_wrong_columns_name_the_column(tmp_path: Path, traces: tuple[Path, Path]) -> None:
    bad = tmp_path / "bad.csv"
    bad.write_text("sn,cpu,memory_mib,gpu,model\nn1,1,1,1,A\n")
    proc = run_cli("simulate", "--nodes", str(bad), "--pods", str(traces[1]))
    assert_one_line_error(proc, str(bad), "cpu_milli")


def test_non_numeric_cell_names_row_and_column(tmp_path: Path, traces: tuple[Path, Path]) -> None:
    bad = tmp_path / "pods.csv"
    bad.write_text("name,cpu_milli,memory_mib,num_gpu,gpu_milli\np1,lots,1,1,1000\n")
    proc = run_cli("simulate", "--nodes", str(traces[0]), "--pods", str(bad))
    assert_one_line_error(proc, f"{bad}:2", "cpu_milli")


def test_unknown_policy_lists_the_known_ones(traces: tuple[Path, Path]) -> None:
    proc = run_cli(
        "simulate", "--policy", "bestest", "--nodes", str(traces[0]), "--pods", str(traces[1])
    )
    assert_one_line_error(proc, "bestest", "binpack", "fgd")


@pytest.mark.parametrize(
    ("which", "text", "needle"),
    [
        ("pods", "name,cpu_milli,memory_mib,num_gpu,gpu_milli\np1,1000,1,0,0\n", "no pod asks"),
        ("nodes", "sn,cpu_milli,memory_mib,gpu,model\nn1,32000,131072,0,\n", "no node has"),
    ],
)
def test_fill_needs_gpus_on_both_sides(
    tmp_path: Path, traces: tuple[Path, Path], which: str, text: str, needle: str
) -> None:
    # Tuning to 130 % of the GPUs by GPU request has nothing to go by without them.
    bad = tmp_path / f"{which}-without-gpus.csv"
    bad.write_text(text)
    nodes, pods = (bad, traces[1]) if which == "nodes" else (traces[0], bad)
    proc = run_cli("simulate", "--nodes", str(nodes), "--pods", str(pods))
    assert_one_line_error(proc, f"--{which} {bad}", needle)


@pytest.mark.parametrize("loads", ["-5", "80,-10", "eighty", "0"])
def test_bad_loads(loads: str, traces: tuple[Path, Path]) -> None:
    proc = run_cli(
        "simulate", f"--loads={loads}", "--nodes", str(traces[0]), "--pods", str(traces[1])
    )
    assert_one_line_error(proc, "--loads")


@pytest.mark.parametrize("option", ["--clusters=0", "--seeds=-1", "--workers=x"])
def test_bad_counts(option: str, traces: tuple[Path, Path]) -> None:
    proc = run_cli("simulate", option, "--nodes", str(traces[0]), "--pods", str(traces[1]))
    assert_one_line_error(proc, option.split("=", maxsplit=1)[0])


def test_fill_json_and_dump(tmp_path: Path, traces: tuple[Path, Path]) -> None:
    dump = tmp_path / "placements.jsonl"
    proc = run_cli(
        "simulate", "--protocol", "fill", "--nodes", str(traces[0]), "--pods", str(traces[1]),
        "--policy", "binpack", "--policy", "fgd", "--clusters", "2", "--seed", "3",
        "--json", "--dump-placements", str(dump),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert (doc["protocol"], doc["nodes"], doc["gpus"], doc["clusters"], doc["seed"]) == (
        "fill", 9, 42, 2, 3,
    )  # fmt: skip
    assert {(r["policy"], r["load_pct"]) for r in doc["results"]} == {
        (p, load) for p in ("binpack", "fgd") for load in (80, 90, 100, 110, 130)
    }
    for row in doc["results"]:
        assert 0 <= row["gpu_alloc_pct"] <= 100
    final = {r["policy"]: r for r in doc["results"] if r["load_pct"] == 130}
    lines = [json.loads(line) for line in dump.read_text().splitlines()]
    # One line per placed pod, for both policies, with the documented fields.
    assert len(lines) == final["binpack"]["placed"] + final["fgd"]["placed"]
    keys = {
        "pod",
        "cluster",
        "node",
        "gpu_index",
        "num_gpu",
        "gpu_milli",
        "cpu_milli",
        "memory_mib",
    }
    assert all(set(line) == keys for line in lines)
    assert all(line["cluster"] in ("cluster-0", "cluster-1") for line in lines)
    assert all((line["gpu_index"] is None) == (line["gpu_milli"] in (0, 1000)) for line in lines)
