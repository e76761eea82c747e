"""A finished job's pods in a Kubernetes member (kmock, real HTTP): kept by the garbage
collection for ``retention.finishedPodsSeconds``, listed by ``fedbroker pods`` meanwhile,
then collected, and said to be."""

from __future__ import annotations

from pathlib import Path

import kmock
import pytest
from builders import Clock, until
from kmock_namespaces import NamespacedEmulator
from test_kube_service import k8s, kubelet, make_config, manifest, our_pod

from broker.config import Config
from broker.service.admission import NotFound
from broker.service.facade import Service

__all__ = ["k8s"]  # the fixture, used by name

pytestmark = pytest.mark.kmock(cls=NamespacedEmulator)


async def collect(service: Service) -> None:
    """One garbage collection, as the upkeep task runs it every garbageCollectSeconds."""
    async with service.shared.lock:
        await service.cycles.failover.collect()


async def test_a_finished_jobs_pods_stay_for_the_retention_then_go(
    k8s: kmock.KubernetesEmulator, tmp_path: Path
) -> None:
    config = make_config(
        tmp_path, str(k8s.url).rstrip("/"), "launchMode: pin, podPollSeconds: 0.02"
    )
    clock = Clock()
    service = Service(config, clock=clock)
    await service.start()
    try:
        await service.submit("team-a", manifest("job", count=2))
        await service.schedule_once()
        await until(lambda: our_pod(k8s, "job-worker-1") is not None)
        for i in range(2):
            await kubelet(k8s, f"job-worker-{i}", "Running", node="n1")
        await service.launches_done(timeout=10)
        for i in range(2):
            await kubelet(k8s, f"job-worker-{i}", "Succeeded")
        await service.runs_done(timeout=10)
        assert (await service.get("team-a", "job")).state == "Succeeded"
        clock.now += 599
        await collect(service)
        rows = await service.pods("team-a", "job")
        assert [(r.name, r.phase, r.cluster) for r in rows] == [
            ("job-worker-0", "Succeeded", "east"), ("job-worker-1", "Succeeded", "east")
        ]  # fmt: skip
        clock.now += 1
        await collect(service)
        assert our_pod(k8s, "job-worker-0") is None and our_pod(k8s, "job-worker-1") is None
        with pytest.raises(NotFound, match=r"its pods were deleted 10m after it finished"):
            await service.pods("team-a", "job")
    finally:
        await service.close()


async def test_a_restart_keeps_a_finished_jobs_pods_for_the_rest_of_the_retention(
    k8s: kmock.KubernetesEmulator, tmp_path: Path
) -> None:
    def config() -> Config:
        server = str(k8s.url).rstrip("/")
        return make_config(tmp_path, server, "launchMode: pin, podPollSeconds: 0.02")

    clock = Clock()
    service = Service(config(), clock=clock)
    await service.start()
    try:
        await service.submit("team-a", manifest("job"))
        await service.schedule_once()
        await until(lambda: our_pod(k8s, "job-worker-0") is not None)
        await kubelet(k8s, "job-worker-0", "Running", node="n1")
        await service.launches_done(timeout=10)
        await kubelet(k8s, "job-worker-0", "Succeeded")
        await service.runs_done(timeout=10)
        assert (await service.get("team-a", "job")).state == "Succeeded"
    finally:
        await service.close()

    clock.now += 300  # away for half the retention
    restarted = Service(config(), clock=clock)
    await restarted.start()  # its rebuild ends with a garbage collection
    try:
        await collect(restarted)
        assert our_pod(k8s, "job-worker-0") is not None
        rows = await restarted.pods("team-a", "job")
        assert [(r.name, r.phase) for r in rows] == [("job-worker-0", "Succeeded")]
        clock.now += 299
        await collect(restarted)
        assert our_pod(k8s, "job-worker-0") is not None
        clock.now += 1  # 600 s after it finished
        await collect(restarted)
        assert our_pod(k8s, "job-worker-0") is None
        with pytest.raises(NotFound, match=r"its pods were deleted 10m after it finished"):
            await restarted.pods("team-a", "job")
    finally:
        await restarted.close()
