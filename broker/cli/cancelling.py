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
from broker.cli.render import render
from broker.cli.submitting import shown

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
        return EXIT_ERROR
    except KeyboardInterrupt:
        return 130


def _for(args: argparse.Namespace, name: str) -> argparse.Namespace:
    """The arguments of cancelling the one job ``name`` (``exchange``'s request)."""
    return argparse.Namespace(**{**vars(args), "name": name})


async def _cancel_one(args: argparse.Namespace, name: str) -> int:
    _, answer = await exchange(_for(args, name))
    print(shown(args.output, answer, render("cancel", answer)))
    return 0


async def selected(args: argparse.Namespace) -> list[str]:
    """The names of the unfinished jobs whose labels match ``-l``."""
    query = {"command": "list", "queue": None, "state": None, "cluster": None, "name": None,
             "mine": False, "limit": SELECTED_LIMIT}  # fmt: skip
    doc = await list_jobs(argparse.Namespace(**{**vars(args), **query}))
    return [
        j["metadata"]["name"] for j in doc.get("items", [])
        if j.get("status", {}).get("state") not in FINAL_STATES
    ]  # fmt: skip


async def _cancel_all(args: argparse.Namespace) -> int:
    names = list(args.name) or await selected(args)
    if not names:
        sys.stderr.write(f"fedbroker: no unfinished job matches -l {args.selector}\n")
    failed = 0
    answers: list[Any] = []
    for name in names:
        try:
            _, answer = await exchange(_for(args, name))
        except ClientError as exc:
            failed += 1
            sys.stderr.write(f"fedbroker: error: job {name!r}: {exc}\n")
            continue
        answers.append(answer)
        if args.output == "table":
            state = answer.get("status", {}).get("state") if isinstance(answer, dict) else None
            print(f"job {name!r} cancelled ({state})", flush=True)
    if args.output != "table":
        print(shown(args.output, {"items": answers}, ""))
    return EXIT_ERROR if failed else 0


__all__ = ["SELECTED_LIMIT", "run_cancel", "selected"]
