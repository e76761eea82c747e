"""A queued job's reason in a list (``status.waiting``): the scheduler's last refusal in one
line, worded from the job's shape when capacity is what it lacks."""

from __future__ import annotations

from builders import gang, job, pod_set

from broker.core.decide import NO_ROOM
from broker.model import Reason, ReasonCode
from broker.service.waiting import MAX_SUMMARY, waiting_summary

FULL = Reason(ReasonCode.NODE_FIT, "pod set worker: no node has 8 whole free GPUs", "a")


def test_no_room_is_said_from_the_gang() -> None:
    assert waiting_summary(gang("g", pods=4, gpus=8), (NO_ROOM,)) == (
        "no cluster has room for 4 pods of 8 GPUs"
    )
    typed = gang("g", pods=2, gpus=1, gpu_types=["H100", "A100"], min_member=1)
    assert waiting_summary(typed, (FULL,)) == (
        "no cluster has room for 2 pods of 1 A100/H100 GPU (at least 1 pod)"
    )
    mixed = job("m", pod_set("lead", 1), pod_set("worker", 3, milli=500))
    assert waiting_summary(mixed, (NO_ROOM,)) == (
        "no cluster has room for 1 pod + 3 pods of 0.5 GPU"
    )


def test_other_reasons_are_said_per_cluster_or_as_they_are() -> None:
    g = gang("g", pods=1, gpus=8)
    quota = Reason(ReasonCode.QUOTA, "queue training: A100 quota 16 GPUs, 16 in use")
    assert waiting_summary(g, (quota,)) == f"QuotaExceeded: {quota.message}"
    typed = Reason(ReasonCode.GPU_TYPE, "no A100 GPUs here (has T4)", "b")
    assert waiting_summary(g, (FULL, typed)) == (
        "fits no cluster: a full; b no A100 GPUs here (has T4)"
    )
    long = tuple(Reason(ReasonCode.SELECTOR, "x" * 80, f"c{i}") for i in range(5))
    assert len(waiting_summary(g, long)) == MAX_SUMMARY
    assert waiting_summary(g, ()) == ""
