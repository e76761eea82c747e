"""``fedbroker __complete jobs [--server URL] [--token T] [--ca-file F] [--context NAME]
[PREFIX]``: the names of the caller's jobs that start with PREFIX, one a line, for shell
completion.

Hidden (not in the help or the parser: ``main`` hands it the words before parsing), as
kubectl's ``__complete`` is. The completion script (``broker.cli.completion``) calls it
when a job name is expected (``get``, ``explain``, ``cancel``, ``pods``, ``logs``), passing
on the connection flags of the line being completed; the environment supplies the rest as
for any client command. It fails silently (nothing printed, exit 1) and gives up after
COMPLETE_TIMEOUT_SECONDS, so an unreachable broker never stalls the shell.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Sequence

from broker.cli.client import list_jobs
from broker.cli.connection import add_connection_options

COMPLETE = "__complete"
COMPLETE_TIMEOUT_SECONDS = 3.0
COMPLETE_LIMIT = 1000  # names offered at most


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=f"fedbroker {COMPLETE}", add_help=False)
    parser.add_argument("what", choices=("jobs",))
    add_connection_options(parser)
    parser.add_argument("prefix", nargs="?", default="")
    return parser


def _glob_escaped(text: str) -> str:
    """``text`` as a literal in the server's name glob."""
    return "".join(f"[{c}]" if c in "*?[" else c for c in text)


async def job_names(args: argparse.Namespace) -> list[str]:
    query = argparse.Namespace(
        **vars(args), command="list", queue=None, state=None, cluster=None, selector=None,
        mine=False, limit=COMPLETE_LIMIT, retry_for=0.0,
        name=f"{_glob_escaped(args.prefix)}*" if args.prefix else None,
    )  # fmt: skip
    doc = await asyncio.wait_for(list_jobs(query), COMPLETE_TIMEOUT_SECONDS)
    names = (j.get("metadata", {}).get("name") for j in doc.get("items", []))
    return [n for n in names if isinstance(n, str) and n.startswith(args.prefix)]


def run_complete(argv: Sequence[str]) -> int:
    """Print the matching names; any failure prints nothing (exit 1)."""
    try:
        args, _ = _parser().parse_known_intermixed_args(list(argv))
        names = asyncio.run(job_names(args))
    except (Exception, SystemExit):
        return 1
    sys.stdout.write("".join(f"{n}\n" for n in names))
    return 0


__all__ = ["COMPLETE", "COMPLETE_TIMEOUT_SECONDS", "job_names", "run_complete"]
