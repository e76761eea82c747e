"""The JobSet controller (kubernetes-sigs/jobset ``pkg/controllers/jobset_controller.go``),
played; the Job controller (``controllers.batchjob``) then makes each child Job's pods.

* Child Jobs: ``<jobset>-<replicatedJob>-<jobIndex>`` for each replicated job's
  ``replicas``, from its template, owned by the JobSet; ``labelAndAnnotateObject`` labels
  and annotates both the Job and its pod template with ``jobset.sigs.k8s.io/jobset-name``,
  ``replicatedjob-name``, ``restart-attempt``, ``replicatedjob-replicas``,
  ``global-replicas``, ``job-index``, ``job-key`` (sha1 of ``<namespace>/<job>``) and
  ``job-global-index`` (the replicas of the replicated jobs before it plus ``job-index``);
  with DNS hostnames (the default) the pods' ``subdomain`` is the JobSet's name and a
  headless Service of that name selects ``jobset-name``.
* Status: ``replicatedJobsStatus`` per replicated job; a child Job ``Failed`` fails the
  JobSet (no failure policy: no restarts) with ``FailedJobs`` "jobset failed due to one or
  more job failures"; every child Job ``Complete`` (success policy ``All``) completes it with
  ``AllJobsCompleted`` "jobset completed successfully"; ``terminalState`` says which.
"""

from __future__ import annotations

import copy
import hashlib
from collections.abc import Mapping
from typing import Any

import kmock as kmocklib

from controllers.base import JOBS, Controllers, Obj, has_condition

KIND = "JobSet"
RESOURCE = kmocklib.resource("jobset.x-k8s.io", "v1alpha2", "jobsets")
PREFIX = "jobset.sigs.k8s.io/"
COMPLETED = ("AllJobsCompleted", "jobset completed successfully")
FAILED = ("FailedJobs", "jobset failed due to one or more job failures")


def meta_condition(kind: str, reason: str, message: str, now: str) -> Obj:
    """A ``metav1.Condition`` (what JobSet and KubeRay write)."""
    return {"type": kind, "status": "True", "reason": reason, "message": message,
            "lastTransitionTime": now}  # fmt: skip


def _labels(js: Mapping[str, Any], rjob: Mapping[str, Any], index: int) -> dict[str, str]:
    name, namespace = js["metadata"]["name"], js["metadata"]["namespace"]
    rjobs = js["spec"]["replicatedJobs"]
    before = 0
    for other in rjobs:
        if other["name"] == rjob["name"]:
            break
        before += int(other.get("replicas", 1))
    job = f"{name}-{rjob['name']}-{index}"
    values = {
        "jobset-name": name, "replicatedjob-name": rjob["name"], "restart-attempt": "0",
        "replicatedjob-replicas": str(rjob.get("replicas", 1)),
        "global-replicas": str(sum(int(r.get("replicas", 1)) for r in rjobs)),
        "job-index": str(index),
        "job-key": hashlib.sha1(f"{namespace}/{job}".encode()).hexdigest(),
        "job-global-index": str(before + index),
    }  # fmt: skip
    return {PREFIX + k: v for k, v in values.items()}


def _dress(obj: Obj, labels: Mapping[str, str]) -> None:
    meta = obj.setdefault("metadata", {})
    meta["labels"] = {**(meta.get("labels") or {}), **labels}
    meta["annotations"] = {**(meta.get("annotations") or {}), **labels}


class JobSetController:
    """Reconciles every JobSet of the member."""

    def __init__(self, c: Controllers) -> None:
        self.c = c

    async def reconcile(self) -> None:
        for js in self.c.live(RESOURCE):
            if not (has_condition(js, "Completed") or has_condition(js, "Failed")):
                await self._jobset(js)

    async def _jobset(self, js: Obj) -> None:
        name = js["metadata"]["name"]
        dns = ((js["spec"].get("network") or {}).get("enableDNSHostnames")) is not False
        if dns:
            await self.c.service(js, name, {PREFIX + "jobset-name": name})
        existing = {j["metadata"]["name"]: j for j in self.c.owned(JOBS, js)}
        for rjob in js["spec"]["replicatedJobs"]:
            for index in range(int(rjob.get("replicas", 1))):
                job_name = f"{name}-{rjob['name']}-{index}"
                if job_name not in existing:
                    existing[job_name] = await self._job(js, rjob, index, job_name, dns)
        await self._status(js, list(existing.values()))

    async def _job(self, js: Obj, rjob: Obj, index: int, name: str, dns: bool) -> Obj:
        template = copy.deepcopy(rjob["template"])
        labels = _labels(js, rjob, index)
        body: Obj = {"apiVersion": "batch/v1", "kind": "Job",
                     "metadata": {**(template.get("metadata") or {}), "name": name},
                     "spec": template["spec"]}  # fmt: skip
        _dress(body, labels)
        _dress(body["spec"]["template"], labels)
        if dns:
            body["spec"]["template"].setdefault("spec", {})["subdomain"] = js["metadata"]["name"]
        return await self.c.create(JOBS, js, body)

    async def _status(self, js: Obj, jobs: list[Obj]) -> None:
        per: dict[str, Obj] = {}
        for job in jobs:
            rjob = job["metadata"]["labels"][PREFIX + "replicatedjob-name"]
            row = per.setdefault(rjob, {"name": rjob, "ready": 0, "succeeded": 0, "failed": 0,
                                        "active": 0, "suspended": 0})  # fmt: skip
            st = job.get("status") or {}
            key = "succeeded" if has_condition(job, "Complete") else "failed"
            if has_condition(job, "Complete") or has_condition(job, "Failed"):
                row[key] += 1
            elif st.get("active"):
                row["active"] += 1
                row["ready"] += 1 if st.get("ready") else 0
        status: Obj = {"replicatedJobsStatus": list(per.values()), "restarts": 0}
        wanted = sum(int(r.get("replicas", 1)) for r in js["spec"]["replicatedJobs"])
        end = None
        if any(has_condition(j, "Failed") for j in jobs):
            end = ("Failed", *FAILED)
        elif len(jobs) == wanted and all(has_condition(j, "Complete") for j in jobs):
            end = ("Completed", *COMPLETED)
        if end is not None:
            status["conditions"] = [meta_condition(*end, self.c.now)]
            status["terminalState"] = end[0]
        old = js.get("status") or {}
        if any(old.get(k) != v for k, v in status.items()):
            await self.c.status(RESOURCE, js, status)
