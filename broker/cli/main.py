"""The ``fedbroker`` command line: the composition root of the one-shot commands.

Each command family registers its own subcommands (``add_*_command``) and names the
function that runs each; this module only puts them together, in the order of the help.
Users' mistakes (missing files, wrong columns, unknown policies, bad numbers) end in one line
on stderr naming the problem and exit status 2, never a traceback.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from broker.cli.agent import add_agent_command, run_agent_command
from broker.cli.args import EXIT_USAGE, CommandParser, UsageError
from broker.cli.bench import add_bench_command, run_bench_command
from broker.cli.cancelling import run_cancel
from broker.cli.client import CLIENT_COMMANDS, add_client_commands, run_client
from broker.cli.completion import add_completion_command, completion_script
from broker.cli.contexts import add_config_command, run_config
from broker.cli.demo import add_demo_command, run_demo
from broker.cli.jobnames import COMPLETE, run_complete
from broker.cli.plan import (
    InspectError,
    add_inspect_command,
    add_plan_command,
    run_inspect,
    run_plan,
)
from broker.cli.podlogs import PODS_COMMANDS, add_pods_commands, run_pods
from broker.cli.runtime import add_serve_command, run_serve
from broker.cli.simulate import add_simulate_command, run_simulate
from broker.cli.submitting import run_submit
from broker.cli.top import add_top_command, run_top
from broker.sim.traces import TraceError

Run = Callable[[argparse.Namespace], int]


def _add_client_commands(sub: Any) -> None:
    add_client_commands(sub, CommandParser)


def run_completion(args: argparse.Namespace) -> int:
    print(completion_script(build_parser(), args.shell), end="")
    return 0


# Every family: how it adds its subcommands, and the runner of each (in the help's order).
FAMILIES: tuple[tuple[Callable[[Any], None], Mapping[str, Run]], ...] = (
    (add_simulate_command, {"simulate": run_simulate}),
    (
        _add_client_commands,
        {**dict.fromkeys(CLIENT_COMMANDS, run_client), "submit": run_submit, "cancel": run_cancel},
    ),
    (add_pods_commands, dict.fromkeys(PODS_COMMANDS, run_pods)),
    (add_serve_command, {"serve": run_serve}),
    (add_demo_command, {"demo": run_demo}),
    (add_top_command, {"top": run_top}),
    (add_inspect_command, {"inspect": run_inspect}),
    (add_plan_command, {"plan": run_plan}),
    (add_agent_command, {"agent": run_agent_command}),
    (add_bench_command, {"bench": run_bench_command}),
    (add_config_command, {"config": run_config}),
    (add_completion_command, {"completion": run_completion}),
)
_RUNNERS: dict[str, Run] = {name: run for _, runs in FAMILIES for name, run in runs.items()}


def version() -> str:
    """The installed package's version (its metadata), or ``unknown`` when run from a tree
    that was never installed."""
    try:
        return importlib.metadata.version("fedbroker")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def build_parser() -> argparse.ArgumentParser:
    parser = CommandParser(
        prog="fedbroker",
        description="Multi-cluster GPU federation broker. `fedbroker demo` runs one on "
        "simulated clusters; the other commands talk to a running broker "
        "($FEDBROKER_SERVER, $FEDBROKER_TOKEN). Reference: docs/cli.md.",
    )
    parser.add_argument(
        "--version", action="version", version=f"fedbroker {version()}",
        help="print the installed version and exit",
    )  # fmt: skip
    sub = parser.add_subparsers(dest="command", required=True, parser_class=CommandParser)
    for add, _ in FAMILIES:
        add(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    words = sys.argv[1:] if argv is None else list(argv)
    if words[:1] == [COMPLETE]:  # the completion script's call, kept out of the help
        return run_complete(words[1:])
    args = build_parser().parse_args(words)
    try:
        return _RUNNERS[args.command](args)
    except (UsageError, TraceError, InspectError) as exc:
        sys.stderr.write(f"fedbroker: error: {exc}\n")
        return EXIT_USAGE
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
