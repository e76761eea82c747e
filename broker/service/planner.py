"""Where dry runs are computed (``POST /v1/plan`` and explain's per-cluster rows):
``Planner``, one worker thread behind bounded admission, each run on a time budget.

Why a thread rather than slices on the event loop: a policy's decision is one synchronous
call, and a long one cannot yield inside without every policy being rewritten; the finest
slice the loop could have is one whole decision, and the costliest decisions (a
maximum-size gang that fits nowhere, tried pod by pod on every node) last seconds. In a
thread, the loop keeps serving everyone else while it runs. It is safe because the worker
reads only what nobody changes: the ledger's snapshot (its cluster views are frozen when
the snapshot is taken on the loop, and the ledger copies a view before its next write to
it), the Job (a frozen dataclass), a policy instance made for this dry run alone (the
scheduler's own keep memos and a random generator the cycle uses on the loop) and, for
explain, copies of the queue's heaps and maps (``JobQueue.position_frame``). The ``work``
a caller hands over must read nothing else. One worker only: pure-Python work
holds the GIL, so a second thread would add no throughput and take the interpreter from
the loop more often; with one, the loop waits at most one switch interval for it (1 ms
under ``fedbroker serve``, ``broker.process``).

The bounds (``api.plans``): the caller's tenant has at most ``perTenant`` dry runs
admitted (waiting or running), all tenants together at most ``maxWaiting`` waiting behind
the one running; beyond either, ``PlanBusy``. The running one stops when its budget
(``budgetSeconds``) is spent, ``OverBudget`` (``broker.service.budget``). Both are a 429
with Retry-After at the API. A dry run whose caller went away is dropped while it waits
and stopped at its next budget check while it runs; its slot is given back only when the
worker is done with it, so the work queued for the thread never exceeds the bounds.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from broker.config import PlanLimits
from broker.service.budget import Budget, PlanRefused

T = TypeVar("T")

# A busy refusal's Retry-After: most dry runs take well under a second (the budget bounds
# the rest), and a client asking again sooner than that is refused as cheaply again.
BUSY_RETRY_AFTER_SECONDS = 1


class PlanBusy(PlanRefused):
    """The caller's tenant has its dry runs under way already, or too many are waiting."""


class Planner:
    """One worker thread for dry runs, with the bounds of the module's docstring."""

    def __init__(self, limits: PlanLimits, clock: Callable[[], float] = time.monotonic) -> None:
        self.limits = limits
        self._clock = clock
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="fedbroker-plan")
        self._admitted: Counter[str] = Counter()
        self._budgets: set[Budget] = set()

    @property
    def admitted(self) -> int:
        """Dry runs waiting or running now."""
        return len(self._budgets)

    async def run(self, caller: str, work: Callable[[Budget], T]) -> T:
        """``work(budget)`` in the worker thread, the budget started as it starts (``work``
        checks it, e.g. through ``budgeted`` snapshots); raises PlanBusy at once when the
        bounds are reached, OverBudget when the budget runs out. ``work`` must read only
        data nobody changes meanwhile."""
        budget = Budget(self.limits.budget_seconds, self._clock)
        self._admit(caller, budget)
        try:
            future = self._executor.submit(_work, budget, work)
        except BaseException:
            self._release(caller, budget)
            raise
        loop = asyncio.get_running_loop()
        future.add_done_callback(lambda _: _call_soon(loop, lambda: self._release(caller, budget)))
        try:
            return await asyncio.wrap_future(future)
        except asyncio.CancelledError:
            if future.cancel():  # still waiting: it will never run
                self._release(caller, budget)
            else:
                budget.abandon()  # running: it stops at its next check
            raise

    def _admit(self, caller: str, budget: Budget) -> None:
        limits = self.limits
        if self._admitted[caller] >= limits.per_tenant:
            raise PlanBusy(
                f"plan: tenant {caller!r} has {limits.per_tenant} dry runs (plan, explain) "
                f"under way, its limit (api.plans.perTenant); retry after "
                f"{BUSY_RETRY_AFTER_SECONDS} s",
                BUSY_RETRY_AFTER_SECONDS,
            )
        if len(self._budgets) > limits.max_waiting:
            raise PlanBusy(
                f"plan: {limits.max_waiting} dry runs are waiting for the planner "
                f"(api.plans.maxWaiting); retry after {BUSY_RETRY_AFTER_SECONDS} s",
                BUSY_RETRY_AFTER_SECONDS,
            )
        self._admitted[caller] += 1
        self._budgets.add(budget)

    def _release(self, caller: str, budget: Budget) -> None:
        if budget not in self._budgets:
            return  # released already (a waiting one cancelled by its caller)
        self._budgets.discard(budget)
        self._admitted[caller] -= 1
        if self._admitted[caller] <= 0:
            del self._admitted[caller]

    def close(self) -> None:
        """Stop: the waiting dry runs are dropped, the running one stops at its next check."""
        for budget in self._budgets:
            budget.abandon()
        self._executor.shutdown(wait=False, cancel_futures=True)


def _work(budget: Budget, work: Callable[[Budget], T]) -> T:
    """In the worker thread: the budget starts when the work does, not while it waits."""
    budget.check()  # abandoned while waiting
    budget.start()
    return work(budget)


def _call_soon(loop: asyncio.AbstractEventLoop, release: Callable[[], None]) -> None:
    """The worker is done with a dry run (from its thread, or the loop's for a cancelled
    waiting one): its slot is given back on the loop, which owns the counts."""
    with contextlib.suppress(RuntimeError):  # a closed loop: nothing is counted any more
        loop.call_soon_threadsafe(release)


__all__ = ["BUSY_RETRY_AFTER_SECONDS", "PlanBusy", "Planner"]
