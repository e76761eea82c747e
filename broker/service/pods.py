"""A job's pods and logs, read from its member through the launcher's ``PodReader``.

``JobPods`` answers ``GET /v1/jobs/{name}/pods`` and ``/logs``: the job is looked up in the
store for its tenant first (another tenant's job, or none, is ``NotFound``: 404), then a
job that is Placed or Running, or Succeeded or Failed on the cluster its record names, is
asked about; a queued job is a ``Conflict`` (409, saying its state), and a finished job
whose pods are gone is a ``NotFound`` (404) saying why: cancelled (deleted then), or
deleted after ``retention.finishedPodsSeconds`` (``FinishedPods``). The reader is the
launcher's (``ClusterLauncher`` dispatches to each Kubernetes member's ``KubePods``, the
simulated launcher reads its own); it is handed nothing but the tenant and job names, so it
can show no other job's pods. A log read without a pod names the job's first pod by name.
"""

from __future__ import annotations

from broker.figures import span
from broker.ports import (
    LaunchSpec,
    LogRequest,
    LogStream,
    PodNotFound,
    PodReader,
    PodReadError,
    PodRow,
)
from broker.service.admission import Admission, Conflict, NotFound
from broker.service.finished_pods import FINISHED_STATES, MAX_KEPT
from broker.service.state import Shared
from broker.store import JobRecord

SHOWN_STATES = ("Placed", "Running", "Succeeded", "Failed")


class JobPods:
    """The pods and logs of a tenant's placed, running and finished jobs."""

    def __init__(self, shared: Shared, admission: Admission) -> None:
        self.s = shared
        self.admission = admission

    def _reader(self) -> PodReader:
        launcher = self.s.launcher
        if not isinstance(launcher, PodReader):
            raise PodReadError("launcher: this broker's launcher cannot show pods")
        return launcher

    async def _placed(self, tenant: str, name: str) -> tuple[JobRecord, LaunchSpec]:
        record = await self.admission.get(tenant, name)
        if record.state == "Cancelled" and record.cluster:
            raise NotFound(f"job {name!r} was cancelled; its pods were deleted then")
        if record.state not in SHOWN_STATES or not record.cluster:
            raise Conflict(
                f"name: job {name!r} is {record.state}; only a placed, running or finished "
                "job has pods"
            )
        return record, LaunchSpec(tenant=tenant, job=name)

    async def _rows(self, record: JobRecord, spec: LaunchSpec) -> list[PodRow]:
        """The job's pods; for a finished job, none is an answer saying why."""
        cluster = record.cluster or ""
        rows = await self._reader().pods(cluster, spec)
        if rows or record.state not in FINISHED_STATES:
            return rows
        keep = self.s.finished_pods.keep_seconds
        ago = self.s.clock() - record.updated_at
        finished = f"job {record.name!r} {record.state.lower()} {span(ago)} ago on {cluster}"
        if ago >= keep:
            raise NotFound(
                f"{finished}; its pods were deleted {span(keep)} after it finished "
                "(retention.finishedPodsSeconds)"
            )
        raise NotFound(
            f"{finished}; its pods are no longer in the cluster (deleted by someone else, lost "
            "with a simulated member when the broker restarted, or deleted early: more than "
            f"{MAX_KEPT:,} finished jobs' pods were kept)"
        )

    async def pods(self, tenant: str, name: str) -> list[PodRow]:
        record, spec = await self._placed(tenant, name)
        return await self._rows(record, spec)

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
        record, spec = await self._placed(tenant, name)
        cluster, reader = record.cluster or "", self._reader()
        if pod is None:
            rows = await self._rows(record, spec)
            if not rows:
                raise PodNotFound(f"job {name!r} has no pods yet")
            pod = min(row.name for row in rows)
        request = LogRequest(pod, container, tail_lines, follow, timestamps, previous)
        return await reader.logs(cluster, spec, request)


__all__ = ["SHOWN_STATES", "JobPods"]
