"""The workload examples in deploy/examples: each, wrapped as ``fedbroker submit -f`` wraps
it, parses, passes the baseline template policy and derives the expected pod sets; each
object validates against its kind's real CRD (FEDBROKER_CRDS; batch Job has none)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from crds import schema_problems

from broker.cli.wrap import wrap
from broker.manifest import admit_templates, parse_manifest, to_job

EXAMPLES = Path(__file__).resolve().parents[2] / "deploy" / "examples"
# (file, its CRD or None, [(pod set, count, GPUs per pod)])
CASES: list[tuple[str, str | None, list[tuple[str, int, int]]]] = [
    ("jobset.yaml", "jobset.x-k8s.io_jobsets.yaml", [("driver", 1, 0), ("workers", 4, 1)]),
    ("pytorchjob.yaml", "kubeflow.org_pytorchjobs.yaml", [("master", 1, 2), ("worker", 3, 2)]),
    ("rayjob.yaml", "ray.io_rayjobs.yaml", [("head", 1, 0), ("gpu", 2, 1), ("submitter", 1, 0)]),
    ("raycluster.yaml", "ray.io_rayclusters.yaml", [("head", 1, 0), ("gpu", 2, 1)]),
    ("indexed-job.yaml", None, [("main", 4, 1)]),
    ("mpijob.yaml", "kubeflow.org_mpijobs-v2beta1.yaml", [("launcher", 1, 0), ("worker", 4, 8)]),
    ("leaderworkerset.yaml", "leaderworkerset.x-k8s.io_leaderworkersets.yaml",
     [("leader", 2, 8), ("worker", 6, 8)]),
]  # fmt: skip


@pytest.mark.parametrize(("name", "crd", "expected"), CASES, ids=[c[0] for c in CASES])
def test_each_example_derives_its_pod_sets(
    name: str, crd: str | None, expected: list[tuple[str, int, int]]
) -> None:
    doc = yaml.safe_load((EXAMPLES / name).read_text())
    wrapped = wrap(doc, None, None)
    assert wrapped["spec"]["queue"] == "training"
    manifest = parse_manifest(json.dumps(wrapped).encode(), "application/json")
    job = to_job(admit_templates(manifest, "baseline", ["default"]), "team-a", "training")
    assert [(ps.name, ps.count, ps.resources.gpus) for ps in job.pod_sets] == expected
    if crd is not None:
        assert schema_problems(doc, crd) == []
        # as admitted (defaults written in, the broker's labels off) it still validates
        assert schema_problems(manifest.wire()["spec"]["workload"], crd) == []


def test_the_trainjob_example_validates_and_derives_from_a_runtime() -> None:
    """deploy/examples/trainjob.yaml is CRD-valid; given the member's runtime (as admission
    looks it up), its trainer is 2 pods of 4 GPUs."""
    doc = yaml.safe_load((EXAMPLES / "trainjob.yaml").read_text())
    assert schema_problems(doc, "trainer.kubeflow.org_trainjobs.yaml") == []
    wrapped = wrap(doc, None, None)
    pod = {"spec": {"restartPolicy": "Never", "containers": [{"name": "node", "image": "x"}]}}
    job = {"metadata": {"labels": {"trainer.kubeflow.org/trainjob-ancestor-step": "trainer"}},
           "spec": {"template": pod}}  # fmt: skip
    wrapped["spec"]["workload"]["runtime"] = {
        "kind": "ClusterTrainingRuntime", "name": "torch-distributed", "clusters": ["east"],
        "spec": {"template": {"spec": {"replicatedJobs": [{"name": "node", "template": job}]}}},
    }  # fmt: skip
    manifest = parse_manifest(json.dumps(wrapped).encode(), "application/json")
    admitted = admit_templates(manifest, "baseline", ["default"])
    derived = to_job(admitted, "team-a", "training")
    assert [(ps.name, ps.count, ps.resources.gpus) for ps in derived.pod_sets] == [("node", 2, 4)]
