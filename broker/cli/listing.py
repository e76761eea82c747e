"""How the client commands' answers are printed (``broker.cli.output``), with what ``list``
adds: the TENANT column (``-A``, ``-o wide``), the wide columns, ``--sort-by``, and the
count of jobs beyond ``--limit``.

The API pages a list by a cursor (``continue``) and counts nothing, so when a list stops
at ``--limit`` with more to come, the rest are counted by following the cursor (pages of
the API's largest size, at most MORE_PAGES of them; beyond that the count says "more
than"). The count goes to stderr, so what a pipe reads is the table alone.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Awaitable, Callable
from typing import Any

from broker.cli.output import emit, sort_items
from broker.cli.render import JOB_HEADER, job_row, render, render_finished, table

ListJobs = Callable[[argparse.Namespace], Awaitable[dict[str, Any]]]

PAGE = 1000  # the API's largest page
MORE_PAGES = 10

# --sort-by's columns: each column of the tables, as a path into an item.
JOB_COLUMNS = {
    "NAME": ".metadata.name", "TENANT": ".metadata.namespace", "QUEUE": ".status.queue",
    "STATE": ".status.state", "CLUSTER": ".status.cluster", "AGE": ".status.createdAt",
    "PRIORITY": ".spec.priority", "ATTEMPTS": ".status.attempts",
    "GENERATION": ".status.generation", "REASON": ".status.reason",
}  # fmt: skip
CLUSTER_COLUMNS = {"CLUSTER": ".cluster"}
POD_COLUMNS = {
    "POD": ".name", "POD-SET": ".podSet", "CLUSTER": ".cluster", "NODE": ".node",
    "PHASE": ".phase", "RESTARTS": ".restarts", "SLOT": ".slot",
}  # fmt: skip
WIDE_JOB_COLUMNS = ("PRIORITY", "ATTEMPTS", "GENERATION")


def sorted_answer(command: str, doc: Any, sort_by: str | None) -> Any:
    """The answer with its items in ``--sort-by``'s order (as it is without the flag)."""
    where = {"list": ("items", JOB_COLUMNS), "clusters": ("clusters", CLUSTER_COLUMNS),
             "pods": ("pods", POD_COLUMNS)}.get(command)  # fmt: skip
    if not sort_by or where is None or not isinstance(doc, dict):
        return doc
    key, columns = where
    return {**doc, key: sort_items(doc.get(key) or [], sort_by, columns)}


def print_answer(args: argparse.Namespace, doc: Any) -> None:
    """A client command's answer in the output asked for."""
    output = args.output
    if args.command == "list":
        every = bool(getattr(args, "all_tenants", False))
        emit(doc, output, lambda d: jobs_table(d, tenants=every),
             lambda d: jobs_table(d, tenants=True, wide=True))  # fmt: skip
    elif args.command == "explain" and isinstance(doc, dict) and "finished" in doc:
        emit(doc, output, lambda d: render_finished(d["finished"]))
    else:
        emit(doc, output, lambda d: render(args.command, d))


def jobs_table(doc: Any, *, tenants: bool, wide: bool = False) -> str:
    """``list``'s table; with the TENANT column after NAME, and the wide columns before the
    last (the reason, the longest)."""
    header = list(JOB_HEADER)
    rows = [job_row(j) for j in doc.get("items", [])]
    extra: list[str] = []
    if tenants:
        extra.append("TENANT")
    header[1:1] = extra
    for row, job in zip(rows, doc.get("items", []), strict=True):
        row[1:1] = [job.get("metadata", {}).get("namespace")] if tenants else []
    if wide:
        header[-1:-1] = WIDE_JOB_COLUMNS
        for row, job in zip(rows, doc.get("items", []), strict=True):
            status = job.get("status", {})
            row[-1:-1] = [job.get("spec", {}).get("priority"), status.get("attempts"),
                          status.get("generation")]  # fmt: skip
    return table(header, rows)


async def count_more(args: argparse.Namespace, list_jobs: ListJobs, cursor: str) -> str:
    """How many jobs follow ``cursor``: '250', or 'more than 10000' past MORE_PAGES pages."""
    counted = 0
    after: str | None = cursor
    for _ in range(MORE_PAGES):
        page = argparse.Namespace(**{**vars(args), "limit": PAGE, "after": after})
        doc = await list_jobs(page)
        counted += len(doc.get("items") or [])
        after = doc.get("continue")
        if after is None:
            return f"{counted}"
    return f"more than {counted}"


def more_note(count: str, limit: int) -> None:
    """The line on stderr for jobs beyond the limit (none for none: a page that ends
    exactly at the limit still carries a cursor)."""
    if count == "0":
        return
    raise_it = f"raise --limit (now {limit}, at most {PAGE}) or " if limit < PAGE else ""
    jobs = "job" if count == "1" else "jobs"
    sys.stderr.write(
        f"fedbroker: {count} more {jobs} not shown: {raise_it}narrow the list (--state, "
        f"--queue, -l, --name)\n"
    )


__all__ = [
    "CLUSTER_COLUMNS",
    "JOB_COLUMNS",
    "POD_COLUMNS",
    "count_more",
    "jobs_table",
    "more_note",
    "print_answer",
    "sorted_answer",
]
