"""Which placed or running jobs fail over when their member is lost, and what the lifecycle
does with them (issue 14, item 5): an injected clock, no I/O."""

from __future__ import annotations

import pytest
from builders import Clock, federation, job, node, placement, pod, pod_set
from hypothesis import given
from hypothesis import strategies as st

from broker.config.tenancy import QueueConfig
from broker.core.failover import due
from broker.core.lifecycle import Lifecycle, LifecycleSettings
from broker.core.queue import JobQueue, Pending, QueueSpec


def setup(clock: Clock) -> tuple[Lifecycle, JobQueue]:
    ledger = federation({"east": [node("e1", gpus=4)], "west": [node("w1", gpus=4)]})
    queue = JobQueue([QueueSpec("fast"), QueueSpec("slow"), QueueSpec("off")])
    lifecycle = Lifecycle(ledger, queue, LifecycleSettings())
    for name, q, cluster, host in [
        ("a", "fast", "east", "e1"), ("b", "slow", "east", "e1"),
        ("c", "off", "east", "e1"), ("d", "fast", "west", "w1"),
    ]:  # fmt: skip
        pending = Pending(job(name, pod_set("worker", 1, gpus=1), queue=q), 1, 0.0, attempts=2)
        pl = placement(f"default/{name}", cluster, pod(f"{name}-0", host, [0 if name < "c" else 1]))
        if name == "b":
            pl = placement("default/b", cluster, pod("b-0", host, [2]))
        ledger.assume(pl)
        lifecycle.placed(pending, pl, clock())
    lifecycle.all_running("default/a", clock())
    return lifecycle, queue


BOUNDS = {"fast": 60.0, "slow": 600.0, "off": None}


@pytest.mark.parametrize(
    ("stale_for", "expected"),
    [(None, []), (0.0, []), (59.9, []), (60.0, ["default/a"]), (599.0, ["default/a"]),
     (600.0, ["default/a", "default/b"]), (10_000.0, ["default/a", "default/b"])],
)  # fmt: skip
def test_jobs_fail_over_once_their_queues_bound_has_passed(
    stale_for: float | None, expected: list[str]
) -> None:
    clock = Clock(1_000.0)
    lifecycle, _ = setup(clock)
    since = {} if stale_for is None else {"east": clock.now - stale_for}
    lost = due(lifecycle.launches(), since, BOUNDS, clock.now)
    assert [lo.launch.placement.job for lo in lost] == expected  # never c (off), never d (west)
    for lo in lost:
        assert lo.cluster == "east" and "cluster east lost" in lo.reason
        assert lo.reason.startswith("FailedOver:")


def test_off_by_default() -> None:
    assert QueueConfig.model_validate({"name": "q"}).failover_after_seconds is None
    clock = Clock(1_000.0)
    lifecycle, _ = setup(clock)
    off = {"fast": None, "slow": None, "off": None}
    assert due(lifecycle.launches(), {"east": 0.0, "west": 0.0}, off, clock.now) == []


@pytest.mark.parametrize("bad", [0, 29, 86_401, -1])
def test_the_bound_is_bounded(bad: int) -> None:
    with pytest.raises(ValueError, match="failoverAfterSeconds"):
        QueueConfig.model_validate({"name": "q", "failoverAfterSeconds": bad})


def test_fail_over_requeues_at_once_keeping_attempts_and_releases_the_member() -> None:
    clock = Clock(1_000.0)
    lifecycle, queue = setup(clock)
    ledger = lifecycle._ledger
    clock.now += 700
    for key in ("default/a", "default/b"):  # running and still launching
        outcome = lifecycle.fail_over(key, clock.now, "FailedOver: cluster east lost")
        assert outcome is not None and outcome.state == "Queued"
        assert outcome.attempts == 2 and outcome.not_before == clock.now
        pending = queue.get(key)
        assert pending is not None and pending.attempts == 2
        assert lifecycle.get(key) is None
    assert lifecycle.fail_over("default/a", clock.now, "again") is None
    assert set(ledger.reservations()) == {"default/c", "default/d"}
    # east now holds only c's GPU: a's (bound) and b's (reserved) are released.
    assert ledger.snapshot().clusters["east"].free_milli() == 3000


@given(
    east=st.none() | st.integers(0, 100_000),
    west=st.none() | st.integers(0, 100_000),
    bounds=st.fixed_dictionaries(
        {q: st.none() | st.floats(30, 86_400) for q in ("fast", "slow", "off")}
    ),
)
def test_a_job_fails_over_exactly_when_its_member_was_stale_for_its_bound(
    east: int | None, west: int | None, bounds: dict[str, float | None]
) -> None:
    clock = Clock(200_000.0)
    lifecycle, _ = setup(clock)
    stale_for = {"east": east, "west": west}
    since = {c: clock.now - s for c, s in stale_for.items() if s is not None}
    lost = {lo.launch.placement.job for lo in due(lifecycle.launches(), since, bounds, clock.now)}
    for launch in lifecycle.launches():
        stale = stale_for[launch.placement.cluster]
        bound = bounds[launch.pending.job.queue]
        expected = stale is not None and bound is not None and stale >= bound
        assert (launch.placement.job in lost) == expected
