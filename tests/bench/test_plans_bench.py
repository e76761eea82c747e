"""``fedbroker bench --plans`` on a tiny federation: the reader's figures in both phases,
and every planner client's plans answered (200 or 429, nothing else). Nothing here looks
at how fast anything is: a slow machine must not fail the suite."""

from __future__ import annotations

import gc
import json
import math
from collections.abc import Iterator

import pytest

from broker.bench.plans import PLANNERS, plan_body
from broker.cli.main import main
from broker.manifest import parse_manifest
from broker.manifest.fields import MAX_PODS


@pytest.fixture(autouse=True)
def restored_gc() -> Iterator[None]:
    """The run tunes the collector as ``serve`` does; not for later tests."""
    threshold = gc.get_threshold()
    yield
    gc.set_threshold(*threshold)


def test_the_plan_is_the_largest_a_tenant_may_ask() -> None:
    manifest = parse_manifest(plan_body(), "application/json")
    assert manifest.spec.pod_sets is not None
    assert sum(ps.count for ps in manifest.spec.pod_sets) == MAX_PODS


def test_reads_are_measured_alone_and_with_plans(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["bench", "--plans", "--clusters", "1", "--nodes-per-cluster", "8", "--reads", "20"]
    assert main([*args, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert (doc["reads"], doc["planners"], doc["nodes"]) == (20, PLANNERS, 8)
    for phase in ("quiet", "busy"):
        p50, p99, most = (doc[f"{phase}_{k}_ms"] for k in ("p50", "p99", "max"))
        assert math.isfinite(p99) and 0 <= p50 <= p99 <= most, phase
    # Each client sent at least its first plan before the reads ended and was answered.
    sent = doc["plans_answered"] + doc["plans_refused_busy"] + doc["plans_refused_budget"]
    assert sent >= PLANNERS
    assert doc["plans_other"] == 0
    assert doc["reads_failed"] == 0
