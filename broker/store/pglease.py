"""Leader election's statements on PostgreSQL (broker.service.leader.PostgresLease), each
timed by the database's clock, and the fence a replica's job writes check (see
PostgresStore.fence)."""

from __future__ import annotations

from typing import Final

import asyncpg

# One statement, timed by the database's clock: insert, or take over a row that expired or
# is already ours (a restarted replica with the same identity); no row returned otherwise.
ACQUIRE: Final = (
    "INSERT INTO leases (name, holder, expires_at) "
    "VALUES ($1, $2, now() + make_interval(secs => $3)) "
    "ON CONFLICT (name) DO UPDATE SET holder = EXCLUDED.holder, "
    "expires_at = EXCLUDED.expires_at "
    "WHERE leases.expires_at < now() OR leases.holder = EXCLUDED.holder "
    "RETURNING holder"
)
RENEW: Final = (
    "UPDATE leases SET expires_at = now() + make_interval(secs => $3) "
    "WHERE name = $1 AND holder = $2 AND expires_at >= now() RETURNING holder"
)
HOLDER: Final = "SELECT holder FROM leases WHERE name = $1 AND expires_at >= now()"
RELEASE: Final = "DELETE FROM leases WHERE name = $1 AND holder = $2"
# The holder holds the lease unexpired; key-share-locks its row until the write commits.
FENCE: Final = (
    "SELECT 1 FROM leases WHERE name = $1 AND holder = $2 AND expires_at > now() FOR KEY SHARE"
)


async def hold(
    pool: asyncpg.Pool, statement: str, name: str, holder: str, seconds: float
) -> str | None:
    """Run ACQUIRE or RENEW: the holder when it took, else the live one (None: nobody)."""
    held = await pool.fetchval(statement, name, holder, float(seconds))
    if held is not None:
        return str(held)
    live = await pool.fetchval(HOLDER, name)
    return None if live is None else str(live)


__all__ = ["ACQUIRE", "FENCE", "HOLDER", "RELEASE", "RENEW", "hold"]
