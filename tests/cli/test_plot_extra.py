"""matplotlib is the optional extra ``fedbroker[plot]``: the broker never imports it (the
service's image carries no plotting stack), and ``--plot`` without it is refused in one line
naming the extra, exit status 2, before any run starts.

Each case runs in a subprocess, so that what it imports (or cannot) is its own; a missing
matplotlib is made by ``sys.modules["matplotlib"] = None``, which makes both
``importlib.util.find_spec`` and ``import`` see no such package.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from test_simulate_cli import NODES, PODS

ROOT = Path(__file__).resolve().parents[2]
HINT = "pip install 'fedbroker[plot]'"

WITHOUT_MATPLOTLIB = """
import sys
sys.modules["matplotlib"] = None
from broker.cli.main import main
raise SystemExit(main(sys.argv[1:]))
"""

# What `fedbroker serve` imports and builds, started and closed on the demo's federation.
SERVE_IMPORTS = """
import asyncio, json, sys, tempfile
from pathlib import Path
from broker.cli.main import build_parser
from broker.cli.runtime import serve
from broker.config import demo_config
from broker.http.app import make_app
from broker.service.facade import Service

build_parser()
config = demo_config(Path(tempfile.mkdtemp()), {"team-a": "a", "team-b": "b", "admin": "c"})

async def main() -> None:
    service = Service(config)
    make_app(service, config)
    await service.start()
    await service.close()

asyncio.run(main())
print(json.dumps(sorted(m for m in sys.modules if m.partition(".")[0] == "matplotlib")))
"""


def python(code: str, *args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        capture_output=True, text=True, check=False, cwd=cwd, timeout=120,
    )  # fmt: skip


@pytest.mark.parametrize(
    "args",
    [
        ["simulate", "--protocol", "fill", "--loads", "50"],
        ["simulate", "--protocol", "replay", "--policy", "gang"],
        ["bench", "--soak", "--clusters", "1", "--nodes-per-cluster", "2", "--jobs", "1"],
    ],
    ids=["simulate-fill", "simulate-replay", "bench-soak"],
)
def test_plot_without_matplotlib_is_one_line_naming_the_extra(
    args: list[str], tmp_path: Path
) -> None:
    png = tmp_path / "out.png"
    proc = python(WITHOUT_MATPLOTLIB, *args, "--plot", str(png))
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("fedbroker: error: argument --plot: needs matplotlib")
    assert lines[0].endswith(HINT), lines[0]
    assert proc.stdout == ""  # refused before the run, not after it
    assert not png.exists()


def test_plot_with_matplotlib_is_accepted(tmp_path: Path) -> None:
    """The check refuses only a missing matplotlib (here it is installed: `make test`)."""
    nodes, pods, png = tmp_path / "nodes.csv", tmp_path / "pods.csv", tmp_path / "fill.png"
    nodes.write_text(NODES)
    pods.write_text(PODS)
    proc = python(
        "from broker.cli.main import main; import sys; raise SystemExit(main(sys.argv[1:]))",
        *("simulate", "--nodes", str(nodes), "--pods", str(pods), "--loads", "50"),
        *("--plot", str(png)),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert png.read_bytes().startswith(b"\x89PNG")


def test_serve_never_imports_matplotlib() -> None:
    """The CLI's parser (every command registered), the service and its app, started and
    closed: no matplotlib module is loaded."""
    proc = python(SERVE_IMPORTS)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]", proc.stdout


def test_the_import_check_sees_matplotlib_when_something_imports_it() -> None:
    """The check above can fail: the same probe after a plotting import names it."""
    proc = python(SERVE_IMPORTS.replace("build_parser()", "build_parser()\nimport broker.sim.plot"))
    assert proc.returncode == 0, proc.stderr
    assert "matplotlib" in proc.stdout
