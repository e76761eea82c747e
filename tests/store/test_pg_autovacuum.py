"""Opening a PostgreSQL store warns, in one line, when the server's autovacuum is off:
every transition leaves a dead row behind, and without it the job tables grow without
bound."""

from __future__ import annotations

import logging

import asyncpg
import pytest
from services import postgres_database

from broker.store.pgerrors import autovacuum_warning
from broker.store.postgres import PostgresStore


@pytest.mark.parametrize(
    ("setting", "warns"), [("on", False), ("off", True), (None, True), ("", True)]
)
def test_the_warning_says_what_to_do_unless_autovacuum_is_on(
    setting: str | None, warns: bool
) -> None:
    text = autovacuum_warning(setting)
    assert (text is not None) == warns
    if text is not None:
        assert text.startswith("autovacuum is ") and "VACUUM" in text and "\n" not in text


async def test_opening_warns_exactly_when_the_server_has_it_off(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async with postgres_database() as url:
        conn = await asyncpg.connect(url)
        try:
            setting = await conn.fetchval("SHOW autovacuum")
        finally:
            await conn.close()
        store = PostgresStore(url)
        with caplog.at_level(logging.WARNING, logger="broker.store.postgres"):
            await store.open()
            await store.close()
    warned = [r.getMessage() for r in caplog.records if "autovacuum is" in r.getMessage()]
    assert len(warned) == (0 if setting == "on" else 1)
    assert all(store.url_for_logs in line for line in warned)
