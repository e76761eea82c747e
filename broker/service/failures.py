"""What the one launch-failure path says about a failure: its cause, the job's history
reason, one log line and the metric (DESIGN.md invariant 9, no stranded capacity).

Whatever goes wrong while a job is launched, adopted after a restart or followed while it
runs reaches ``Binding.failed`` (or, for a job a rebuild could not adopt, the rebuild's
requeue), which rolls the job back: its objects deleted, its reservation or bound usage
released, requeued with backoff, or failed at the scheduler's ``launchRefusalLimit``.
``Failure.of`` reads the exception: ``refused`` (a ``LaunchError`` marked permanent: the
member refused what the job asked of it), ``transient`` (any other ``LaunchError``:
unreachable, 5xx, timeouts, a gang that did not start) or ``error`` (any other exception:
a response the client could not handle, a mistake of ours). The history gets a
``LaunchError``'s message (log-safe by the port's contract: objects and the member's
answer), cut to ``REASON_CHARS``, but only the type of any other exception: its text may
name a member's address, and tenants read their jobs' history. ``report`` logs it once,
with the job, cluster and stage (and the traceback of an ``error``), and counts it in
``fedbroker_launch_failures_total{cluster,stage,cause}``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Literal

from broker.ports import LaunchError
from broker.service.metrics import SchedulerMetrics

log = logging.getLogger(__name__)

Stage = Literal["launch", "adopt", "follow", "delete"]
Cause = Literal["refused", "transient", "error"]

# A member's message in a job's history is cut to this many characters.
REASON_CHARS = 300


def cut(text: str, limit: int = REASON_CHARS) -> str:
    """One line of at most ``limit`` characters (an ellipsis where it was cut)."""
    line = " ".join(text.split())
    return line if len(line) <= limit else f"{line[: limit - 1]}…"


@dataclass(frozen=True, slots=True)
class Failure:
    """One failure of a job's launch, adoption, run watch or deletion, as read."""

    stage: Stage
    cause: Cause
    said: str  # what the job's history may show of the exception

    @staticmethod
    def of(exc: Exception, stage: Stage) -> Failure:
        if isinstance(exc, LaunchError):
            return Failure(stage, "refused" if exc.permanent else "transient", cut(str(exc)))
        return Failure(stage, "error", f"unexpected {type(exc).__name__} (see the broker's log)")

    @property
    def refused(self) -> bool:
        return self.cause == "refused"

    def reason(self, cluster: str) -> str:
        """The job's history reason (the lifecycle adds the retry or the refusal count)."""
        if self.stage == "follow":
            return f"run no longer followed in {cluster}: {self.said}"
        if self.refused:
            return f"launch refused by {cluster}: {self.said}"
        return f"launch failed: {self.said}"


def report(
    metrics: SchedulerMetrics, job: str, cluster: str, failure: Failure, exc: Exception
) -> None:
    """The failure's one log line (with the traceback of an unexpected error) and its count."""
    metrics.launch_failures.labels(cluster, failure.stage, failure.cause).inc()
    what = f"job {job} in {cluster}: {failure.stage} {failure.cause}"
    if failure.cause == "error":
        log.error("%s: %s", what, type(exc).__name__, exc_info=exc)
    else:
        log.warning("%s: %s", what, failure.said)


__all__ = ["REASON_CHARS", "Cause", "Failure", "Stage", "cut", "report"]
