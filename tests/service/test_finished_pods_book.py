"""The finished-pods book a new leader refills from the store (``FinishedPods.restore``):
which stored jobs count as having pods kept, and that their time runs from their end, not
from the restart. The service around it: test_kube_finished_pods."""

from __future__ import annotations

import pytest

from broker.service.finished_pods import FinishedPods
from broker.store import JobRecord, JobState


def record(name: str, state: JobState, cluster: str | None, ended: float) -> JobRecord:
    return JobRecord("team-a", name, "q", 1, {}, state, cluster, None, 0, None, "", 1.0, ended, 1)


@pytest.mark.parametrize(
    ("state", "cluster", "kept"),
    [
        ("Succeeded", "east", True),  # a run that ended: its pods stay for their logs
        ("Failed", "east", True),
        ("Cancelled", "east", False),  # its pods were deleted when it was cancelled
        ("Failed", None, False),  # never placed (refused, or failed before a launch)
    ],
)
def test_which_finished_jobs_have_their_pods_kept(
    state: JobState, cluster: str | None, kept: bool
) -> None:
    book = FinishedPods(600.0, lambda: 100.0)
    assert book.restore([record("job", state, cluster, 90.0)]) == int(kept)
    assert book.live("east") == ({"team-a/job"} if kept else set())


def test_the_retention_runs_from_each_jobs_end() -> None:
    now = [1000.0]
    book = FinishedPods(600.0, lambda: now[0])
    book.restore(
        [record("early", "Succeeded", "east", 450.0), record("late", "Failed", "west", 900.0)]
    )
    assert book.live("east") == {"team-a/early"} and book.live("west") == {"team-a/late"}
    now[0] = 1050.0  # 600 s after early ended
    assert [k.placement.job for k in book.due()] == ["team-a/early"]
    assert book.live("east") == set() and book.live("west") == {"team-a/late"}
    kept = book.get("team-a/late")
    assert kept is not None and (kept.placement.cluster, kept.launch) == ("west", None)
