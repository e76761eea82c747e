"""The demo's generator now and then submits a JobSet or a PyTorchJob: each it draws is
admitted for the demo's team-a (baseline, ``default`` account) as a small GPU gang."""

from __future__ import annotations

import json
import random

from broker.cli.demo import draw_manifest, workload_manifest
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
