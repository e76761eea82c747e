"""Why a queued job waits, in one short line: the ``status.waiting`` of a job in a list.

The scheduler keeps the reasons of its last refusal on the job's queue entry
(``Pending.waiting``); ``waiting_summary`` words them for a list's REASON column, so a list
costs one dictionary look-up per job shown, never an explain. The line says what the gang
needs when capacity is what it lacks ("no cluster has room for 4 pods of 8 A100 GPUs"), the
refusal itself when it is not per cluster (a quota, no clusters), that every cluster is
stale when none can be asked, else each cluster's first reason. ``explain`` has the full
per-cluster answer. A job the federation could not take even empty
(``policies.never_fits``) is said to never fit instead (``never_fits_line``).
"""

from __future__ import annotations

from broker.model import MILLI_PER_GPU, Job, PodSet, Reason, ReasonCode
from policies.never_fits import NeverFits
from policies.topology import level_name

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
    text = " + ".join(_pods_phrase(job, ps, ps.count) for ps in job.pod_sets)
    if 0 < job.min_member < job.total_pods:
        text += f" (at least {job.min_member} pod{'s' if job.min_member != 1 else ''})"
    return text


def _pods_phrase(job: Job, ps: PodSet, count: int) -> str:
    """``count`` pods like those of ``ps``, e.g. ``4 pods of 8 A100 GPUs``."""
    kinds = "/".join(sorted(str(t) for t in job.gpu_types))
    milli = ps.resources.gpu_request_milli
    pods = f"{count} pod{'s' if count != 1 else ''}"
    if not milli:
        return pods
    gpus = milli / MILLI_PER_GPU
    unit = "GPU" if gpus <= 1 else "GPUs"
    return f"{pods} of {gpus:g} {kinds + ' ' if kinds else ''}{unit}"


def never_fits_line(job: Job, never: NeverFits) -> str:
    """Why the job can never fit the federation as it is made, e.g. ``never fits: no
    cluster could take 400 pods of 8 A100 GPUs even empty; the largest, b, could take 52``."""
    if not never.clusters:
        return "never fits: no cluster matches its placement (cluster selector or needs)"
    ps = next((p for p in job.pod_sets if p.name == never.pod_set), None)
    if ps is None:
        what = f"at least {never.pods} of its pods" if job.elastic else "all its pod sets"
    else:
        at_least = "at least " if job.elastic else ""
        what = at_least + _pods_phrase(job, ps, never.pods)
        if ps.topology is not None and ps.topology.required:
            what += f" in one {level_name(ps.topology.required)}"
    even = "even empty and with every burst pool at its maxNodes" if never.burst else "even empty"
    largest = f"the largest, {never.cluster}, could take {never.largest}"
    if not never.cluster:
        largest = "none could take one of them" if ps is not None else ""
    text = f"never fits: no cluster could take {what} {even}"
    return _short(text + (f"; {largest}" if largest else ""))


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


__all__ = ["gang_phrase", "never_fits_line", "waiting_summary"]
