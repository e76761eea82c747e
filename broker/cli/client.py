"""The CLI client: ``fedbroker submit | get | list | cancel | explain | clusters | pools``.

It talks to a running broker over its HTTP API (``broker.cli.connection``: ``--server`` or
``$FEDBROKER_SERVER``, a scheme-less ``host:port`` taken as http://, default
http://127.0.0.1:8080; token from ``--token`` or ``$FEDBROKER_TOKEN``; an https server's
certificate verified against ``--ca-file`` or ``$FEDBROKER_CA_FILE``, else the system's
trust store; or a context of the client's config file) and prints tables for people
(``broker.cli.render``) or ``-o json|yaml`` for scripts (``broker.cli.listing``). Every
failure is one line on stderr: the server's own error message (a 401 with what sets the
token), or why it could not be reached (with how to start a broker). The token is sent as a
bearer header and never printed.

``submit`` labels a job ``fedbroker.io/submitted-by=<user>`` (``list --mine``) and says on
stderr what a known name did (reused a finished one: its next generation; an active one with
the same spec: nothing new). ``list`` shows each job's last reason (``status.waiting``, why a
queued job waits), filters by ``--name``/``-l``/``--mine`` on the server (following its
cursor up to ``--limit``); ``list``/``get`` ``--watch`` print what changes
(``broker.cli.watching``). ``explain`` of a finished job says how, when and where it ran
instead of an empty table. ``submit`` and ``cancel`` run in ``broker.cli.submitting`` and
``broker.cli.cancelling`` (several documents, several jobs) on ``exchange``.

A 503 or 429 with Retry-After is asked again for at most ``--retry-for`` seconds
(``broker.cli.retrying``; default ``$FEDBROKER_RETRY_SECONDS`` or 30; 0 turns it off).
"""

from __future__ import annotations

import argparse
import asyncio
import getpass
import json
import os
import re
import sys
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any
from urllib.parse import quote

import aiohttp
import yaml

from broker.cli.connection import (
    DEFAULT_SERVER,
    EXIT_ERROR,
    ClientError,
    InputError,
    add_connection_options,
    ca_file_of,
    exit_status,
    server_url,
    token_of,
    trust,
    unreachable,
)
from broker.cli.listing import count_more, more_note, print_answer, sorted_answer
from broker.cli.output import add_output_options, add_sort_option
from broker.cli.retrying import (
    DEFAULT_RETRY_SECONDS,
    REQUEST_TIMEOUT_SECONDS,
    Sleep,
    retried,
    retry_after_seconds,
    retry_seconds,
    send_request,
)
from broker.cli.tenants import add_tenant_options, find_tenant, tenant_params
from broker.cli.watching import watch
from broker.cli.wrap import WrapError, is_plain_object, wrap
from broker.manifest import ManifestError
from broker.manifest.documents import DuplicateKey, duplicate_keys_refused
from broker.manifest.parsing import load_yaml

SUBMITTED_BY = "fedbroker.io/submitted-by"
USER_ENV = "FEDBROKER_USER"
FINAL_STATES = ("Succeeded", "Failed", "Cancelled")


def add_client_commands(sub: Any, parser_class: type[argparse.ArgumentParser]) -> None:
    common = _common_options(parser_class)
    _add_submit(sub, common)
    for name, text in (
        ("get", "show a job and its history"),
        ("explain", "why a job waits (or, once finished, how and where it ran)"),
    ):
        cmd = sub.add_parser(name, parents=[common], help=text)
        cmd.add_argument("name", help="the job's name (metadata.name)")
        add_tenant_options(cmd)
    sub.choices["get"].add_argument(
        "-w", "--watch", action="store_true", help="then its row on each change, until Ctrl-C"
    )
    cancel = sub.add_parser("cancel", parents=[common], help="cancel jobs, by name or -l")
    cancel.add_argument("name", nargs="*", help="the jobs' names")
    cancel.add_argument("-l", "--selector", metavar="LABELS", help="every active job whose "
                        "metadata.labels match, as list's -l")  # fmt: skip
    add_tenant_options(cancel)
    _add_list(sub, common)
    add_sort_option(
        sub.add_parser("clusters", parents=[common], help="capacity per cluster and GPU type")
    )
    sub.add_parser(
        "pools", parents=[common], help="burst pools: nodes up and coming, node-hours, cost"
    )


def _common_options(parser_class: type[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    common = parser_class(add_help=False)
    add_connection_options(common)
    add_output_options(common)
    common.add_argument(
        "--retry-for",
        type=retry_seconds,
        metavar="SECONDS",
        default=os.environ.get("FEDBROKER_RETRY_SECONDS", str(DEFAULT_RETRY_SECONDS)),
        help="retry a 503 or 429 with Retry-After (no leader, store down, state being "
        "rebuilt, rate limited) for "
        "at most this long in all; 0: never (default $FEDBROKER_RETRY_SECONDS or 30)",
    )
    return common


def _add_submit(sub: Any, common: argparse.ArgumentParser) -> None:
    submit = sub.add_parser("submit", parents=[common], help="submit a FederatedJob manifest")
    submit.add_argument(
        "-f", "--file", type=Path, required=True,
        help="the manifest: a FederatedJob, or a plain workload object (Job, JobSet, "
        "PyTorchJob, ...) to wrap in one; YAML (several documents: each submitted) or "
        "JSON; - reads stdin, a directory its *.yaml, *.yml and *.json files in order",
    )  # fmt: skip
    submit.add_argument(
        "--queue", help="queue of a plain workload object (default: its fedbroker.io/queue "
        "label, else the tenant's default queue)",
    )  # fmt: skip
    submit.add_argument(
        "--priority", type=int,
        help="priority of a plain workload object (default: its fedbroker.io/priority label, "
        "else 0)",
    )  # fmt: skip


def _add_list(sub: Any, common: argparse.ArgumentParser) -> None:
    lister = sub.add_parser(
        "list", parents=[common], help="list your jobs, with why each waits",
        description="Your tenant's jobs (an admin's token: every tenant's), oldest first, "
        "with the last reason of each: for a waiting job, why the scheduler could not place "
        "it at its last look.",
    )  # fmt: skip
    lister.add_argument("--queue", help="only jobs of this queue")
    lister.add_argument("--state", choices=JOB_STATES, help="only jobs in this state")
    lister.add_argument("--cluster", help="only jobs placed on this cluster")
    lister.add_argument(
        "--name", metavar="PATTERN",
        help="only names containing PATTERN, or matching it as a glob when it has * ? or [",
    )  # fmt: skip
    lister.add_argument(
        "-l", "--selector", metavar="LABELS",
        help="only jobs whose metadata.labels match, kubectl-style: k=v,k2!=v,k3,!k4",
    )  # fmt: skip
    lister.add_argument(
        "--mine", action="store_true",
        help=f"only jobs submitted by you: `fedbroker submit` labels each job "
        f"{SUBMITTED_BY}=<user> (${USER_ENV}, else your login name)",
    )  # fmt: skip
    lister.add_argument(
        "--limit", type=_limit, default=100,
        help="at most this many jobs (1..1000); how many more there are is said on stderr",
    )  # fmt: skip
    add_sort_option(lister)
    add_tenant_options(lister)
    lister.add_argument(
        "-w", "--watch", action="store_true",
        help="then print each job whose state changes (read on /v1/events), until Ctrl-C",
    )  # fmt: skip


CLIENT_COMMANDS = ("submit", "get", "list", "cancel", "explain", "clusters", "pools")
JOB_STATES = ("Queued", "Placed", "Running", "Succeeded", "Failed", "Cancelled")


def _limit(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number, not {text!r}") from None
    if not 1 <= value <= 1000:
        raise argparse.ArgumentTypeError(f"must be within 1..1000, not {value}")
    return value


def submitter() -> str:
    """Who ``submit`` labels a job with: $FEDBROKER_USER, else the login name, made a valid
    label value (letters, digits, ``-_.``; at most 63 characters)."""
    raw = os.environ.get(USER_ENV) or _login()
    value = re.sub(r"[^A-Za-z0-9_.-]+", "-", raw)[:63].strip("-_.")
    return value or "unknown"


def _login() -> str:
    try:
        return getpass.getuser()
    except (OSError, KeyError):
        return "unknown"


def run_client(args: argparse.Namespace) -> int:
    try:
        if args.command in ("list", "get") and args.watch:
            return asyncio.run(watch_list(args))
        _, doc = asyncio.run(_answer(args))
    except ClientError as exc:
        sys.stderr.write(f"fedbroker: error: {exc}\n")
        return exit_status(exc)
    except KeyboardInterrupt:
        return 0 if getattr(args, "watch", False) else 130
    more = doc.pop("more", None) if args.command == "list" else None
    print_answer(args, sorted_answer(args.command, doc, getattr(args, "sort_by", None)))
    if more is not None:
        more_note(more, args.limit)
    return 0


async def _answer(args: argparse.Namespace) -> tuple[int, Any]:
    """The command's answer (status, JSON); a list follows its cursor up to --limit; an
    explain of a finished job carries the job (under ``finished``) for the table."""
    if args.command == "list":
        doc = await list_jobs(args)
        if doc["continue"] is not None and args.output in ("table", "wide"):
            doc["more"] = await count_more(args, list_jobs, doc["continue"])
        return 200, doc
    await find_tenant(args, list_jobs)
    status, doc = await exchange(args)
    if (
        args.command == "explain" and args.output in ("table", "wide")
        and isinstance(doc, dict) and doc.get("state") in FINAL_STATES
    ):  # fmt: skip
        job_path = f"/v1/jobs/{quote(args.name)}"
        _, job = await exchange(args, _Request("GET", job_path, params=tenant_params(args)))
        doc = {**doc, "finished": job}
    return status, doc


async def list_jobs(args: argparse.Namespace) -> dict[str, Any]:
    """Up to --limit jobs: a filtered page may hold fewer (the server reads a bounded
    number of jobs per request), so the cursor is followed until the limit or the end."""
    items: list[Any] = []
    cursor: str | None = getattr(args, "after", None)
    while True:
        request = _request_for(args)
        request.params["limit"] = str(args.limit - len(items))
        if cursor is not None:
            request.params["continue"] = cursor
        _, doc = await exchange(args, request)
        items.extend(doc.get("items") or [])
        cursor = doc.get("continue")
        if cursor is None or len(items) >= args.limit:
            return {"items": items, "continue": cursor}


async def _sleep(seconds: float) -> None:
    await asyncio.sleep(seconds)


@dataclass(frozen=True)
class _Request:
    method: str
    path: str
    body: bytes | None = None
    params: dict[str, str] = field(default_factory=dict)
    content_type: str | None = None


def _request_for(args: argparse.Namespace) -> _Request:
    """The HTTP request a client command stands for."""
    given = getattr(args, "name", None)
    if isinstance(given, list):  # cancel's names: one request cancels the first
        given = given[0] if given else None
    name = quote(given or "", safe="")
    match args.command:
        case "submit":
            try:
                body = args.file.read_bytes()
            except OSError as exc:
                raise InputError(f"{args.file}: {exc.strerror}") from None
            return submit_request(args, body, str(args.file), args.file.suffix == ".json")
        case "get":
            return _Request("GET", f"/v1/jobs/{name}", params=tenant_params(args))
        case "cancel":
            return _Request("DELETE", f"/v1/jobs/{name}", params=tenant_params(args))
        case "explain":
            return _Request("GET", f"/v1/jobs/{name}/explain", params=tenant_params(args))
        case "list":
            return _Request("GET", "/v1/jobs", params=list_params(args))
        case "clusters":
            return _Request("GET", "/v1/clusters")
        case "pools":
            return _Request("GET", "/v1/pools")
    return _Request("GET", "")


def list_params(args: argparse.Namespace) -> dict[str, str]:
    """The query of ``list``: its filters; ``--mine`` is a selector on the submitter."""
    selectors = [s for s in (args.selector,) if s]
    if args.mine:
        selectors.append(f"{SUBMITTED_BY}={submitter()}")
    filters = (
        ("queue", args.queue), ("state", args.state), ("cluster", args.cluster),
        ("name", args.name), ("selector", ",".join(selectors)),
    )  # fmt: skip
    params = {k: str(v) for k, v in filters if v} | tenant_params(args)
    params["limit"] = str(args.limit)
    return params


def submit_request(args: argparse.Namespace, body: bytes, source: str, is_json: bool) -> _Request:
    """The POST of one manifest document (``source`` names it in errors)."""
    kind = "application/json" if is_json else "application/yaml"
    labelled = _labelled(args, body, source, is_json)
    if labelled is not None:
        return _Request("POST", "/v1/jobs", labelled, content_type="application/json")
    return _Request("POST", "/v1/jobs", body, content_type=kind)


def _labelled(args: argparse.Namespace, body: bytes, source: str, is_json: bool) -> bytes | None:
    """The manifest to send as JSON: a plain workload object wrapped in a FederatedJob
    (``wrap``), and a FederatedJob labelled with who submitted it (``--mine``); None for
    what does not parse as either (sent as it is: the broker names what is wrong)."""
    # A key given twice is refused here as the broker would: sent on as JSON, the second
    # value would silently win.
    try:
        if is_json:
            doc: Any = json.loads(body, object_pairs_hook=duplicate_keys_refused)
        else:
            doc = load_yaml(body)
    except DuplicateKey as exc:
        raise InputError(f"{source}: {exc.message('manifest')}") from None
    except ManifestError as exc:  # JSON's duplicate key
        raise InputError(f"{source}: {exc}") from None
    except (yaml.YAMLError, ValueError, RecursionError):
        return None
    if is_plain_object(doc):
        try:
            doc = wrap(doc, args.queue, args.priority)
        except WrapError as exc:
            raise InputError(f"{source}: {exc}") from None
    elif args.queue is not None or args.priority is not None:
        raise InputError("--queue/--priority: only for a plain workload object")
    if not isinstance(doc, dict) or not isinstance(doc.get("metadata"), dict):
        return None
    labels = doc["metadata"].get("labels")
    if labels is None:
        labels = {}
    if not isinstance(labels, dict):
        return None
    doc["metadata"] = {**doc["metadata"], "labels": {SUBMITTED_BY: submitter(), **labels}}
    try:
        return json.dumps(doc).encode()
    except (TypeError, ValueError):  # YAML dates and the like: let the broker say
        return None


async def call(args: argparse.Namespace, *, sleep: Sleep = _sleep) -> Any:
    """The command's request, its answer as JSON; raises ClientError (one line)."""
    return (await exchange(args, sleep=sleep))[1]


async def exchange(
    args: argparse.Namespace, request: _Request | None = None, *, sleep: Sleep = _sleep
) -> tuple[int, Any]:
    """``request`` (default: the command's), its answer's status and JSON; raises
    ClientError (one line).

    ``sleep`` waits between retries (tests inject one that returns at once: the budget is
    counted in the waits asked for as well as in wall-clock time, so it still runs out).
    """
    base = server_url(args)
    request = request or _request_for(args)
    token = token_of(args)
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    if request.content_type is not None:
        headers["Content-Type"] = request.content_type
    timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_SECONDS)
    connector = aiohttp.TCPConnector(ssl=trust(ca_file_of(args)))
    try:
        async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
            send = partial(
                send_request, session, request.method, base + request.path, request.body, headers,
                request.params, token,
            )  # fmt: skip
            answer: tuple[int, Any] = await retried(send, float(args.retry_for), sleep)
            return answer
    except aiohttp.ClientError as exc:
        raise ClientError(unreachable(base, exc)) from None
    except TimeoutError:
        raise ClientError(
            f"the broker at {base} did not answer within {REQUEST_TIMEOUT_SECONDS:g} s"
        ) from None


async def watch_list(args: argparse.Namespace) -> int:
    """``list --watch`` and ``get --watch`` (``broker.cli.watching``)."""
    await find_tenant(args, list_jobs)  # get -A: the one tenant with that name
    return await watch(args, _sorted_jobs if args.command == "list" else _one_job)


async def _sorted_jobs(args: argparse.Namespace) -> dict[str, Any]:
    """Every answer of ``list --watch`` in ``--sort-by``'s order, as ``list`` prints it."""
    return sorted_answer("list", await list_jobs(args), args.sort_by)  # type: ignore[no-any-return]


async def _one_job(args: argparse.Namespace) -> dict[str, Any]:
    return {"items": [await call(args)]}


__all__ = [
    "CLIENT_COMMANDS",
    "DEFAULT_SERVER",
    "EXIT_ERROR",
    "SUBMITTED_BY",
    "ClientError",
    "add_client_commands",
    "call",
    "exchange",
    "list_jobs",
    "retry_after_seconds",
    "run_client",
    "submit_request",
    "submitter",
    "watch_list",
]
