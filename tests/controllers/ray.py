"""KubeRay's RayCluster and RayJob controllers (ray-project/kuberay
``ray-operator/controllers/ray``), played.

RayCluster (``raycluster_controller.go``, ``common/pod.go``, ``utils/util.go``):
* Pods: the head ``<cluster>-head-<5 random>`` and, per worker group, ``replicas`` (clamped
  to ``[minReplicas, maxReplicas]``) times ``numOfHosts`` workers
  ``<cluster>-<group>-worker-<5 random>`` (``PodName``: lowercase), from the group's
  template, owned by the RayCluster, labelled ``ray.io/cluster``, ``ray.io/node-type``
  (head/worker), ``ray.io/group`` (``headgroup`` for the head), ``ray.io/identifier``,
  ``ray.io/is-ray-node: yes``, ``app.kubernetes.io/name: kuberay`` and
  ``app.kubernetes.io/created-by: kuberay-operator``; workers get the ``wait-gcs-ready``
  init container (the Ray container's image, env, mounts and securityContext; 200m/256Mi).
  The head Service ``<cluster>-head-svc``.
* Status: ``state: ready`` once the head and every worker run; worker replica counts.

RayJob (``rayjob_controller.go``, K8sJobMode):
* ``Initializing``: ``rayClusterName`` ``<rayjob>-<5 random>`` (``GenerateRayClusterName``)
  and ``jobId``; the RayCluster made with the RayJob's labels copied plus
  ``ray.io/originated-from-cr-name`` and ``ray.io/originated-from-crd: RayJob``, its
  annotations, an owner reference to the RayJob.
* The cluster ready: the submitter Job ``<rayjob>`` (from ``submitterPodTemplate``, owned by
  the RayJob; the Job controller makes its pod), ``jobDeploymentStatus: Running``.
* The Ray job's own status stands for what the dashboard reports: ``RUNNING`` while the submitter
  runs, ``SUCCEEDED``/``FAILED`` as the submitter Job ends (``ray job submit`` follows the job and
  exits with its outcome; the Job's own pod retries are one attempt). ``SUCCEEDED``: ``Complete``.
  ``FAILED`` with retries left (``status.failed`` below ``backoffLimit``): ``Retrying``, then the
  cluster and submitter deleted and a new attempt from ``New``; no retries left: ``Failed``, reason
  ``AppFailed``.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import kmock as kmocklib

from controllers.base import JOBS, PODS, Controllers, Obj, has_condition, labels_of, phase
from controllers.jobset import meta_condition

RAY_CLUSTERS = kmocklib.resource("ray.io", "v1", "rayclusters")
RAY_JOBS = kmocklib.resource("ray.io", "v1", "rayjobs")
CREATED_BY = {"app.kubernetes.io/name": "kuberay",
              "app.kubernetes.io/created-by": "kuberay-operator"}  # fmt: skip


def workers_wanted(group: Mapping[str, Any]) -> int:
    low, high = int(group.get("minReplicas", 0)), int(group.get("maxReplicas", 2**31 - 1))
    replicas = group.get("replicas")
    count = low if replicas is None else min(max(int(replicas), low), high)
    return count * int(group.get("numOfHosts", 1))


def _wait_gcs(template: Mapping[str, Any]) -> Obj:
    ray = (template.get("spec") or {}).get("containers", [{}])[0]
    out: Obj = {
        "name": "wait-gcs-ready", "image": ray.get("image", ""),
        "command": ["/bin/bash", "-lc", "--"],
        "args": ["until ray health-check --address ${FQ_RAY_IP}:6379; do sleep 5; done"],
        "resources": {"limits": {"cpu": "200m", "memory": "256Mi"},
                      "requests": {"cpu": "200m", "memory": "256Mi"}},
    }  # fmt: skip
    for key in ("env", "volumeMounts", "securityContext"):
        if ray.get(key):
            out[key] = copy.deepcopy(ray[key])
    return out


class RayClusterController:
    """Reconciles every RayCluster of the member (a RayJob's included)."""

    def __init__(self, c: Controllers) -> None:
        self.c = c

    async def reconcile(self) -> None:
        for cluster in self.c.live(RAY_CLUSTERS):
            await self._cluster(cluster)

    async def _cluster(self, cluster: Obj) -> None:
        name = cluster["metadata"]["name"]
        spec = cluster["spec"]
        pods = self.c.owned(PODS, cluster)
        await self.c.service(cluster, f"{name}-head-svc",
                             {"ray.io/cluster": name, "ray.io/node-type": "head"})  # fmt: skip
        if not [p for p in pods if labels_of(p).get("ray.io/node-type") == "head"]:
            pods.append(await self._pod(cluster, spec["headGroupSpec"]["template"], "head",
                                        "headgroup"))  # fmt: skip
        desired = 0
        for group in spec.get("workerGroupSpecs") or ():
            wanted = workers_wanted(group)
            desired += wanted
            have = [p for p in pods if labels_of(p).get("ray.io/group") == group["groupName"]]
            for _ in range(wanted - len(have)):
                pods.append(await self._pod(cluster, group["template"], "worker",
                                            group["groupName"]))  # fmt: skip
        workers = [p for p in pods if labels_of(p).get("ray.io/node-type") == "worker"]
        running = sum(1 for p in workers if phase(p) == "Running")
        head_up = any(phase(p) == "Running" for p in pods if p not in workers)
        status: Obj = {
            "desiredWorkerReplicas": desired, "readyWorkerReplicas": running,
            "availableWorkerReplicas": running, "head": {"serviceName": f"{name}-head-svc"},
        }  # fmt: skip
        if head_up and running >= desired:
            status["state"] = "ready"
        old = cluster.get("status") or {}
        if any(old.get(k) != v for k, v in status.items()):
            await self.c.status(RAY_CLUSTERS, cluster, status)

    async def _pod(self, cluster: Obj, template: Obj, node_type: str, group: str) -> Obj:
        name = cluster["metadata"]["name"]
        given = copy.deepcopy(template)
        labels = {"ray.io/cluster": name, "ray.io/node-type": node_type, "ray.io/group": group,
                  "ray.io/identifier": f"{name}-{node_type}", "ray.io/is-ray-node": "yes",
                  **CREATED_BY}  # fmt: skip
        if node_type == "head":
            pod_name = f"{name}-head-{self.c.suffix()}"
        else:
            pod_name = f"{name}-{group}-worker-{self.c.suffix()}".lower()
            spec = given.setdefault("spec", {})
            spec["initContainers"] = [*(spec.get("initContainers") or []), _wait_gcs(template)]
        return await self.c.pod(cluster, given, pod_name, labels)


class RayJobController:
    """Reconciles every RayJob of the member (see the module's docstring)."""

    def __init__(self, c: Controllers) -> None:
        self.c = c

    async def reconcile(self) -> None:
        for job in self.c.live(RAY_JOBS):
            await self._job(job)

    async def _job(self, job: Obj) -> None:
        status = job.get("status") or {}
        state = status.get("jobDeploymentStatus") or "New"
        if state == "New":
            await self._initialize(job, status)
        elif state in ("Initializing", "Running"):
            await self._follow(job, status, state)
        elif state == "Retrying":
            for cluster in self.c.owned(RAY_CLUSTERS, job):
                await self.c.delete(RAY_CLUSTERS, cluster)
            for submitter in self.c.owned(JOBS, job):
                await self.c.delete(JOBS, submitter)
            await self.c.status(RAY_JOBS, job, {"jobDeploymentStatus": "New", "jobStatus": ""})

    async def _initialize(self, job: Obj, status: Obj) -> None:
        name = job["metadata"]["name"]
        cluster = f"{name}-{self.c.suffix()}"
        labels = {**(job["metadata"].get("labels") or {}),
                  "ray.io/originated-from-cr-name": name,
                  "ray.io/originated-from-crd": "RayJob"}  # fmt: skip
        meta: Obj = {"name": cluster, "labels": labels}
        if job["metadata"].get("annotations"):
            meta["annotations"] = dict(job["metadata"]["annotations"])
        await self.c.create(RAY_CLUSTERS, job, {
            "apiVersion": "ray.io/v1", "kind": "RayCluster", "metadata": meta,
            "spec": copy.deepcopy(job["spec"]["rayClusterSpec"]),
        })  # fmt: skip
        started = status.get("startTime") or self.c.now
        await self.c.status(RAY_JOBS, job, {
            "jobDeploymentStatus": "Initializing", "rayClusterName": cluster,
            "jobId": f"{name}-{self.c.suffix()}", "startTime": started,
            "failed": int(status.get("failed") or 0),
            "succeeded": int(status.get("succeeded") or 0),
        })  # fmt: skip

    async def _follow(self, job: Obj, status: Obj, state: str) -> None:
        clusters = self.c.owned(RAY_CLUSTERS, job)
        if state == "Initializing":
            if clusters and (clusters[0].get("status") or {}).get("state") == "ready":
                await self._submit(job)
                await self.c.status(
                    RAY_JOBS, job, {"jobDeploymentStatus": "Running", "jobStatus": "PENDING"}
                )
            return
        # An attempt ends with its submitter Job (``ray job submit`` exits with the Ray job's
        # outcome; the Job's own retries are the same attempt's): counted once.
        submitters = self.c.owned(JOBS, job)
        pods = [p for j in submitters for p in self.c.owned(PODS, j)]
        phases = {phase(p) for p in pods}
        if any(has_condition(j, "Complete") for j in submitters):
            await self.c.status(RAY_JOBS, job, {
                "jobStatus": "SUCCEEDED", "jobDeploymentStatus": "Complete",
                "endTime": self.c.now, "succeeded": int(status.get("succeeded") or 0) + 1,
                "message": "Job finished successfully.",
            })  # fmt: skip
        elif any(has_condition(j, "Failed") for j in submitters):
            failed = int(status.get("failed") or 0) + 1
            retry = failed <= int(job["spec"].get("backoffLimit") or 0)
            end: Obj = {"jobStatus": "FAILED", "failed": failed,
                        "message": "Job entrypoint command failed with exit code 1"}  # fmt: skip
            if retry:
                end["jobDeploymentStatus"] = "Retrying"
            else:
                end.update(jobDeploymentStatus="Failed", reason="AppFailed", endTime=self.c.now)
            await self.c.status(RAY_JOBS, job, end)
        elif "Running" in phases and status.get("jobStatus") != "RUNNING":
            await self.c.status(RAY_JOBS, job, {"jobStatus": "RUNNING"})

    async def _submit(self, job: Obj) -> None:
        """The submitter Job (K8sJobMode), once."""
        name = job["metadata"]["name"]
        if self.c.owned(JOBS, job):
            return
        template = copy.deepcopy(job["spec"].get("submitterPodTemplate") or {})
        template.setdefault("spec", {}).setdefault("restartPolicy", "Never")
        config = job["spec"].get("submitterConfig") or {}
        labels = {"ray.io/originated-from-cr-name": name, "ray.io/originated-from-crd": "RayJob",
                  "app.kubernetes.io/created-by": "kuberay-operator"}  # fmt: skip
        await self.c.create(JOBS, job, {
            "apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name, "labels": labels},
            "spec": {"backoffLimit": int(config.get("backoffLimit", 2)), "template": template},
        })  # fmt: skip


__all__ = ["RayClusterController", "RayJobController", "meta_condition"]
