"""PostgreSQL's driver errors mapped onto the store's, the URL's secrets kept out of every
message, and what the server's setup says to the operator (``autovacuum_warning``).

Anything that means "the server cannot be used right now" (refused or dropped connections,
timeouts, shutdown, too many clients, a read-only standby after failover, bad credentials)
becomes ``StoreUnavailable``, so the service reports not-ready and retries; every other
server error is a ``StoreError``. Messages name the store by its redacted URL and have the
password scrubbed from driver text as a second guard.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Final
from urllib.parse import parse_qsl, unquote, urlsplit

import asyncpg
import asyncpg.exceptions as pgerr

from broker.store import StoreError, StoreUnavailable

UNAVAILABLE: Final = (
    OSError,  # refused, unreachable, DNS
    TimeoutError,  # connect or command timeout (asyncio.TimeoutError is the same class)
    asyncpg.InterfaceError,  # connection closed under us
    # A query sent on a connection the server has just terminated can trip asyncpg's
    # protocol state check before the EOF is seen; the pool drops that connection.
    pgerr.InternalClientError,
    pgerr.PostgresConnectionError,  # class 08
    pgerr.OperatorInterventionError,  # class 57: admin shutdown, cannot connect now
    pgerr.InsufficientResourcesError,  # class 53: too many connections, disk full
    pgerr.InvalidAuthorizationSpecificationError,  # class 28: fixed by config, not code
    pgerr.InvalidCatalogNameError,  # the database does not exist (yet)
    pgerr.ReadOnlySQLTransactionError,  # connected to a standby after a failover
)


class _PoolReconnectsWithoutTraceback(logging.Filter):
    """asyncpg's pool logs a warning with a full traceback each time it fails to reconnect
    its minimum of connections, every second while the server is down or restarting. That
    is expected (the store reports it as StoreUnavailable, the service as not-ready), not a
    bug: such a record keeps its message and the error's one-line summary, not the trace."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, UNAVAILABLE):
            record.msg = f"{record.getMessage()}: {type(exc).__name__}: {exc}"
            record.args = None
            record.exc_info = None
            record.exc_text = None
        return True


POOL_LOG_FILTER: Final = _PoolReconnectsWithoutTraceback()


def secrets_in(url: str) -> list[str]:
    """Every spelling of a password in ``url`` (userinfo or query, raw and decoded)."""
    try:
        parts = urlsplit(url)
        found = [parts.password or ""]
        found += [v for k, v in parse_qsl(parts.query) if k.lower() in ("password", "sslpassword")]
    except ValueError:
        return []
    found += [unquote(s) for s in found]
    return sorted({s for s in found if s}, key=len, reverse=True)


def scrub(exc: BaseException, secrets: Sequence[str]) -> str:
    """The error as one line, every secret replaced. Drivers do not put the password in
    messages today; this keeps it that way."""
    text = f"{type(exc).__name__}: {exc}"
    for secret in secrets:
        text = text.replace(secret, "***")
    return text


@contextmanager
def translated(what: str, secrets: Sequence[str]) -> Iterator[None]:
    """Driver errors inside become the store's: ``{what} failed: {scrubbed error}``."""
    try:
        yield
    except StoreError:
        raise
    except UNAVAILABLE as exc:
        raise StoreUnavailable(f"{what} failed: {scrub(exc, secrets)}") from exc
    except asyncpg.PostgresError as exc:
        raise StoreError(f"{what} failed: {scrub(exc, secrets)}") from exc


def autovacuum_warning(setting: str | None) -> str | None:
    """What to tell the operator about the server's ``autovacuum`` setting, if anything.
    Every transition leaves a dead row version behind (``state`` is indexed: no HOT
    update), so without autovacuum the job tables and their indexes grow without bound and
    every write slows down (a soak at 200 jobs/s left 86,000 dead rows beside 23,000 live
    ones after 150 s)."""
    if setting == "on":
        return None
    return (
        f"autovacuum is {setting or 'unknown'} on the server: the jobs and job_history "
        "tables will bloat and writes slow down; turn it on, or VACUUM them regularly"
    )


async def reset_connection(conn: asyncpg.Connection) -> None:
    """What a connection back in the pool needs here: no transaction left open. asyncpg's
    default reset also unlocks advisory locks, closes cursors, unlistens and resets settings,
    none of which the store leaves behind (its only advisory lock is transaction-scoped), in
    one more round trip per write."""
    if conn.is_in_transaction():
        await conn.execute("ROLLBACK")


__all__ = [
    "POOL_LOG_FILTER",
    "UNAVAILABLE",
    "autovacuum_warning",
    "reset_connection",
    "scrub",
    "secrets_in",
    "translated",
]
