"""The ``fedbroker`` command line: the composition root of the one-shot commands.

Users' mistakes (missing files, wrong columns, unknown policies, bad numbers) end in one line
on stderr naming the problem and exit status 2, never a traceback.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from adapters.simulated import OPENB_MIX, generate_nodes, generated_pod_mix
from broker.cli.agent import add_agent_command
from broker.cli.client import CLIENT_COMMANDS, add_client_commands, run_client
from broker.cli.demo import add_demo_command
from broker.cli.plan import InspectError, add_inspect_command, add_plan_command
from broker.cli.runtime import add_serve_command
from broker.model import Node
from broker.sim.traces import TraceError, TracePod, read_nodes, read_openb_pods
from policies import POLICY_NAMES

EXIT_USAGE = 2


class UsageError(Exception):
    """A problem with what the user asked for; printed as one line."""


def _loads(text: str) -> list[int]:
    try:
        loads = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--loads must be whole percentages like 80,90,130, not {text!r}"
        ) from None
    if not loads or any(x <= 0 for x in loads):
        raise argparse.ArgumentTypeError(f"--loads must be positive percentages, not {text!r}")
    return loads


def _positive(name: str) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{name} must be a whole number, not {text!r}"
            ) from None
        if value < 1:
            raise argparse.ArgumentTypeError(f"{name} must be at least 1, not {value}")
        return value

    return parse


def _positive_float(name: str) -> Callable[[str], float]:
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} must be a number, not {text!r}") from None
        if not 0 < value < float("inf"):
            raise argparse.ArgumentTypeError(f"{name} must be a positive number, not {text!r}")
        return value

    return parse


def _fraction(name: str) -> Callable[[str], float]:
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} must be a number, not {text!r}") from None
        if not 0.0 <= value <= 1.0:
            raise argparse.ArgumentTypeError(f"{name} must be between 0 and 1, not {text!r}")
        return value

    return parse


def _policy(text: str) -> str:
    if text not in POLICY_NAMES:
        raise argparse.ArgumentTypeError(
            f"unknown policy {text!r} (known: {', '.join(POLICY_NAMES)})"
        )
    return text


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        sys.stderr.write(f"fedbroker: error: {message}\n")
        raise SystemExit(EXIT_USAGE)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="fedbroker", description="Multi-cluster GPU federation broker")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    sim = sub.add_parser("simulate", help="replay real traces through the placement core")
    sim.add_argument("--protocol", choices=("fill", "replay"), default="fill")
    sim.add_argument(
        "--nodes", type=Path, help="node list CSV (default: a generated openb-mix federation)"
    )
    sim.add_argument(
        "--pods", type=Path, help="pod list CSV (default: a generated openb-like workload)"
    )
    sim.add_argument("--policy", type=_policy, action="append", help="policy to run (repeatable)")
    sim.add_argument(
        "--clusters",
        type=_positive("--clusters"),
        default=None,
        help="split nodes round-robin into this many on-prem clusters (default: 1 for fill, "
        "2 for replay)",
    )
    sim.add_argument("--seed", type=int, default=None, help="default: 0 for fill, 1 for replay")
    sim.add_argument(
        "--seeds", type=_positive("--seeds"), default=1, help="run seeds S..S+N-1 and average"
    )
    sim.add_argument("--loads", type=_loads, default=[80, 90, 100, 110, 130])
    sim.add_argument("--json", action="store_true")
    sim.add_argument("--dump-placements", type=Path, metavar="FILE")
    sim.add_argument("--plot", type=Path, metavar="FILE", help="write a PNG plot")
    sim.add_argument(
        "--workers", type=_positive("--workers"), default=1, help="fill: runs in parallel"
    )
    sim.add_argument(
        "--jobs", type=_positive("--jobs"), default=2000, help="replay: gang jobs to generate"
    )
    sim.add_argument(
        "--time-scale",
        type=_positive_float("--time-scale"),
        default=None,
        help="replay: trace seconds per simulated second (default 60 with --pods; 10 for the "
        "generated workload, whose day becomes 2.4 simulated hours)",
    )
    sim.add_argument(
        "--gang-load",
        type=_positive_float("--gang-load"),
        default=None,
        help="replay: GPU load the generated jobs offer over the trace span, %% of all GPUs "
        "(default 90 with --pods; 130 for the generated workload: a federation short of "
        "GPUs, where bursting matters)",
    )
    sim.add_argument(
        "--cycle-seconds",
        type=_positive_float("--cycle-seconds"),
        default=10.0,
        help="replay: simulated seconds between scheduling cycles (also run on every event)",
    )
    sim.add_argument(
        "--scan-misses",
        type=_positive("--scan-misses"),
        default=32,
        help="replay: a cycle stops after this many queued jobs in a row do not fit",
    )
    sim.add_argument(
        "--no-burst",
        action="store_true",
        help="replay: no burst pool (by default one simulated cloud pool grows a third, "
        "empty cluster for gangs that waited burstAfterSeconds=120: nodes of 8 x A100, 96 "
        "cores, 1152 GiB like AWS p4d.24xlarge, 32.77 USD/h on demand in us-east-1; "
        "scaleDownAfterSeconds=600, provisioning timeout 900 s)",
    )
    sim.add_argument(
        "--burst-max-nodes",
        type=_positive("--burst-max-nodes"),
        default=32,
        help="replay: the burst pool's maximum size in nodes",
    )
    sim.add_argument(
        "--burst-provision-seconds",
        type=_positive_float("--burst-provision-seconds"),
        default=300.0,
        help="replay: simulated seconds from a scale-up until a new node is Ready",
    )
    sim.add_argument(
        "--burst-failure-rate",
        type=_fraction("--burst-failure-rate"),
        default=0.0,
        help="replay: share of new burst nodes that never come up (seeded)",
    )

    add_client_commands(sub, _Parser)
    add_serve_command(sub)
    add_demo_command(sub)
    add_inspect_command(sub)
    add_plan_command(sub)
    add_agent_command(sub)

    bench = sub.add_parser("bench", help="measure placement decisions per second of the core")
    bench.add_argument(
        "--clusters", type=_positive("--clusters"), default=None,
        help="member clusters (default 20; 100 with --cycle)",
    )  # fmt: skip
    bench.add_argument("--nodes-per-cluster", type=_positive("--nodes-per-cluster"), default=500)
    bench.add_argument("--decisions", type=_positive("--decisions"), default=5000)
    bench.add_argument(
        "--scaling", action="store_true", help="also measure at 2,000 and 50,000 nodes"
    )
    bench.add_argument("--seed", type=int, default=0)
    bench.add_argument("--json", action="store_true")
    bench.add_argument(
        "--e2e", action="store_true", help="submit -> placed through HTTP and the real service"
    )
    bench.add_argument("--jobs", type=_positive("--jobs"), default=5000, help="e2e: jobs to submit")
    bench.add_argument("--rate", type=_positive("--rate"), default=500, help="e2e: submissions/s")
    bench.add_argument(
        "--cycle", action="store_true",
        help="scheduling cycle time and memory with a backlog of --queued jobs",
    )  # fmt: skip
    bench.add_argument(
        "--queued", type=_positive("--queued"), default=100_000, help="cycle: jobs queued"
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command == "simulate":
            return _simulate(args)
        if args.command in CLIENT_COMMANDS:
            return run_client(args)
        if args.command == "serve":
            from broker.cli.runtime import run_serve

            return run_serve(args)
        if args.command == "demo":
            from broker.cli.demo import run_demo

            return run_demo(args)
        if args.command == "inspect":
            from broker.cli.plan import run_inspect

            return run_inspect(args)
        if args.command == "plan":
            from broker.cli.plan import run_plan

            return run_plan(args)
        if args.command == "agent":
            from broker.cli.agent import run_agent_command

            return run_agent_command(args)
        if args.command == "bench" and args.clusters is None:
            args.clusters = 100 if args.cycle else 20
        if args.command == "bench" and args.cycle:
            from broker.bench.cycle import main_cycle

            return main_cycle(args)
        if args.command == "bench" and args.e2e:
            from broker.bench.e2e import main_e2e

            return main_e2e(args)
        if args.command == "bench":
            from broker.bench.decisions import run_bench

            return run_bench(args)
    except (UsageError, TraceError, InspectError) as exc:
        sys.stderr.write(f"fedbroker: error: {exc}\n")
        return EXIT_USAGE
    except KeyboardInterrupt:
        return 130
    return EXIT_USAGE


def load_inputs(
    nodes_path: Path | None, pods_path: Path | None, seed: int
) -> tuple[list[Node], list[TracePod]]:
    """Trace files when given, else the generated openb-mix federation and workload."""
    import random

    nodes = read_nodes(nodes_path) if nodes_path else generate_nodes(OPENB_MIX, "openb-node")
    if pods_path:
        pods = read_openb_pods(pods_path)
    else:
        rng = random.Random(seed)
        pods = [
            TracePod(f"gen-pod-{i:05d}", generated_pod_mix(rng), frozenset()) for i in range(8000)
        ]
    return nodes, pods


def _simulate(args: argparse.Namespace) -> int:
    policies = args.policy or ["binpack", "fgd"]
    replay = args.protocol == "replay"
    if args.clusters is None:
        args.clusters = 2 if replay else 1
    if args.seed is None:
        args.seed = 1 if replay else 0
    generated = args.pods is None
    if args.time_scale is None:
        args.time_scale = 10.0 if generated else 60.0
    if args.gang_load is None:
        args.gang_load = 130.0 if generated else 90.0
    nodes, pods = load_inputs(args.nodes, args.pods, args.seed)
    if args.protocol == "replay":
        from broker.sim.replay import run_replay

        return run_replay(args, nodes, pods, policies)
    from broker.sim.fill import as_dict, fill, mean_by_policy_and_load

    seeds = list(range(args.seed, args.seed + args.seeds))
    dump = None
    if args.dump_placements:
        try:
            dump = args.dump_placements.open("w")
        except OSError as exc:
            raise UsageError(f"--dump-placements {args.dump_placements}: {exc.strerror}") from None
    try:
        results = fill(nodes, pods, policies, args.clusters, seeds, args.loads, dump, args.workers)
    finally:
        if dump is not None:
            dump.close()
    rows = mean_by_policy_and_load(results)
    gpus = sum(n.allocatable.gpus for n in nodes)
    if args.json:
        doc: dict[str, object] = {
            "protocol": "fill",
            "nodes": len(nodes),
            "gpus": gpus,
            "clusters": args.clusters,
            "seed": args.seed,
            "results": rows,
        }
        if args.seeds > 1:
            doc["seeds"] = seeds
            doc["per_seed"] = [as_dict(r) for r in results]
        print(json.dumps(doc))
    else:
        _print_fill_table(rows, len(nodes), gpus, args.clusters, seeds)
    if args.plot:
        from broker.sim.plot import plot_fill

        try:
            plot_fill(rows, args.plot)
        except OSError as exc:
            raise UsageError(f"--plot {args.plot}: {exc.strerror}") from None
        if not args.json:
            print(f"plot written to {args.plot}")
    return 0


def _print_fill_table(
    rows: list[dict[str, object]], nodes: int, gpus: int, clusters: int, seeds: list[int]
) -> None:
    loads = sorted({int(str(r["load_pct"])) for r in rows})
    policies = list(dict.fromkeys(str(r["policy"]) for r in rows))
    by = {(str(r["policy"]), int(str(r["load_pct"]))): r for r in rows}
    print(
        f"fill protocol: {nodes} nodes, {gpus} GPUs, {clusters} cluster(s), "
        f"seeds {seeds[0]}..{seeds[-1]}"
    )
    print("GPU allocation (%) at arrived load:")
    header = (
        f"{'policy':<10}"
        + "".join(f"{str(load) + '%':>9}" for load in loads)
        + f"{'placed':>9}{'failed':>9}"
    )
    print(header)
    for p in policies:
        last = by[(p, loads[-1])]
        cells = "".join(f"{by[(p, load)]['gpu_alloc_pct']:>9.2f}" for load in loads)
        print(f"{p:<10}{cells}{last['placed']:>9}{last['failed']:>9}")


if __name__ == "__main__":
    raise SystemExit(main())
