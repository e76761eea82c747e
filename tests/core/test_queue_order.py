"""The queue's incremental order (per-queue heaps merged by their heads) against the
definition: sorting every eligible job by (-priority, -queue priority, fair share, seq),
over any sequence of pushes, removals, requeues, charges, partial walks and clocks; and
the lifecycle's deadline heap and reclaimable counts against a walk over every launch."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from builders import federation, nodes, single
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.core.lifecycle import Lifecycle, LifecycleSettings
from broker.core.queue import JobQueue, Pending, QueueSpec
from broker.model import Placement, PodPlacement, Resources

QUEUES = [QueueSpec("hi", priority=5), QueueSpec("a", reclaimable=True), QueueSpec("b", weight=2.0)]
CAPACITY = {"A100": 16_000, "H100": 8_000}


def reference(queue: JobQueue, jobs: Mapping[str, Pending], now: float) -> list[str]:
    specs = {q.name: q for q in queue.queues()}
    shares = {name: queue.dominant_share(name, CAPACITY) for name in specs}

    def key(p: Pending) -> tuple[int, int, float, int]:
        spec = specs[p.job.queue]
        return (-p.job.priority, -spec.priority, shares[spec.name], p.seq)

    return [p.job.key for p in sorted((p for p in jobs.values() if p.not_before <= now), key=key)]


op = st.one_of(
    st.tuples(
        st.just("push"),
        st.integers(0, 30),
        st.sampled_from(["hi", "a", "b"]),
        st.integers(-2, 2),
        st.sampled_from([0.0, 0.0, 5.0, 20.0]),
    ),
    st.tuples(st.just("remove"), st.integers(0, 30)),
    st.tuples(st.just("walk"), st.integers(1, 6), st.sampled_from([0.0, 4.0, 10.0, 30.0])),
    st.tuples(st.just("charge"), st.sampled_from(["hi", "a", "b"]), st.integers(0, 8_000)),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(op, max_size=60))
def test_the_order_is_the_definitions_whatever_happened(ops: list[tuple[object, ...]]) -> None:
    queue = JobQueue(QUEUES)
    model: dict[str, Pending] = {}
    seq = 0
    for step in ops:
        if step[0] == "push":
            _, n, name, priority, not_before = step
            seq += 1
            job = dataclasses.replace(single(f"j{n}"), queue=str(name), priority=int(priority))  # type: ignore[call-overload]
            pending = Pending(job, seq, 0.0, not_before=float(not_before))  # type: ignore[arg-type]
            queue.push(pending)
            model[job.key] = pending
        elif step[0] == "remove":
            key = f"{single(f'j{step[1]}').key}"
            assert (queue.remove(key) is None) == (model.pop(key, None) is None)
        elif step[0] == "charge":
            queue.charge(f"charged-{step[1]}", str(step[1]), {"A100": int(step[2])})  # type: ignore[call-overload]
        else:  # a cycle that looks at a few jobs, admits every other one, then stops
            _, count, now = step
            expected = reference(queue, model, float(now))  # type: ignore[arg-type]
            with queue.ordering(float(now), CAPACITY) as ordering:  # type: ignore[arg-type]
                seen = []
                for pending in ordering:
                    seen.append(pending.job.key)
                    if len(seen) % 2:
                        queue.remove(pending.job.key)
                        del model[pending.job.key]
                    if len(seen) >= int(count):  # type: ignore[call-overload]
                        break
            assert seen == expected[: len(seen)]
            assert len(seen) == min(int(count), len(expected))  # type: ignore[call-overload]
        assert len(queue) == len(model)
    for now in (0.0, 100.0):
        assert [p.job.key for p in queue.ordered(now, CAPACITY)] == reference(queue, model, now)


def test_a_job_queued_during_a_walk_waits_for_the_next() -> None:
    queue = JobQueue(QUEUES)
    queue.push(Pending(dataclasses.replace(single("first"), queue="a"), 1, 0.0))
    with queue.ordering(0.0, CAPACITY) as ordering:
        got = [next(ordering).job.name]
        victim = dataclasses.replace(single("victim"), queue="b", priority=9)
        queue.push(Pending(victim, 0, 0.0))
        got += [p.job.name for p in ordering]
    assert got == ["first"]
    assert [p.job.name for p in queue.ordered(0.0, CAPACITY)] == ["victim", "first"]


def _placement(job: str, cluster: str) -> Placement:
    pod = PodPlacement(f"{job}-0", "n-0", (), Resources(cpu_milli=1))
    return Placement(job, cluster, (pod,))


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.integers(0, 12),
            st.sampled_from(["place", "run", "end", "back"]),
            st.sampled_from(["hi", "a"]),
            st.integers(0, 3),
            st.integers(1, 50),
        ),
        max_size=50,
    ),
    st.integers(0, 60),
)
def test_deadlines_and_reclaimable_priorities_match_a_walk(
    ops: list[tuple[int, str, str, int, int]], now: int
) -> None:
    queue = JobQueue(QUEUES)
    ledger = federation({"c0": nodes("n", 1), "c1": nodes("n", 1)})
    lifecycle = Lifecycle(ledger, queue, LifecycleSettings())
    for n, what, name, priority, timeout in ops:
        key = f"t/j{n}"
        if what == "place":
            job = dataclasses.replace(single(f"j{n}"), queue=name, priority=priority,
                                      schedule_timeout_seconds=timeout)  # fmt: skip
            if lifecycle.get(key) is None:
                placement = _placement(key, f"c{n % 2}")
                ledger.assume(placement)
                lifecycle.placed(Pending(job, n, 0.0), placement, 0.0)
        elif what == "run":
            lifecycle.all_running(key, 0.0)
        elif what == "end":
            lifecycle.finished(key, True, "done")
        else:
            lifecycle.roll_back(key, 0.0, "timeout")
        launches = lifecycle.launches()
        due = {la.placement.job for la in launches if not la.running and la.deadline <= now}
        assert {la.placement.job for la in lifecycle.expired(float(now))} == due
        assert {la.placement.job for la in lifecycle.expired(float(now))} == due  # still due
        reclaimable = [la for la in launches if la.pending.job.queue == "a"]
        lowest = min((la.pending.job.priority for la in reclaimable), default=None)
        assert lifecycle.lowest_reclaimable() == lowest
        assert {id(la) for la in lifecycle.reclaimable()} == {id(la) for la in reclaimable}
