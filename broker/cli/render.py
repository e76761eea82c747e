"""The tables a person reads: ``table`` lays out rows in aligned columns, and ``render``
turns each client command's answer (``submit``, ``get``, ``list``, ``cancel``, ``explain``,
``clusters``, ``pools``) into one (pure but for ages, measured from the wall clock). Other
CLI commands (``pods``, the demo's live status) lay out their own rows with ``table``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any

from broker.figures import ALLOCATED, FREE, LARGEST_GANG, RESERVED, STRANDED, TOTAL, gang, span


def _age(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    delta = max(0.0, time.time() - seconds)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if delta >= size:
            return f"{int(delta // size)}{unit}"
    return f"{int(delta)}s"


def table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    cells = [[str(c) for c in header], *[[("-" if c is None else str(c)) for c in r] for r in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells
    )


def _job_row(job: dict[str, Any]) -> list[object]:
    meta, status = job.get("metadata", {}), job.get("status", {})
    return [
        meta.get("name"),
        status.get("queue"),
        status.get("state"),
        status.get("cluster"),
        _age(status.get("createdAt")),
        status.get("waiting") or status.get("reason"),
    ]


job_row = _job_row  # a list's row, for tables built around it (broker.cli.listing)

JOB_HEADER = ("NAME", "QUEUE", "STATE", "CLUSTER", "AGE", "REASON")


def _render_job(doc: Any) -> str:
    return table(JOB_HEADER, [_job_row(doc)])


def _render_get(doc: Any) -> str:
    out = _render_job(doc)
    history = doc.get("status", {}).get("history") or []
    if history:
        rows = [
            [_age(h.get("at")), h.get("state"), h.get("cluster"), h.get("reason")] for h in history
        ]
        out += "\n\nHISTORY\n" + table(("AGO", "STATE", "CLUSTER", "REASON"), rows)
    return out


def _render_list(doc: Any) -> str:
    return table(JOB_HEADER, [_job_row(j) for j in doc.get("items", [])])


def _render_explain(doc: Any) -> str:
    head = f"{doc.get('job')}: {doc.get('state')}" + (
        f" on {doc['cluster']}" if doc.get("cluster") else ""
    )
    if doc.get("state") in ("Placed", "Running") and not doc.get("clusters"):
        return _render_placed(head, str(doc.get("job")))
    rows = [
        [
            c.get("cluster"),
            "yes" if c.get("fits") else "no",
            c.get("largestFit"),
            "; ".join(f"{r.get('code')}: {r.get('message')}" for r in c.get("reasons", [])) or "-",
        ]
        for c in doc.get("clusters", [])
    ]
    return head + "\n" + table(("CLUSTER", "FITS", "LARGEST-FIT", "WHY NOT"), rows) + _next(doc)


def _render_placed(head: str, name: str) -> str:
    """``explain`` of a placed or running job: it waits for nothing, so no table of
    clusters; where to look instead."""
    return "\n".join((
        f"{head} (placed: it no longer waits for a cluster)",
        f"  pods:  fedbroker pods {name}",
        f"  logs:  fedbroker logs {name}",
        f"  more:  fedbroker get {name}   (its history)",
    ))  # fmt: skip


# -- explain of a waiting job: what happens next ------------------------------------------


def _when(at: float) -> str:
    """'now', or 'in 25s' from the wall clock."""
    left = at - time.time()
    return "now" if left <= 0 else f"in {span(left)}"


def _ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def _position_line(p: dict[str, Any]) -> str:
    if p.get("position") is None:
        return f"backing off after a failed attempt; tried again {_when(p['backoffUntil'])}"
    ahead = p.get("sameGpuTypeAhead") or 0
    return (
        f"{_ordinal(p['position'])} of {p.get('waiting')} waiting "
        f"({_ordinal(p.get('inQueue') or 0)} of {p.get('queueWaiting')} in queue {p['queue']}); "
        f"{ahead} {'job' if ahead == 1 else 'jobs'} ahead may take the same GPU type"
    )


def _burst_lines(b: dict[str, Any]) -> list[str]:
    cost = f"${b.get('costPerHour') or 0:.2f}/h (${b.get('costPerNodeHour') or 0:.2f}/node-h)"
    where = f"{b.get('pool')} (cluster {b.get('cluster')})"
    if b.get("status") == "requested":
        return [
            f"{b.get('nodes')} nodes requested from pool {where}, {b.get('arrived')} up; "
            f"{cost}; given up {_when(b.get('deadline') or 0)} if not all up"
        ]
    if b.get("status") == "planned":
        coming = b["nodes"] - b["newNodes"]
        grow = f"+{b['newNodes']} nodes" + (f" ({coming} more already coming up)" if coming else "")
        return [
            f"pool {where} grows by {grow}, up ~{span(b.get('provisionSeconds') or 0)} "
            f"after the scale-up, {cost}; eligible {_when(b.get('eligibleAt') or 0)} "
            f"(burstAfterSeconds {b.get('burstAfterSeconds'):g})",
            *_refusal_lines(b),  # pools not read yet
        ]
    return ["no pool can take it:", *_refusal_lines(b)]


def _refusal_lines(b: dict[str, Any]) -> list[str]:
    lines = []
    for r in b.get("refusals", []):
        again = "read again" if r.get("code") == "unavailable" else "may grow again"
        until = f"; {again} {_when(r['until'])}" if r.get("until") is not None else ""
        pool = f"{r['pool']}: " if r.get("pool") else ""
        lines.append(f"  - {pool}{r.get('message')} [{r.get('code')}]{until}")
    return lines


def _next(doc: dict[str, Any]) -> str:
    """A waiting job's place in the queues and its burst option ('' when not waiting)."""
    position, burst = doc.get("position"), doc.get("burst")
    out = [doc["neverFits"]] if doc.get("neverFits") else []
    if position:
        out.append(f"QUEUE  {_position_line(position)}")
    if burst:
        first, *rest = _burst_lines(burst)
        out += [f"BURST  {first}", *rest]
    return "\n\n" + "\n".join(out) if out else ""


_CLUSTER_FIGURES = (TOTAL, ALLOCATED, RESERVED, FREE, STRANDED)  # then the largest gang


def _cluster_state(c: dict[str, Any]) -> str:
    """As the terminal view marks a cluster: stale (no placements), disconnected (its watch
    or agent not heard from, not stale yet), else ready."""
    if c.get("stale"):
        return "stale"
    return "disconnected" if c.get("connected") is False else "ready"


def _render_clusters(doc: Any) -> str:
    rows = []
    for c in doc.get("clusters", []):
        # A cluster with no GPU nodes (yet: a burst cluster) still gets its row.
        for t in c.get("gpuTypes") or [{"gpuType": "-", "total": 0}]:
            pods, per_pod = t.get(LARGEST_GANG.field) or 0, t.get(LARGEST_GANG.per_unit) or 0
            rows.append([
                c.get("cluster") or c.get("name"), _cluster_state(c), t.get("gpuType"),
                *(_gpus(t.get(f.field)) for f in _CLUSTER_FIGURES), gang(pods, per_pod),
            ])  # fmt: skip
    header = ("CLUSTER", "STATE", "GPU", *(f.column for f in _CLUSTER_FIGURES),
              LARGEST_GANG.column)  # fmt: skip
    return table(header, rows)


def _gpus(value: object) -> object:
    """A GPU amount as the terminal view writes it: ``3``, ``0.5``; ``-`` for none."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return f"{value:.0f}" if float(value).is_integer() else f"{value:.1f}"
    return value


def _render_pools(doc: Any) -> str:
    pools = [
        [p.get("pool"), p.get("cluster"), p.get("gpuType"), p.get("replicas"),
         p.get("ready"), p.get("coming"), "yes" if p.get("failing") else "no",
         p.get("scaleUps"), p.get("scaleDowns"), p.get("nodeHours"),
         p.get("idleNodeHours"), p.get("cost")]
        for p in doc.get("pools", [])
    ]  # fmt: skip
    text = table(
        ("POOL", "CLUSTER", "GPU", "REPLICAS", "UP", "COMING", "FAILING", "SCALE-UPS",
         "REMOVED", "NODE-H", "IDLE-H", "COST"), pools,
    )  # fmt: skip
    waiting = [[r.get("job"), r.get("pool"), r.get("nodes"), r.get("arrived")]
               for r in doc.get("requests", [])]  # fmt: skip
    if waiting:
        text += "\n\n" + table(("WAITING GANG", "POOL", "NODES", "UP"), waiting)
    return text


def render_finished(job: dict[str, Any]) -> str:
    """``explain`` of a finished job: nothing waits, so say how and when it ended, where it
    ran, and where its story is (``get``), instead of an empty table of clusters."""
    meta, status = job.get("metadata", {}), job.get("status", {})
    name, state = meta.get("name"), status.get("state")
    history = status.get("history") or []
    ran = [h for h in history if h.get("state") in ("Placed", "Running") and h.get("cluster")]
    where = status.get("cluster") or (ran[-1].get("cluster") if ran else None)
    ended = status.get("updatedAt")
    when = (
        f" at {datetime.fromtimestamp(ended, UTC):%Y-%m-%d %H:%M:%S} UTC, {_age(ended)} ago"
        if isinstance(ended, int | float) else ""
    )  # fmt: skip
    lines = [f"{name}: {state}{when} (finished: it no longer waits for anything)"]
    how = status.get("reason")
    if how:
        lines.append(f"  how:   {how}")
    if where:
        started = next((h.get("at") for h in history if h.get("state") == "Running"), None)
        took = f", ran for {span(ended - started)}" if started and ended else ""
        lines.append(f"  where: {where}{took}")
    else:
        lines.append("  where: never placed (it ended while it waited)")
    generation = status.get("generation") or 1
    lines.append(f"  run:   generation {generation}; submit the name again to start the next")
    lines.append(f"  more:  fedbroker get {name}   (its history)")
    return "\n".join(lines)


_RENDERERS: dict[str, Callable[[Any], str]] = {
    "submit": _render_job,
    "cancel": _render_job,
    "get": _render_get,
    "list": _render_list,
    "explain": _render_explain,
    "clusters": _render_clusters,
    "pools": _render_pools,
}


def render(command: str, doc: Any) -> str:
    """The table a person reads for ``command``'s answer (JSON for an unknown command)."""
    renderer = _RENDERERS.get(command)
    return json.dumps(doc, indent=2) if renderer is None else renderer(doc)


__all__ = ["JOB_HEADER", "render", "render_finished", "table"]
