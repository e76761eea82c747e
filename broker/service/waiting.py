"""Why a queued job waits, in one short line: the ``status.waiting`` of a job in a list.

The scheduler keeps the reasons of its last refusal on the job's queue entry
(``Pending.waiting``); ``waiting_summary`` words them for a list's REASON column, so a list
costs one dictionary look-up per job shown, never an explain. The line says what the gang
needs when capacity is what it lacks ("no cluster has room for 4 pods of 8 A100 GPUs"), the
refusal itself when it is not per cluster (a quota, no clusters), that every cluster is
stale when none can be asked, else each cluster's first reason. ``explain`` has the full
per-cluster answer.
"""

from __future__ import annotations

from broker.model import MILLI_PER_GPU, Job, Reason, ReasonCode

# Codes that say "not enough room now" (as opposed to "never here": labels, types, taints).
_ROOM = frozenset(
    {
        ReasonCode.INSUFFICIENT_GPUS,
        ReasonCode.NODE_FIT,
        ReasonCode.GANG_TOO_LARGE,
        ReasonCode.CPU_MEMORY,
    }
)
MAX_SUMMARY = 160


def gang_phrase(job: Job) -> str:
    """What the job asks for, e.g. ``4 pods of 8 A100 GPUs`` (pod sets joined by ``+``)."""
    kinds = "/".join(sorted(str(t) for t in job.gpu_types))
    parts = []
    for ps in job.pod_sets:
        milli = ps.resources.gpu_request_milli
        pods = f"{ps.count} pod{'s' if ps.count != 1 else ''}"
        if not milli:
            parts.append(pods)
            continue
        gpus = milli / MILLI_PER_GPU
        unit = "GPU" if gpus <= 1 else "GPUs"
        parts.append(f"{pods} of {gpus:g} {kinds + ' ' if kinds else ''}{unit}")
    text = " + ".join(parts)
    if 0 < job.min_member < job.total_pods:
        text += f" (at least {job.min_member} pod{'s' if job.min_member != 1 else ''})"
    return text


def waiting_summary(job: Job, reasons: tuple[Reason, ...]) -> str:
    """One line for a list: why ``job`` waited at the last cycle that looked at it."""
    if not reasons:
        return ""
    if all(r.code in _ROOM for r in reasons):
        return _short(f"no cluster has room for {gang_phrase(job)}")
    if all(r.code == ReasonCode.STALE for r in reasons):  # nothing known to have room or not
        names = ", ".join(sorted({r.cluster or "-" for r in reasons}))
        return _short(f"every cluster is stale ({names}): no placements until one reports")
    if all(r.cluster is None for r in reasons):  # quota, no clusters: not per cluster
        return _short("; ".join(f"{r.code}: {r.message}" for r in reasons))
    first: dict[str, Reason] = {}
    for r in reasons:
        first.setdefault(r.cluster or "-", r)
    parts = [
        f"{cluster} {'full' if r.code in _ROOM else r.message}" for cluster, r in first.items()
    ]
    return _short("fits no cluster: " + "; ".join(parts))


def _short(text: str) -> str:
    return text if len(text) <= MAX_SUMMARY else text[: MAX_SUMMARY - 3] + "..."


__all__ = ["gang_phrase", "waiting_summary"]
