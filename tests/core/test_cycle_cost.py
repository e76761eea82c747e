"""A scheduling cycle's work does not grow with the jobs already running (issue 15).

Work is counted, not timed: every Python and C function call made during the cycle
(``sys.setprofile``), so the test fails on a walk over the live jobs however fast the
machine is. The same federation and the same waiting jobs, with 100 and then 2,000 jobs
running (half of them in a reclaimable queue, so preemption is possible and its bound is
asked for): the cycle's calls must be the same, within a small constant."""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable
from types import FrameType
from typing import Any

from builders import federation, gang, nodes, single

from broker.core.lifecycle import Lifecycle, LifecycleSettings
from broker.core.queue import JobQueue, Pending, QueueSpec
from broker.core.scheduler import PolicyBook, SchedulerSettings, run_cycle
from broker.core.shapes import UnplaceableShapes
from broker.model import Placement

QUEUES = [QueueSpec("serve", reclaimable=True), QueueSpec("train", priority=1)]


def calls_during(work: Callable[[], object]) -> int:
    count = 0

    def profile(_frame: FrameType, event: str, _arg: Any) -> None:
        nonlocal count
        if event in ("call", "c_call"):
            count += 1

    sys.setprofile(profile)
    try:
        work()
    finally:
        sys.setprofile(None)
    return count


def world(running: int) -> tuple[JobQueue, Any, Lifecycle, PolicyBook, UnplaceableShapes]:
    """Two clusters of 300 8-GPU nodes, ``running`` one-GPU jobs running, ten waiting jobs
    (eight that fit, two 64-node gangs that never do)."""
    ledger = federation({"east": nodes("e", 300), "west": nodes("w", 300)})
    queue = JobQueue(QUEUES)
    lifecycle = Lifecycle(ledger, queue, LifecycleSettings())
    policies = PolicyBook(queue)
    settings = SchedulerSettings()
    for i in range(running):
        job = dataclasses.replace(single(f"run-{i}"), queue=QUEUES[i % 2].name, priority=i % 3)
        queue.push(Pending(job, i, 0.0))
    result = run_cycle(
        queue, ledger, policies, 0.0, dataclasses.replace(settings, max_jobs_per_cycle=running or 1)
    )
    for pending, placement in result.admitted:
        lifecycle.placed(pending, placement, 0.0)
        lifecycle.all_running(placement.job, 1.0)
    assert len(lifecycle) == running and not len(queue)
    for i in range(8):
        queue.push(Pending(dataclasses.replace(single(f"new-{i}"), queue="train"), 10_000 + i, 2.0))
    for i in range(2):
        big = dataclasses.replace(gang(f"huge-{i}", 640, gpus=8), queue="train", priority=5)
        queue.push(Pending(big, 20_000 + i, 2.0))
    return queue, ledger, lifecycle, policies, UnplaceableShapes()


def cycle_calls(running: int) -> tuple[int, list[Placement]]:
    queue, ledger, lifecycle, policies, memo = world(running)
    settings = SchedulerSettings()
    # A first cycle learns the unplaceable shapes; the second is the one measured.
    run_cycle(queue, ledger, policies, 3.0, settings, lifecycle=lifecycle, memo=memo)
    for i in range(8):
        queue.push(
            Pending(dataclasses.replace(single(f"more-{i}"), queue="train"), 30_000 + i, 4.0)
        )
    out: list[Placement] = []

    def one_cycle() -> None:
        lifecycle.expired(5.0)
        result = run_cycle(queue, ledger, policies, 5.0, settings, lifecycle=lifecycle, memo=memo)
        out.extend(p for _, p in result.admitted)

    return calls_during(one_cycle), out


def test_a_cycles_work_does_not_grow_with_the_running_jobs() -> None:
    few, placed_few = cycle_calls(100)
    many, placed_many = cycle_calls(2_000)
    # Same decisions either way: the eight new single-GPU jobs placed, the gangs not.
    assert len(placed_few) == len(placed_many) == 8
    # Twenty times the running jobs, the same work (a walk over them would add >= 1,900).
    assert abs(many - few) <= max(200, few // 20), (few, many)
