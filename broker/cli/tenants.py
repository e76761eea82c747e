"""``--tenant NAME`` and ``-A/--all-tenants``: an admin's (or a viewer's) reach into other
tenants' jobs, on the commands that name a job or list them.

The API takes ``?tenant=`` from an admin or a viewer and ignores it from anyone else (whose
own tenant is always meant), so the flags are sent as they are and the broker decides.
``list -A`` shows a TENANT column (an admin's list holds every tenant's jobs already);
``list --tenant T`` lists T's only. On a command that names one job, ``-A`` finds the
tenant whose job has that name: one such tenant is used, several are an error naming them
(pick one with ``--tenant``).
"""

from __future__ import annotations

import argparse
from collections.abc import Awaitable, Callable
from typing import Any

from broker.cli.args import UsageError
from broker.cli.connection import ClientError

ListJobs = Callable[[argparse.Namespace], Awaitable[dict[str, Any]]]


def add_tenant_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--tenant", metavar="NAME", default=None,
        help="admins and viewers: this tenant's job(s) (default: the token's tenant; an "
        "admin's list: every tenant's)",
    )  # fmt: skip
    parser.add_argument(
        "-A", "--all-tenants", action="store_true",
        help="admins and viewers: every tenant (list: with a TENANT column; a job's name: "
        "the one tenant that has it)",
    )  # fmt: skip


def tenant_params(args: argparse.Namespace) -> dict[str, str]:
    """The ``tenant`` query a command sends (none for ``-A`` or no flag)."""
    tenant, every = getattr(args, "tenant", None), getattr(args, "all_tenants", False)
    if tenant and every:
        raise UsageError("--tenant and -A/--all-tenants: give one")
    return {"tenant": tenant} if tenant else {}


async def find_tenant(args: argparse.Namespace, list_jobs: ListJobs) -> None:
    """Under ``-A`` on a command that names a job: set ``args.tenant`` to the tenant that
    has a job of that name; ClientError when none or several have one."""
    if not getattr(args, "all_tenants", False) or args.command == "list":
        return
    tenant_params(args)  # the two flags together are refused first
    lister = argparse.Namespace(**{
        **vars(args), "command": "list", "tenant": None, "queue": None, "state": None,
        "cluster": None, "selector": None, "mine": False, "limit": 1000,
        "retry_for": getattr(args, "retry_for", 0.0),
    })  # fmt: skip
    doc = await list_jobs(lister)
    owners = sorted({
        str(j.get("metadata", {}).get("namespace"))
        for j in doc.get("items", []) if j.get("metadata", {}).get("name") == args.name
    })  # fmt: skip
    if not owners:
        raise ClientError(f"no tenant the token may read has a job named {args.name!r}")
    if len(owners) > 1:
        raise ClientError(
            f"tenants {', '.join(owners)} each have a job named {args.name!r}: pick one with "
            f"--tenant"
        )
    args.tenant, args.all_tenants = owners[0], False


__all__ = ["add_tenant_options", "find_tenant", "tenant_params"]
