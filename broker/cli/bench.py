"""``fedbroker bench``: its flags, and which benchmark of broker.bench a run means
(placement decisions per second, ``--topology``: gang decisions with and without topology
requests, ``--e2e`` through HTTP and the service, ``--soak`` with jobs that end,
``--cycle``, ``--restart``: time to ready after ``kill -9``, ``--plans``: a tenant's reads
while others ask for dry runs)."""

from __future__ import annotations

import argparse
from typing import Any, get_args

from broker.cli.args import plot_file, positive
from broker.cli.output import add_output_options, yaml_from_json
from broker.model import PolicyName

# The policies the service offers that place single pods themselves (auto and gang hand
# single pods to binpack).
SINGLE_POLICIES = tuple(p for p in get_args(PolicyName) if p not in ("auto", "gang"))


def add_bench_command(sub: Any) -> None:
    cmd = sub.add_parser("bench", help="measure placement decisions per second of the core")
    cmd.add_argument(
        "--clusters", type=positive("--clusters"), default=None,
        help="member clusters (default 20; 100 with --cycle; 2 with --plans)",
    )  # fmt: skip
    cmd.add_argument(
        "--nodes-per-cluster", type=positive("--nodes-per-cluster"), default=None,
        help="nodes in each simulated cluster (default 500; 100 with --plans)",
    )  # fmt: skip
    cmd.add_argument("--decisions", type=positive("--decisions"), default=5000,
                     help="placement decisions to time")  # fmt: skip
    cmd.add_argument(
        "--scaling", action="store_true", help="also measure at 2,000 and 50,000 nodes"
    )
    cmd.add_argument("--seed", type=int, default=0, help="random seed of the generated jobs")
    cmd.add_argument(
        "--single-policy", choices=SINGLE_POLICIES, default="binpack",
        help="the policy that places the single-pod jobs (default binpack, as auto does)",
    )  # fmt: skip
    add_output_options(cmd)
    cmd.add_argument(
        "--e2e", action="store_true", help="submit -> placed through HTTP and the real service"
    )
    cmd.add_argument(
        "--jobs", type=positive("--jobs"), default=None,
        help="e2e/soak/restart: jobs (default 5,000; soak 1,000,000; restart 10,000)",
    )  # fmt: skip
    cmd.add_argument(
        "--rate", type=positive("--rate"), default=None,
        help="e2e/soak: submissions/s (default 500; soak 300)",
    )  # fmt: skip
    cmd.add_argument(
        "--soak", action="store_true",
        help="jobs that end, through HTTP and the real service: one row per --window jobs",
    )  # fmt: skip
    cmd.add_argument(
        "--window", type=positive("--window"), default=100_000, help="soak: jobs per row"
    )
    cmd.add_argument(
        "--retention", type=positive("--retention"), default=600.0, metavar="SECONDS",
        help="soak: finished jobs kept this long before the leader purges them (default 600; "
        "the store levels off at about rate x this many finished jobs)",
    )  # fmt: skip
    cmd.add_argument(
        "--plot", type=plot_file, metavar="FILE", help="soak: CPU/job, p99s and RSS as a PNG"
    )
    cmd.add_argument(
        "--store", default=None, metavar="URL",
        help="soak/restart: a postgresql:// server, on which a fresh database is created and "
        "dropped afterwards (default: SQLite in a temp dir)",
    )  # fmt: skip
    _add_cycle_and_restart(cmd)
    _add_plans_and_topology(cmd)


def _add_plans_and_topology(cmd: Any) -> None:
    """The flags of the plans and topology benchmarks (``--plans``, ``--topology``)."""
    cmd.add_argument(
        "--plans", action="store_true",
        help="one tenant's read latency, alone and while 4 clients of another (read-only "
        "token) send maximum-size dry runs (POST /v1/plan)",
    )  # fmt: skip
    cmd.add_argument(
        "--reads", type=positive("--reads"), default=1000,
        help="plans: reads of /v1/clusters in each phase, at 200/s",
    )  # fmt: skip
    cmd.add_argument(
        "--topology", action="store_true",
        help="gang decisions/s with a required and a preferred rack against the same gangs "
        "without a request, on racks and blocks laid over the nodes",
    )  # fmt: skip
    cmd.add_argument(
        "--rack-nodes", type=positive("--rack-nodes"), default=16, help="topology: nodes per rack"
    )
    cmd.add_argument(
        "--block-racks", type=positive("--block-racks"), default=8,
        help="topology: racks per block",
    )  # fmt: skip


def _add_cycle_and_restart(cmd: Any) -> None:
    """The flags of the cycle and restart benchmarks (``--cycle``, ``--restart``)."""
    cmd.add_argument(
        "--cycle", action="store_true",
        help="scheduling cycle time and memory with a backlog of --queued jobs",
    )  # fmt: skip
    cmd.add_argument(
        "--queued", type=positive("--queued"), default=100_000, help="cycle: jobs queued"
    )
    cmd.add_argument(
        "--restart", action="store_true",
        help="time to ready of `serve` after kill -9 with --jobs live jobs in the store, "
        "and its first /metrics read (every requeued job still waiting)",
    )  # fmt: skip
    cmd.add_argument(
        "--kube", action="store_true",
        help="restart: every job Running on Kubernetes members served by kmock (a test "
        "dependency), restored from its pod instead of requeued",
    )  # fmt: skip


def run_bench_command(args: argparse.Namespace) -> int:
    args.json = args.output in ("json", "yaml")  # the benchmarks print JSON themselves
    with yaml_from_json(args.output):
        return _bench(args)


def _bench(args: argparse.Namespace) -> int:
    if args.clusters is None:
        args.clusters = 100 if args.cycle else 2 if args.plans else 20
    if args.nodes_per_cluster is None:
        args.nodes_per_cluster = 100 if args.plans else 500
    if args.plans:
        from broker.bench.plans import main_plans

        return main_plans(args)
    if args.restart:
        from broker.bench.restart import main_restart

        args.jobs = args.jobs or 10_000
        return main_restart(args)
    if args.cycle:
        from broker.bench.cycle import main_cycle

        return main_cycle(args)
    if args.soak:
        from broker.bench.soak import main_soak

        args.jobs = args.jobs or 1_000_000
        args.rate = args.rate or 300
        return main_soak(args)
    args.jobs = args.jobs or 5000
    args.rate = args.rate or 500
    if args.e2e:
        from broker.bench.e2e import main_e2e

        return main_e2e(args)
    if args.topology:
        from broker.bench.topology import main_topology

        return main_topology(args)
    from broker.bench.decisions import run_bench

    return run_bench(args)
