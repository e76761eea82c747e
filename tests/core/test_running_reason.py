"""A Running job's reason counts its start from its placement, and says its pods in words
that agree in number ("its 1 pod", "all 2 pods")."""

from __future__ import annotations

import pytest
from builders import gang, placement, pod

from broker.core.lifecycle import Launch, running_reason
from broker.core.queue import Pending


@pytest.mark.parametrize(
    ("pods", "expected"),
    [
        (1, "its 1 pod running 3s after placement (26s after submission)"),
        (2, "all 2 pods running 3s after placement (26s after submission)"),
    ],
)
def test_running_reason(pods: int, expected: str) -> None:
    job = gang("train", pods=pods)
    placed = placement("t/train", "c", *(pod(f"p{i}", "n1", [i]) for i in range(pods)))
    launch = Launch(Pending(job, 0, enqueued_at=100.0), placed, placed_at=123.0, deadline=1e9)
    assert running_reason(launch, 126.0) == expected
