"""The store's schema: one ordered list of versioned migrations shared by both backends.

Each migration is a version number and a tuple of DDL statements written once, with a few
``{placeholders}`` for the types the two dialects spell differently (the auto-numbered
``seq`` key, JSON columns, 64-bit integers, floats). ``render`` expands them for
``"sqlite"`` or ``"postgres"``; everything else is portable SQL, so the two schemas cannot
drift apart. The backends apply the pending ones in a single transaction under a lock
(SQLite: ``BEGIN IMMEDIATE``; PostgreSQL: an advisory transaction lock) and record each
version once in ``schema_migrations``; re-opening an up-to-date database applies nothing.

Rules for adding a migration: append, never edit a released one; a new version is the last
version plus one; statements must be transactional DDL/DML in both dialects (no
``CREATE INDEX CONCURRENTLY``, no ``VACUUM``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from broker.store import StoreError

Dialect = Literal["sqlite", "postgres"]

# Why per dialect: SQLite needs INTEGER PRIMARY KEY AUTOINCREMENT for a key that is never
# reused (FIFO order must survive deletes and restarts); PostgreSQL spells that an identity
# column. JSON is TEXT in SQLite and JSONB in PostgreSQL (queryable, validated on write).
_TYPES: dict[Dialect, dict[str, str]] = {
    "sqlite": {
        "seq_key": "INTEGER PRIMARY KEY AUTOINCREMENT",
        "id_key": "INTEGER PRIMARY KEY AUTOINCREMENT",
        "json": "TEXT",
        "int64": "INTEGER",
        "float": "REAL",
    },
    "postgres": {
        "seq_key": "BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY",
        "id_key": "BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY",
        "json": "JSONB",
        "int64": "BIGINT",
        "float": "DOUBLE PRECISION",
    },
}

# The bookkeeping table itself is created outside the numbered list (it has to exist before
# we can ask which versions are applied), inside the same locked transaction.
SCHEMA_MIGRATIONS_DDL = (
    "CREATE TABLE IF NOT EXISTS schema_migrations ("
    " version INTEGER PRIMARY KEY,"
    " name TEXT NOT NULL)"
)

_STATES_CHECK = "('Queued', 'Placed', 'Running', 'Succeeded', 'Failed', 'Cancelled')"


def _sqlite_history_trigger(event: str) -> str:
    return (
        f"CREATE TRIGGER jobs_history_{event.lower()} AFTER {event} ON jobs BEGIN "
        "INSERT INTO job_history (tenant, name, at, state, reason, cluster) "
        "VALUES (NEW.tenant, NEW.name, NEW.updated_at, NEW.state, NEW.reason, NEW.cluster); "
        "END"
    )


@dataclass(frozen=True, slots=True)
class Migration:
    version: int
    name: str
    statements: tuple[str, ...]

    # Statements only one dialect can spell (triggers), applied after the shared ones.
    per_dialect: tuple[tuple[Dialect, str], ...] = ()

    def render(self, dialect: Dialect) -> tuple[str, ...]:
        shared = tuple(statement.format(**_TYPES[dialect]) for statement in self.statements)
        return shared + tuple(sql for d, sql in self.per_dialect if d == dialect)


MIGRATIONS: tuple[Migration, ...] = (
    Migration(
        1,
        "jobs and job_history",
        (
            f"""CREATE TABLE jobs (
                seq {{seq_key}},
                tenant TEXT NOT NULL,
                name TEXT NOT NULL,
                queue TEXT NOT NULL,
                priority {{int64}} NOT NULL,
                manifest {{json}} NOT NULL,
                state TEXT NOT NULL CHECK (state IN {_STATES_CHECK}),
                cluster TEXT,
                placement {{json}},
                attempts INTEGER NOT NULL DEFAULT 0,
                not_before {{float}},
                reason TEXT NOT NULL DEFAULT '',
                created_at {{float}} NOT NULL,
                updated_at {{float}} NOT NULL,
                UNIQUE (tenant, name)
            )""",
            # active_jobs() and the state filter of list_jobs; (state, seq) keeps FIFO order
            # without a sort.
            "CREATE INDEX jobs_state_seq ON jobs (state, seq)",
            "CREATE INDEX jobs_queue_seq ON jobs (queue, seq)",
            "CREATE INDEX jobs_cluster_seq ON jobs (cluster, seq)",
            # (tenant, seq) serves per-tenant listing; the UNIQUE index is on (tenant, name).
            "CREATE INDEX jobs_tenant_seq ON jobs (tenant, seq)",
            f"""CREATE TABLE job_history (
                id {{id_key}},
                tenant TEXT NOT NULL,
                name TEXT NOT NULL,
                at {{float}} NOT NULL,
                state TEXT NOT NULL CHECK (state IN {_STATES_CHECK}),
                reason TEXT NOT NULL,
                cluster TEXT,
                FOREIGN KEY (tenant, name) REFERENCES jobs (tenant, name) ON DELETE CASCADE
            )""",
            "CREATE INDEX job_history_job ON job_history (tenant, name, id)",
        ),
    ),
    Migration(
        2,
        "job_history written by triggers",
        (),
        # Every insert or update of a job row is a state transition; the database records
        # it in job_history in the same statement. A write is then one statement, atomic on
        # its own, which lets the SQLite backend's group commit skip a savepoint per write.
        per_dialect=(
            ("sqlite", _sqlite_history_trigger("INSERT")),
            ("sqlite", _sqlite_history_trigger("UPDATE")),
            (
                "postgres",
                """CREATE FUNCTION job_history_record() RETURNS trigger
                LANGUAGE plpgsql AS $$
                BEGIN
                    INSERT INTO job_history (tenant, name, at, state, reason, cluster)
                    VALUES (NEW.tenant, NEW.name, NEW.updated_at, NEW.state, NEW.reason,
                            NEW.cluster);
                    RETURN NULL;
                END $$""",
            ),
            (
                "postgres",
                "CREATE TRIGGER jobs_history_insert AFTER INSERT ON jobs "
                "FOR EACH ROW EXECUTE FUNCTION job_history_record()",
            ),
            (
                "postgres",
                "CREATE TRIGGER jobs_history_update AFTER UPDATE ON jobs "
                "FOR EACH ROW EXECUTE FUNCTION job_history_record()",
            ),
        ),
    ),
    Migration(
        3,
        "leader election leases",
        (),
        # broker/leader.py: one row per lease, timed by the database's clock. PostgreSQL
        # only: replicas on SQLite (one machine) elect with an OS file lock instead.
        per_dialect=(
            (
                "postgres",
                "CREATE TABLE leases ("
                " name TEXT PRIMARY KEY,"
                " holder TEXT NOT NULL,"
                " expires_at TIMESTAMPTZ NOT NULL)",
            ),
        ),
    ),
    Migration(
        4,
        "job generations, retention and per-tenant caps",
        (
            # A finished job's name may be submitted again: the new submission is
            # the next generation of the name; the finished one moves to job_generations
            # (its record and history as JSON) and the live row is replaced.
            "ALTER TABLE jobs ADD COLUMN generation {int64} NOT NULL DEFAULT 1",
            """CREATE TABLE job_generations (
                tenant TEXT NOT NULL,
                name TEXT NOT NULL,
                generation {int64} NOT NULL,
                record {json} NOT NULL,
                history {json} NOT NULL,
                finished_at {float} NOT NULL,
                PRIMARY KEY (tenant, name, generation)
            )""",
            # Retention (Store.purge_finished) finds old finished jobs and generations fast.
            "CREATE INDEX job_generations_finished ON job_generations (finished_at)",
            "CREATE INDEX jobs_state_updated ON jobs (state, updated_at)",
            # count_active, on every submission (the tenant's cap of active jobs).
            "CREATE INDEX jobs_tenant_state ON jobs (tenant, state)",
        ),
    ),
    Migration(
        5,
        "active jobs by seq",
        (
            # The rebuild after a restart reads the active jobs in pages by seq
            # (Store.active_jobs); a partial index holds just them, in seq order, so a page
            # costs its own rows however many finished jobs the table keeps. (The
            # (state, seq) index serves one state; three states in seq order need a sort of
            # every active job for each page.) The states are literals: the statements
            # spell them the same way (sql.ACTIVE_LITERALS), which is how both planners
            # know the index applies.
            "CREATE INDEX jobs_active_seq ON jobs (seq) "
            "WHERE state IN ('Queued', 'Placed', 'Running')",
        ),
    ),
    Migration(
        6,
        "the lease holder as a key",
        (),
        # Job writes fence themselves with FOR KEY SHARE on the lease row (PostgresStore.
        # fence): a renewal (an UPDATE of expires_at only) then never waits for them, while
        # a takeover (an UPDATE of holder, a column of this unique index: a key update)
        # and a release (DELETE) still wait for every write in flight. With FOR SHARE,
        # renewals queued behind a stream of overlapping writes and starved: the soak's
        # leader lost its lease at 300 jobs/s.
        per_dialect=(
            ("postgres", "CREATE UNIQUE INDEX leases_name_holder ON leases (name, holder)"),
        ),
    ),
    Migration(
        7,
        "fewer index entries per transition",
        (
            # Every transition changes state and updated_at, so (state, updated_at) and
            # (tenant, state) each lost and gained an entry on every one (on PostgreSQL,
            # where no transition is a HOT update, every index gains one). Retention reads
            # only finished jobs and count_active only active ones: partial indexes hold
            # just those, so a job enters the first once (its final transition) and the
            # second once (its submission), and leaves it once. The states are literals,
            # as migration 5's (sql.FINAL_LITERALS, sql.ACTIVE_LITERALS).
            "DROP INDEX jobs_state_updated",
            "CREATE INDEX jobs_finished_updated ON jobs (updated_at) "
            "WHERE state IN ('Succeeded', 'Failed', 'Cancelled')",
            "DROP INDEX jobs_tenant_state",
            "CREATE INDEX jobs_tenant_active ON jobs (tenant) "
            "WHERE state IN ('Queued', 'Placed', 'Running')",
        ),
    ),
    Migration(
        8,
        "history without a foreign key on PostgreSQL",
        (),
        # Every history row (one per submission and transition) made PostgreSQL check its
        # job exists with a query it plans once per connection: without statistics (a fresh
        # database, before autovacuum first analyzes it) it chose the (tenant, seq) index,
        # which ties with the unique (tenant, name) one at that size, and then scanned all
        # of the tenant's jobs for each row: 1.2 ms per insert with 6,000 jobs, growing with
        # every one (100,000 jobs had not loaded after 23 minutes). The history is written
        # only by the triggers, from the row just written, so the check proves nothing; the
        # cascade it gave, deleting a job's history with its row, is spelled out in the two
        # statements that delete jobs (sql.delete_finished_job, sql.purge_finished_jobs).
        # SQLite checks a foreign key through the parent's unique index without a planner,
        # so its key stays.
        per_dialect=(
            ("postgres", "ALTER TABLE job_history DROP CONSTRAINT job_history_tenant_name_fkey"),
        ),
    ),
)


def check_order(migrations: Sequence[Migration]) -> None:
    """Versions must be 1, 2, 3, ... so that "applied up to N" means one thing everywhere."""
    for expected, migration in enumerate(migrations, start=1):
        if migration.version != expected:
            raise StoreError(
                f"migration list is out of order: found version {migration.version} "
                f"where {expected} was expected"
            )


def pending(migrations: Sequence[Migration], applied: Sequence[int]) -> list[Migration]:
    """The migrations still to apply, given the versions a database already has.

    A database that knows a version this code does not is refused rather than used: an
    older broker writing to a newer schema is how rolling deploys corrupt data.
    """
    check_order(migrations)
    known = {m.version for m in migrations}
    unknown = sorted(set(applied) - known)
    if unknown:
        raise StoreError(
            f"database schema has version(s) {unknown} that this broker does not know "
            f"(it knows up to {len(migrations)}); upgrade the broker"
        )
    done = set(applied)
    return [m for m in migrations if m.version not in done]


Execute = Callable[[str, Sequence[Any]], Awaitable[object]]
_SELECT_VERSIONS = "SELECT version FROM schema_migrations ORDER BY version"
_RECORD: dict[Dialect, str] = {
    "sqlite": "INSERT INTO schema_migrations (version, name) VALUES (?, ?)",
    "postgres": "INSERT INTO schema_migrations (version, name) VALUES ($1, $2)",
}


async def migrate(
    dialect: Dialect,
    migrations: Sequence[Migration],
    execute: Execute,
    versions: Callable[[str], Awaitable[Sequence[int]]],
    failed: Callable[[Migration, Exception], None],
) -> None:
    """Bring a database up to date inside the caller's locked transaction: the bookkeeping
    table, then each pending migration's statements and its version row. ``failed`` sees
    a failing statement's error first: it raises the store's error for a driver's one."""
    await execute(SCHEMA_MIGRATIONS_DDL, ())
    for migration in pending(migrations, await versions(_SELECT_VERSIONS)):
        try:
            for statement in migration.render(dialect):
                await execute(statement, ())
        except Exception as exc:
            failed(migration, exc)
            raise
        await execute(_RECORD[dialect], (migration.version, migration.name))
