"""training-operator v1.9's PyTorchJob controller (kubeflow/training-operator
``pkg/controller.v1/pytorch`` and ``pkg/controller.v1/common``), played.

* Pods: ``<job>-<replica type, lowercase>-<index>`` (``genGeneralName``), from each
  replica spec's template, owned by the PyTorchJob, labelled
  ``training.kubeflow.org/job-name``, ``operator-name: pytorchjob-controller``,
  ``replica-type`` (lowercase), ``replica-index`` and, on the master,
  ``job-role: master``; with a Master, each Worker gets the ``init-pytorch`` init container
  (``initcontainer.go``: waits for ``<job>-master-0`` to resolve; limits 100m/20Mi, requests
  50m/10Mi). Containers named ``pytorch`` get ``MASTER_ADDR``, ``MASTER_PORT``,
  ``WORLD_SIZE``, ``RANK`` and ``PYTHONUNBUFFERED``. A replica spec's ``restartPolicy`` is
  the pods' (``ExitCode`` becomes ``Never``). The master gets a headless Service of its name
  ("Service is in need only for Master").
* Status: ``Created`` first; ``Running`` once the master (or, without one, a worker) runs;
  a replica Failed (restart policy Never or ExitCode): ``Failed``; every master replica
  succeeded: ``Succeeded``, ``Running`` turned False, ``completionTime``. Reasons are
  ``PyTorchJob<Condition>``; ``replicaStatuses`` per replica type.
"""

from __future__ import annotations

import copy
from typing import Any

import kmock as kmocklib

from controllers.base import PODS, Controllers, Obj, has_condition, labels_of, phase
from controllers.base import condition as _condition

KIND = "PyTorchJob"
RESOURCE = kmocklib.resource("kubeflow.org", "v1", "pytorchjobs")
LABEL = "training.kubeflow.org/"
PORT = 23456
INIT = {
    "name": "init-pytorch", "image": "alpine:3.10", "imagePullPolicy": "IfNotPresent",
    "resources": {"limits": {"cpu": "100m", "memory": "20Mi"},
                  "requests": {"cpu": "50m", "memory": "10Mi"}},
}  # fmt: skip


def condition(kind: str, reason: str, message: str, now: str) -> Obj:
    return _condition(kind, reason, message, now, stamp="lastUpdateTime")


class PyTorchJobController:
    """Reconciles every PyTorchJob of the member."""

    def __init__(self, c: Controllers) -> None:
        self.c = c

    async def reconcile(self) -> None:
        for job in self.c.live(RESOURCE):
            if not (has_condition(job, "Succeeded") or has_condition(job, "Failed")):
                await self._job(job)

    async def _job(self, job: Obj) -> None:
        name = job["metadata"]["name"]
        specs: dict[str, Any] = job["spec"]["pytorchReplicaSpecs"]
        world = sum(int(s.get("replicas", 1)) for s in specs.values())
        existing = {p["metadata"]["name"] for p in self.c.owned(PODS, job)}
        for rtype, spec in specs.items():
            for i in range(int(spec.get("replicas", 1))):
                pod = f"{name}-{rtype.lower()}-{i}"
                if pod not in existing:
                    await self._pod(job, rtype, spec, i, world)
        if "Master" in specs:
            selector = {LABEL + "job-name": name, LABEL + "replica-type": "master",
                        LABEL + "replica-index": "0"}  # fmt: skip
            await self.c.service(job, f"{name}-master-0", selector)
        await self._status(job, specs)

    async def _pod(self, job: Obj, rtype: str, spec: Obj, index: int, world: int) -> None:
        name = job["metadata"]["name"]
        template = copy.deepcopy(spec["template"])
        pod_spec = template.setdefault("spec", {})
        policy = spec.get("restartPolicy") or "OnFailure"
        pod_spec["restartPolicy"] = "Never" if policy == "ExitCode" else policy
        rank = index + (1 if rtype == "Worker" and "Master" in job["spec"]["pytorchReplicaSpecs"]
                        else 0)  # fmt: skip
        env = [{"name": "MASTER_PORT", "value": str(PORT)},
               {"name": "MASTER_ADDR", "value": f"{name}-master-0"},
               {"name": "WORLD_SIZE", "value": str(world)}, {"name": "RANK", "value": str(rank)},
               {"name": "PYTHONUNBUFFERED", "value": "1"}]  # fmt: skip
        for container in pod_spec.get("containers") or ():
            if container.get("name") == "pytorch":
                container["env"] = [*(container.get("env") or []), *env]
        if rtype == "Worker" and "Master" in job["spec"]["pytorchReplicaSpecs"]:
            command = ["sh", "-c", f"until nslookup {name}-master-0; do echo waiting for "
                       "master; sleep 2; done;"]  # fmt: skip
            init = {**copy.deepcopy(INIT), "command": command}
            pod_spec["initContainers"] = [*(pod_spec.get("initContainers") or []), init]
        labels = {
            LABEL + "job-name": name,
            LABEL + "operator-name": "pytorchjob-controller",
            LABEL + "replica-type": rtype.lower(),
            LABEL + "replica-index": str(index),
        }
        if rtype == "Master":
            labels[LABEL + "job-role"] = "master"
        await self.c.pod(job, template, f"{name}-{rtype.lower()}-{index}", labels)

    async def _status(self, job: Obj, specs: dict[str, Any]) -> None:
        ns, name = job["metadata"]["namespace"], job["metadata"]["name"]
        pods = self.c.owned(PODS, job)
        replicas: dict[str, Obj] = {}
        for rtype in specs:
            mine = [p for p in pods if labels_of(p).get(LABEL + "replica-type") == rtype.lower()]
            replicas[rtype] = {
                "active": sum(1 for p in mine if phase(p) in ("Pending", "Running")),
                "succeeded": sum(1 for p in mine if phase(p) == "Succeeded"),
                "failed": sum(1 for p in mine if phase(p) == "Failed"),
            }
        lead = "Master" if "Master" in specs else "Worker"
        now = self.c.now
        conditions = list((job.get("status") or {}).get("conditions") or ())
        kinds = {c["type"] for c in conditions}
        add: list[Obj] = []
        if "Created" not in kinds:
            add.append(condition("Created", "PyTorchJobCreated",
                                 f"PyTorchJob {name} is created.", now))  # fmt: skip
        lead_pods = [p for p in pods if labels_of(p).get(LABEL + "replica-type") == lead.lower()]
        if "Running" not in kinds and any(phase(p) == "Running" for p in lead_pods):
            add.append(condition("Running", "PyTorchJobRunning",
                                 f"PyTorchJob {ns}/{name} is running.", now))  # fmt: skip
        failed = next((t for t, r in replicas.items() if r["failed"]), None)
        wanted = int(specs[lead].get("replicas", 1))
        if failed is not None:
            message = (f"PyTorchJob {ns}/{name} is failed because {replicas[failed]['failed']} "
                       f"{failed} replica(s) failed.")  # fmt: skip
            add.append(condition("Failed", "PyTorchJobFailed", message, now))
        elif replicas[lead]["succeeded"] >= wanted:
            conditions = [{**c, "status": "False"} if c["type"] == "Running" else c
                          for c in conditions]  # fmt: skip
            add.append(
                condition(
                    "Succeeded",
                    "PyTorchJobSucceeded",
                    f"PyTorchJob {ns}/{name} successfully completed.",
                    now,
                )
            )
        status: Obj = {"conditions": [*conditions, *add], "replicaStatuses": replicas}
        if any(c["type"] in ("Succeeded", "Failed") for c in add):
            status["completionTime"] = now
        if not add and (job.get("status") or {}).get("replicaStatuses") == replicas:
            return
        await self.c.status(RESOURCE, job, status)
