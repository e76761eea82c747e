"""A TrainJob's pod sets, derived from its runtime as the Trainer controller builds the
JobSet (kubeflow/trainer ``pkg/runtime/framework/plugins/jobset/builder.go``), and the
object the launcher creates: tables over the derivation, pure."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from crds import schema_problems

from broker.manifest import ManifestError, admit_templates, parse_manifest, to_job, workload_of
from broker.manifest.errors import FieldError
from broker.manifest.workloads import derive, field_violations, trainjob

ANCESTOR = "trainer.kubeflow.org/trainjob-ancestor-step"


def rjob(name: str, ancestor: str | None = None, container: str = "node", **job: Any) -> Any:
    meta = {"labels": {ANCESTOR: ancestor}} if ancestor else {}
    pod = {"spec": {"restartPolicy": "Never", "containers": [
        {"name": container, "image": "runtime:1",
         "resources": {"requests": {"cpu": "1", "memory": "1Gi"}}}]}}  # fmt: skip
    return {"name": name, "template": {"metadata": meta, "spec": {**job, "template": pod}}}


def runtime(*jobs: Any, **policy: Any) -> dict[str, Any]:
    return {
        "mlPolicy": {"torch": {}, **policy},
        "template": {"spec": {"replicatedJobs": list(jobs)}},
    }


TORCH = runtime(rjob("node", "trainer"))
GPU4 = {"limits": {"nvidia.com/gpu": "4", "cpu": "8", "memory": "32Gi"}}

CASES = [
    pytest.param(TORCH, {}, [("node", 1, 0)], id="one-node-by-default"),
    pytest.param({**TORCH, "mlPolicy": {"numNodes": 3}}, {}, [("node", 3, 0)], id="runtime-nodes"),
    pytest.param({**TORCH, "mlPolicy": {"numNodes": 3}}, {"numNodes": 2}, [("node", 2, 0)],
                 id="trainjob-nodes-win"),
    pytest.param(TORCH, {"numNodes": 2, "resourcesPerNode": GPU4}, [("node", 2, 4)],
                 id="resources-per-node"),
    pytest.param(runtime(rjob("dataset-initializer", "dataset-initializer", "dataset-initializer"),
                         rjob("node", "trainer", parallelism=9, completions=9)),
                 {"numNodes": 2}, [("dataset-initializer", 1, 0), ("node", 2, 0)],
                 id="initializer-and-trainer"),
    pytest.param(runtime(rjob("node", "trainer"), rjob("sidecar", None, "x", parallelism=2),
                         ), {"numNodes": 2, "resourcesPerNode": GPU4},
                 [("node", 2, 4), ("sidecar", 2, 0)], id="other-job-as-a-jobset-counts"),
]  # fmt: skip


def obj(trainer: dict[str, Any], spec: dict[str, Any] | None) -> dict[str, Any]:
    body: dict[str, Any] = {
        "apiVersion": trainjob.API_VERSION, "kind": "TrainJob",
        "spec": {"runtimeRef": {"name": "torch-distributed"}, "trainer": trainer},
    }  # fmt: skip
    if spec is not None:
        body["runtime"] = {"kind": "ClusterTrainingRuntime", "name": "torch-distributed",
                           "clusters": ["east"], "spec": spec}  # fmt: skip
    return body


@pytest.mark.parametrize(("spec", "trainer", "expected"), CASES)
def test_pod_sets_are_the_runtimes_with_the_trainer_overrides(
    spec: dict[str, Any], trainer: dict[str, Any], expected: list[tuple[str, int, int]]
) -> None:
    manifest = {"apiVersion": "fedbroker.io/v1alpha1", "kind": "FederatedJob",
                "metadata": {"name": "tj"}, "spec": {"workload": obj(trainer, spec)}}  # fmt: skip
    admitted = admit_templates(
        parse_manifest(json.dumps(manifest).encode(), None), "baseline", ["default"]
    )
    job = to_job(admitted, "acme", "training")
    assert [(p.name, p.count, p.resources.gpus) for p in job.pod_sets] == expected
    assert job.clusters == frozenset({"east"})


def test_the_trainer_overrides_go_into_the_node_container_only() -> None:
    spec = runtime(rjob("node", "trainer"))
    spec["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"][
        "containers"
    ].append({"name": "sidecar", "image": "side:1", "env": [{"name": "A", "value": "1"}]})
    trainer = {"image": "me:2", "command": ["torchrun"], "args": ["x"],
               "env": [{"name": "A", "value": "2"}], "resourcesPerNode": GPU4}  # fmt: skip
    [node] = derive(obj(trainer, spec))
    node_c, side = node.template["spec"]["containers"]
    assert (node_c["image"], node_c["command"], node_c["args"]) == ("me:2", ["torchrun"], ["x"])
    assert node_c["resources"] == GPU4 and node_c["env"] == [{"name": "A", "value": "2"}]
    assert side == {"name": "sidecar", "image": "side:1", "env": [{"name": "A", "value": "1"}]}
    assert node.path == ("runtime", "spec", "template", "spec", "replicatedJobs", 0,
                         "template", "spec", "template")  # fmt: skip


JOBS = ("runtime", "spec", "template", "spec", "replicatedJobs")
AFTER_INIT = {**rjob("node", "trainer"), "dependsOn": [{"name": "init", "status": "Complete"}]}
REFUSED = [
    pytest.param(runtime(rjob("init", "dataset-initializer"), AFTER_INIT),
                 (*JOBS, 1, "dependsOn"), id="depends-on"),
    pytest.param(runtime(rjob("node", "trainer"), mpi={"runLauncherAsNode": True}),
                 ("runtime", "spec", "mlPolicy", "mpi", "runLauncherAsNode"),
                 id="launcher-as-node"),
    pytest.param(runtime(), JOBS, id="no-jobs"),
]  # fmt: skip


@pytest.mark.parametrize(("spec", "path"), REFUSED)
def test_a_runtime_the_broker_cannot_count_is_refused_where_it_says_so(
    spec: dict[str, Any], path: tuple[Any, ...]
) -> None:
    with pytest.raises(FieldError) as info:
        derive(obj({}, spec))
    assert info.value.path == path


def test_without_its_runtime_a_trainjob_parses_but_counts_nothing() -> None:
    manifest = {"apiVersion": "fedbroker.io/v1alpha1", "kind": "FederatedJob",
                "metadata": {"name": "tj"}, "spec": {"workload": obj({}, None)}}  # fmt: skip
    parsed = parse_manifest(json.dumps(manifest).encode(), None)
    assert parsed.spec.workload is not None and parsed.spec.workload.unresolved
    with pytest.raises(ManifestError, match=r"spec\.workload\.spec\.runtimeRef\.name: "):
        to_job(parsed, "acme", "training")


def test_the_tenant_may_not_patch_the_runtime_itself() -> None:
    body = obj({}, None)
    body["spec"]["runtimePatches"] = [{"manager": "me", "trainingRuntimeSpec": {}}]
    body["spec"]["managedBy"] = "kueue.x-k8s.io/multikueue"
    paths = {v.path for v in field_violations(body)}
    assert paths == {("spec", "runtimePatches"), ("spec", "managedBy")}


def test_the_created_trainjob_carries_the_brokers_runtime_patch_and_validates() -> None:
    manifest = {"apiVersion": "fedbroker.io/v1alpha1", "kind": "FederatedJob",
                "metadata": {"name": "tj"},
                "spec": {"workload": obj({"numNodes": 2}, runtime(
                    rjob("init", "model-initializer", "model-initializer"),
                    rjob("node", "trainer")))}}  # fmt: skip
    admitted = admit_templates(
        parse_manifest(json.dumps(manifest).encode(), None), "baseline", ["default"]
    )
    spec = workload_of(admitted.wire())
    assert spec is not None and "runtime" not in spec.object
    [patch] = spec.object["spec"]["runtimePatches"]
    assert patch["manager"] == "fedbroker.io/broker"
    jobs = patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]
    assert [j["name"] for j in jobs] == ["init", "node"]
    assert [name for name, _ in spec.pod_sets] == ["init", "node"]
    body = copy.deepcopy(dict(spec.object))
    body["metadata"] = {"name": "tj", "namespace": "team-acme"}
    assert schema_problems(body, "trainer.kubeflow.org_trainjobs.yaml") == []


@pytest.mark.parametrize("priority", [False, True], ids=["scheduler", "and-priority"])
def test_a_member_runtime_may_name_its_gang_scheduler_yet_keeps_every_other_rule(
    priority: bool,
) -> None:
    """In delegate mode the member's runtime names the gang scheduler (a runtime patch
    cannot): the runtime is the member's, so its schedulerName is no tenant's choice and
    is admitted; every other rule still holds on its templates."""
    named = runtime(rjob("node", "trainer"))
    pod = named["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    pod["schedulerName"] = "scheduler-plugins-scheduler"
    if priority:
        pod["priorityClassName"] = "high"
    manifest = {
        "apiVersion": "fedbroker.io/v1alpha1",
        "kind": "FederatedJob",
        "metadata": {"name": "tj"},
        "spec": {"workload": obj({"numNodes": 2}, named)},
    }
    parsed = parse_manifest(json.dumps(manifest).encode(), None)
    if priority:
        with pytest.raises(ManifestError) as info:
            admit_templates(parsed, "baseline", ["default"])
        assert str(info.value).startswith("spec.workload.runtime.spec.template.spec.")
        assert "priorityClassName: the broker orders jobs" in str(info.value)
        assert "and 1 more" not in str(info.value)  # the scheduler is not refused beside it
        return
    admitted = admit_templates(parsed, "baseline", ["default"])
    assert [p.count for p in to_job(admitted, "acme", "training").pod_sets] == [2]
    stored = admitted.wire()["spec"]["workload"]["runtime"]["spec"]
    [node] = stored["template"]["spec"]["replicatedJobs"]
    assert node["template"]["spec"]["template"]["spec"]["schedulerName"] == pod["schedulerName"]
