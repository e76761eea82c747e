"""``fedbroker bench --e2e`` on a tiny federation: every offered job is acknowledged and
placed, the figures come from the broker's own probes, and a run inside a longer process
(this test's) leaves the collector as it found it. Nothing here looks at how fast anything
is: a slow machine must not fail the suite."""

from __future__ import annotations

import gc
import json
import math
from collections.abc import Iterator

import pytest

from broker.cli.main import main
from broker.process import _freeze_survivors

TINY = ["bench", "--e2e", "--clusters", "2", "--nodes-per-cluster", "20", "--json"]


@pytest.fixture(autouse=True)
def restored_gc() -> Iterator[None]:
    """The run tunes the collector as ``serve`` does; not for later tests."""
    threshold = gc.get_threshold()
    yield
    gc.set_threshold(*threshold)


def test_every_job_is_acknowledged_placed_and_measured(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main([*TINY, "--jobs", "300", "--rate", "1000"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert (doc["acknowledged"], doc["failed"], doc["placed"]) == (300, 0, 300)
    for key in ("ack_p99_ms", "submit_to_placed_p99_ms", "loop_lag_p99_ms"):
        assert math.isfinite(doc[key]) and doc[key] >= 0, key
    assert doc["ack_p50_ms"] <= doc["ack_p99_ms"]
    assert doc["submit_to_placed_p50_ms"] <= doc["submit_to_placed_p99_ms"]
    assert 0 < doc["broker_rss_mib"] <= doc["broker_max_rss_mib"] + 1
    assert doc["broker_cpu_ms_per_job"] > 0
    # serving() released the heap: no freezing callback left behind, nothing frozen.
    assert _freeze_survivors not in gc.callbacks
    assert gc.get_freeze_count() == 0
