"""A member's permanent refusals of a launch (invariant 9): ``Lifecycle.roll_back`` with
``refused`` releases the reservation as any rollback does and backs the job off with
Kueue's backoff, until the ``refusal_limit``-th refusal fails it; other failures back off
without counting toward that limit."""

from __future__ import annotations

import pytest
from builders import federation, gang, nodes
from hypothesis import given, settings
from hypothesis import strategies as st
from test_scheduling import Harness

from broker.core.lifecycle import Lifecycle, LifecycleSettings, Outcome
from broker.core.queue import Pending

JOB = "default/g"
REASON = "launch refused by c: create pod g-worker-0: HTTP 422 Invalid: bad"


def harness(refusal_limit: int, backoff_limit: int | None = None) -> Harness:
    ledger = federation({"c": nodes("n", 1, gpus=8)})
    h = Harness(ledger)
    limits = LifecycleSettings(backoff_limit=backoff_limit, refusal_limit=refusal_limit)
    h.lifecycle = Lifecycle(ledger, h.queue, limits)
    h.queue.push(Pending(gang("g", pods=1, gpus=8), 0, 0.0))
    return h


def attempt(h: Harness, now: float, refused: bool) -> Outcome:
    """Place the job at ``now`` (its backoff over) and roll it back 5 s later."""
    assert h.cycle(now) == [JOB]
    outcome = h.lifecycle.roll_back(JOB, now + 5, REASON if refused else "timeout", refused=refused)
    assert outcome is not None
    assert h.ledger.reservations() == {}  # released, whatever the outcome
    return outcome


# (failures in order: True a refusal, False another failure; the refusal limit) -> each
# outcome's (state, the end of its reason, its backoff in seconds or None when it failed).
TABLE = [
    pytest.param([True, True, True], 3, [
        ("Queued", "; refusal 1 of 3; retry in 60s", 60.0),
        ("Queued", "; refusal 2 of 3; retry in 120s", 120.0),
        ("Failed", "; refused 3 times", None),
    ], id="three refusals fail the job"),
    pytest.param([True], 1, [("Failed", "; refused 1 times", None)], id="limit 1: at once"),
    pytest.param([False, True, False, True], 2, [
        ("Queued", "timeout; retry in 60s", 60.0),
        ("Queued", "; refusal 1 of 2; retry in 120s", 120.0),
        ("Queued", "timeout; retry in 240s", 240.0),
        ("Failed", "; refused 2 times", None),
    ], id="other failures back off without counting"),
    pytest.param([False] * 4, 1, [
        ("Queued", f"timeout; retry in {60 * 2**i}s", 60.0 * 2**i) for i in range(4)
    ], id="no refusal never fails"),
]  # fmt: skip


@pytest.mark.parametrize(("failures", "limit", "expected"), TABLE)
def test_the_refusal_limit_fails_the_job(
    failures: list[bool], limit: int, expected: list[tuple[str, str, float | None]]
) -> None:
    h = harness(refusal_limit=limit)
    now, got = 0.0, []
    for refused in failures:
        outcome = attempt(h, now, refused)
        backoff = None if outcome.not_before is None else outcome.not_before - (now + 5)
        got.append((outcome.state, outcome.reason.removeprefix(REASON), backoff))
        now = outcome.not_before or now
    assert got == expected
    if got[-1][0] == "Failed":
        assert len(h.queue) == 0 and h.lifecycle.get(JOB) is None


def test_the_backoff_limit_still_applies_to_refusals() -> None:
    h = harness(refusal_limit=5, backoff_limit=1)
    assert attempt(h, 0.0, refused=True).state == "Queued"
    second = attempt(h, 65.0, refused=True)
    assert second.state == "Failed" and second.reason.endswith("backoff limit 1 reached")


@settings(max_examples=60, deadline=None)
@given(st.lists(st.booleans(), min_size=1, max_size=8), st.integers(1, 4))
def test_a_job_fails_exactly_at_its_limit_th_refusal(failures: list[bool], limit: int) -> None:
    h = harness(refusal_limit=limit)
    now, refusals = 0.0, 0
    for refused in failures:
        outcome = attempt(h, now, refused)
        refusals += refused
        assert (outcome.state == "Failed") == (refusals >= limit)
        if outcome.state == "Failed":
            return
        now = outcome.not_before or now
