"""A broker served over the HTTP API for a test: the real ``Service`` on a config of the
test's own (``{db}`` in its text becomes a SQLite file in the test's folder), started on a
test clock, behind aiohttp's test server; closed with the test. ``federation`` writes the
admission tests' config: one simulated cluster, a gang queue and tenants with tokens."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from aiohttp.test_utils import TestClient, TestServer
from builders import Clock

from broker.config import parse_config
from broker.http.app import make_app
from broker.service.facade import Service

Client = TestClient[Any, Any]


def token(tenant: str) -> str:
    """The static token ``federation`` gives tenant ``team-<tenant>``."""
    return f"tok-{tenant}-".ljust(32, "0")


def bearer(tenant: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token(tenant)}"}


_FEDERATION = """\
store: {url: "sqlite:///{db}"}
clusters:
- name: small-a
  source:
    simulated: {shapes: [{gpuType: A100, gpus: 8, cpu: "CPU", memory: 1024Gi, count: 2}]}
queues:
- {name: training, policy: gang}
tenants:
"""


def federation(*tenants: str, cpu: str = "96") -> str:
    """A config for ``served``: one simulated cluster of two 8-GPU A100 nodes of ``cpu``
    cores, a gang queue ``training`` and, for each entry (``"a"``, or ``"r: podSecurity:
    restricted"``: a name, then settings as in a YAML flow mapping), tenant
    ``team-<name>`` with its token (``bearer``)."""
    text = _FEDERATION.replace("CPU", cpu)
    for entry in tenants:
        name, _, settings = entry.partition(":")
        more = f", {settings.strip()}" if settings.strip() else ""
        text += f"- {{name: team-{name}, defaultQueue: training{more}, "
        text += f"token: {{value: {token(name)}}}}}\n"
    return text.replace("{", "{{").replace("}", "}}").replace("{{db}}", "{db}")


@asynccontextmanager
async def served(config_text: str, folder: Path) -> AsyncIterator[tuple[Client, Service]]:
    config = parse_config(config_text.format(db=folder / "jobs.db"), "test config")
    service = Service(config, clock=Clock())
    await service.start()
    client: Client = TestClient(TestServer(make_app(service, config)))
    await client.start_server()
    try:
        yield client, service
    finally:
        await client.close()
        await service.close()
