"""Explain's queue positions (issue 16, acceptance 5) agree with the order the next cycles
place in: queue jobs in several queues (priorities, queue priorities, weights, some usage
already charged), read every job's position, then free capacity step by step (one full
cluster of foreign pods, on an injected clock) by exactly what the job at the next position
needs, run one cycle each time, and check that it is that job which is placed."""

from __future__ import annotations

import dataclasses
from itertools import count

import pytest
from builders import federation, gang, node, occupy
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.core.queue import JobQueue, Pending, PositionFrame, QueueSpec
from broker.core.scheduler import PolicyBook, SchedulerSettings, federation_capacity, run_cycle
from broker.model import PodDeleted

QUEUES = [
    QueueSpec("hi", priority=5),
    QueueSpec("a"),
    QueueSpec("b", weight=2.0),
    QueueSpec("c", weight=0.5),
]
GPUS = 8  # per node; every pod of these jobs takes a whole node

# (queue, job priority, nodes the gang needs)
spec = st.tuples(st.sampled_from([q.name for q in QUEUES]), st.integers(-1, 1), st.integers(1, 2))


def queued(jobs: list[tuple[str, int, int]], used: dict[str, int]) -> JobQueue:
    queue = JobQueue(QUEUES)
    for name, milli in used.items():
        queue.charge(f"running-{name}", name, {"A100": milli})
    for i, (name, priority, nodes) in enumerate(jobs):
        job = gang(f"j{i}", pods=nodes, gpus=GPUS, gpu_types=["A100"])
        job = dataclasses.replace(job, queue=name, priority=priority)
        queue.push(Pending(job, i + 1, 0.0))
    return queue


@settings(max_examples=120, deadline=None)
@given(
    st.lists(spec, min_size=1, max_size=10),
    st.dictionaries(st.sampled_from(["a", "b", "c"]), st.integers(0, 16_000), max_size=3),
)
def test_positions_are_the_order_cycles_place_in(
    jobs: list[tuple[str, int, int]], used: dict[str, int]
) -> None:
    queue = queued(jobs, used)
    total_nodes = sum(nodes for _, _, nodes in jobs)
    ledger = federation({"c1": [node(f"n{i}", GPUS) for i in range(total_nodes)]})
    for i in range(total_nodes):  # full: a foreign pod on every node
        occupy(ledger, "c1", f"n{i}", range(GPUS), name=f"filler-{i}")
    capacity = federation_capacity(ledger.snapshot())[0]
    now = 100.0
    places = {p.job.key: queue.position(p.job.key, now, capacity) for p in queue.pending()}
    positions = {key: at for key, at in places.items() if at is not None}
    rank = {key: at.position or 0 for key, at in positions.items()}
    assert len(positions) == len(jobs)
    assert sorted(rank.values()) == list(range(1, len(jobs) + 1))
    for key, at in positions.items():
        assert at.waiting == len(jobs)
        same_queue = sorted(rank[k] for k, p in positions.items() if p.queue == at.queue)
        assert at.queue_waiting == len(same_queue)
        # Its place in its own queue is its rank among its queue's jobs by overall place.
        assert at.in_queue == same_queue.index(rank[key]) + 1
        assert at.same_gpu_type_ahead == rank[key] - 1  # one GPU type for all
    expected = sorted(rank, key=rank.__getitem__)
    fillers = count()
    policies, cycle = PolicyBook(queue), SchedulerSettings()
    placed = []
    for key in expected:
        pending = queue.get(key)
        assert pending is not None
        for _ in range(pending.job.total_pods):  # free exactly what the next one needs
            ledger.apply(PodDeleted("c1", f"filler-{next(fillers)}"))
        now += 10.0
        result = run_cycle(queue, ledger, policies, now, cycle)
        placed += [p.job.key for p, _ in result.admitted]
    assert placed == expected


def test_same_gpu_type_counts_only_jobs_that_may_take_that_type() -> None:
    queue = JobQueue([QueueSpec("a")])
    for i, types in enumerate((["H100"], ["A100"], [], ["A100", "H100"], ["A100"])):
        job = dataclasses.replace(gang(f"j{i}", pods=1, gpus=8, gpu_types=types), queue="a")
        queue.push(Pending(job, i + 1, 0.0))
    at = queue.position("default/j4", 0.0, {"A100": 64_000, "H100": 64_000})
    assert at is not None
    assert (at.position, at.in_queue, at.same_gpu_type_ahead) == (5, 5, 3)  # not the H100 one


def test_a_job_backing_off_has_no_place_until_its_backoff_ends() -> None:
    queue = JobQueue([QueueSpec("a")])
    first = dataclasses.replace(gang("first", pods=1, gpus=8), queue="a")
    again = dataclasses.replace(gang("again", pods=1, gpus=8), queue="a")
    queue.push(Pending(first, 1, 0.0))
    queue.push(Pending(again, 2, 0.0, attempts=1, not_before=160.0))
    waiting = queue.position("default/again", 100.0, {"A100": 8_000})
    assert waiting is not None and (waiting.position, waiting.backoff_until) == (None, 160.0)
    assert queue.position("default/first", 100.0, {"A100": 8_000}) == dataclasses.replace(
        waiting, position=1, waiting=1, in_queue=1, queue_waiting=1, same_gpu_type_ahead=0,
        backoff_until=None, queue="a",
    )  # fmt: skip
    after = queue.position("default/again", 200.0, {"A100": 8_000})
    assert after is not None and (after.position, after.waiting) == (2, 2)
    assert queue.position("default/nobody", 200.0, {}) is None


def test_a_frame_walks_the_queue_as_it_was_when_copied() -> None:
    queue = queued([("a", 0, 1), ("b", 0, 1), ("a", 0, 1), ("c", 0, 1), ("a", 0, 1)], {})
    capacity = {"A100": 64_000}
    before = queue.position("default/j4", 0.0, capacity)
    frame = queue.position_frame("default/j4", 0.0)
    assert isinstance(frame, PositionFrame)
    # The live queue moves on: a job ahead leaves, two urgent ones arrive, usage is charged.
    assert queue.remove("default/j0") is not None
    for i in range(2):
        urgent = dataclasses.replace(gang(f"urgent{i}", pods=1, gpus=GPUS), queue="a", priority=5)
        queue.push(Pending(urgent, 99 + i, 0.0))
    queue.charge("running-a", "a", {"A100": 16_000})
    assert frame.walk(capacity) == before
    now = queue.position("default/j4", 0.0, capacity)
    assert before is not None and (before.position, before.waiting) == (5, 5)
    assert now is not None and (now.position, now.waiting) == (6, 6)


def test_the_walk_stops_where_its_check_raises() -> None:
    queue = queued([("a", 0, 1)] * 8, {})
    frame = queue.position_frame("default/j7", 0.0)
    assert isinstance(frame, PositionFrame)
    checks = count(1)

    def check() -> None:
        if next(checks) > 3:
            raise TimeoutError

    with pytest.raises(TimeoutError):
        frame.walk({"A100": 64_000}, check)
    at = frame.walk({"A100": 64_000})  # the frame itself is untouched by a stopped walk
    assert at.position == 8
