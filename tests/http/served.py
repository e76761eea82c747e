"""A broker served over the HTTP API for a test: the real ``Service`` on a config of the
test's own (``{db}`` in its text becomes a SQLite file in the test's folder), started on a
test clock, behind aiohttp's test server; closed with the test."""

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
