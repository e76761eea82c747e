"""A placed job's pods and logs, read from its member through the launcher's ``PodReader``.

``JobPods`` answers ``GET /v1/jobs/{name}/pods`` and ``/logs``: the job is looked up in the
store for its tenant first (another tenant's job, or none, is ``NotFound``: 404), then only
a job that is Placed or Running, on a known cluster, is asked about (else ``Conflict``:
409, saying its state). The reader is the launcher's (``ClusterLauncher`` dispatches to
each Kubernetes member's ``KubePods``, the simulated launcher reads its own); it is handed
nothing but the tenant and job names, so it can show no other job's pods. A log read
without a pod names the job's first pod by name.
"""

from __future__ import annotations

from broker.ports import (
    LaunchSpec,
    LogRequest,
    LogStream,
    PodNotFound,
    PodReader,
    PodReadError,
    PodRow,
)
from broker.service.admission import Admission, Conflict
from broker.service.state import Shared

SHOWN_STATES = ("Placed", "Running")


class JobPods:
    """The pods and logs of a tenant's placed jobs."""

    def __init__(self, shared: Shared, admission: Admission) -> None:
        self.s = shared
        self.admission = admission

    def _reader(self) -> PodReader:
        launcher = self.s.launcher
        if not isinstance(launcher, PodReader):
            raise PodReadError("launcher: this broker's launcher cannot show pods")
        return launcher

    async def _placed(self, tenant: str, name: str) -> tuple[str, LaunchSpec]:
        record = await self.admission.get(tenant, name)
        if record.state not in SHOWN_STATES or not record.cluster:
            raise Conflict(
                f"name: job {name!r} is {record.state}; only a placed or running job has pods"
            )
        return record.cluster, LaunchSpec(tenant=tenant, job=name)

    async def pods(self, tenant: str, name: str) -> list[PodRow]:
        cluster, spec = await self._placed(tenant, name)
        return await self._reader().pods(cluster, spec)

    async def logs(
        self,
        tenant: str,
        name: str,
        pod: str | None,
        container: str | None = None,
        tail_lines: int | None = None,
        follow: bool = False,
        *,
        timestamps: bool = False,
        previous: bool = False,
    ) -> LogStream:
        """Open the log of ``pod`` (None: the job's first pod by name)."""
        cluster, spec = await self._placed(tenant, name)
        reader = self._reader()
        if pod is None:
            rows = await reader.pods(cluster, spec)
            if not rows:
                raise PodNotFound(f"job {name!r} has no pods yet")
            pod = min(row.name for row in rows)
        request = LogRequest(pod, container, tail_lines, follow, timestamps, previous)
        return await reader.logs(cluster, spec, request)


__all__ = ["SHOWN_STATES", "JobPods"]
