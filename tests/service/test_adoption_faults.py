"""Adopting and following after a restart fail down the one launch-failure path too
(invariant 9), against the member that fails on cue (``tests/launch_faults.py``): a gang a
restarted broker found Placed, whose adoption fails, is rolled back with backoff
(``stage="adopt"``) and launches once the member recovers; a running workload restored
from its workload object (its recorded plan) and its pods, whose status can no longer be
read, is followed a few polls more, then
rolled back (its Job and pods deleted, its GPUs freed) rather than held with nothing
following it. The books agree throughout."""

from __future__ import annotations

from pathlib import Path

import kmock as kmocklib
import pytest
from builders import Clock, until
from launch_faults import FaultyMember, books
from test_kube_service import manifest as gang_manifest
from test_launch_faults import (
    JOB,
    T0,
    broker,
    clock,
    failures,
    member,
    our_pods,
    placed,
    run,
)
from test_workload_service import JOBS, NS, live
from test_workload_service import manifest as workload_manifest

__all__ = ["clock", "member"]  # fixtures, from the launch fault tests
pytestmark = pytest.mark.kmock(cls=FaultyMember)
SERVICES = kmocklib.resource("", "v1", "services")


async def test_a_placed_gang_whose_adoption_fails_backs_off_then_launches(
    member: FaultyMember, tmp_path: Path, clock: Clock
) -> None:
    first = await broker(member, tmp_path, clock)
    try:
        await first.submit("team-a", gang_manifest("train"))
        await placed(first)
        await until(lambda: bool(our_pods(member)))  # created, not yet running
    finally:
        await first.close()
    # Its pod is read back (the job is restored, Placed) but its rendezvous Service is gone:
    # the adoption creates it again, and the member cannot take it now.
    del member.objects[SERVICES, NS, "rdzv-train"]
    member.inject("create", "unavailable")
    clock.now = T0 + 10
    second = await broker(member, tmp_path, clock)
    try:
        await until(lambda: failures(second, "transient", stage="adopt") == 1)
        await second.launches_done(timeout=30)
        record = await second.get("team-a", "train")
        assert (record.state, record.attempts, record.not_before) == ("Queued", 1, T0 + 70)
        assert record.reason.startswith("launch failed: create service fedbroker-team-a/rdzv")
        await until(lambda: not books(second, member) and not our_pods(member))
        member.recover()
        clock.now = T0 + 70
        await run(second, member, "gang", attempt=2)
        assert (await second.get("team-a", "train")).state == "Running"
        assert not books(second, member)
    finally:
        member.recover()
        await second.close()


async def test_a_restored_workload_whose_status_cannot_be_read_is_rolled_back(
    member: FaultyMember, tmp_path: Path, clock: Clock
) -> None:
    first = await broker(member, tmp_path, clock)
    try:
        await first.submit("team-a", workload_manifest("train", "Job"))
        await run(first, member, "Job", attempt=1)
    finally:
        await first.close()
    second = await broker(member, tmp_path, clock)
    try:
        launch = second.lifecycle.get(JOB)
        assert launch is not None and launch.running  # restored from its plan and pods, followed
        assert not books(second, member)
        clock.now = T0 + 30
        job = live(member, JOBS)["train"]
        job.patch({"status": None})  # the server's defaulted status removed, then
        job.patch({"status": "not an object"})  # one the broker cannot read
        await until(lambda: failures(second, "error", stage="follow") == 1)
        await second.runs_done(timeout=30)
        record = await second.get("team-a", "train")
        assert (record.state, record.attempts, record.not_before) == ("Queued", 1, T0 + 90)
        assert record.reason == (
            "run no longer followed in east: unexpected AttributeError (see the broker's log)"
            "; retry in 60s"
        )
        assert "train" not in live(member, JOBS) and not our_pods(member)
        await until(lambda: not books(second, member))
        assert not second.ledger.reservations() and second.lifecycle.get(JOB) is None
    finally:
        await second.close()
