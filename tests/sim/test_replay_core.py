"""The replay runs the service's core: a quota turns a placement down, a high-priority gang
preempts a low-priority job of a reclaimable queue, and the victim is requeued and restarts
(issue 12's acceptance test), each shown against a control replay where it cannot act."""

from __future__ import annotations

import dataclasses

from broker.core.queue import QueueSpec
from broker.model import GpuType, Job, Node, PodSet, Resources
from broker.sim.arrivals import PREEMPTIBLE_QUEUE, Arrival, Workload, build_workload
from broker.sim.replay import ReplayConfig, ReplayResult, replay, replay_policy

BATCH_QUOTA = 8  # GPUs
QUEUES = (
    QueueSpec("batch", quota={"G2": BATCH_QUOTA}, borrow=False, reclaimable=True),
    QueueSpec("prod", priority=1),
)


def nodes() -> list[Node]:
    res = Resources(gpus=8, cpu_milli=96_000, memory_mib=393_216)
    return [Node(f"n-{i}", GpuType("G2"), res) for i in range(2)]


def job(name: str, pods: int, queue: str, priority: int = 0) -> Job:
    res = Resources(gpus=8, cpu_milli=8_000, memory_mib=32_768)
    return Job(name, (PodSet("p", pods, res),), queue=queue, priority=priority)


def workload() -> Workload:
    """Two whole-node batch jobs (the quota admits one at a time), then a two-node prod
    gang that fits only if the running batch job is evicted."""
    arrivals = (
        Arrival(0.0, job("lo-1", 1, "batch"), 1000.0),
        Arrival(1.0, job("lo-2", 1, "batch"), 1000.0),
        Arrival(2.0, job("hi", 2, "prod", priority=10), 100.0),
    )
    return Workload(arrivals, 3000.0, 0, 0)


def run(queues: tuple[QueueSpec, ...] = QUEUES) -> ReplayResult:
    config = ReplayConfig(clusters=1, queues=queues, samples=30)
    return replay_policy(nodes(), workload(), "gang", config)


def waits(result: ReplayResult) -> dict[str, float]:
    return {key.split("/")[-1]: w for key, w in result.waits.items()}


def test_quota_and_preemption_act_in_the_replay() -> None:
    result = run()
    # lo-2 fits node n-1 at t=1 but its queue's quota is taken by lo-1: refused.
    assert result.quota_refusals >= 1
    assert result.peak_queue_gpus["batch"] <= BATCH_QUOTA
    # hi needs both nodes: lo-1 (reclaimable, lower priority) is evicted and hi placed at once.
    assert result.preemptions == 1
    assert waits(result)["hi"] == 0.0
    # lo-1 was requeued and ran again after hi (t=102); lo-2 only once lo-1 was done (t=1102).
    assert result.pods_placed == 1 + 2 + 1 + 1
    assert waits(result) == {"lo-1": 0.0, "hi": 0.0, "lo-2": 1101.0}
    assert result.unstarted == 0 and result.conflicts == 0


def test_without_a_quota_both_batch_jobs_start_at_once() -> None:
    free = (dataclasses.replace(QUEUES[0], quota=None), QUEUES[1])
    result = run(free)
    assert result.quota_refusals == 0
    assert waits(result)["lo-2"] == 0.0
    assert result.peak_queue_gpus["batch"] == 2 * 8


def test_a_queue_that_is_not_reclaimable_is_never_preempted() -> None:
    kept = (dataclasses.replace(QUEUES[0], reclaimable=False), QUEUES[1])
    result = run(kept)
    assert result.preemptions == 0
    assert waits(result)["hi"] == 1000.0 - 2.0  # until lo-1 ends at t=1000


# -- the generated mix's low-priority queue ------------------------------------------------


def test_the_preemptible_share_moves_one_pod_jobs_only_and_no_other_draw() -> None:
    plain = build_workload([], 64, 200, 3, 60.0, 90.0)
    mixed = build_workload([], 64, 200, 3, 60.0, 90.0, preemptible_share=0.5)
    assert [(a.at, a.run_seconds, a.job.pod_sets) for a in plain.arrivals] == [
        (a.at, a.run_seconds, a.job.pod_sets) for a in mixed.arrivals
    ]
    moved = [a.job for a in mixed.arrivals if a.job.queue == PREEMPTIBLE_QUEUE.name]
    singles = [a for a in mixed.arrivals if a.job.total_pods == 1]
    assert moved and len(moved) < len(singles)
    assert all(j.total_pods == 1 and j.priority == -1 for j in moved)
    assert all(a.job.queue == "default" for a in plain.arrivals)


def test_the_default_queue_preempts_the_preemptible_jobs() -> None:
    nodes_ = nodes()
    cfg = ReplayConfig(clusters=1, seed=5, jobs=60, time_scale=30.0, samples=10)
    _, (control,) = replay(nodes_, [], ["auto"], cfg)
    _, (mixed,) = replay(nodes_, [], ["auto"], dataclasses.replace(cfg, preemptible_share=1.0))
    assert control.preemptions == 0
    assert mixed.preemptions > 0
