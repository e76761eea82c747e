"""The queue, the scheduling cycle and the gang lifecycle, on an injected clock."""

from __future__ import annotations

import dataclasses

import pytest
from builders import ClusterSpec, federation, gang, node, nodes, single
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.core.ledger import Ledger
from broker.core.lifecycle import Lifecycle, LifecycleSettings
from broker.core.queue import JobQueue, Pending, QueueSpec, backoff_seconds
from broker.core.scheduler import PolicyBook, SchedulerSettings, run_cycle
from broker.core.shapes import UnplaceableShapes
from broker.model import Job, NodeUpdated, PolicyName, ReasonCode


def queued(
    job: Job, seq: int, *, queue: str = "default", priority: int = 0, at: float = 0.0
) -> Pending:
    return Pending(dataclasses.replace(job, queue=queue, priority=priority), seq, at)


def free_milli(ledger: Ledger) -> dict[str, int]:
    return {name: view.free_milli() for name, view in ledger.snapshot().clusters.items()}


class Harness:
    def __init__(
        self, ledger: Ledger, queues: list[QueueSpec] | None = None, **settings: float
    ) -> None:
        self.ledger = ledger
        self.queue = JobQueue(queues or [QueueSpec("default")])
        self.policies = PolicyBook(self.queue)
        self.settings = SchedulerSettings(
            starvation_seconds=settings.get("starvation", 600.0),
            max_held_gangs=int(settings.get("held_gangs", 1)),
        )
        self.lifecycle = Lifecycle(ledger, self.queue, LifecycleSettings(backoff_limit=None))

    def cycle(self, now: float) -> list[str]:
        result = run_cycle(
            self.queue, self.ledger, self.policies, now, self.settings, lifecycle=self.lifecycle
        )
        self.preempted = [outcome for _, outcome in result.preempted]
        for pending, placement in result.admitted:
            self.lifecycle.placed(pending, placement, now)
        return [p.job.key for p, _ in result.admitted]


@pytest.mark.parametrize(
    ("attempts", "expected"),
    [(0, 0.0), (1, 60.0), (2, 120.0), (3, 240.0), (6, 1920.0), (7, 3600.0), (30, 3600.0)],
)
def test_backoff_is_kueues(attempts: int, expected: float) -> None:
    assert backoff_seconds(attempts) == expected


def test_order_is_priority_then_queue_priority_then_fair_share_then_fifo() -> None:
    queue = JobQueue([QueueSpec("hi", priority=10), QueueSpec("a"), QueueSpec("b")])
    capacity = {"A100": 16_000}
    queue.charge("x", "a", {"A100": 8_000})  # queue a already holds half the A100s
    jobs = [
        queued(single("late-b"), 5, queue="b"),
        queued(single("early-b"), 1, queue="b"),
        queued(single("a"), 0, queue="a"),
        queued(single("hi"), 9, queue="hi"),
        queued(single("urgent"), 10, queue="a", priority=5),
    ]
    for p in jobs:
        queue.push(p)
    order = [p.job.name for p in queue.ordered(0.0, capacity)]
    assert order == ["urgent", "hi", "early-b", "late-b", "a"]


def test_backed_off_jobs_wait_their_turn() -> None:
    queue = JobQueue([QueueSpec("default")])
    p = queued(single("j"), 0)
    p.not_before = 100.0
    queue.push(p)
    assert queue.ordered(99.9, {}) == []
    assert [x.job.name for x in queue.ordered(100.0, {})] == ["j"]


def test_two_gangs_never_double_book_the_only_node() -> None:
    h = Harness(federation({"c": nodes("n", 1, gpus=8)}))
    h.queue.push(queued(gang("g1", pods=2, gpus=4), 0))
    h.queue.push(queued(gang("g2", pods=2, gpus=4), 1))
    assert h.cycle(0.0) == ["default/g1"]
    assert len(h.queue) == 1 and free_milli(h.ledger) == {"c": 0}


def test_small_jobs_backfill_around_a_waiting_gang() -> None:
    h = Harness(federation({"c": nodes("n", 2, gpus=4)}))
    h.queue.push(queued(gang("big", pods=3, gpus=4), 0))
    h.queue.push(queued(single("small", gpus=1), 1))
    assert h.cycle(0.0) == ["default/small"]


def test_a_starving_gang_holds_its_closest_cluster() -> None:
    # a: 3 nodes, two taken (the gang could get 1 of its 3 pods there); b: 1 node half taken.
    ledger = federation(
        {
            "a": ClusterSpec(nodes("a", 3, gpus=8), labels={"c": "a"}),
            "b": ClusterSpec(nodes("b", 1, gpus=8), labels={"c": "b"}),
        }
    )
    h = Harness(ledger, starvation=300.0)
    for i, (cluster, gpus) in enumerate([("a", 8), ("a", 8), ("b", 4)]):
        filler = dataclasses.replace(single(f"fill{i}", gpus=gpus), cluster_selector={"c": cluster})
        h.queue.push(queued(filler, i))
    h.cycle(0.0)
    assert free_milli(ledger) == {"a": 8000, "b": 4000}
    h.queue.push(queued(gang("big", pods=3, gpus=8), 10, at=0.0))
    # Before the bound, binpack puts a small job in the fullest cluster: a, the gang's.
    h.queue.push(queued(single("early", gpus=1), 11))
    assert h.cycle(10.0) == ["default/early"]
    assert ledger.reservations()["default/early"].cluster == "a"
    h.lifecycle.cancel("default/early")
    # Past it, a's nodes are held for the gang (all three: it needs them all): the small
    # job goes to b instead.
    h.queue.push(queued(single("late", gpus=1), 12))
    result = run_cycle(h.queue, ledger, h.policies, 400.0, h.settings)
    assert result.held == {"a": {f"a-{i}": "default/big" for i in range(3)}}
    assert [(p.job.name, pl.cluster) for p, pl in result.admitted] == [("late", "b")]


def test_a_hold_takes_only_the_nodes_the_gang_needs() -> None:
    # 8 nodes: 4 full, 2 with 2 GPUs free, 2 empty. A starving gang of 3 x 8 GPUs holds the
    # 2 empty nodes and one of the others (3 nodes would take it once empty), nothing more:
    # a small job behind it still lands on the fourth node.
    ledger = federation({"c": nodes("n", 8, gpus=8)})
    h = Harness(ledger, starvation=300.0)
    for i, gpus in enumerate([8, 8, 8, 8, 6, 6]):
        h.queue.push(queued(single(f"fill{i}", gpus=gpus), i))
    h.cycle(0.0)
    h.queue.push(queued(gang("big", pods=3, gpus=8), 10))
    h.queue.push(queued(single("small", gpus=2), 11))
    result = run_cycle(h.queue, ledger, h.policies, 400.0, h.settings)
    held = result.held["c"]
    assert sorted(held.values()) == ["default/big"] * 3
    free = {n: s.whole_free for n, s in ledger.snapshot().clusters["c"].nodes.items()}
    [(pending, placement)] = result.admitted
    assert pending.job.name == "small" and placement.cluster == "c"
    [pod] = placement.pods
    assert pod.node not in held and sorted(free[n] for n in held) == [2, 8, 8]


def test_only_the_oldest_starving_gangs_hold() -> None:
    # a and b: 3 of 4 nodes full. Two starving gangs of 2 x 8 GPUs, room for neither: by
    # default only the older one holds nodes; allowed two, each holds in one cluster.
    ledger = federation(
        {
            "a": ClusterSpec(nodes("a", 4, gpus=8), labels={"c": "a"}),
            "b": ClusterSpec(nodes("b", 4, gpus=8), labels={"c": "b"}),
        }
    )
    h = Harness(ledger, starvation=300.0)
    for i, cluster in enumerate("aaabbb"):
        filler = dataclasses.replace(single(f"fill{i}", gpus=8), cluster_selector={"c": cluster})
        h.queue.push(queued(filler, i))
    h.cycle(0.0)
    h.queue.push(queued(gang("old", pods=2, gpus=8), 10, at=0.0))
    h.queue.push(queued(gang("young", pods=2, gpus=8), 11, at=50.0))

    def holders(settings: SchedulerSettings) -> dict[str, set[str]]:
        result = run_cycle(h.queue, ledger, h.policies, 400.0, settings)
        return {c: set(nodes.values()) for c, nodes in result.held.items()}

    assert list(holders(h.settings).values()) == [{"default/old"}]
    two = holders(dataclasses.replace(h.settings, max_held_gangs=2))
    assert sorted(map(sorted, two.values())) == [["default/old"], ["default/young"]]


def test_an_auto_job_takes_its_queues_policy_and_a_named_one_its_own() -> None:
    book = PolicyBook(JobQueue([QueueSpec("default"), QueueSpec("batch", policy="spread")]))

    def chosen(queue: str, policy: PolicyName) -> str:
        job = dataclasses.replace(single("j"), policy=policy)
        return book.for_job(queued(job, 0, queue=queue)).name

    assert chosen("default", "auto") == "auto"
    assert chosen("batch", "auto") == "spread"
    assert chosen("default", "firstfit") == chosen("batch", "firstfit") == "firstfit"


def test_quota_without_borrowing_refuses_with_a_reason() -> None:
    queues = [QueueSpec("capped", quota={"A100": 8}, borrow=False)]
    h = Harness(federation({"c": nodes("n", 4, gpus=8)}), queues)
    h.queue.push(queued(gang("fits", pods=1, gpus=8), 0, queue="capped"))
    h.queue.push(queued(gang("over", pods=1, gpus=8), 1, queue="capped"))
    result = run_cycle(h.queue, h.ledger, h.policies, 0.0, h.settings)
    assert [p.job.name for p, _ in result.admitted] == ["fits"]
    (reason,) = result.waiting["default/over"].reasons
    assert reason.code == ReasonCode.QUOTA and "quota for A100 is 8" in reason.message


def test_quota_with_borrowing_takes_idle_capacity() -> None:
    queues = [QueueSpec("lender"), QueueSpec("borrower", quota={"A100": 0}, borrow=True)]
    h = Harness(federation({"c": nodes("n", 1, gpus=8)}), queues)
    h.queue.push(queued(single("b", gpus=2), 0, queue="borrower"))
    assert h.cycle(0.0) == ["default/b"]
    assert h.queue.usage("borrower") == {"A100": 2000}


def test_gang_timeout_deletes_releases_and_requeues_with_backoff() -> None:
    ledger = federation({"c": nodes("n", 2, gpus=8)})
    before = free_milli(ledger)
    h = Harness(ledger)
    job = dataclasses.replace(gang("g", pods=2, gpus=8), schedule_timeout_seconds=120)
    h.queue.push(Pending(job, 0, 0.0))
    assert h.cycle(0.0) == ["default/g"]
    assert free_milli(ledger) == {"c": 0}
    assert h.lifecycle.expired(119.0) == []
    (late,) = h.lifecycle.expired(120.0)
    outcome = h.lifecycle.roll_back(late.placement.job, 120.0, "pods not all running after 120s")
    assert outcome is not None and outcome.state == "Queued" and outcome.not_before == 180.0
    assert free_milli(ledger) == before  # every GPU it held is free again
    assert ledger.reservations() == {}
    assert h.cycle(179.0) == []  # backing off
    assert h.cycle(180.0) == ["default/g"]
    (late,) = h.lifecycle.expired(300.0)
    again = h.lifecycle.roll_back(late.placement.job, 300.0, "timeout")
    assert again is not None and again.attempts == 2 and again.not_before == 420.0


def test_rolling_back_a_running_gang_frees_its_bound_capacity() -> None:
    # A gang rolled back after it ran (its pods deleted) gives back its bound usage, not
    # only a reservation it no longer holds: placed again, it fits where it was.
    ledger = federation({"c": nodes("n", 1, gpus=8)})
    before = free_milli(ledger)
    h = Harness(ledger)
    h.queue.push(Pending(gang("g", pods=1, gpus=8), 0, 0.0))
    assert h.cycle(0.0) == ["default/g"]
    assert h.lifecycle.all_running("default/g", 1.0) is not None
    outcome = h.lifecycle.roll_back("default/g", 2.0, "pods deleted")
    assert outcome is not None and outcome.state == "Queued"
    assert free_milli(ledger) == before
    assert h.cycle(outcome.not_before or 0.0) == ["default/g"]


def test_backoff_limit_fails_the_job() -> None:
    ledger = federation({"c": nodes("n", 1, gpus=8)})
    h = Harness(ledger)
    h.lifecycle = Lifecycle(ledger, h.queue, LifecycleSettings(backoff_limit=1))
    h.queue.push(Pending(gang("g", pods=1, gpus=8), 0, 0.0))
    h.cycle(0.0)
    first = h.lifecycle.roll_back("default/g", 600.0, "timeout")
    assert first is not None and first.state == "Queued"
    h.cycle(660.0)
    second = h.lifecycle.roll_back("default/g", 1300.0, "timeout")
    assert second is not None and second.state == "Failed" and "backoff limit 1" in second.reason
    assert len(h.queue) == 0 and ledger.reservations() == {}


def test_running_then_finished_frees_the_capacity() -> None:
    ledger = federation({"c": nodes("n", 1, gpus=8)})
    before = free_milli(ledger)
    h = Harness(ledger)
    h.queue.push(Pending(gang("g", pods=2, gpus=2), 0, 0.0))
    h.cycle(0.0)
    running = h.lifecycle.all_running("default/g", 5.0)
    assert running is not None and running.state == "Running"
    assert h.lifecycle.expired(10_000.0) == []  # running gangs never time out
    assert ledger.reservations() == {}  # bound now, not assumed
    assert free_milli(ledger) == {"c": 4000}
    done = h.lifecycle.finished("default/g", True, "exit 0")
    assert done is not None and done.state == "Succeeded"
    assert free_milli(ledger) == before and h.queue.usage("default") == {}


def test_cancel_removes_a_waiting_or_placed_job() -> None:
    ledger = federation({"c": nodes("n", 1, gpus=8)})
    h = Harness(ledger)
    h.queue.push(Pending(gang("placed", pods=1, gpus=8), 0, 0.0))
    h.queue.push(Pending(gang("waiting", pods=1, gpus=8), 1, 0.0))
    h.cycle(0.0)
    assert h.lifecycle.cancel("default/waiting").state == "Cancelled"
    assert h.lifecycle.cancel("default/placed").state == "Cancelled"
    assert len(h.queue) == 0 and ledger.reservations() == {}
    assert free_milli(ledger) == {"c": 8000}


def preemption_harness() -> Harness:
    queues = [QueueSpec("research", reclaimable=True), QueueSpec("prod"), QueueSpec("urgent")]
    ledger = federation({"c": nodes("n", 2, gpus=8)})
    h = Harness(ledger, queues)
    # One node holds big (8 GPUs); the other small (2) + mid (4), all research; 2 free.
    for seq, (name, gpus) in enumerate([("big", 8), ("mid", 4), ("small", 2)]):
        h.queue.push(queued(single(name, gpus=gpus), seq, queue="research"))
        assert h.cycle(0.0) == [f"default/{name}"]
        h.lifecycle.all_running(f"default/{name}", 1.0)
    return h


def test_a_higher_priority_job_evicts_the_fewest_gpus_of_reclaimable_jobs() -> None:
    h = preemption_harness()
    mid = h.lifecycle.get("default/mid")
    assert mid is not None
    h.queue.push(queued(single("vip", gpus=8), 10, queue="urgent", priority=100))
    assert h.cycle(5.0) == ["default/vip"]
    # Evicting small + mid frees 6 GPUs (enough beside the 2 free); big would free 8.
    assert sorted(o.job for o in h.preempted) == ["default/mid", "default/small"]
    assert all(o.state == "Queued" and "preempted by default/vip" in o.reason for o in h.preempted)
    assert {p.job.name for p in h.queue.pending()} == {"mid", "small"}
    assert h.ledger.reservations()["default/vip"].pods[0].node == mid.placement.pods[0].node


def test_equal_priority_and_unreclaimable_jobs_are_never_evicted() -> None:
    h = preemption_harness()
    h.queue.push(queued(single("peer", gpus=8), 10, queue="urgent", priority=0))
    assert h.cycle(5.0) == [] and h.preempted == []
    queues = [QueueSpec("prod"), QueueSpec("urgent")]
    h2 = Harness(federation({"c": nodes("n", 1, gpus=8)}), queues)
    h2.queue.push(queued(single("keep", gpus=8), 0, queue="prod"))
    h2.cycle(0.0)
    h2.queue.push(queued(single("vip", gpus=8), 1, queue="urgent", priority=100))
    assert h2.cycle(1.0) == [] and h2.preempted == []


def test_a_gang_is_evicted_whole_or_not_at_all() -> None:
    queues = [QueueSpec("research", reclaimable=True), QueueSpec("urgent")]
    ledger = federation({"c": nodes("n", 2, gpus=8)})
    before = free_milli(ledger)
    h = Harness(ledger, queues)
    h.queue.push(queued(gang("pair", pods=2, gpus=4), 0, queue="research"))
    h.cycle(0.0)
    pair_nodes = {p.node for p in ledger.reservations()["default/pair"].pods}
    h.lifecycle.all_running("default/pair", 1.0)
    h.queue.push(queued(gang("vip", pods=2, gpus=8), 1, queue="urgent", priority=10))
    assert h.cycle(2.0) == ["default/vip"]
    assert [o.job for o in h.preempted] == ["default/pair"]
    assert len(pair_nodes) >= 1 and free_milli(ledger) == {"c": 0}
    h.lifecycle.finished("default/vip", True, "done")
    assert free_milli(ledger) == before  # nothing of the evicted gang was left behind


def test_snapshot_without_leaves_the_live_ledger_alone() -> None:
    h = preemption_harness()
    live = free_milli(h.ledger)
    big = h.lifecycle.get("default/big")
    assert big is not None
    what_if = h.ledger.snapshot_without([big.placement])
    assert what_if.clusters["c"].free_milli() == live["c"] + 8000
    assert free_milli(h.ledger) == live


# --- unplaceable shapes: a backlog that does not fit costs no decisions ----------------------


def test_a_remembered_shape_waits_without_a_decision_until_room_is_freed() -> None:
    ledger = federation({"c": nodes("n", 1, gpus=8)})
    h = Harness(ledger)
    memo = UnplaceableShapes()
    h.queue.push(queued(single("filler", gpus=8), 0))
    assert h.cycle(0.0) == ["default/filler"]
    for i in range(5):
        h.queue.push(queued(single(f"big{i}", gpus=8), 1 + i))
    result = run_cycle(h.queue, ledger, h.policies, 1.0, h.settings, memo=memo)
    assert (len(result.decisions), result.skipped, len(result.waiting)) == (1, 4, 5)
    assert result.waiting["default/big3"].reasons == result.waiting["default/big0"].reasons
    # Nothing changed: nobody is decided again.
    result = run_cycle(h.queue, ledger, h.policies, 2.0, h.settings, memo=memo)
    assert (len(result.decisions), result.skipped) == (0, 5)
    # The filler ends: room was made, the first of them is placed at once.
    h.lifecycle.cancel("default/filler")
    result = run_cycle(h.queue, ledger, h.policies, 3.0, h.settings, memo=memo)
    assert [p.job.name for p, _ in result.admitted] == ["big0"]
    assert result.skipped == 3  # big1 was decided (no room after big0); the rest skipped


def test_an_assumption_keeps_the_memo_and_a_new_node_clears_it() -> None:
    ledger = federation({"c": nodes("n", 2, gpus=8)})
    memo = UnplaceableShapes()
    h = Harness(ledger)
    h.queue.push(queued(gang("wide", pods=3, gpus=8), 0))
    h.queue.push(queued(single("s", gpus=8), 1))
    result = run_cycle(h.queue, ledger, h.policies, 0.0, h.settings, memo=memo)
    assert [p.job.name for p, _ in result.admitted] == ["s"]  # assumed: growth unchanged
    result = run_cycle(h.queue, ledger, h.policies, 1.0, h.settings, memo=memo)
    assert (len(result.decisions), result.skipped) == (0, 1)
    ledger.apply(NodeUpdated("c", node("n-new", gpus=8)))
    ledger.apply(NodeUpdated("c", node("n-new2", gpus=8)))
    result = run_cycle(h.queue, ledger, h.policies, 2.0, h.settings, memo=memo)
    assert [p.job.name for p, _ in result.admitted] == ["wide"]


def test_a_starving_gang_is_remembered_and_still_holds_its_cluster() -> None:
    # a and b: 2 of 3 nodes taken. Two starving gangs of one shape, no room for either.
    ledger = federation(
        {
            "a": ClusterSpec(nodes("a", 3, gpus=8), labels={"c": "a"}),
            "b": ClusterSpec(nodes("b", 3, gpus=8), labels={"c": "b"}),
        }
    )
    h = Harness(ledger, starvation=300.0, held_gangs=2)
    for i, cluster in enumerate(["a", "a", "b", "b"]):
        filler = dataclasses.replace(single(f"fill{i}", gpus=8), cluster_selector={"c": cluster})
        h.queue.push(queued(filler, i))
    h.cycle(0.0)
    h.queue.push(queued(gang("big1", pods=3, gpus=8), 10))
    h.queue.push(queued(gang("big2", pods=3, gpus=8), 11))
    memo = UnplaceableShapes()
    first = run_cycle(h.queue, ledger, h.policies, 400.0, h.settings, memo=memo)
    # big2 has big1's shape: not decided, yet it holds nodes where it comes closest.
    assert (len(first.decisions), first.skipped) == (1, 1)
    holders = {c: set(nodes.values()) for c, nodes in first.held.items()}
    assert sorted(holders.values()) == [{"default/big1"}, {"default/big2"}]
    again = run_cycle(h.queue, ledger, h.policies, 401.0, h.settings, memo=memo)
    # Nothing changed: no decision, and the holds are those a full decision gave.
    assert (len(again.decisions), again.skipped) == (0, 2)
    assert again.held == first.held
    assert again.waiting["default/big1"].largest_fit == first.waiting["default/big1"].largest_fit
    # Room appears in a: the memo is dropped and big1 is placed there at once.
    h.lifecycle.cancel("default/fill0")
    h.lifecycle.cancel("default/fill1")
    third = run_cycle(h.queue, ledger, h.policies, 402.0, h.settings, memo=memo)
    assert [(p.job.name, pl.cluster) for p, pl in third.admitted] == [("big1", "a")]


def test_skipped_jobs_do_not_use_up_the_decisions_of_a_cycle() -> None:
    ledger = federation({"c": nodes("n", 1, gpus=4)})
    h = Harness(ledger)
    few = SchedulerSettings(max_jobs_per_cycle=2)
    for i in range(5):
        h.queue.push(queued(single(f"big{i}", gpus=8), i))
    h.queue.push(queued(single("small", gpus=1), 9))
    # Without the memo the bound is spent on the first two, which cannot fit.
    result = run_cycle(h.queue, ledger, h.policies, 0.0, few)
    assert result.admitted == [] and len(result.waiting) == 2
    result = run_cycle(h.queue, ledger, h.policies, 0.0, few, memo=UnplaceableShapes())
    assert [p.job.name for p, _ in result.admitted] == ["small"]
    assert (len(result.decisions), result.skipped) == (2, 4)


def test_a_job_that_may_preempt_is_always_decided() -> None:
    h = preemption_harness()
    memo = UnplaceableShapes()
    urgent = [queued(single(f"urgent{i}", gpus=8), 100 + i, queue="urgent", priority=10)
              for i in range(2)]  # fmt: skip
    for p in urgent:
        h.queue.push(p)
    result = run_cycle(h.queue, h.ledger, h.policies, 5.0, h.settings, lifecycle=h.lifecycle,
                       memo=memo)  # fmt: skip
    assert result.skipped == 0 and result.preempted


@settings(max_examples=40, deadline=None)
@given(
    node_gpus=st.lists(st.sampled_from([2, 4, 8]), min_size=1, max_size=4),
    shapes=st.lists(
        st.tuples(st.integers(1, 3), st.sampled_from([1, 2, 4, 8]), st.sampled_from([1, 4])),
        min_size=1, max_size=25,
    ),
    ends=st.lists(st.integers(0, 1000), max_size=6),
)  # fmt: skip
def test_the_memo_never_changes_what_is_placed(
    node_gpus: list[int], shapes: list[tuple[int, int, int]], ends: list[int]
) -> None:
    """Two schedulers, one remembering unplaceable shapes and one deciding every job, see
    the same jobs and the same ends of running jobs: they place exactly the same."""

    def build() -> Harness:
        ledger = federation({"c": [node(f"n{i}", gpus=g) for i, g in enumerate(node_gpus)]})
        h = Harness(ledger)
        h.settings = SchedulerSettings(max_jobs_per_cycle=10_000)
        for seq, (pods, gpus, cpu) in enumerate(shapes):
            job = gang(f"j{seq}", pods=pods, gpus=gpus, cpu=cpu * 1000)
            h.queue.push(queued(job, seq))
        return h

    plain, remembering = build(), build()
    memo = UnplaceableShapes()
    for step, end in enumerate([*ends, 0]):
        now = float(step)
        a = run_cycle(plain.queue, plain.ledger, plain.policies, now, plain.settings)
        b = run_cycle(remembering.queue, remembering.ledger, remembering.policies, now,
                      remembering.settings, memo=memo)  # fmt: skip
        assert a.admitted == b.admitted
        assert a.waiting.keys() == b.waiting.keys()
        for h, result in ((plain, a), (remembering, b)):
            for pending, placement in result.admitted:
                h.lifecycle.placed(pending, placement, now)
        running = sorted(plain.ledger.reservations())
        if running:  # the same job ends in both
            gone = running[end % len(running)]
            plain.lifecycle.cancel(gone)
            remembering.lifecycle.cancel(gone)


def test_a_cycle_out_of_time_stops_after_its_decision_and_the_next_goes_on() -> None:
    # A budget of 0 s: every cycle makes exactly one decision (progress), then stops.
    ledger = federation({"c": nodes("n", 4, gpus=8)})
    h = Harness(ledger)
    no_time = SchedulerSettings(max_cycle_seconds=0.0)
    for i in range(3):
        h.queue.push(queued(single(f"j{i}", gpus=8), i))
    placed = []
    for now in range(3):
        result = run_cycle(h.queue, ledger, h.policies, float(now), no_time)
        assert len(result.decisions) == 1 and result.cut_short == (now < 2)
        placed += [p.job.name for p, _ in result.admitted]
    assert placed == ["j0", "j1", "j2"]
    # Unbounded (the default for replays and tests), one cycle takes them all.
    for i in range(3, 6):
        h.queue.push(queued(single(f"j{i}", gpus=8), i))
    result = run_cycle(h.queue, ledger, h.policies, 9.0, h.settings)
    assert len(result.admitted) == 1 and len(result.waiting) == 2 and not result.cut_short
