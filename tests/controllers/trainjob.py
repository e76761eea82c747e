"""Kubeflow Trainer v2's TrainJob controller (kubeflow/trainer ``pkg/controller``, the jobset
plugin ``pkg/runtime/framework/plugins/jobset``), played; the JobSet and Job controllers
(``controllers.jobset``, ``controllers.batchjob``) then make the pods.

* The JobSet: named as the TrainJob, owned by it, labelled
  ``trainer.kubeflow.org/trainjob-name``, its spec the runtime's ``spec.template.spec``
  (``runtimeRef``: a ClusterTrainingRuntime by name, or a TrainingRuntime in the TrainJob's
  namespace) with the TrainJob's ``trainer`` written into the replicated job labelled
  ``trainer.kubeflow.org/trainjob-ancestor-step: trainer`` (one Job of ``numNodes`` pods:
  parallelism and completions; its ``node`` containers take ``image``, ``command``, ``args``
  and ``resourcesPerNode``), then each ``runtimePatches`` entry's pod template patch applied to
  the replicated job of its name (labels and annotations merged, scheduling gates and the
  other pod fields it gives set).
* Status: ``Created`` (``JobsCreationSucceeded``) once the JobSet is made; ``jobsStatus``
  from the JobSet's ``replicatedJobsStatus``; the JobSet's ``Completed`` and ``Failed``
  conditions copied as ``Complete`` and ``Failed`` (their reasons and messages kept).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import kmock as kmocklib

from controllers import jobset
from controllers.base import Controllers, Obj, has_condition
from controllers.jobset import meta_condition

KIND = "TrainJob"
GROUP = "trainer.kubeflow.org"
RESOURCE = kmocklib.resource(GROUP, "v1alpha1", "trainjobs")
CLUSTER_RUNTIMES = kmocklib.resource(GROUP, "v1alpha1", "clustertrainingruntimes")
RUNTIMES = kmocklib.resource(GROUP, "v1alpha1", "trainingruntimes")
ANCESTOR = f"{GROUP}/trainjob-ancestor-step"
CREATED = ("JobsCreationSucceeded", "Succeeded to create Jobs")


def _patch(job: Obj, patch: Mapping[str, Any]) -> None:
    """One runtime patch's pod template applied to a replicated job's Job spec."""
    pod_patch = ((patch.get("template") or {}).get("spec") or {}).get("template") or {}
    meta = job["template"].setdefault("metadata", {})
    for key in ("labels", "annotations"):
        given = (pod_patch.get("metadata") or {}).get(key) or {}
        if given:
            meta[key] = {**(meta.get(key) or {}), **given}
    for key, value in (pod_patch.get("spec") or {}).items():
        job["template"].setdefault("spec", {})[key] = copy.deepcopy(value)


def jobset_spec(train: Mapping[str, Any], runtime: Mapping[str, Any]) -> Obj:
    """The spec of the JobSet the Trainer makes for ``train`` from ``runtime`` (a runtime's
    ``spec``)."""
    spec: Obj = copy.deepcopy(dict(runtime["template"]["spec"]))
    trainer = train["spec"].get("trainer") or {}
    nodes = trainer.get("numNodes") or (runtime.get("mlPolicy") or {}).get("numNodes") or 1
    patches = [p["trainingRuntimeSpec"]["template"]["spec"]
               for p in train["spec"].get("runtimePatches") or ()
               if p.get("trainingRuntimeSpec")]  # fmt: skip
    for rj in spec["replicatedJobs"]:
        job = rj["template"]["spec"]
        if ((rj["template"].get("metadata") or {}).get("labels") or {}).get(ANCESTOR) == "trainer":
            rj["replicas"], job["parallelism"], job["completions"] = 1, nodes, nodes
            for c in job["template"]["spec"]["containers"]:
                if c["name"] != "node":
                    continue
                for key in ("image", "command", "args"):
                    if trainer.get(key) is not None:
                        c[key] = copy.deepcopy(trainer[key])
                if trainer.get("resourcesPerNode"):
                    c["resources"] = copy.deepcopy(trainer["resourcesPerNode"])
        for patch in patches:
            for given in patch.get("replicatedJobs") or ():
                if given.get("name") == rj["name"]:
                    _patch(job, given)
    return spec


class TrainJobController:
    """Reconciles every TrainJob of the member."""

    def __init__(self, c: Controllers) -> None:
        self.c = c

    def runtime(self, train: Mapping[str, Any]) -> Obj | None:
        ref = train["spec"]["runtimeRef"]
        if ref.get("kind") == "TrainingRuntime":
            return self.c.stored(RUNTIMES, train["metadata"]["namespace"]).get(ref["name"])
        return self.c.stored(CLUSTER_RUNTIMES).get(ref["name"])

    async def reconcile(self) -> None:
        for train in self.c.live(RESOURCE):
            if not (has_condition(train, "Complete") or has_condition(train, "Failed")):
                await self._train(train)

    async def _train(self, train: Obj) -> None:
        found = self.c.owned(jobset.RESOURCE, train)
        if not found:
            runtime = self.runtime(train)
            if runtime is None:
                return  # the Trainer waits for its runtime
            name = train["metadata"]["name"]
            found = [await self.c.create(jobset.RESOURCE, train, {
                "apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
                "metadata": {"name": name, "labels": {f"{GROUP}/trainjob-name": name}},
                "spec": jobset_spec(train, runtime["spec"]),
            })]  # fmt: skip
        await self._status(train, found[0])

    async def _status(self, train: Obj, js: Obj) -> None:
        old = train.get("status") or {}
        conditions = [c for c in old.get("conditions") or () if c["type"] == "Created"]
        if not conditions:
            conditions = [meta_condition("Created", *CREATED, self.c.now)]
        for given, kind in (("Completed", "Complete"), ("Failed", "Failed")):
            for c in (js.get("status") or {}).get("conditions") or ():
                if c["type"] == given and c["status"] == "True":
                    conditions.append({**c, "type": kind})
        jobs = [{"name": r["name"], **{k: r.get(k, 0) for k in
                                       ("ready", "succeeded", "failed", "active", "suspended")}}
                for r in (js.get("status") or {}).get("replicatedJobsStatus") or ()]  # fmt: skip
        status: Obj = {"conditions": conditions, "jobsStatus": jobs}
        if any(old.get(k) != v for k, v in status.items()):
            await self.c.status(RESOURCE, train, status)
