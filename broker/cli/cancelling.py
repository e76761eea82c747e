"""``fedbroker cancel NAME...`` and ``fedbroker cancel -l LABELS``.

One name is answered as before (the job's table, or ``-o json|yaml``). Several names, or a
label selector (``-l``: kubectl's syntax, matched by the server against each job's
``metadata.labels`` as ``list -l`` is; only jobs not yet finished are taken), are cancelled
one by one, each reported on its own line (``job 'x' cancelled (Cancelled)``: its state); a failure
is one line on stderr naming the job, the rest are still cancelled, and the exit status is 1
if any failed. Names together with ``-l``, or neither, is a usage error (exit 2).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import Any

from broker.cli.args import EXIT_USAGE
from broker.cli.client import EXIT_ERROR, FINAL_STATES, ClientError, exchange, list_jobs
from broker.cli.connection import exit_status
from broker.cli.listing import print_answer
from broker.cli.output import formatted
from broker.cli.submitting import TABLES
from broker.cli.tenants import find_tenant

SELECTED_LIMIT = 1000  # the most jobs one ``cancel -l`` takes (the list's own limit)


def run_cancel(args: argparse.Namespace) -> int:
    if bool(args.name) == bool(args.selector):
        sys.stderr.write("fedbroker: error: cancel: give job names or -l LABELS (one of them)\n")
        return EXIT_USAGE
    try:
        if len(args.name) == 1:
            return asyncio.run(_cancel_one(args, args.name[0]))
        return asyncio.run(_cancel_all(args))
    except ClientError as exc:
        sys.stderr.write(f"fedbroker: error: {exc}\n")
        return exit_status(exc)
    except KeyboardInterrupt:
        return 130


def _for(args: argparse.Namespace, name: str, tenant: str | None = None) -> argparse.Namespace:
    """The arguments of cancelling the one job ``name`` (``exchange``'s request), of
    ``tenant`` when known (a job an admin's ``-l -A`` found)."""
    one = argparse.Namespace(**{**vars(args), "name": name})
    if tenant is not None:
        one.tenant, one.all_tenants = tenant, False
    return one


async def _cancel_one(args: argparse.Namespace, name: str) -> int:
    one = _for(args, name)
    await find_tenant(one, list_jobs)
    _, answer = await exchange(one)
    print_answer(one, answer)
    return 0


async def selected(args: argparse.Namespace) -> list[tuple[str, str | None]]:
    """The unfinished jobs whose labels match ``-l``: each name, and its tenant when the
    list spans tenants (``--tenant``, ``-A``)."""
    query = {"command": "list", "queue": None, "state": None, "cluster": None, "name": None,
             "mine": False, "limit": SELECTED_LIMIT, "sort_by": None}  # fmt: skip
    doc = await list_jobs(argparse.Namespace(**{**vars(args), **query}))
    spans = bool(getattr(args, "all_tenants", False) or getattr(args, "tenant", None))
    return [
        (j["metadata"]["name"], j["metadata"].get("namespace") if spans else None)
        for j in doc.get("items", []) if j.get("status", {}).get("state") not in FINAL_STATES
    ]  # fmt: skip


async def _cancel_all(args: argparse.Namespace) -> int:
    jobs = [(n, None) for n in args.name] or await selected(args)
    if not jobs:
        sys.stderr.write(f"fedbroker: no unfinished job matches -l {args.selector}\n")
    failed = 0
    answers: list[Any] = []
    for name, tenant in jobs:
        try:
            one = _for(args, name, tenant)
            await find_tenant(one, list_jobs)
            _, answer = await exchange(one)
        except ClientError as exc:
            failed += 1
            sys.stderr.write(f"fedbroker: error: job {name!r}: {exc}\n")
            continue
        answers.append(answer)
        if args.output in TABLES:
            state = answer.get("status", {}).get("state") if isinstance(answer, dict) else None
            print(f"job {name!r} cancelled ({state})", flush=True)
    if args.output not in TABLES:
        print(formatted({"items": answers}, args.output, str))
    return EXIT_ERROR if failed else 0


__all__ = ["SELECTED_LIMIT", "run_cancel", "selected"]
