"""The demo's generator now and then submits a JobSet or a PyTorchJob: each it draws is
admitted for the demo's team-a (baseline, ``default`` account) as a small GPU gang."""

from __future__ import annotations

import json
import random

from broker.cli.demo_workload import (
    BurstBudget,
    draw_manifest,
    pods_of,
    within_budget,
    workload_manifest,
)
from broker.manifest import admit_templates, parse_manifest, to_job


def test_drawn_workloads_are_small_admitted_gangs() -> None:
    rng = random.Random(7)
    kinds = set()
    for i in range(40):
        manifest = workload_manifest(rng, f"wl-{i}")
        kinds.add(manifest["spec"]["workload"]["kind"])
        parsed = parse_manifest(json.dumps(manifest).encode(), "application/json")
        job = to_job(admit_templates(parsed, "baseline", ["default"]), "team-a", "training")
        assert 2 <= job.total_pods <= 4
        assert all(ps.resources.gpus == 1 for ps in job.pod_sets)
    assert kinds == {"JobSet", "PyTorchJob"}


def test_the_generator_draws_some_workloads() -> None:
    rng = random.Random(1)
    drawn = [draw_manifest(rng, "r", i)[1] for i in range(400)]
    assert any("workload" in m["spec"] for m in drawn)
    assert sum("podSets" in m["spec"] for m in drawn) > 300


def test_the_generator_never_asks_the_pool_for_more_than_it_leaves_free() -> None:
    """Drawn gangs that may burst are let through while their pods fit what is left of
    the pool; past that a gang goes without allowBurst, an A100-only one not at all."""
    rng = random.Random(5)
    budget = BurstBudget(12)
    left, kept_burst, stripped, dropped = 12, 0, 0, 0
    for i in range(400):
        tenant, drawn = draw_manifest(rng, "r", i)
        body = within_budget(tenant, drawn, budget, left)
        may_burst = drawn["spec"].get("placement", {}).get("allowBurst", False)
        if body is None:
            assert drawn["spec"]["placement"]["gpuTypes"] == ["A100"]
            dropped += 1
        elif body["spec"].get("placement", {}).get("allowBurst"):
            left -= pods_of(body)
            kept_burst += 1
        elif may_burst:
            assert "allowBurst" not in body["spec"].get("placement", {})
            stripped += 1
        assert left >= 0
    assert sum(budget.waiting.values()) == 12 - left
    assert kept_burst and stripped and dropped


def test_pods_of_counts_pod_sets_and_embedded_workloads() -> None:
    rng = random.Random(3)
    for i in range(60):
        manifest = workload_manifest(rng, f"wl-{i}")
        parsed = parse_manifest(json.dumps(manifest).encode(), "application/json")
        job = to_job(admit_templates(parsed, "baseline", ["default"]), "team-a", "training")
        assert pods_of(manifest) == job.total_pods
