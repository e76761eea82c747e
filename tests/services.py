"""Real services for the tests: a fresh PostgreSQL database per use.

Tests that need a service use it when it is reachable and skip with a reason when it is not,
except under FEDBROKER_REQUIRE_SERVICES=1 (as .ci/run sets), where they fail instead.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import pytest

from broker.store import redact_url

PG_URL = os.environ.get("FEDBROKER_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test")


@asynccontextmanager
async def postgres_database(prefix: str = "fedbroker_test") -> AsyncIterator[str]:
    """A fresh database on the test server, dropped on exit; yields its URL."""
    try:
        admin = await asyncpg.connect(PG_URL, timeout=5)
    except (OSError, TimeoutError, asyncpg.PostgresError) as exc:
        reason = f"PostgreSQL at {redact_url(PG_URL)} is unreachable: {exc}"
        if os.environ.get("FEDBROKER_REQUIRE_SERVICES") == "1":
            pytest.fail(f"{reason} (FEDBROKER_REQUIRE_SERVICES=1)")
        pytest.skip(reason)
    name = f"{prefix}_{secrets.token_hex(6)}"
    await admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield urlunsplit(urlsplit(PG_URL)._replace(path=f"/{name}"))
    finally:
        # FORCE: a killed process (a broker, a child writer) may leave a backend behind.
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.close()
