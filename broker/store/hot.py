"""The registry of the statements the broker sends often: what tests/store/
test_query_plans.py checks for full scans on both backends."""

from __future__ import annotations

from typing import Any

from broker.store import JobRecord, Placing
from broker.store.batch import (
    Move,
    NewJob,
    insert_new_jobs,
    move_jobs,
    moved_rows,
    moving_jobs,
    place_jobs,
    queued_among,
    update_jobs,
)
from broker.store.migrations import Dialect
from broker.store.sql import (
    Statement,
    active_jobs,
    count_active,
    delete_finished_job,
    finished_since,
    generations,
    history,
    insert_job,
    list_jobs,
    purge_finished_jobs,
    purge_generations,
    select_job,
    state_of,
    update_job,
)


def hot_statements(dialect: Dialect) -> dict[str, Statement]:
    """Every statement the broker sends often, built by the functions the backends call
    (sample arguments): tests/store/test_query_plans.py fails if one needs a full scan of a
    table. A new statement on a hot path belongs here too."""

    def listing(**filters: Any) -> Statement:
        every: dict[str, Any] = {"tenant": None, "queue": None, "state": None, "cluster": None}
        return list_jobs(dialect, **{**every, **filters}, limit=100, after_seq=10)

    update = update_job(
        dialect, "team-a", "job-1", "Running", "pods running", 50.0, cluster="c", placement=None,
        expected=("Placed",), attempts=None, not_before=None,
    )  # fmt: skip
    moves = [
        JobRecord("team-a", "job-1", "q", 1, {}, "Placed", "c", None, 1, None, "", 40.0, 45.0, 7),
        JobRecord("team-b", "job-2", "q", 1, {}, "Running", "c", None, 1, None, "", 40.0, 45.0, 9),
    ]
    placings = [
        Placing(7, "c", {"cluster": "c", "nodes": {"n1": 1}}, 0, "placed on c"),
        Placing(9, "d", {"cluster": "d", "nodes": {"n2": 1}}, 1, "placed on d"),
    ]
    fenced = {} if dialect == "sqlite" else _fenced(dialect, placings)
    one_row = {} if dialect == "postgres" else {  # SQLite's transition_many, place_many
        "moving": moving_jobs(moves), "moved rows": moved_rows("[7, 9]"),
        "queued among": queued_among(placings),
    }  # fmt: skip
    return {
        **fenced,
        **one_row,
        "insert": insert_job(dialect, "team-a", "job-new", "q", 1, {"spec": {}}, 50.0),
        "get": select_job(dialect, "team-a", "job-1"),
        "state of": state_of(dialect, "team-a", "job-1"),
        "transition": update,
        "transition many": update_jobs(dialect, moves, "Queued", "requeued", 50.0),
        "place many": place_jobs(dialect, placings, 50.0),
        "insert many": insert_new_jobs(dialect, _NEW_JOBS),
        "move many": move_jobs(dialect, _MOVES),
        "list": listing(),
        "list by state": listing(state=("Queued", "Placed")),
        "list by tenant": listing(tenant="team-a"),
        "list by tenant and state": listing(tenant="team-a", state="Running"),
        "list by queue": listing(queue="q"),
        "list by cluster": listing(cluster="c"),
        "history": history(dialect, "team-a", "job-1"),
        "active jobs": active_jobs(dialect),
        "active jobs page": active_jobs(dialect, after_seq=10, limit=1000),
        "count active": count_active(dialect, "team-a"),
        "generations": generations(dialect, "team-a", "job-1"),
        "purge finished": purge_finished_jobs(dialect, 40.0, 1000),
        "purge generations": purge_generations(dialect, 40.0),
        "finished since": finished_since(dialect, 40.0, 10_000),
        "delete finished": delete_finished_job(dialect, "team-a", "job-1"),
    }


def _fenced(dialect: Dialect, placings: list[Placing]) -> dict[str, Statement]:
    """PostgreSQL's fenced statements (SQLite's writer lock is the fence there)."""
    lease = ("scheduler", "host-a:8080")
    return {
        "fenced transition": update_job(
            dialect,
            "team-a",
            "job-1",
            "Running",
            "pods running",
            50.0,
            cluster="c",
            placement=None,
            expected=("Placed",),
            attempts=None,
            not_before=None,
            fence=lease,
        ),
        "fenced place many": place_jobs(dialect, placings, 50.0, fence=lease),
        "fenced insert": insert_new_jobs(dialect, _NEW_JOBS, lease),
        "fenced move": move_jobs(dialect, _MOVES, lease),
    }


_NEW_JOBS = (
    NewJob("team-a", "job-new", "q", 1, "{}", 50.0),
    NewJob("team-b", "x", "q", 1, "{}", 50.0),
)
_MOVES = (
    Move("team-a", "job-1", "Running", "up", 50.0, ("Placed",)),
    Move("team-b", "job-2", "Failed", "gone", 50.0, None, 2, 60.0),
)


__all__ = ["hot_statements"]
