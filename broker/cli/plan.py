"""``fedbroker inspect`` and ``fedbroker plan``: read Kubernetes member clusters once.

The clusters are read with the service's own watcher and translation code
(``ClusterWatcher.list_once``) into a Ledger; an unreachable cluster is reported stale
after a bounded timeout instead of failing the command. ``inspect`` prints that capacity
snapshot; ``plan`` asks the job's policy where a manifest would go right now (cluster and
nodes) or, per cluster, why it does not fit. Neither creates anything. Both exit 1 when no
context could be read, and ``plan`` exits 3 when the job fits nowhere now, so a script can
tell "no" from "could not ask" (docs/cli.md, "Exit codes").
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from adapters.kube.translate import GpuConfig
from adapters.kube.watch import ClusterWatcher
from broker.cli.output import add_output_options, formatted
from broker.core.ledger import Ledger
from broker.core.queue import JobQueue, Pending, QueueSpec
from broker.core.scheduler import PolicyBook
from broker.manifest import ManifestError, parse_manifest, to_job
from broker.model import MILLI_PER_GPU, CapacityEvent, Cluster, Job
from broker.ports import KubeconfigError
from broker.service.explain import plan_of

DEFAULT_TIMEOUT = 5.0
EXIT_UNREACHABLE = 1  # no context could be read: there is nothing to show or decide on
EXIT_NO_FIT = 3  # plan: the clusters were read, and the job fits none of them now


class InspectError(Exception):
    """A user error (bad kubeconfig path or context): one line, exit 2."""


def add_inspect_command(sub: Any) -> None:
    p = sub.add_parser("inspect", help="read Kubernetes member clusters once, print capacity")
    p.add_argument("--kubeconfig", type=Path, required=True, metavar="FILE",
                   help="the kubeconfig holding the member clusters")  # fmt: skip
    p.add_argument(
        "--context",
        action="append",
        default=[],
        metavar="NAME",
        help="a context to read (repeatable; default: every context)",
    )
    p.add_argument("--gpu-type-label", default=None, help="node label with the GPU type")
    p.add_argument(
        "--timeout",
        type=float,
        default=DEFAULT_TIMEOUT,
        help="seconds before an unreachable cluster is reported stale",
    )
    add_output_options(p)


async def read_clusters(
    kubeconfig: Path,
    contexts: Sequence[str] = (),
    *,
    gpu: GpuConfig | None = None,
    timeout: float = DEFAULT_TIMEOUT,
) -> Ledger:
    """One Ledger holding every context's cluster as listed now (stale if unreachable)."""
    # Imported here: every fedbroker command imports this module, and only reading
    # clusters needs kubernetes (the heaviest import of a start).
    from adapters.kubeapi.kubeconfig import load_clients

    gpu = gpu or GpuConfig()
    try:
        clients, _ = await load_clients(kubeconfig, contexts)
    except KubeconfigError as exc:
        raise InspectError(str(exc)) from None
    ledger = Ledger()
    try:
        watchers = {
            name: ClusterWatcher(name, client, lambda _: None, gpu)
            for name, client in clients.items()
        }

        async def read(w: ClusterWatcher) -> list[CapacityEvent] | None:
            try:
                async with asyncio.timeout(timeout):
                    return await w.list_once()
            except Exception:  # unreachable or broken: stale, not a crash
                return None

        results = await asyncio.gather(*(read(w) for w in watchers.values()))
    finally:
        for client in clients.values():
            await client.close()  # type: ignore[no-untyped-call]
    for name, events in zip(watchers, results, strict=True):
        ledger.add_cluster(Cluster(name))
        if events is None:
            ledger.set_stale(name, True)
        for ev in events or ():
            ledger.apply(ev)
    return ledger


def snapshot_document(ledger: Ledger) -> dict[str, Any]:
    clusters = []
    for name, view in ledger.snapshot().clusters.items():
        nodes = [
            {
                "name": state.name,
                "gpu_type": state.node.gpu_type,
                "gpus_allocatable": state.node.allocatable.gpus,
                "gpus_used": sum(1 for free in state.gpu_free if free < MILLI_PER_GPU),
                "schedulable": state.node.schedulable,
            }
            for state in sorted(view.nodes.values(), key=lambda s: s.name)
        ]
        clusters.append({"name": name, "stale": view.stale, "nodes": nodes})
    return {"clusters": clusters}


def add_plan_command(sub: Any) -> None:
    p = sub.add_parser("plan", help="where a manifest would go now on Kubernetes clusters")
    p.add_argument("-f", "--file", type=Path, required=True, help="FederatedJob YAML or JSON")
    p.add_argument("--kubeconfig", type=Path, required=True, metavar="FILE",
                   help="the kubeconfig holding the member clusters")  # fmt: skip
    p.add_argument("--context", action="append", default=[], metavar="NAME",
                   help="a context to read (repeatable; default: every context)")  # fmt: skip
    p.add_argument("--gpu-type-label", default=None, help="node label with the GPU type")
    p.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT,
                   help="seconds before an unreachable cluster is reported stale")  # fmt: skip
    add_output_options(p)


def plan_document(job: Job, ledger: Ledger) -> dict[str, Any]:
    """The decision on the current snapshot, as printed by ``plan --json``: the policy the
    scheduler would use (the job's own, or its queue's for ``auto``), via the service's
    ``plan_of`` (the same as ``POST /v1/plan``)."""
    policy = PolicyBook(JobQueue([QueueSpec(job.queue)])).for_job(Pending(job, 0, 0.0))
    plan = plan_of(job, policy, ledger.snapshot())
    placement = plan.placement
    if placement is not None:
        return {
            "job": job.name,
            "fits": True,
            "cluster": placement.cluster,
            "pods": [{"pod": p.pod, "node": p.node, "gpus": list(p.gpus)} for p in placement.pods],
            "clusters": [],
        }
    return {
        "job": job.name,
        "fits": False,
        "cluster": None,
        "pods": [],
        "clusters": [
            {"cluster": row.cluster, "largestFit": row.largest_fit, "reasons": row.reasons_json()}
            for row in plan.clusters
        ],
    }


def run_plan(args: argparse.Namespace) -> int:
    try:
        body = args.file.read_bytes()
    except OSError as exc:
        raise InspectError(f"{args.file}: {exc.strerror}") from None
    kind = "application/json" if args.file.suffix == ".json" else "application/yaml"
    try:
        manifest = parse_manifest(body, kind)
    except ManifestError as exc:
        raise InspectError(f"{args.file}: {exc}") from None
    namespace = manifest.metadata.namespace or "default"
    job = to_job(manifest, namespace, "default")
    gpu = GpuConfig(type_label=args.gpu_type_label) if args.gpu_type_label else GpuConfig()
    ledger = asyncio.run(
        read_clusters(args.kubeconfig, args.context, gpu=gpu, timeout=args.timeout)
    )
    doc = plan_document(job, ledger)
    if args.output in ("json", "yaml"):
        print(formatted(doc, args.output, str))
    elif doc["fits"]:
        print(f"{job.name}: would be placed on {doc['cluster']}")
        for pod in doc["pods"]:
            print(f"  {pod['pod']:<40} -> {pod['node']}  GPUs {pod['gpus']}")
    else:
        print(f"{job.name}: does not fit anywhere now")
        for cluster in doc["clusters"]:
            why = "; ".join(r["message"] for r in cluster["reasons"]) or "-"
            print(f"  {cluster['cluster']}: largest fit {cluster['largestFit']} pods; {why}")
    if _none_read(ledger):
        return EXIT_UNREACHABLE
    return 0 if doc["fits"] else EXIT_NO_FIT


def _none_read(ledger: Ledger) -> bool:
    """Whether no context could be read (said on stderr in one line when so)."""
    clusters = ledger.snapshot().clusters
    if not clusters or not all(view.stale for view in clusters.values()):
        return False
    names = ", ".join(clusters)
    sys.stderr.write(
        f"fedbroker: error: no context could be read ({names}): unreachable, or no answer "
        "within --timeout\n"
    )
    return True


def run_inspect(args: argparse.Namespace) -> int:
    gpu = GpuConfig(type_label=args.gpu_type_label) if args.gpu_type_label else GpuConfig()
    ledger = asyncio.run(
        read_clusters(args.kubeconfig, args.context, gpu=gpu, timeout=args.timeout)
    )
    _print_inspected(snapshot_document(ledger), args.output)
    return EXIT_UNREACHABLE if _none_read(ledger) else 0


def _print_inspected(doc: dict[str, Any], output: str) -> None:
    if output in ("json", "yaml"):
        print(formatted(doc, output, str))
        return
    for cluster in doc["clusters"]:
        state = "STALE (unreachable)" if cluster["stale"] else f"{len(cluster['nodes'])} nodes"
        print(f"cluster {cluster['name']}: {state}")
        if cluster["nodes"]:
            print(f"  {'node':<30}{'gpu type':<28}{'gpus':>6}{'used':>6}  schedulable")
        for n in cluster["nodes"]:
            print(
                f"  {n['name']:<30}{n['gpu_type'] or '-':<28}{n['gpus_allocatable']:>6}"
                f"{n['gpus_used']:>6}  {'yes' if n['schedulable'] else 'no'}"
            )
