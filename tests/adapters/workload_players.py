"""Controllers the workload tests play as their upstream code does, one class per kind, each
reconciling from the stored object only (tests/adapters/workload_cluster.py calls
``reconcile`` at every poll; a kind x mode matrix can do the same):

* ``MPIOperator``: the standalone MPI Operator v2 (kubeflow/mpi-operator,
  ``pkg/controller/mpi_job_controller.go``): workers ``<name>-worker-<i>`` made as pods,
  labelled ``training.kubeflow.org/{operator-name,job-name,job-role}`` and
  ``replica-index``, with ``hostname``/``subdomain``, the replica's restartPolicy, the env and
  the SSH Secret mount it adds; the launcher a batch Job ``<name>-launcher`` (through the
  member's Job rules) made at once or, with ``launcherCreationPolicy: WaitForWorkersReady``,
  once every worker is Ready; then the Job controller's pod ``<name>-launcher-<x>``. Status:
  ``Created``, ``Running`` (launcher and every worker running), ``Succeeded``/``Failed`` from
  the launcher Job's ``Complete``/``Failed`` (itself from its pod's phase, the Job
  controller's part), reasons and messages as upstream writes them.
* ``LeaderWorkerSetController``: kubernetes-sigs/lws (``pkg/controllers``, ``pkg/webhooks``):
  the leader StatefulSet ``<name>``'s pods ``<name>-<group>`` (from ``leaderTemplate`` or
  else ``workerTemplate``), then, once a group's leader exists (``LeaderCreated``), its
  worker StatefulSet ``<name>-<group>``'s pods ``<name>-<group>-<worker>`` (ordinals from 1);
  labels ``leaderworkerset.sigs.k8s.io/{name,group-index,worker-index,group-key}``, the size
  annotation, the ``LWS_*`` env the pod webhook adds, and the StatefulSet controller's own
  labels. Status: ``Available`` once every group's pods run. Never ends.

Each also plays the member's garbage collector for what it made besides pods (the launcher
Job): gone with its owner. The pods, the launcher Job and the statuses are the ones the
matrix's players make (tests/controllers/mpijob.py, leaderworkerset.py: pure functions
there), made here in this member's synchronous, budgeted way."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

import kmock as kmocklib
from controllers import leaderworkerset, mpijob

if TYPE_CHECKING:
    from workload_cluster import Cluster

Obj = dict[str, Any]
JOBS = kmocklib.resource("batch", "v1", "jobs")
NOW = "2026-01-01T01:00:00Z"


class Player(Protocol):
    """A controller the test plays: makes what it makes (at most ``limit`` pods this time),
    writes the status it writes."""

    def reconcile(self, member: Cluster, limit: int | None) -> None: ...


def condition(kind: str, reason: str, message: str, status: str = "True", **times: str) -> Obj:
    """A condition as its controller writes it (``times``: the kind's other timestamps)."""
    return {"type": kind, "status": status, "reason": reason, "message": message,
            "lastTransitionTime": NOW, **times}  # fmt: skip


def _ready(pod: Mapping[str, Any]) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or ()
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def _phase(pod: Mapping[str, Any] | None) -> str:
    return str(((pod or {}).get("status") or {}).get("phase") or "Pending")


# -- the MPI Operator ---------------------------------------------------------------------


class MPIOperator:
    def __init__(self) -> None:
        self.launcher_pods = 0

    def _worker(self, member: Cluster, obj: Obj, i: int) -> None:
        name, template, _ = mpijob.worker_pod(obj, i)
        member.create_pod(name, template["metadata"], template["spec"])

    def _launcher_job(self, member: Cluster, obj: Obj) -> None:
        body = mpijob.launcher_job(obj)
        owner = {"apiVersion": "kubeflow.org/v2beta1", "kind": "MPIJob",
                 "name": obj["metadata"]["name"],
                 "uid": obj["metadata"].get("uid", "mpijob-uid"), "controller": True}  # fmt: skip
        body["metadata"] |= {"namespace": member.ns, "ownerReferences": [owner]}
        member.k8s.controller_create(JOBS, member.ns, body)

    def _job_controller(self, member: Cluster, name: str, budget: int) -> None:
        """The batch Job controller for the launcher Job: a pod while none is active, its
        end as the Job's conditions (1.31+: SuccessCriteriaMet/FailureTarget first)."""
        job = member.stored(JOBS).get(f"{name}-launcher")
        if job is None or (job.get("status") or {}).get("conditions"):
            return
        pods = [p for n, p in member.pods().items() if n.startswith(f"{name}-launcher-")]
        if any(_phase(p) == "Succeeded" for p in pods):
            done = "Reached expected number of succeeded pods"
            conditions = [condition("SuccessCriteriaMet", "CompletionsReached", done),
                          condition("Complete", "CompletionsReached", done)]  # fmt: skip
            member.patch(JOBS, job, {"conditions": conditions, "succeeded": 1})
            return
        failed = [p for p in pods if _phase(p) == "Failed"]
        if len(failed) > int(job["spec"].get("backoffLimit", 6)):
            limit = "Job has reached the specified backoff limit"
            conditions = [condition("FailureTarget", "BackoffLimitExceeded", limit),
                          condition("Failed", "BackoffLimitExceeded", limit)]  # fmt: skip
            member.patch(JOBS, job, {"conditions": conditions, "failed": len(failed)})
            return
        if len(pods) - len(failed) == 0 and budget > 0:
            template = job["spec"]["template"]
            self.launcher_pods += 1
            owner = {"apiVersion": "batch/v1", "kind": "Job", "name": job["metadata"]["name"],
                     "uid": job["metadata"]["uid"], "controller": True}  # fmt: skip
            meta = {**template.get("metadata", {}), "ownerReferences": [owner]}
            member.create_pod(f"{name}-launcher-{self.launcher_pods:05d}", meta, template["spec"])

    def reconcile(self, member: Cluster, limit: int | None) -> None:
        obj = member.workload()
        if obj is None:  # the garbage collector: the launcher Job goes with its owner
            for owned in list(member.stored(JOBS)):
                member.k8s.objects[JOBS, member.ns, owned].delete()
            return
        name, spec = obj["metadata"]["name"], obj["spec"]
        worker = spec["mpiReplicaSpecs"].get("Worker")
        workers = int(worker["replicas"]) + member.extra if worker else 0
        job = member.stored(JOBS).get(f"{name}-launcher")
        done = bool(job and (job.get("status") or {}).get("conditions"))
        budget = 0 if done else limit if limit is not None else 1 << 30
        for i in range(workers):
            if f"{name}-worker-{i}" not in member.pods() and budget > 0:
                self._worker(member, obj, i)
                budget -= 1
        pods = member.pods()
        made = [pods[f"{name}-worker-{i}"] for i in range(workers) if f"{name}-worker-{i}" in pods]
        waits = spec.get("launcherCreationPolicy") == "WaitForWorkersReady"
        ready = len(made) == workers and all(_ready(p) for p in made)
        if job is None and (ready or not waits) and budget > 0:
            self._launcher_job(member, obj)
        if not done:
            self._job_controller(member, name, budget)
        self._status(member, obj, made)

    def _status(self, member: Cluster, obj: Obj, workers: list[Obj]) -> None:
        name = obj["metadata"]["name"]
        job = member.stored(JOBS).get(f"{name}-launcher")
        pods = [p for n, p in member.pods().items() if n.startswith(f"{name}-launcher-")]
        running = all(_phase(p) == "Running" for p in workers)
        running = running and job is not None and any(_phase(p) == "Running" for p in pods)
        found = mpijob.conditions({**obj, "metadata": {**obj["metadata"], "namespace": member.ns}},
                                  job, pods, running, NOW)  # fmt: skip
        member.patch(member.resource, obj, {"conditions": found, "startTime": NOW})


# -- LeaderWorkerSet ----------------------------------------------------------------------


class LeaderWorkerSetController:
    def _pod(self, member: Cluster, obj: Obj, group: int, worker: int) -> None:
        name, template = leaderworkerset.pod(obj, member.ns, group, worker)
        member.create_pod(name, template["metadata"], template["spec"])

    def reconcile(self, member: Cluster, limit: int | None) -> None:
        obj = member.workload()
        if obj is None:
            return
        name, spec = obj["metadata"]["name"], obj["spec"]
        groups = int(spec.get("replicas", 1))
        size = int(spec["leaderWorkerTemplate"].get("size", 1))
        budget = limit if limit is not None else 1 << 30
        wanted = [(g, 0) for g in range(groups)]
        for g in range(groups):
            if f"{name}-{g}" in member.pods():  # the leader exists: its workers' StatefulSet
                last = size - 1 + (member.extra if g == groups - 1 else 0)
                wanted += [(g, w) for w in range(1, last + 1)]
        for g, w in wanted:
            pod = f"{name}-{g}" if w == 0 else f"{name}-{g}-{w}"
            if pod not in member.pods() and budget > 0:
                self._pod(member, obj, g, w)
                budget -= 1
        found = leaderworkerset.status(obj, leaderworkerset.groups_ready(obj, member.pods()), NOW)
        member.patch(member.resource, obj, found)


PLAYERS: Mapping[str, type[Player]] = {
    "MPIJob": MPIOperator,
    "LeaderWorkerSet": LeaderWorkerSetController,
}
