"""The simulated launcher's run ends: one heap of deadlines and one loop timer for every
running job (``adapters.simulated.launcher._Ends``). Every end not cancelled is delivered
once, never before its run time, in deadline order; a cancelled one never is."""

from __future__ import annotations

import asyncio
import itertools

from builders import placement, pod
from hypothesis import given, settings
from hypothesis import strategies as st

from adapters.simulated.launcher import _DUE_SLACK_SECONDS, DELETED_KEPT, SimulatedLauncher
from broker.ports import RunEnd

RUNS = st.lists(
    st.tuples(st.integers(min_value=0, max_value=25), st.booleans()),  # (run ms, cancelled)
    min_size=1, max_size=30,
)  # fmt: skip


async def scenario(runs: list[tuple[int, bool]]) -> None:
    ms = {f"t/j{i}": run for i, (run, _) in enumerate(runs)}
    launcher = SimulatedLauncher(run_seconds=lambda p: ms[p.job] / 1000)
    loop = asyncio.get_running_loop()
    delivered: list[tuple[str, float]] = []
    owed = {f"t/j{i}" for i, (_, cancelled) in enumerate(runs) if not cancelled}
    all_in = loop.create_future()
    started: dict[str, float] = {}
    watched: dict[str, float] = {}

    def on_end(job: str):  # type: ignore[no-untyped-def]
        def ended(end: RunEnd) -> None:
            assert end.succeeded
            delivered.append((job, loop.time()))
            if {j for j, _ in delivered} >= owed and not all_in.done():
                all_in.set_result(None)

        return ended

    handles = {}
    for i in range(len(runs)):
        key = f"t/j{i}"
        gang = placement(key, "sim", pod(f"t.j{i}-0", "n1", [0]))
        await launcher.launch(gang)
        # The launcher reads the loop's clock inside watch(): its deadline is bracketed by
        # the two reads here, whatever the machine does between them (a preempted test
        # process put a deadline after the next one's).
        started[key] = loop.time()
        handles[key] = launcher.watch(gang, on_end(key))
        watched[key] = loop.time()
    for i, (_, cancelled) in enumerate(runs):
        if cancelled:
            handles[f"t/j{i}"].cancel()
    if owed:
        async with asyncio.timeout(5):
            await all_in
    jobs = [job for job, _ in delivered]
    assert sorted(jobs) == sorted(owed)  # each owed end once, no cancelled one
    for job, at in delivered:
        assert at >= started[job] + ms[job] / 1000 - _DUE_SLACK_SECONDS
        assert job not in launcher.running  # its pods are gone once it ended
    # In deadline order (deadlines a timer's slack apart may swap): each end's earliest
    # possible deadline is at most the next one's latest.
    for a, b in itertools.pairwise(jobs):
        assert started[a] + ms[a] / 1000 <= watched[b] + ms[b] / 1000 + _DUE_SLACK_SECONDS


@settings(max_examples=40, deadline=None)
@given(RUNS)
def test_every_end_not_cancelled_arrives_once_in_deadline_order(
    runs: list[tuple[int, bool]],
) -> None:
    asyncio.run(scenario(runs))


async def test_the_record_of_deletions_keeps_only_the_latest() -> None:
    launcher = SimulatedLauncher()
    for i in range(DELETED_KEPT + 5):
        gang = placement(f"t/d{i}", "sim", pod(f"t.d{i}-0", "n1", [0]))
        await launcher.launch(gang)
        await launcher.delete(gang)
    assert len(launcher.deleted) == DELETED_KEPT  # a months-long run does not grow it
    assert launcher.deleted[0] == "t/d5" and launcher.deleted[-1] == f"t/d{DELETED_KEPT + 4}"
    assert not launcher.running
