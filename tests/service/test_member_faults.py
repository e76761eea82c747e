"""Member cluster faults through a TCP proxy in front of the mock API server (kmock, real
HTTP, the real client): connection refused, a black hole (accepts, never answers), slow
answers, and every connection reset mid-watch. Expected: stale after staleAfterSeconds (on
the service's injected clock), no placements there meanwhile, recovery with a relist, and no
duplicate launch of the job that waited."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import kmock
import kmock as kmocklib
import pytest
from builders import Clock, until
from kmock_namespaces import NamespacedEmulator
from tcp_proxy import TcpProxy
from test_kube_service import CONFIG, NS, PODS, kubeconfig_doc, manifest, node_obj

from broker.config import parse_config
from broker.service.facade import Service

NODES = kmock.resource("", "v1", "nodes")
STALE_AFTER = 30.0

pytestmark = pytest.mark.kmock(cls=NamespacedEmulator)


@pytest.fixture
def k8s(kmock: kmocklib.KubernetesEmulator) -> kmocklib.KubernetesEmulator:
    kmock.resources["v1/pods"] = kmocklib.ResourceInfo(namespaced=True)
    kmock.resources["v1/nodes"] = kmocklib.ResourceInfo(namespaced=False)
    # Served, as by any API server: a member back from staleness is garbage-collected
    # (pods and rendezvous Services) before it is trusted again.
    kmock.resources["v1/services"] = kmocklib.ResourceInfo(namespaced=True)
    kmock.objects[NODES, None, "n1"] = node_obj("n1")
    return kmock


def east(service: Service) -> dict[str, Any]:
    [row] = service.clusters()
    return row


def our_pods(k8s: kmocklib.KubernetesEmulator, job: str) -> list[str]:
    return sorted(
        name
        for (res, ns, name), obj in list(k8s.objects.items())
        if res == PODS and ns == NS and not obj.deleted
        and obj.raw["metadata"].get("labels", {}).get("fedbroker.io/job") == job
    )  # fmt: skip


def watch_requests(k8s: kmock.KubernetesEmulator) -> int:
    return sum(1 for request in k8s if request.params.get("watch") == "true")


@pytest.mark.parametrize("fault", ["refused", "black hole", "reset mid-watch", "slow"])
async def test_member_fault_stale_no_placements_relist_no_duplicates(
    k8s: kmocklib.KubernetesEmulator, tmp_path: Path, fault: str
) -> None:
    port = int(str(k8s.url).rstrip("/").rsplit(":", 1)[1])
    proxy = TcpProxy(port, delay=0.05)
    await proxy.start()
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(json.dumps(kubeconfig_doc(proxy.url)))
    kube = (
        "launchMode: pin, podPollSeconds: 0.02, watchInactivitySeconds: 1, requestTimeoutSeconds: 2"
    )
    text = CONFIG.format(
        db=tmp_path / "jobs.db", kubeconfig=kubeconfig, kube=kube,
        scheduler=f"staleAfterSeconds: {STALE_AFTER}",
    )  # fmt: skip
    clock = Clock(1_000.0)
    service = Service(parse_config(text, "test config"), clock=clock)
    await service.start()
    try:
        await until(lambda: bool(east(service)["connected"]))
        lists = east(service)["relists"]
        down = fault in ("refused", "black hole")
        match fault:
            case "refused":
                await proxy.refuse()
            case "black hole":
                proxy.mode = "blackhole"
                proxy.reset()
            case "reset mid-watch":
                # Mid-watch: once both watches (nodes, pods) are open, not while the first
                # list's connection is all there is (a reset then breaks nothing).
                await until(lambda: watch_requests(k8s) >= 2)
                proxy.reset()
            case "slow":
                proxy.mode = "slow"
        await service.submit("team-a", manifest("train"))
        if down:
            await until(lambda: not east(service)["connected"], timeout=20)
            clock.now += STALE_AFTER - 1
            await service.schedule_once()
            assert not east(service)["stale"]  # down, but not for staleAfterSeconds yet
            assert (await service.get("team-a", "train")).state == "Placed"
            await service.cancel("team-a", "train")
            await service.submit("team-a", manifest("again"))
            clock.now += 2
            await service.schedule_once()
            assert east(service)["stale"]
            assert (await service.get("team-a", "again")).state == "Queued"  # not there
            explained = await service.explain("team-a", "again")
            assert [r["code"] for r in explained["clusters"][0]["reasons"]] == ["ClusterStale"]
            # Back: trusted again only after a relist.
            if fault == "refused":
                await proxy.start()
            proxy.mode = "pass"
            await until(lambda: east(service)["relists"] > lists, timeout=30)
            await service.schedule_once()
            assert not east(service)["stale"]
            job = "again"
        else:
            # A reset or a slow network: the watch reconnects (relisting after a reset);
            # the cluster never goes stale and the job is placed as usual.
            if fault == "reset mid-watch":
                await until(lambda: east(service)["relists"] > lists, timeout=20)
            await service.schedule_once()
            assert not east(service)["stale"]
            job = "train"
        assert (await service.get("team-a", job)).state == "Placed"
        await until(lambda: bool(our_pods(k8s, job)), timeout=20)
        for _ in range(5):  # more cycles: the launch is never repeated
            await service.schedule_once()
        assert our_pods(k8s, job) == [f"{job}-worker-0"]
        assert proxy.connections > 1
    finally:
        await service.close()
        await proxy.close()
