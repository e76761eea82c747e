"""The CLI client: ``fedbroker submit | get | list | cancel | explain | clusters``.

It talks to a running broker over its HTTP API (``--server``, default
``$FEDBROKER_SERVER`` or http://127.0.0.1:8080; token from ``--token`` or
``$FEDBROKER_TOKEN``) and prints tables for people or ``-o json|yaml`` for scripts. Every
failure is one line on stderr: the server's own error message, or why it could not be
reached. The token is sent as a bearer header and never printed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import aiohttp
import yaml

DEFAULT_SERVER = "http://127.0.0.1:8080"
EXIT_ERROR = 1


class ClientError(Exception):
    """One line for the user."""


def add_client_commands(sub: Any, parser_class: type[argparse.ArgumentParser]) -> None:
    common = parser_class(add_help=False)
    common.add_argument("--server", default=os.environ.get("FEDBROKER_SERVER", DEFAULT_SERVER))
    common.add_argument("--token", default=None, help="bearer token (default $FEDBROKER_TOKEN)")
    common.add_argument("-o", "--output", choices=("table", "json", "yaml"), default="table")

    submit = sub.add_parser("submit", parents=[common], help="submit a FederatedJob manifest")
    submit.add_argument("-f", "--file", type=Path, required=True, help="YAML or JSON manifest")
    for name, text in (
        ("get", "show a job and its history"),
        ("cancel", "cancel a job"),
        ("explain", "why a job waits"),
    ):
        cmd = sub.add_parser(name, parents=[common], help=text)
        cmd.add_argument("name")
    lister = sub.add_parser("list", parents=[common], help="list your jobs")
    lister.add_argument("--queue")
    lister.add_argument("--state")
    lister.add_argument("--cluster")
    lister.add_argument("--limit", type=int, default=100)
    sub.add_parser("clusters", parents=[common], help="capacity per cluster and GPU type")
    sub.add_parser(
        "pools", parents=[common], help="burst pools: nodes up and coming, node-hours, cost"
    )


CLIENT_COMMANDS = ("submit", "get", "list", "cancel", "explain", "clusters", "pools")


def run_client(args: argparse.Namespace) -> int:
    try:
        doc = asyncio.run(_call(args))
    except ClientError as exc:
        sys.stderr.write(f"fedbroker: error: {exc}\n")
        return EXIT_ERROR
    if args.output == "json":
        print(json.dumps(doc, indent=2))
    elif args.output == "yaml":
        print(yaml.safe_dump(doc, sort_keys=False), end="")
    else:
        print(render(args.command, doc))
    return 0


async def _call(args: argparse.Namespace) -> Any:
    token = args.token or os.environ.get("FEDBROKER_TOKEN", "")
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    base = args.server.rstrip("/")
    method, path, body, params = "GET", "", None, {}
    match args.command:
        case "submit":
            try:
                body = args.file.read_bytes()
            except OSError as exc:
                raise ClientError(f"{args.file}: {exc.strerror}") from None
            kind = "application/json" if args.file.suffix == ".json" else "application/yaml"
            headers["Content-Type"] = kind
            method, path = "POST", "/v1/jobs"
        case "get":
            path = f"/v1/jobs/{args.name}"
        case "cancel":
            method, path = "DELETE", f"/v1/jobs/{args.name}"
        case "explain":
            path = f"/v1/jobs/{args.name}/explain"
        case "list":
            path = "/v1/jobs"
            params = {
                k: str(v)
                for k, v in (
                    ("queue", args.queue),
                    ("state", args.state),
                    ("cluster", args.cluster),
                )
                if v
            }
            params["limit"] = str(args.limit)
        case "clusters":
            path = "/v1/clusters"
        case "pools":
            path = "/v1/pools"
    timeout = aiohttp.ClientTimeout(total=30)
    try:
        async with (
            aiohttp.ClientSession(timeout=timeout) as session,
            session.request(method, base + path, data=body, headers=headers, params=params) as resp,
        ):
            text = await resp.text()
            try:
                doc = json.loads(text) if text else {}
            except json.JSONDecodeError:
                doc = {"error": text.strip()[:200]}
            if resp.status >= 400:
                message = doc.get("error") if isinstance(doc, dict) else None
                raise ClientError(f"{resp.status} {message or resp.reason}")
            return doc
    except aiohttp.ClientConnectionError:
        raise ClientError(f"cannot reach the broker at {base} (is it running? --server)") from None
    except TimeoutError:
        raise ClientError(f"the broker at {base} did not answer within 30 s") from None


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
        status.get("reason"),
    ]


JOB_HEADER = ("NAME", "QUEUE", "STATE", "CLUSTER", "AGE", "REASON")


def render(command: str, doc: Any) -> str:
    if command in ("submit", "cancel"):
        return table(JOB_HEADER, [_job_row(doc)])
    if command == "get":
        out = table(JOB_HEADER, [_job_row(doc)])
        history = doc.get("status", {}).get("history") or []
        if history:
            rows = [
                [_age(h.get("at")), h.get("state"), h.get("cluster"), h.get("reason")]
                for h in history
            ]
            out += "\n\nHISTORY\n" + table(("AGO", "STATE", "CLUSTER", "REASON"), rows)
        return out
    if command == "list":
        return table(JOB_HEADER, [_job_row(j) for j in doc.get("items", [])])
    if command == "explain":
        head = f"{doc.get('job')}: {doc.get('state')}" + (
            f" on {doc['cluster']}" if doc.get("cluster") else ""
        )
        rows = [
            [
                c.get("cluster"),
                "yes" if c.get("fits") else "no",
                c.get("largestFit"),
                "; ".join(f"{r.get('code')}: {r.get('message')}" for r in c.get("reasons", []))
                or "-",
            ]
            for c in doc.get("clusters", [])
        ]
        return head + "\n" + table(("CLUSTER", "FITS", "LARGEST-FIT", "WHY NOT"), rows)
    if command == "clusters":
        rows = []
        for c in doc.get("clusters", []):
            # A cluster with no GPU nodes (yet: a burst cluster) still gets its row.
            for t in c.get("gpuTypes") or [{"gpuType": "-", "total": 0}]:
                rows.append(
                    [
                        c.get("cluster") or c.get("name"),
                        t.get("gpuType"),
                        t.get("total"),
                        t.get("allocated"),
                        t.get("reserved"),
                        t.get("free"),
                        t.get("largestGang"),
                    ]
                )
        return table(
            ("CLUSTER", "GPU", "TOTAL", "ALLOCATED", "RESERVED", "FREE", "LARGEST-GANG"), rows
        )
    if command == "pools":
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
    return json.dumps(doc, indent=2)
