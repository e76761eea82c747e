"""The demo's workload generator: a seeded mix of jobs submitted through the real HTTP API.

It submits gangs (queue ``training``, tenant team-a), now and then a JobSet or PyTorchJob,
and small whole or shared-GPU jobs (queue ``inference``, tenant team-b), as a supervised
task of ``fedbroker demo``. It is background load, so it leaves room for the jobs a person
submits next to it: it pauses while more than ``MAX_PENDING`` jobs wait, and its own jobs
that may burst never hold more of the burst pools' nodes than the pools' maximum less
``BURST_HEADROOM_NODES`` (a gang of it over that budget is submitted without ``allowBurst``,
or, when only a pool has its GPU type, not at all). A person's job that fits nowhere
on-prem therefore always finds the nodes it needs in the pool.
"""

from __future__ import annotations

import asyncio
import logging
import random
import secrets
from collections.abc import Mapping
from typing import Any

import aiohttp

from broker.cli.runtime import TaskFactory
from broker.manifest.workloads import jobset, pytorchjob
from broker.service.facade import Service

log = logging.getLogger("broker.demo")

MAX_PENDING = 40  # the generator pauses while more jobs than this wait in the queues
# Pool nodes the generator never takes: the README's example gang (4 pods of 8 GPUs, one
# pool node each) bursts into them when the on-prem clusters are full.
BURST_HEADROOM_NODES = 4


def draw_manifest(rng: random.Random, run_id: str, seq: int) -> tuple[str, dict[str, Any]]:
    """(tenant, manifest): a gang for team-a's training queue (one in four; allowed to burst,
    and one in seven of them asks for A100s, which only the cloud pool has; one in twenty
    of all is a JobSet or PyTorchJob: ``workload_manifest``), else a small job for team-b's
    inference queue, on one whole GPU or a quarter or half of one."""
    if rng.random() < 0.05:  # now and then a JobSet or a PyTorchJob, as teams run them
        return "team-a", workload_manifest(rng, f"wl-{run_id}-{seq:05d}")
    placement: dict[str, Any] = {}
    if rng.random() < 0.25:
        pods, gpus = rng.randint(2, 8), rng.choice((4, 8))
        resources: dict[str, Any] = {
            "nvidia.com/gpu": gpus, "cpu": str(8 * gpus), "memory": f"{32 * gpus}Gi"
        }  # fmt: skip
        tenant, queue, policy = "team-a", "training", "gang"
        gang = {"minMember": pods, "scheduleTimeoutSeconds": 600}
        placement = {"allowBurst": True}
        if rng.random() < 0.15:  # A100 only: no on-prem cluster has them, so it bursts
            placement["gpuTypes"] = ["A100"]
            pods, resources = rng.randint(2, 4), {"nvidia.com/gpu": 8, "cpu": "64",
                                                  "memory": "512Gi"}  # fmt: skip
            gang["minMember"] = pods
    else:
        pods, gang = 1, {}
        if rng.random() < 0.5:
            resources = {"nvidia.com/gpu": 1, "cpu": "4", "memory": "16Gi"}
        else:
            resources = {"fedbroker.io/gpu-milli": rng.choice((250, 500)), "cpu": "2",
                         "memory": "8Gi"}  # fmt: skip
        tenant, queue, policy = "team-b", "inference", "binpack"
    spec: dict[str, Any] = {
        "queue": queue,
        "policy": policy,
        "podSets": [{"name": "worker", "count": pods, "resources": resources}],
    }
    if gang:
        spec["gang"] = gang
    if placement:
        spec["placement"] = placement
    name = f"{'gang' if gang else 'small'}-{run_id}-{seq:05d}"
    manifest = {"apiVersion": "fedbroker.io/v1alpha1", "kind": "FederatedJob",
                "metadata": {"name": name}, "spec": spec}  # fmt: skip
    return tenant, manifest


def workload_manifest(rng: random.Random, name: str) -> dict[str, Any]:
    """A small JobSet (2 to 4 one-GPU workers) or PyTorchJob (a master and 1 to 3 workers
    of one GPU each) for team-a's training queue, embedded as ``spec.workload``."""
    limits = {"nvidia.com/gpu": 1, "cpu": "4", "memory": "16Gi"}
    container = {"name": "train", "image": "nvcr.io/nvidia/pytorch:24.05-py3",
                 "resources": {"limits": limits}}  # fmt: skip
    pod = {"spec": {"restartPolicy": "Never", "containers": [container]}}
    workers = rng.randint(1, 3)
    if rng.random() < 0.5:
        job_template = {"spec": {"parallelism": workers + 1, "template": pod}}
        replicated = [{"name": "workers", "template": job_template}]
        obj: dict[str, Any] = {"apiVersion": jobset.API_VERSION, "kind": jobset.KIND,
                               "spec": {"replicatedJobs": replicated}}  # fmt: skip
    else:
        # The training operator wants its container named "pytorch".
        pod = {"spec": {**pod["spec"], "containers": [{**container, "name": "pytorch"}]}}
        replicas = {"Master": {"replicas": 1, "template": pod},
                    "Worker": {"replicas": workers, "template": pod}}  # fmt: skip
        obj = {"apiVersion": pytorchjob.API_VERSION, "kind": pytorchjob.KIND,
               "spec": {"pytorchReplicaSpecs": replicas}}  # fmt: skip
    spec = {"queue": "training", "policy": "gang", "workload": obj,
            "placement": {"allowBurst": True}}  # fmt: skip
    return {"apiVersion": "fedbroker.io/v1alpha1", "kind": "FederatedJob",
            "metadata": {"name": name}, "spec": spec}  # fmt: skip


class BurstBudget:
    """How many pool nodes the generator may still ask for: the pools' maximum less the
    headroom, less what the pools hold or bring up now (whoever for), less a node per pod
    of the generator's own jobs that may burst and still wait (a pod never needs more than
    one pool node). A job of it placed on-prem no longer counts; one placed in a pool is
    counted by the pool."""

    def __init__(self, nodes: int) -> None:
        self.nodes = nodes  # the pools' maximum less the headroom
        self.waiting: dict[str, int] = {}  # job key -> pods

    def adopt(self, service: Service) -> None:
        """Count the jobs that may burst already waiting (a restart's), whoever's."""
        for pending in service.queue.pending():
            if pending.job.allow_burst:
                self.waiting[pending.job.key] = pending.job.total_pods

    def left(self, service: Service) -> int:
        for key in [k for k in self.waiting if service.queue.get(k) is None]:
            del self.waiting[key]  # placed, ended or refused
        pools = service.burst(None)["pools"]
        held = sum(int(p["ready"]) + int(p["coming"]) for p in pools)
        return self.nodes - held - sum(self.waiting.values())


def burst_nodes_for_workload(service: Service) -> int:
    """The budget: every burst pool's maximum, less the headroom kept for people's jobs."""
    nodes = sum(p.max_nodes or 0 for p in service.config.burst_pools)
    return max(0, nodes - BURST_HEADROOM_NODES)


def pods_of(manifest: Mapping[str, Any]) -> int:
    """How many pods a drawn manifest runs (its pod sets, or its embedded workload's)."""
    spec = manifest["spec"]
    if "podSets" in spec:
        return sum(int(ps["count"]) for ps in spec["podSets"])
    workload = spec["workload"]["spec"]
    if "replicatedJobs" in workload:
        return sum(int(r["template"]["spec"]["parallelism"]) for r in workload["replicatedJobs"])
    return sum(int(r["replicas"]) for r in workload["pytorchReplicaSpecs"].values())


def within_budget(
    tenant: str, manifest: dict[str, Any], budget: BurstBudget, left: int
) -> dict[str, Any] | None:
    """The manifest as the budget lets it go, ``left`` pool nodes being left in it:
    unchanged (and counted) when it may not burst or its pods fit; else without
    ``allowBurst``, or None when only a pool has the GPU type it asks for."""
    placement = manifest["spec"].get("placement", {})
    if not placement.get("allowBurst"):
        return manifest
    pods = pods_of(manifest)
    if pods <= left:
        budget.waiting[f"{tenant}/{manifest['metadata']['name']}"] = pods
        return manifest
    if placement.get("gpuTypes") == ["A100"]:
        return None
    placement = {k: v for k, v in placement.items() if k != "allowBurst"}
    spec = {k: v for k, v in manifest["spec"].items() if k != "placement"}
    if placement:
        spec["placement"] = placement
    return {**manifest, "spec": spec}


def workload(tokens: Mapping[str, str], seed: int, per_second: float = 2.0) -> TaskFactory:
    """The generator as a supervisor task: submits through the HTTP API until cancelled."""

    async def run(service: Service, url: str) -> None:
        rng = random.Random(seed)
        run_id = secrets.token_hex(3)  # a restart with the same seed submits new names
        headers = {t: {"Authorization": f"Bearer {tok}"} for t, tok in tokens.items()}
        timeout = aiohttp.ClientTimeout(total=10)
        budget = BurstBudget(burst_nodes_for_workload(service))
        budget.adopt(service)
        sent = 0
        async with aiohttp.ClientSession(base_url=url, timeout=timeout) as session:
            while True:
                await asyncio.sleep(rng.expovariate(per_second))
                if _pending(service) > MAX_PENDING:
                    continue
                tenant, drawn = draw_manifest(rng, run_id, sent)
                sent += 1
                body = within_budget(tenant, drawn, budget, budget.left(service))
                if body is not None:
                    await _submit(session, body, headers[tenant])

    return run


async def _submit(
    session: aiohttp.ClientSession, body: Mapping[str, Any], headers: Mapping[str, str]
) -> None:
    try:
        async with session.post("/v1/jobs", json=body, headers=headers) as r:
            if r.status >= 400:
                log.warning("workload: submit answered %s: %s", r.status, await r.text())
    except (aiohttp.ClientError, TimeoutError) as exc:
        log.warning("workload: submit failed: %s", exc)


def _pending(service: Service) -> int:
    return sum(q.pending for q in service.view.queues())


__all__ = [
    "BURST_HEADROOM_NODES", "BurstBudget", "draw_manifest", "pods_of", "within_budget",
    "workload", "workload_manifest",
]  # fmt: skip
