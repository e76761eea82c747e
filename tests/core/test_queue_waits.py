"""The queue's per-queue sums (JobQueue.waits: what /metrics and the dashboard report) and
the fitting shapes waiting (JobQueue.fit_shapes: the stranded GPUs') against the
definition, a walk over every waiting job, whatever was pushed, pushed again or removed;
and the heaps behind them kept within the jobs waiting."""

from __future__ import annotations

import dataclasses
from typing import cast

from builders import gang, single
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.core.queue import JobQueue, Pending, QueueSpec
from broker.core.waits import QueueWaits
from policies.stranded import fit_shapes

QUEUES = [QueueSpec("a"), QueueSpec("b")]


def reference(queue: JobQueue, name: str, now: float) -> QueueWaits:
    jobs = queue.pending(name)
    waits = [max(0.0, now - p.enqueued_at) for p in jobs]
    gangs = [max(0.0, now - p.enqueued_at) for p in jobs if p.job.total_pods > 1]
    return QueueWaits(
        len(jobs), sum(p.job.gpu_request_milli for p in jobs) / 1000,
        max(waits, default=0.0), max(gangs, default=0.0),
    )  # fmt: skip


op = st.one_of(
    st.tuples(
        st.just("push"),
        st.integers(0, 12),
        st.sampled_from(["a", "b"]),
        st.booleans(),
        st.integers(1, 4),
        st.floats(0.0, 100.0, allow_nan=False),
        st.sampled_from([(), ("T4",), ("A100", "T4")]),
    ),
    st.tuples(st.just("remove"), st.integers(0, 12)),
    st.tuples(st.just("report"), st.floats(0.0, 200.0, allow_nan=False)),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(op, max_size=80))
def test_the_sums_are_a_walk_over_the_waiting_jobs(ops: list[tuple[object, ...]]) -> None:
    queue = JobQueue(QUEUES)
    for seq, step in enumerate(ops):
        if step[0] == "push":  # a name pushed again replaces its entry (another shape too)
            _, n, name, is_gang, gpus, enqueued_at, types = step
            g = int(gpus)  # type: ignore[call-overload]
            where = cast(tuple[str, ...], types)
            shape = (
                gang(f"j{n}", 3, g, gpu_types=where)
                if is_gang
                else single(f"j{n}", g, gpu_types=where)
            )
            job = dataclasses.replace(shape, queue=str(name))
            queue.push(Pending(job, seq, float(enqueued_at)))  # type: ignore[arg-type]
        elif step[0] == "remove":
            queue.remove(single(f"j{step[1]}").key)
        else:
            now = float(step[1])  # type: ignore[arg-type]
            for name in ("a", "b"):
                assert queue.waits(name, now) == reference(queue, name, now)
            shapes = frozenset().union(*(fit_shapes(p.job) for p in queue.pending()))
            counted = queue.fit_shapes()
            assert set(counted) == shapes and len(counted) == len(shapes)  # each once


def test_stale_entries_are_dropped_once_and_the_heaps_stay_bounded() -> None:
    """10,000 jobs pushed, all but 10 removed: a report drops the stale heads for good, and
    pushes that follow rebuild a heap once it is mostly stale."""
    queue = JobQueue([QueueSpec("default")])
    shapes = [gang(f"g{i}") if i % 2 else single(f"s{i}") for i in range(10_000)]
    for i, job in enumerate(shapes):
        queue.push(Pending(job, i, float(i)))
    for job in shapes[:-10]:
        queue.remove(job.key)
    assert queue.waits("default", 10_000.0) == QueueWaits(10, 25.0, 10.0, 9.0)
    assert queue.wait_heap_sizes("default") == (10, 5)  # the stale heads dropped
    for job in shapes[-10:]:  # the newest go, then others come: no report in between
        queue.remove(job.key)
    for i in range(200):
        queue.push(Pending(single(f"n{i}"), 20_000 + i, 20_000.0 + i))
    since, gang_since = queue.wait_heap_sizes("default")
    assert since <= 2 * 200 and gang_since == 5  # stale until read
    assert queue.waits("default", 20_300.0) == reference(queue, "default", 20_300.0)
    assert queue.wait_heap_sizes("default")[1] == 0


def test_jobs_alike_count_as_one_shape_however_many_wait() -> None:
    """What a stranded-GPU reading walks does not grow with the jobs waiting."""
    queue = JobQueue([QueueSpec("default")])
    jobs = [single(f"s{i}", 2) for i in range(1_000)]
    for i, job in enumerate(jobs):
        queue.push(Pending(job, i, 0.0))
    queue.push(Pending(gang("g", 2, 8), 1_000, 0.0))
    assert len(queue.fit_shapes()) == 2
    for job in jobs[:-1]:
        queue.remove(job.key)
    assert len(queue.fit_shapes()) == 2
    queue.remove(jobs[-1].key)
    assert queue.fit_shapes() == tuple(fit_shapes(gang("g", 2, 8)))
