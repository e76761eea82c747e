"""``fedbroker pods JOB`` and ``fedbroker logs JOB [-p POD | --all-pods] [-c CONTAINER]
[--tail N] [-f] [--timestamps] [--previous]``.

Clients of a running broker like ``broker.cli.client`` (same ``--server``, ``--token``,
``--ca-file`` and environment): ``pods`` prints a job's pods as a table (or ``-o yaml|json``),
``logs`` streams one pod's log to stdout as it arrives (``-f``: until the pod's log ends or
the user interrupts; ``--all-pods``: every pod's, prefixed, ``broker.cli.gang_logs``). Every
failure is one line on stderr (the server's error message).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import Any, BinaryIO

import aiohttp

from broker.cli.args import EXIT_USAGE
from broker.cli.client import list_jobs
from broker.cli.connection import (
    ClientError,
    add_connection_options,
    answer_body,
    ca_file_of,
    error_of,
    exit_status,
    http_error,
    server_url,
    token_of,
    trust,
    unreachable,
)
from broker.cli.gang_logs import SELECTOR_KEYS, all_pods, parse_selector
from broker.cli.listing import sorted_answer
from broker.cli.output import add_output_options, add_sort_option, formatted
from broker.cli.render import table
from broker.cli.tenants import add_tenant_options, find_tenant, tenant_params

POD_HEADER = ("POD", "POD-SET", "CLUSTER", "NODE", "PHASE", "RESTARTS", "SLOT")
CONNECT_TIMEOUT_SECONDS = 30.0


def add_pods_commands(sub: Any) -> None:
    common = argparse.ArgumentParser(add_help=False)
    add_connection_options(common)
    pods = sub.add_parser("pods", parents=[common], help="a placed job's pods")
    pods.add_argument("name", help="the job's name")
    add_output_options(pods)
    add_sort_option(pods)
    add_tenant_options(pods)
    logs = sub.add_parser("logs", parents=[common], help="stream a pod's log of a job")
    logs.add_argument("name", help="the job's name")
    logs.add_argument("-p", "--pod", help="the pod (default: the job's first)")
    logs.add_argument("-c", "--container", help="the container (default: the pod's first)")
    logs.add_argument("--tail", type=int, metavar="N", help="only the last N lines")
    logs.add_argument("-f", "--follow", action="store_true", help="keep streaming")
    logs.add_argument("--all-pods", action="store_true", help="every pod of the job, each "
                      "line after [pod/NAME] (not with -p)")  # fmt: skip
    logs.add_argument("-l", "--selector", metavar="KEY=VALUE[,...]", type=_selector,
                      help="the pods whose fields match, as with --all-pods; keys: "
                      f"{', '.join(SELECTOR_KEYS)}")  # fmt: skip
    logs.add_argument("--timestamps", action="store_true",
                      help="each line after when it was written (RFC 3339)")  # fmt: skip
    logs.add_argument("--previous", action="store_true",
                      help="the previous instance of the container")  # fmt: skip
    add_tenant_options(logs)


def _selector(text: str) -> dict[str, str]:
    try:
        return parse_selector(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def run_pods(args: argparse.Namespace) -> int:
    return _run(args, sys.stdout.buffer)


def _run(args: argparse.Namespace, out: BinaryIO) -> int:
    if args.command == "logs" and (args.all_pods or args.selector) and args.pod is not None:
        sys.stderr.write("fedbroker: error: --all-pods/-l: not with -p/--pod\n")
        return EXIT_USAGE
    try:
        asyncio.run(call(args, out))
    except ClientError as exc:
        sys.stderr.write(f"fedbroker: error: {exc}\n")
        return exit_status(exc)
    return 0


def _request(args: argparse.Namespace) -> tuple[str, dict[str, str]]:
    if args.command == "pods":
        return f"/v1/jobs/{args.name}/pods", tenant_params(args)
    params = {**tenant_params(args), "pod": args.pod, "container": args.container,
              "tailLines": None if args.tail is None else str(args.tail),
              "follow": "true" if args.follow else None,
              "timestamps": "true" if args.timestamps else None,
              "previous": "true" if args.previous else None}  # fmt: skip
    return f"/v1/jobs/{args.name}/logs", {k: v for k, v in params.items() if v is not None}


async def call(args: argparse.Namespace, out: BinaryIO) -> None:
    """Send the command's request; write the table or the log to ``out``."""
    await find_tenant(args, list_jobs)
    path, params = _request(args)
    if args.command == "logs" and (args.all_pods or args.selector):
        await all_pods(args, params, out)
        return
    base = server_url(args)
    token = token_of(args)
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=CONNECT_TIMEOUT_SECONDS)
    connector = aiohttp.TCPConnector(ssl=trust(ca_file_of(args)))
    try:
        async with (
            aiohttp.ClientSession(timeout=timeout, connector=connector) as session,
            session.get(base + path, params=params, headers=headers) as resp,
        ):
            if resp.status >= 400:
                message = error_of(answer_body(await resp.text()))
                raise ClientError(http_error(resp.status, message, resp.reason, token))
            if args.command == "pods":
                doc = sorted_answer("pods", await resp.json(), args.sort_by)
                out.write(render_pods(doc, args.output).encode() + b"\n")
                return
            async for chunk in resp.content.iter_any():
                out.write(chunk)
                out.flush()
    except aiohttp.ClientError as exc:
        raise ClientError(unreachable(base, exc)) from None


def render_pods(doc: Any, output: str = "table") -> str:
    return formatted(doc, output, _pods_table)


def _pods_table(doc: Any) -> str:
    rows = [
        [p.get("name"), p.get("podSet"), p.get("cluster"), p.get("node") or "-", p.get("phase"),
         p.get("restarts"), p.get("slot") or "-"]
        for p in doc.get("pods", [])
    ]  # fmt: skip
    return table(POD_HEADER, rows)


PODS_COMMANDS = ("pods", "logs")

__all__ = ["PODS_COMMANDS", "add_pods_commands", "call", "render_pods", "run_pods"]
