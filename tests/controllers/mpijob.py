"""The standalone MPI Operator v2's MPIJob controller (kubeflow/mpi-operator
``pkg/controller/mpi_job_controller.go``, kubeflow.org/v2beta1), played; the Job controller
(``controllers.batchjob``) makes the launcher Job's pod.

* Children, owned by the MPIJob: the headless Service ``<name>`` (selects the job's pods),
  the ConfigMap ``<name>-config`` (the hostfile), the SSH Secret ``<name>-ssh``; each worker
  a pod ``<name>-worker-<i>`` made by the operator itself, labelled
  ``training.kubeflow.org/{operator-name: mpi-operator, job-name, job-role: worker,
  replica-index}``, ``hostname`` its name, ``subdomain`` the job's, the replica's
  ``restartPolicy``, ``K_MPI_JOB_ROLE`` in its first container's env, the SSH keys mounted at
  ``sshAuthMountPath`` and, with no command, ``/usr/sbin/sshd -De``; the launcher a batch Job
  ``<name>-launcher`` (``runPolicy``'s ``backoffLimit``, ``activeDeadlineSeconds``, TTL) whose
  pods are labelled ``job-role: launcher``, get the hostfile mounted and its env, made at once
  (``launcherCreationPolicy: AtStartup``, the default) or once every worker is Ready
  (``WaitForWorkersReady``).
* Status: ``Created`` (``MPIJobCreated``), ``Running`` (the launcher and every worker run),
  then from the launcher Job: ``Complete`` -> ``Succeeded`` (``MPIJobSucceeded``), ``Failed``
  -> ``Failed`` with the Job's reason and message, ``BackoffLimitExceeded`` followed by the
  last failed launcher pod's reason and message; ``Running`` turns False at the end;
  ``replicaStatuses`` per replica type, ``startTime``, ``completionTime``. At the end,
  ``cleanPodPolicy`` ``Running`` deletes the running workers, ``All`` every worker (the
  v2beta1 default ``None`` keeps them).

The pieces are pure functions (``worker_pod``, ``launcher_job``, ``conditions``) that
tests/adapters/workload_players.py plays in its own member too.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

import kmock as kmocklib

from controllers.base import (
    JOBS,
    PODS,
    Controllers,
    Obj,
    condition,
    has_condition,
    labels_of,
    phase,
)

KIND = "MPIJob"
RESOURCE = kmocklib.resource("kubeflow.org", "v2beta1", "mpijobs")
CONFIGMAPS = kmocklib.resource("", "v1", "configmaps")
SECRETS = kmocklib.resource("", "v1", "secrets")
LABEL = "training.kubeflow.org/"
ROLE = LABEL + "job-role"
HOSTFILE = ("OMPI_MCA_orte_default_hostfile", "/etc/mpi/hostfile")


def labels(name: str, role: str) -> dict[str, str]:
    return {LABEL + "operator-name": "mpi-operator", LABEL + "job-name": name, ROLE: role}


def _env(container: Obj, *env: tuple[str, str]) -> None:
    container["env"] = [*container.get("env", ()), *({"name": k, "value": v} for k, v in env)]


def _ssh(pod_spec: Obj, name: str, spec: Mapping[str, Any]) -> None:
    secret = {"secretName": f"{name}-ssh", "defaultMode": 0o600}
    pod_spec["volumes"] = [*pod_spec.get("volumes", ()), {"name": "ssh-auth", "secret": secret}]
    first = pod_spec["containers"][0]
    mount = {"name": "ssh-auth", "mountPath": spec.get("sshAuthMountPath", "/root/.ssh")}
    first["volumeMounts"] = [*first.get("volumeMounts", ()), mount]


def worker_pod(obj: Mapping[str, Any], index: int) -> tuple[str, Obj, Obj]:
    """Worker ``index``'s pod as the operator makes it: (name, template with its labels
    merged in, the labels it adds)."""
    name, spec = obj["metadata"]["name"], obj["spec"]
    replica = spec["mpiReplicaSpecs"]["Worker"]
    template = copy.deepcopy(replica["template"])
    meta = template.setdefault("metadata", {})
    added = {**labels(name, "worker"), LABEL + "replica-index": str(index)}
    meta["labels"] = {**meta.get("labels", {}), **added}
    pod_spec = template["spec"]
    pod_spec |= {"hostname": f"{name}-worker-{index}", "subdomain": name,
                 "restartPolicy": replica.get("restartPolicy", "Never")}  # fmt: skip
    first = pod_spec["containers"][0]
    if not first.get("command") and not first.get("args"):
        first["command"] = ["/usr/sbin/sshd", "-De"]
    _env(first, ("K_MPI_JOB_ROLE", "worker"))
    _ssh(pod_spec, name, spec)
    return f"{name}-worker-{index}", template, added


def launcher_job(obj: Mapping[str, Any]) -> Obj:
    """The launcher's batch Job ``<name>-launcher`` (no owner reference: the caller's)."""
    name, spec = obj["metadata"]["name"], obj["spec"]
    replica = spec["mpiReplicaSpecs"]["Launcher"]
    template = copy.deepcopy(replica["template"])
    meta = template.setdefault("metadata", {})
    meta["labels"] = {**meta.get("labels", {}), **labels(name, "launcher")}
    pod_spec = template["spec"]
    pod_spec |= {"hostname": f"{name}-launcher", "subdomain": name,
                 "restartPolicy": replica.get("restartPolicy", "OnFailure")}  # fmt: skip
    _env(pod_spec["containers"][0], ("K_MPI_JOB_ROLE", "launcher"), HOSTFILE)
    _ssh(pod_spec, name, spec)
    items = [{"key": "hostfile", "path": "hostfile"}]
    config = {"name": "mpi-job-config", "configMap": {"name": f"{name}-config", "items": items}}
    pod_spec["volumes"].append(config)
    run = spec.get("runPolicy") or {}
    passed = ("backoffLimit", "activeDeadlineSeconds", "ttlSecondsAfterFinished")
    return {"apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": f"{name}-launcher", "labels": {"app": name}},
            "spec": {"template": template, **{k: run[k] for k in passed if k in run}}}  # fmt: skip


def conditions(
    obj: Mapping[str, Any], job: Mapping[str, Any] | None, launchers: Sequence[Mapping[str, Any]],
    running: bool, now: str,
) -> list[Obj]:  # fmt: skip
    """The MPIJob's conditions from its launcher Job and pods (``running``: the launcher and
    every worker run), as ``updateMPIJobStatus`` writes them."""

    def mpi(kind: str, reason: str, message: str, status: str = "True") -> Obj:
        return {**condition(kind, reason, message, now, stamp="lastUpdateTime"), "status": status}

    what = f"MPIJob {obj['metadata']['namespace']}/{obj['metadata']['name']}"
    out = [mpi("Created", "MPIJobCreated", f"{what} is created.")]
    ended = {c["type"]: c for c in ((job or {}).get("status") or {}).get("conditions") or ()
             if c.get("status") == "True"}  # fmt: skip
    if running or ended.keys() & {"Complete", "Failed"}:
        out.append(mpi("Running", "MPIJobRunning", f"{what} is running."))
    if "Complete" in ended:
        out[-1]["status"] = "False"
        out.append(mpi("Succeeded", "MPIJobSucceeded", f"{what} successfully completed."))
    elif "Failed" in ended:
        out[-1]["status"] = "False"
        reason, message = ended["Failed"]["reason"], ended["Failed"]["message"]
        failed = [p for p in launchers if phase(p) == "Failed"]
        if reason == "BackoffLimitExceeded" and failed:
            last = failed[-1].get("status") or {}
            reason += "/" + str(last.get("reason") or "")
            message += ": " + str(last.get("message") or "")
        out.append(mpi("Failed", reason, message))
    return out


class MPIJobController:
    """Reconciles every MPIJob of the member."""

    def __init__(self, c: Controllers) -> None:
        self.c = c

    async def reconcile(self) -> None:
        for obj in self.c.live(RESOURCE):
            if not (has_condition(obj, "Succeeded") or has_condition(obj, "Failed")):
                await self._job(obj)

    async def _job(self, obj: Obj) -> None:
        name, spec = obj["metadata"]["name"], obj["spec"]
        await self.c.service(obj, name, {LABEL + "job-name": name})
        for resource, kind, suffix in ((CONFIGMAPS, "ConfigMap", "config"),
                                       (SECRETS, "Secret", "ssh")):  # fmt: skip
            if not self.c.owned(resource, obj):
                await self.c.create(
                    resource,
                    obj,
                    {"apiVersion": "v1", "kind": kind, "metadata": {"name": f"{name}-{suffix}"}},
                )
        mine = {p["metadata"]["name"]: p for p in self.c.owned(PODS, obj)}
        wanted = int(spec["mpiReplicaSpecs"]["Worker"].get("replicas", 0))
        for i in range(wanted):
            if f"{name}-worker-{i}" not in mine:
                pod_name, template, added = worker_pod(obj, i)
                made = await self.c.pod(obj, template, pod_name, added)
                mine[made["metadata"]["name"]] = made
        workers = list(mine.values())
        jobs = self.c.owned(JOBS, obj)
        waits = spec.get("launcherCreationPolicy") == "WaitForWorkersReady"
        ready = len(workers) == wanted and all(_ready(p) for p in workers)
        if not jobs and (ready or not waits):
            jobs = [await self.c.create(JOBS, obj, launcher_job(obj))]
        await self._status(obj, jobs[0] if jobs else None, workers)

    async def _status(self, obj: Obj, job: Obj | None, workers: list[Obj]) -> None:
        launchers = self.c.owned(PODS, job) if job is not None else []
        launchers.sort(key=lambda p: str(p["metadata"].get("creationTimestamp")))
        running = any(phase(p) == "Running" for p in launchers) and all(
            phase(p) == "Running" for p in workers
        )
        found = conditions(obj, job, launchers, running, self.c.now)
        replicas = {
            role: {"active": sum(1 for p in pods if phase(p) in ("Pending", "Running")),
                   "succeeded": sum(1 for p in pods if phase(p) == "Succeeded"),
                   "failed": sum(1 for p in pods if phase(p) == "Failed")}
            for role, pods in (("Launcher", launchers), ("Worker", workers))
        }  # fmt: skip
        old = obj.get("status") or {}
        status: Obj = {"conditions": [_kept(c, old) for c in found], "replicaStatuses": replicas,
                       "startTime": old.get("startTime") or self.c.now}  # fmt: skip
        ended = found[-1]["type"] in ("Succeeded", "Failed")
        if ended:
            status["completionTime"] = self.c.now
            await self._clean(obj, workers)
        if any(old.get(k) != v for k, v in status.items()):
            await self.c.status(RESOURCE, obj, status)

    async def _clean(self, obj: Obj, workers: list[Obj]) -> None:
        policy = (obj["spec"].get("runPolicy") or {}).get("cleanPodPolicy") or "None"
        for pod in workers:
            if policy == "All" or (policy == "Running" and phase(pod) in ("Pending", "Running")):
                await self.c.delete(PODS, pod)


def _kept(found: Obj, old: Mapping[str, Any]) -> Obj:
    """A condition as already written, when its status has not changed (its times kept)."""
    for c in old.get("conditions") or ():
        if c.get("type") == found["type"] and c.get("status") == found["status"]:
            return dict(c)
    return found


def _ready(pod: Mapping[str, Any]) -> bool:
    found = (pod.get("status") or {}).get("conditions") or ()
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in found)


def is_launcher(pod: Mapping[str, Any]) -> bool:
    return labels_of(pod).get(ROLE) == "launcher"
