"""The training runtimes cache (adapters/kube/runtimes.py) against kmock: real HTTP, the
real kubernetes.aio client. A member that does not serve the trainer CRDs has no runtimes
and is readable; a served one is listed, then followed (created, deleted) by its watch; a
TrainingRuntime is found in its own namespace only; a member that refuses the list has
none, and says why."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import kmock as kmocklib
import pytest
from builders import until
from kubernetes.aio.client import ApiClient, Configuration, CustomObjectsApi

from adapters.kube.runtimes import RuntimeCache
from adapters.kube.watch import Backoff
from broker.manifest.workloads.trainjob import READS

G, V = "trainer.kubeflow.org", "v1alpha1"
CTRS = kmocklib.resource(G, V, "clustertrainingruntimes")
TRS = kmocklib.resource(G, V, "trainingruntimes")
CTR, TR = "ClusterTrainingRuntime", "TrainingRuntime"


def runtime(kind: str, name: str, namespace: str | None = None) -> dict[str, Any]:
    meta = {"name": name, **({"namespace": namespace} if namespace else {})}
    return {"apiVersion": f"{G}/{V}", "kind": kind, "metadata": meta,
            "spec": {"template": {"spec": {"replicatedJobs": []}}}}  # fmt: skip


@pytest.fixture
async def api(kmock: kmocklib.KubernetesEmulator) -> AsyncIterator[ApiClient]:
    client = ApiClient(Configuration(host=str(kmock.url).rstrip("/")))
    yield client
    await client.close()  # type: ignore[no-untyped-call]


async def following(cache: RuntimeCache) -> asyncio.Task[None]:
    task = asyncio.create_task(cache.run())
    await until(lambda: cache.lists >= 2)
    return task


async def test_a_member_without_the_trainer_crds_has_no_runtimes(api: ApiClient) -> None:
    waits: list[float] = []

    async def sleep(seconds: float) -> None:
        waits.append(seconds)
        await asyncio.Event().wait()  # listed again only after the wait: never here

    cache = RuntimeCache("east", api, READS, sleep=sleep, backoff=Backoff(cap=7.0))
    task = await following(cache)
    try:
        assert cache.problem(CTR) is None and cache.problem(TR) is None
        assert cache.lookup(CTR, "", "torch") is None
        await until(lambda: waits == [7.0, 7.0])  # not served: listed again after the cap
    finally:
        task.cancel()


async def test_runtimes_are_listed_then_followed(
    kmock: kmocklib.KubernetesEmulator, api: ApiClient
) -> None:
    kmock.resources[f"{G}/{V}/clustertrainingruntimes"] = kmocklib.ResourceInfo(namespaced=False)
    kmock.resources[f"{G}/{V}/trainingruntimes"] = kmocklib.ResourceInfo(namespaced=True)
    kmock.objects[CTRS, None, "torch"] = runtime(CTR, "torch")
    kmock.objects[TRS, "team-a", "mine"] = runtime(TR, "mine", "team-a")
    cache = RuntimeCache("east", api, READS)
    task = await following(cache)
    try:
        assert cache.lookup(CTR, "team-a", "torch") is not None  # cluster-scoped: anywhere
        assert cache.lookup(TR, "team-a", "mine") is not None
        assert cache.lookup(TR, "team-b", "mine") is None  # another tenant's namespace
        custom = CustomObjectsApi(api)
        await custom.create_cluster_custom_object(G, V, "clustertrainingruntimes",
                                                  runtime(CTR, "jax"))  # fmt: skip
        await until(lambda: cache.lookup(CTR, "", "jax") is not None)
        await custom.delete_cluster_custom_object(G, V, "clustertrainingruntimes", "torch")
        await until(lambda: cache.lookup(CTR, "", "torch") is None)
    finally:
        task.cancel()


async def test_a_member_refusing_the_list_has_none_and_says_why(
    kmock: kmocklib.KubernetesEmulator, api: ApiClient
) -> None:
    kmock["list", CTRS] << 403
    kmock.resources[f"{G}/{V}/trainingruntimes"] = kmocklib.ResourceInfo(namespaced=True)

    async def sleep(seconds: float) -> None:
        await asyncio.Event().wait()

    cache = RuntimeCache("east", api, READS, sleep=sleep)
    task = asyncio.create_task(cache.run())
    try:
        await until(lambda: "HTTP 403" in (cache.problem(CTR) or ""))
        assert cache.lookup(CTR, "", "torch") is None
        assert cache.problem(CTR) == (
            "cluster east: ClusterTrainingRuntime list: HTTP 403 (its "
            "ClusterTrainingRuntimes cannot be read)"
        )
    finally:
        task.cancel()
