"""A queued job's reason in a list (``status.waiting``): the scheduler's last refusal in one
line, worded from the job's shape when capacity is what it lacks."""

from __future__ import annotations

import pytest
from builders import gang, job, pod_set

from broker.core.decide import NO_ROOM
from broker.model import Job, Reason, ReasonCode
from broker.service.waiting import MAX_SUMMARY, never_fits_line, waiting_summary
from policies.never_fits import NeverFits

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


NEVER_LINES = [
    (gang("g", 400, 8, gpu_types=["A100"]), NeverFits("worker", 400, 52, "b", False),
     "never fits: no cluster could take 400 pods of 8 A100 GPUs even empty; the largest, b, "
     "could take 52"),
    (gang("g", 400, 8), NeverFits("worker", 400, 352, "b", True),
     "never fits: no cluster could take 400 pods of 8 GPUs even empty and with every burst "
     "pool at its maxNodes; the largest, b, could take 352"),
    (gang("g", 1, 16), NeverFits("worker", 1, 0, "", False),
     "never fits: no cluster could take 1 pod of 16 GPUs even empty; none could take one of "
     "them"),
    (gang("e", 8, 8, min_member=4), NeverFits("worker", 4, 3, "a", False),
     "never fits: no cluster could take at least 4 pods of 8 GPUs even empty; the largest, a, "
     "could take 3"),
    (job("p", pod_set("a", 2, gpus=8), pod_set("b", 1, gpus=8)), NeverFits("", 3, 0, "", False),
     "never fits: no cluster could take all its pod sets even empty"),
    (gang("g", 1, 8), NeverFits("worker", 1, 0, "", False, 0),
     "never fits: no cluster matches its placement (cluster selector or needs)"),
]  # fmt: skip


@pytest.mark.parametrize(("j", "never", "line"), NEVER_LINES)
def test_never_fits_is_said_from_the_shape(j: Job, never: NeverFits, line: str) -> None:
    assert never_fits_line(j, never) == line
