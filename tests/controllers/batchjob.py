"""kube-controller-manager's Job controller (batch/v1, as Kubernetes 1.31 runs it), played:
``pkg/controller/job/job_controller.go`` and ``indexed_job_utils.go``.

* Pods: an Indexed Job's pod of index ``i`` is ``<job>-<i>-<5 random>`` (generateName
  ``<job>-<i>-``), labelled and annotated ``batch.kubernetes.io/job-completion-index``, its
  ``hostname`` ``<job>-<i>`` and every container given ``JOB_COMPLETION_INDEX`` from that
  annotation; a NonIndexed Job's pods are ``<job>-<5 random>``. Every pod is the template's
  (which the API server already gave ``controller-uid``/``job-name`` labels), owned by the
  Job. At most ``parallelism`` pods are active; a successor is made as a pod succeeds
  (Indexed: the lowest index neither succeeded nor active), a failed index is made again
  while the backoff limit allows.
* Status: ``active``/``succeeded``/``failed``/``ready``, ``completedIndexes`` (Indexed),
  ``startTime``; once the completions are reached ``SuccessCriteriaMet``
  (``CompletionsReached``, "Reached expected number of succeeded pods"), then, no pod left
  running, ``Complete`` with the same reason and ``completionTime``. More failures than
  ``backoffLimit``: ``FailureTarget`` (``BackoffLimitExceeded``, "Job has reached the
  specified backoff limit"), the active pods deleted, then ``Failed``. 1.31 writes the
  interim condition first and the terminal one once no pod is left running.
* Not played: the ``batch.kubernetes.io/job-tracking`` finalizer (the member has no
  finalizer-removing controller to release it), pod failure policies, success policies,
  ``backoffLimitPerIndex``, suspension.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from controllers.base import (
    JOBS,
    PODS,
    TERMINAL,
    Controllers,
    Obj,
    condition,
    has_condition,
    labels_of,
    phase,
)

KIND = "Job"
RESOURCE = JOBS
INDEX = "batch.kubernetes.io/job-completion-index"
DONE = ("Reached expected number of succeeded pods", "CompletionsReached")
BACKOFF = ("Job has reached the specified backoff limit", "BackoffLimitExceeded")


def index_of(pod: Mapping[str, Any]) -> int | None:
    value = labels_of(pod).get(INDEX)
    return None if value is None else int(value)


def compact(indexes: set[int]) -> str:
    """``completedIndexes`` as the API writes it: "1,3-5,7"."""
    runs: list[list[int]] = []
    for i in sorted(indexes):
        if runs and runs[-1][1] == i - 1:
            runs[-1][1] = i
        else:
            runs.append([i, i])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


class JobController:
    """Reconciles every batch/v1 Job of the member (a JobSet's and a RayJob's included)."""

    def __init__(self, c: Controllers) -> None:
        self.c = c

    async def reconcile(self) -> None:
        for job in self.c.live(JOBS):
            if not (has_condition(job, "Complete") or has_condition(job, "Failed")):
                await self._job(job)

    async def _job(self, job: Obj) -> None:
        spec = job["spec"]
        pods = self.c.owned(PODS, job)
        active = [p for p in pods if phase(p) not in TERMINAL]
        failed = sum(1 for p in pods if phase(p) == "Failed")
        if has_condition(job, "FailureTarget") or has_condition(job, "SuccessCriteriaMet"):
            await self._finish(job, active)
            return
        indexed = spec.get("completionMode") == "Indexed"
        done = {index_of(p) for p in pods if phase(p) == "Succeeded"}
        succeeded = len(done) if indexed else sum(1 for p in pods if phase(p) == "Succeeded")
        conditions: list[Obj] = list((job.get("status") or {}).get("conditions") or ())
        if failed > int(spec.get("backoffLimit", 6)):
            conditions.append(condition("FailureTarget", BACKOFF[1], BACKOFF[0], self.c.now))
        elif succeeded >= int(spec.get("completions") or 1):
            conditions.append(condition("SuccessCriteriaMet", DONE[1], DONE[0], self.c.now))
        else:
            active += await self._make(job, active, done, succeeded)
        status: Obj = {
            "active": len(active), "succeeded": succeeded, "failed": failed,
            "ready": sum(1 for p in active if phase(p) == "Running"), "terminating": 0,
            "startTime": (job.get("status") or {}).get("startTime") or self.c.now,
            "uncountedTerminatedPods": {}, "conditions": conditions or None,
        }  # fmt: skip
        if indexed:
            status["completedIndexes"] = compact({i for i in done if i is not None})
        if any((job.get("status") or {}).get(k) != v for k, v in status.items()):
            await self.c.status(JOBS, job, status)

    async def _make(self, job: Obj, active: list[Obj], done: set[int | None], ok: int) -> list[Obj]:
        """The pods to add now (see the module's docstring)."""
        spec = job["spec"]
        completions = int(spec.get("completions") or 1)
        room = min(int(spec.get("parallelism") or 1), completions - ok) - len(active)
        if room <= 0:
            return []
        name = job["metadata"]["name"]
        if spec.get("completionMode") != "Indexed":
            return [await self._pod(job, f"{name}-{self.c.suffix()}", None) for _ in range(room)]
        busy = {index_of(p) for p in active}
        todo = [i for i in range(completions) if i not in done and i not in busy][:room]
        return [await self._pod(job, f"{name}-{i}-{self.c.suffix()}", i) for i in todo]

    async def _pod(self, job: Obj, name: str, index: int | None) -> Obj:
        template = copy.deepcopy(job["spec"]["template"])
        if index is None:
            return await self.c.pod(job, template, name, {})
        meta = template.setdefault("metadata", {})
        meta.setdefault("annotations", {})[INDEX] = str(index)
        pod_spec = template.setdefault("spec", {})
        pod_spec.setdefault("hostname", f"{job['metadata']['name']}-{index}")
        source = {"fieldRef": {"fieldPath": f"metadata.annotations['{INDEX}']"}}
        for kind in ("initContainers", "containers"):
            for container in pod_spec.get(kind) or ():
                env = container.setdefault("env", [])
                if not any(e.get("name") == "JOB_COMPLETION_INDEX" for e in env):
                    env.append({"name": "JOB_COMPLETION_INDEX", "valueFrom": source})
        return await self.c.pod(job, template, name, {INDEX: str(index)})

    async def _finish(self, job: Obj, active: list[Obj]) -> None:
        """After the interim condition: the active pods deleted (failure) or waited for
        (success), then the terminal condition."""
        failing = has_condition(job, "FailureTarget")
        if failing:
            for pod in active:
                await self.c.delete(PODS, pod)
        elif active:
            return
        conditions = list((job.get("status") or {}).get("conditions") or ())
        message, reason = BACKOFF if failing else DONE
        final = condition("Failed" if failing else "Complete", reason, message, self.c.now)
        status: Obj = {"conditions": [*conditions, final], "active": 0, "ready": 0}
        if not failing:
            status["completionTime"] = self.c.now
        await self.c.status(JOBS, job, status)
