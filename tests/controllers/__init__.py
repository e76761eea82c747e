"""The controllers of a Kubernetes member played as their upstream code runs them, one module
per kind, for tests over the member emulator (``kmock_namespaces``): they make the children
of the broker's workloads from the stored objects' own templates (so the broker's labels,
gates and PodGroup labels are on every pod), through the member's controller path, owned by
their parents (the member's garbage collection removes them), and write the workloads'
status as upstream does. ``schedulers`` plays the gang schedulers and the kubelet.

``CONTROLLERS`` is keyed by the workload kind the broker creates: a new kind is its module
and one entry. ``Member`` runs them all, with the scheduler of one mode, as a cluster does:
each step reconciles every controller, then schedules and runs pods.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any, Protocol

from kmock_namespaces import NamespacedEmulator

from controllers import batchjob, jobset, leaderworkerset, mpijob, pytorchjob, ray, trainjob
from controllers.base import Controllers
from controllers.schedulers import Mode, Schedulers

log = logging.getLogger(__name__)
# Steps with nothing written to a member (by its players or the broker) after which tests
# take it as settled: what has not happened by then will not
QUIET_STEPS = 60


class Controller(Protocol):
    async def reconcile(self) -> None: ...


# workload kind -> the controllers that run it (a kind's children's controllers included)
CONTROLLERS: Mapping[str, tuple[Callable[[Controllers], Controller], ...]] = {
    "Job": (batchjob.JobController,),
    "JobSet": (jobset.JobSetController, batchjob.JobController),
    "PyTorchJob": (pytorchjob.PyTorchJobController,),
    "RayJob": (ray.RayJobController, ray.RayClusterController, batchjob.JobController),
    "RayCluster": (ray.RayClusterController,),
    "TrainJob": (trainjob.TrainJobController, jobset.JobSetController, batchjob.JobController),
    "MPIJob": (mpijob.MPIJobController, batchjob.JobController),
    "LeaderWorkerSet": (leaderworkerset.LeaderWorkerSetController,),
}
# workload kind -> its resource in the member
RESOURCES: Mapping[str, Any] = {
    "Job": batchjob.RESOURCE,
    "JobSet": jobset.RESOURCE,
    "PyTorchJob": pytorchjob.RESOURCE,
    "RayJob": ray.RAY_JOBS,
    "RayCluster": ray.RAY_CLUSTERS,
    "TrainJob": trainjob.RESOURCE,
    "MPIJob": mpijob.RESOURCE,
    "LeaderWorkerSet": leaderworkerset.RESOURCE,
}
# what controllers make besides pods, Services, Jobs and the workloads above
CHILDREN: tuple[Any, ...] = (mpijob.CONFIGMAPS, mpijob.SECRETS, leaderworkerset.STATEFULSETS)


class Member:
    """Every registered controller, the scheduler of ``mode`` and the kubelet of one
    member; ``running`` steps them in the background."""

    def __init__(self, k8s: NamespacedEmulator, mode: Mode) -> None:
        self.c = Controllers(k8s)
        self.schedulers = Schedulers(self.c, mode)
        kinds = dict.fromkeys(f for factories in CONTROLLERS.values() for f in factories)
        self.controllers = [factory(self.c) for factory in kinds]
        self.steps = 0
        self.failure: Exception | None = None
        self.changed = 0  # the last step after which the member's objects differed
        self._seen = ""
        self._stepped = asyncio.Event()

    async def step(self) -> None:
        for controller in self.controllers:
            await controller.reconcile()
        await self.schedulers.step()
        self.steps += 1
        seen = self.fingerprint()
        if seen != self._seen:
            self._seen, self.changed = seen, self.steps
        self._stepped.set()

    def fingerprint(self) -> str:
        """Every live object of the member as stored (what anyone wrote shows here)."""
        live = sorted(
            (f"{res.group}/{res.plural}/{ns}/{name}", obj.raw)
            for (res, ns, name), obj in list(self.c.k8s.objects.items())
            if not obj.deleted
        )
        return hashlib.sha1(json.dumps(live, sort_keys=True, default=str).encode()).hexdigest()

    async def next_step(self) -> None:
        """Wait for the member's next step (its failure raised)."""
        self._stepped.clear()
        await self._stepped.wait()
        if self.failure is not None:
            raise AssertionError("the member's controllers failed") from self.failure

    @contextlib.asynccontextmanager
    async def running(self, pace: float = 0.005) -> AsyncIterator[Member]:
        """The member's controllers at work while the block runs (a step every ``pace``
        seconds: the cluster's own pace, not a synchronisation; tests wait on conditions,
        counted in the member's steps, never on a wall-clock budget)."""

        async def loop() -> None:
            while True:
                try:
                    await self.step()
                except Exception as exc:  # shown at once: the test would only wait
                    log.exception("the member's controllers failed")
                    self.failure = exc
                    self._stepped.set()
                    raise
                await asyncio.sleep(pace)

        task = asyncio.create_task(loop())
        try:
            yield self
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task  # a controller's failure fails the test here


__all__ = ["CHILDREN", "CONTROLLERS", "QUIET_STEPS", "RESOURCES", "Controllers", "Member", "Mode"]
