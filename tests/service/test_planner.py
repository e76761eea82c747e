"""The dry runs' planner (broker/service/planner.py) and their time budget
(broker/service/budget.py): a budget that is not spent changes no answer (hypothesis), one
that is stops the policy mid-decision, the bounds on admitted dry runs hold per tenant and
in all, a caller that goes away frees its slot only once the worker is done with it, and
the worker reads the snapshot as it was taken while the ledger changes under it.

The worker thread is held with threading events the test sets, never with sleeps; the
budget's clock is injected and counts its calls."""

from __future__ import annotations

import asyncio
import functools
import threading
from collections.abc import Callable

import pytest
from builders import federation, gang, nodes, occupy
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.config import PlanLimits
from broker.core.ledger import Ledger
from broker.model import CapacitySnapshot, Job
from broker.service.budget import Abandoned, Budget, OverBudget, budgeted
from broker.service.explain import Plan, plan_of, plan_work
from broker.service.planner import PlanBusy, Planner
from policies import POLICY_NAMES, make_policy

# A gate the test holds a computation at; a bound so a broken test fails instead of hanging.
GATE_SECONDS = 30.0


class Counting:
    """A clock that moves ``step`` seconds on every call, and counts the calls."""

    def __init__(self, step: float = 1.0) -> None:
        self.calls = 0
        self.step = step

    def __call__(self) -> float:
        self.calls += 1
        return self.calls * self.step


def limits(**given: float) -> PlanLimits:
    return PlanLimits.model_validate({"budgetSeconds": 2.0, **given})


def two_clusters() -> Ledger:
    return federation({"a": nodes("a", 6, gpus=8), "b": nodes("b", 4, gpus=4)})


def plan(job: Job, policy: str) -> Callable[[CapacitySnapshot], Plan]:
    return functools.partial(plan_of, job, make_policy(policy))


@settings(max_examples=60, deadline=None)
@given(
    policy=st.sampled_from(POLICY_NAMES),
    sizes=st.lists(st.integers(0, 6), min_size=1, max_size=3),
    taken=st.integers(0, 40),
    pods=st.integers(1, 12),
    gpus=st.integers(1, 8),
)
def test_a_budget_that_is_not_spent_changes_no_answer(
    policy: str, sizes: list[int], taken: int, pods: int, gpus: int
) -> None:
    ledger = federation({f"c{i}": nodes(f"c{i}", n) for i, n in enumerate(sizes)})
    for i in range(min(taken, sizes[0] * 8)):  # fill the first cluster GPU by GPU
        occupy(ledger, "c0", f"c0-{i // 8}", [i % 8])
    job = gang("train", pods=pods, gpus=gpus)
    snapshot = ledger.snapshot()
    budget = Budget(1e9, Counting())
    budget.start()
    assert plan(job, policy)(budgeted(snapshot, budget)) == plan(job, policy)(snapshot)


def test_a_spent_budget_stops_the_policy_mid_decision() -> None:
    ledger = federation({f"c{i}": nodes(f"c{i}", 50, gpus=8) for i in range(3)})
    job = gang("huge", pods=2000, gpus=1)  # fits no cluster: binpack tries every pod
    whole = Counting(step=0.0)
    never = Budget(1.0, whole)
    never.start()
    plan(job, "binpack")(budgeted(ledger.snapshot(), never))
    assert whole.calls > 1000  # the budget is checked for every pod the policy places

    clock = Counting(step=1.0)
    budget = Budget(5.0, clock)
    budget.start()  # t=1: the deadline is t=6
    with pytest.raises(OverBudget) as refused:
        plan(job, "binpack")(budgeted(ledger.snapshot(), budget))
    assert clock.calls == 7  # five checks within the budget, the sixth past it
    assert str(refused.value).startswith("plan: stopped after its budget of 5 s")
    assert refused.value.retry_after == 5


def test_an_abandoned_budget_stops_at_the_next_check() -> None:
    budget = Budget(1e9, Counting(step=0.0))
    budget.start()
    budget.check()
    budget.abandon()
    with pytest.raises(Abandoned):
        budget.check()


class Held:
    """Work the worker runs only as far as the test lets it: it says when it has started,
    then waits for ``go`` (and sees, at its budget check, whether its caller gave up)."""

    def __init__(self, result: str = "done") -> None:
        self.started = threading.Event()
        self.go = threading.Event()
        self.result = result
        self.outcome: str | None = None

    def __call__(self, budget: Budget) -> str:
        self.started.set()
        assert self.go.wait(GATE_SECONDS)
        try:
            budget.check()
        except Abandoned:
            self.outcome = "abandoned"
            raise
        self.outcome = "finished"
        return self.result

    async def running(self) -> None:
        assert await asyncio.to_thread(self.started.wait, GATE_SECONDS)


async def test_admitted_dry_runs_are_bounded_per_tenant_and_in_all() -> None:
    planner = Planner(limits(perTenant=2, maxWaiting=1))
    first, second = Held("first"), Held("second")
    try:
        running = asyncio.create_task(planner.run("team-a", first))
        await first.running()
        waiting = asyncio.create_task(planner.run("team-a", second))
        await asyncio.sleep(0)  # the task runs up to its await: admitted, waiting
        assert planner.admitted == 2

        with pytest.raises(PlanBusy) as own:  # team-a has its two
            await planner.run("team-a", Held())
        assert "tenant 'team-a' has 2 dry runs (plan, explain) under way" in str(own.value)
        assert own.value.retry_after == 1
        with pytest.raises(PlanBusy) as everyone:  # one running, one waiting: the bound
            await planner.run("team-b", Held())
        assert "1 dry runs are waiting for the planner (api.plans.maxWaiting)" in str(
            everyone.value
        )
        assert not second.started.is_set()

        first.go.set()
        second.go.set()
        assert (await running, await waiting) == ("first", "second")
        assert planner.admitted == 0
        assert await planner.run("team-b", lambda budget: "free again") == "free again"
    finally:
        planner.close()


async def test_a_caller_that_goes_away_frees_its_slot_once_the_worker_is_done() -> None:
    planner = Planner(limits(perTenant=2, maxWaiting=4))
    running, waiting = Held(), Held()
    try:
        first = asyncio.create_task(planner.run("team-a", running))
        await running.running()
        second = asyncio.create_task(planner.run("team-a", waiting))
        await asyncio.sleep(0)
        first.cancel()
        second.cancel()
        for task in (first, second):
            with pytest.raises(asyncio.CancelledError):
                await task
        # The waiting one is dropped at once; the running one holds its slot until the
        # worker stops it at its next budget check.
        assert planner.admitted == 1
        running.go.set()
        # One worker, in order: this runs once the abandoned one has stopped.
        assert await planner.run("team-b", lambda budget: "next") == "next"
        assert (running.outcome, waiting.outcome) == ("abandoned", None)
        assert not waiting.started.is_set()
        assert planner.admitted == 0
    finally:
        planner.close()


async def test_the_worker_reads_the_snapshot_as_it_was_taken() -> None:
    planner = Planner(limits())
    ledger = two_clusters()
    job = gang("train", pods=6, gpus=8)  # exactly cluster a's six nodes
    held = Held()
    work = plan_work(job, make_policy("gang"), ledger.snapshot())

    def after_hold(budget: Budget) -> Plan:
        held(budget)
        return work(budget)

    try:
        task = asyncio.create_task(planner.run("team-a", after_hold))
        await held.running()
        for i in range(6):  # the live ledger fills cluster a while the worker reads
            occupy(ledger, "a", f"a-{i}", range(8))
        held.go.set()
        then = await task
        assert then.placement is not None and then.placement.cluster == "a"
        now = await planner.run("team-a", plan_work(job, make_policy("gang"), ledger.snapshot()))
        assert now.placement is None
        assert [(r.cluster, r.largest_fit) for r in now.clusters] == [("a", 0), ("b", 0)]
    finally:
        planner.close()


async def test_a_closed_planner_stops_its_running_dry_run() -> None:
    planner = Planner(limits())
    held = Held()
    task = asyncio.create_task(planner.run("team-a", held))
    await held.running()
    planner.close()
    held.go.set()
    with pytest.raises(Abandoned):
        await task
    assert held.outcome == "abandoned"
