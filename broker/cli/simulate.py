"""``fedbroker simulate``: replay real traces (or a generated openb-like workload) through
the placement core, by the fill protocol or the replay protocol, and print or dump the
results.

The flags, their defaults and the fill table are this module's; the protocols themselves
live in broker.sim (fill, replay, plot).
"""

from __future__ import annotations

import argparse
import json
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

from adapters.simulated import OPENB_MIX, generate_nodes, generated_pod_mix
from broker.cli.args import (
    UsageError,
    fraction,
    loads,
    plot_file,
    policy,
    positive,
    positive_float,
)
from broker.cli.output import add_output_options, yaml_from_json
from broker.model import Node
from broker.sim.traces import TracePod, read_nodes, read_openb_pods
from policies import POLICY_NAMES

_BURST_HELP = (
    "replay: no burst pool (by default one simulated cloud pool grows a third, empty cluster "
    "for gangs that waited burstAfterSeconds=120: nodes of 8 x A100, 96 cores, 1152 GiB like "
    "AWS p4d.24xlarge, 32.77 USD/h on demand in us-east-1; scaleDownAfterSeconds=600, "
    "provisioning timeout 900 s)"
)


def add_simulate_command(sub: Any) -> None:
    cmd = sub.add_parser("simulate", help="replay real traces through the placement core")
    _add_inputs(cmd)
    _add_fill_options(cmd)
    _add_replay_options(cmd)
    _add_burst_options(cmd)
    _add_topology_options(cmd)


def _add_inputs(cmd: argparse.ArgumentParser) -> None:
    cmd.add_argument("--protocol", choices=("fill", "replay"), default="fill",
                     help="fill: place pods until the federation is full; replay: jobs "
                     "arrive and end over time (waits, utilization)")  # fmt: skip
    cmd.add_argument(
        "--nodes", type=Path, help="node list CSV (default: a generated openb-mix federation)"
    )
    cmd.add_argument(
        "--pods", type=Path, help="pod list CSV (default: a generated openb-like workload)"
    )
    cmd.add_argument(
        "--policy",
        type=policy,
        action="append",
        help=f"policy to run (repeatable): {', '.join(POLICY_NAMES)}; kube-default is "
        "kube-scheduler's default profile, pod by pod (in the replay a gang's pods are "
        "bound as they fit and hold their GPUs until the last one is: the baseline)",
    )
    cmd.add_argument(
        "--clusters",
        type=positive("--clusters"),
        default=None,
        help="split nodes round-robin into this many on-prem clusters (default: 1 for fill, "
        "2 for replay)",
    )
    cmd.add_argument(
        "--seed",
        type=int,
        default=None,
        help="random seed of the generated workload (default: 0 for fill, 1 for replay)",
    )
    cmd.add_argument(
        "--seeds", type=positive("--seeds"), default=1, help="run seeds S..S+N-1 and average"
    )


def _add_fill_options(cmd: argparse.ArgumentParser) -> None:
    cmd.add_argument("--loads", type=loads, default=[80, 90, 100, 110, 130],
                     help="fill: the loads reported, percent of GPU capacity requested "
                     "(default: 80,90,100,110,130)")  # fmt: skip
    add_output_options(cmd)
    cmd.add_argument("--dump-placements", type=Path, metavar="FILE",
                     help="write every placement to FILE (CSV)")  # fmt: skip
    cmd.add_argument("--plot", type=plot_file, metavar="FILE", help="write a PNG plot")
    cmd.add_argument(
        "--workers", type=positive("--workers"), default=1, help="fill: runs in parallel"
    )


# Replay flags checked by a positive type: (flag, its type, default, help), in help order.
_REPLAY_FLAGS: tuple[tuple[str, Callable[[str], Callable[[str], Any]], object, str], ...] = (
    ("--jobs", positive, 2000, "replay: gang jobs to generate"),
    ("--time-scale", positive_float, None,
     "replay: trace seconds per simulated second (default 60 with --pods; 10 for the "
     "generated workload, whose day becomes 2.4 simulated hours)"),
    ("--gang-load", positive_float, None,
     "replay: GPU load the generated jobs offer over the trace span, %% of all GPUs "
     "(default 90 with --pods; 130 for the generated workload: a federation short of "
     "GPUs, where bursting matters)"),
    ("--preemptible", fraction, 0.0,
     "replay: share of the generated one-pod jobs sent to the low-priority reclaimable "
     "queue preemptible (evicted for the default queue's jobs; kube-default ignores "
     "queues)"),
    ("--cycle-seconds", positive_float, 10.0,
     "replay: simulated seconds between scheduling cycles (also run on every event)"),
    ("--scan-misses", positive, 32,
     "replay: decisions per scheduling cycle (the scheduler's maxJobsPerCycle; jobs of a "
     "shape known not to fit are not counted)"),
)  # fmt: skip
_BURST_FLAGS: tuple[tuple[str, Callable[[str], Callable[[str], Any]], object, str], ...] = (
    ("--burst-max-nodes", positive, 32, "replay: the burst pool's maximum size in nodes"),
    ("--burst-provision-seconds", positive_float, 300.0,
     "replay: simulated seconds from a scale-up until a new node is Ready"),
    ("--burst-failure-rate", fraction, 0.0,
     "replay: share of new burst nodes that never come up (seeded)"),
)  # fmt: skip


def _add_replay_options(cmd: argparse.ArgumentParser) -> None:
    for flag, kind, default, text in _REPLAY_FLAGS:
        cmd.add_argument(flag, type=kind(flag), default=default, help=text)


def _add_burst_options(cmd: argparse.ArgumentParser) -> None:
    cmd.add_argument("--no-burst", action="store_true", help=_BURST_HELP)
    for flag, kind, default, text in _BURST_FLAGS:
        cmd.add_argument(flag, type=kind(flag), default=default, help=text)


def _add_topology_options(cmd: argparse.ArgumentParser) -> None:
    cmd.add_argument("--racks-of", type=positive("--racks-of"), metavar="N",
                     help="replay: lay racks of N alike nodes over each cluster's "
                     "nodes (label cloud.provider.com/topology-rack, a level)")  # fmt: skip
    cmd.add_argument("--blocks-of", type=positive("--blocks-of"), metavar="M",
                     help="replay, with --racks-of: blocks of M racks "
                     "(label cloud.provider.com/topology-block)")  # fmt: skip
    cmd.add_argument("--topology-request", choices=("none", "required", "preferred"),
                     default="none", help="replay, with --racks-of: what every gang (more "
                     "than one pod) asks for at rack level (default none)")  # fmt: skip


def load_inputs(
    nodes_path: Path | None, pods_path: Path | None, seed: int
) -> tuple[list[Node], list[TracePod]]:
    """Trace files when given, else the generated openb-mix federation and workload."""
    nodes = read_nodes(nodes_path) if nodes_path else generate_nodes(OPENB_MIX, "openb-node")
    if pods_path:
        pods = read_openb_pods(pods_path)
    else:
        rng = random.Random(seed)
        pods = [
            TracePod(f"gen-pod-{i:05d}", generated_pod_mix(rng), frozenset()) for i in range(8000)
        ]
    return nodes, pods


def run_simulate(args: argparse.Namespace) -> int:
    args.json = args.output in ("json", "yaml")  # the simulator prints JSON itself
    with yaml_from_json(args.output):
        return _simulate(args)


def _simulate(args: argparse.Namespace) -> int:
    policies = args.policy or ["binpack", "fgd"]
    _fill_in_defaults(args)
    nodes, pods = load_inputs(args.nodes, args.pods, args.seed)
    if args.protocol == "replay":
        from broker.sim.replay import run_replay

        return run_replay(args, nodes, pods, policies)
    return _run_fill(args, nodes, pods, policies)


def _fill_in_defaults(args: argparse.Namespace) -> None:
    """The defaults that depend on the protocol, or on whether the workload is generated."""
    replay = args.protocol == "replay"
    topology = args.racks_of is not None
    if topology and not replay:
        raise UsageError("--racks-of: only with --protocol replay")
    if not topology and (args.blocks_of is not None or args.topology_request != "none"):
        flag = "--blocks-of" if args.blocks_of is not None else "--topology-request"
        raise UsageError(f"{flag}: needs --racks-of")
    if args.clusters is None:
        args.clusters = 2 if replay else 1
    if args.seed is None:
        args.seed = 1 if replay else 0
    generated = args.pods is None
    if args.time_scale is None:
        args.time_scale = 10.0 if generated else 60.0
    if args.gang_load is None:
        args.gang_load = 130.0 if generated else 90.0


def _run_fill(
    args: argparse.Namespace, nodes: list[Node], pods: list[TracePod], policies: list[str]
) -> int:
    from broker.sim.fill import as_dict, fill, mean_by_policy_and_load

    # The protocol tunes the list by GPU request against the nodes' GPUs: without both it
    # has nothing to tune (and would never stop growing the list).
    if not any(n.allocatable.gpus for n in nodes):
        raise UsageError(f"--nodes {args.nodes}: no node has a GPU; the fill protocol needs some")
    if not any(p.resources.gpu_request_milli for p in pods):
        raise UsageError(f"--pods {args.pods}: no pod asks for a GPU; the fill protocol needs some")
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
        _plot(rows, args.plot, quiet=args.json)
    return 0


def _plot(rows: list[dict[str, object]], path: Path, *, quiet: bool) -> None:
    from broker.sim.plot import plot_fill

    try:
        plot_fill(rows, path)
    except OSError as exc:
        raise UsageError(f"--plot {path}: {exc.strerror}") from None
    if not quiet:
        print(f"plot written to {path}")


def _print_fill_table(
    rows: list[dict[str, object]], nodes: int, gpus: int, clusters: int, seeds: list[int]
) -> None:
    load_pcts = sorted({int(str(r["load_pct"])) for r in rows})
    policies = list(dict.fromkeys(str(r["policy"]) for r in rows))
    by = {(str(r["policy"]), int(str(r["load_pct"]))): r for r in rows}
    print(
        f"fill protocol: {nodes} nodes, {gpus} GPUs, {clusters} cluster(s), "
        f"seeds {seeds[0]}..{seeds[-1]}"
    )
    print("GPU allocation (%) at arrived load:")
    width = max([10, *(len(p) + 1 for p in policies)])
    header = (
        f"{'policy':<{width}}"
        + "".join(f"{str(load) + '%':>9}" for load in load_pcts)
        + f"{'placed':>9}{'failed':>9}"
    )
    print(header)
    for p in policies:
        last = by[(p, load_pcts[-1])]
        cells = "".join(f"{by[(p, load)]['gpu_alloc_pct']:>9.2f}" for load in load_pcts)
        print(f"{p:<{width}}{cells}{last['placed']:>9}{last['failed']:>9}")
