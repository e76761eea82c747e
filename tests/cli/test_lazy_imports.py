"""A broker of simulated members never imports ``kubernetes``: it is most of a start's imports
(about a second of ``fedbroker serve``'s time to ready), so the Kubernetes adapters import it
only when a Kubernetes member, a kubeconfig or a Cluster API pool is actually used.

Each check runs in a fresh interpreter (``sys.modules`` of this test process holds whatever
other tests imported); a control run shows the check does see ``kubernetes`` when a
Kubernetes adapter is used.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# What `fedbroker serve` imports, then a Service on the demo federation (simulated clusters
# and a simulated burst pool) started, elected and closed, on a SQLite store.
_SERVE = """
import asyncio, json, sys, tempfile
from pathlib import Path
import broker.cli.main, broker.cli.runtime
from broker.config import demo_config
from broker.http.app import make_app
from broker.service.facade import Service

async def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        tokens = {"team-a": "tok-a", "team-b": "tok-b", "admin": "tok-admin"}
        config = demo_config(Path(tmp), tokens)
        service = Service(config)
        make_app(service, config)
        await service.start()
        assert service.leading
        await service.close()

asyncio.run(main())
{extra}
print(json.dumps(sorted(m for m in sys.modules if m.split(".")[0] == "kubernetes")))
"""


def _kubernetes_modules(extra: str = "") -> list[str]:
    done = subprocess.run(
        [sys.executable, "-c", _SERVE.replace("{extra}", extra)],
        cwd=ROOT, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    found: list[str] = json.loads(done.stdout.strip().splitlines()[-1])
    return found


def test_a_broker_of_simulated_members_never_imports_kubernetes() -> None:
    assert _kubernetes_modules() == []


def test_the_check_sees_kubernetes_once_a_kubernetes_adapter_is_used() -> None:
    found = _kubernetes_modules("import adapters.kube.launch")
    assert "kubernetes.aio.client" in found
