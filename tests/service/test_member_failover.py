"""Failover when a member is lost (issue 14, item 5; acceptance 7): two Kubernetes members
served by two kmock emulators (real HTTP, the real client), ``east`` behind a TCP proxy that
black-holes it. A job Running on east is requeued past its queue's failoverAfterSeconds
(on the service's injected clock) and runs on west with its attempt count kept; when east
is back, its old pod is deleted before east takes a new placement, and the ledger counts
the job once."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, cast

import kmock as kmocklib
import pytest
from builders import Clock, until
from kmock_namespaces import NamespacedEmulator
from tcp_proxy import TcpProxy
from test_kube_service import NODES, NS, PODS, manifest, node_obj, used_gpus

from broker.config import parse_config
from broker.service.facade import Service

STALE_AFTER = 30.0
FAILOVER_AFTER = 60.0

CONFIG = """
store: {{url: "sqlite:///{db}"}}
scheduler: {{staleAfterSeconds: {stale}}}
clusters:
- name: east
  source:
    kube: {{kubeconfig: "{kubeconfig}", context: east, {kube}}}
- name: west
  source:
    kube: {{kubeconfig: "{kubeconfig}", context: west, {kube}}}
queues:
- {{name: training, policy: gang, failoverAfterSeconds: {after}}}
tenants:
- {{name: team-a, defaultQueue: training, token: {{value: tok-a-00000000000000000000000000}}}}
"""
KUBE = "launchMode: pin, podPollSeconds: 0.02, watchInactivitySeconds: 1, requestTimeoutSeconds: 2"

pytestmark = pytest.mark.kmock(cls=NamespacedEmulator)


def kubeconfig(servers: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "v1", "kind": "Config", "current-context": "east",
        "contexts": [{"name": n, "context": {"cluster": f"c-{n}", "user": "u"}} for n in servers],
        "clusters": [{"name": f"c-{n}", "cluster": {"server": s}} for n, s in servers.items()],
        "users": [{"name": "u", "user": {"token": "member-token-0000000000000000000000"}}],
    }  # fmt: skip


def prepare(k8s: kmocklib.KubernetesEmulator) -> None:
    k8s.resources["v1/pods"] = kmocklib.ResourceInfo(namespaced=True)
    k8s.resources["v1/nodes"] = kmocklib.ResourceInfo(namespaced=False)
    k8s.resources["v1/services"] = kmocklib.ResourceInfo(namespaced=True)


def pod(k8s: kmocklib.KubernetesEmulator, name: str) -> Any:
    for (res, ns, obj_name), obj in list(k8s.objects.items()):
        if res == PODS and ns == NS and obj_name == name and not obj.deleted:
            return obj
    return None


def row(service: Service, name: str) -> dict[str, Any]:
    return next(r for r in service.clusters() if r["cluster"] == name)


async def run_on(k8s: kmocklib.KubernetesEmulator, name: str, node: str) -> None:
    """The kubelet: the pod is bound where the broker pinned it, and runs."""
    await until(lambda: pod(k8s, name) is not None, timeout=20)
    await cast(NamespacedEmulator, k8s).patch_pod(
        NS, name, {"spec": {"nodeName": node}, "status": {"phase": "Running"}}
    )


async def test_a_lost_members_job_runs_elsewhere_and_its_old_pods_go_first(
    kmock: kmocklib.KubernetesEmulator, tmp_path: Path
) -> None:
    east = kmock
    prepare(east)
    east.objects[NODES, None, "e1"] = node_obj("e1", gpus=1)
    async with NamespacedEmulator() as west, kmocklib.Server(west):
        prepare(west)
        port = int(str(east.url).rstrip("/").rsplit(":", 1)[1])
        proxy = TcpProxy(port)
        await proxy.start()
        path = tmp_path / "kubeconfig"
        path.write_text(json.dumps(kubeconfig({"east": proxy.url, "west": str(west.url)})))
        text = CONFIG.format(
            db=tmp_path / "jobs.db", kubeconfig=path, kube=KUBE, stale=STALE_AFTER,
            after=FAILOVER_AFTER,
        )  # fmt: skip
        clock = Clock(1_000.0)
        service = Service(parse_config(text, "test config"), clock=clock)
        await service.start()
        try:
            await scenario(service, clock, proxy, east, west)
        finally:
            await service.close()
            await proxy.close()


async def scenario(service: Service, clock: Clock, proxy: TcpProxy, east: Any, west: Any) -> None:
    await until(
        lambda: bool(row(service, "east")["connected"] and row(service, "west")["connected"])
    )
    # west has no GPU node yet: the job goes to east and runs there.
    await service.submit("team-a", manifest("train"))
    await service.schedule_once()
    await run_on(east, "train-worker-0", "e1")
    await service.launches_done(timeout=10)
    assert (await service.get("team-a", "train")).state == "Running"
    attempts = (await service.get("team-a", "train")).attempts
    west.objects[NODES, None, "w1"] = node_obj("w1", gpus=1)
    await until(lambda: "w1" in service.ledger.snapshot().clusters["west"].nodes)

    # east is black-holed: down, then stale after staleAfterSeconds, then lost.
    lists = row(service, "east")["relists"]
    proxy.mode = "blackhole"
    proxy.reset()
    await until(lambda: not row(service, "east")["connected"], timeout=20)
    clock.now += STALE_AFTER + FAILOVER_AFTER - 1
    await service.schedule_once()
    assert row(service, "east")["stale"]
    assert (await service.get("team-a", "train")).state == "Running"  # not lost long enough
    clock.now += 2
    await service.schedule_once()
    record = await service.get("team-a", "train")
    assert record.state == "Placed" and record.cluster == "west"
    assert record.attempts == attempts  # kept: a failover is no failed attempt
    history = await service.store.history("team-a", "train")
    [failed_over] = [h for h in history if h.reason.startswith("FailedOver:")]
    assert failed_over.state == "Queued" and "cluster east lost" in failed_over.reason
    await run_on(west, "train-worker-0", "w1")
    await service.launches_done(timeout=10)
    assert (await service.get("team-a", "train")).state == "Running"
    assert "team-a/train" not in service.ledger.reservations()
    assert pod(east, "train-worker-0") is not None  # unreachable: still there

    # east is back: relisted, but stale until our old pod there is gone.
    await service.submit("team-a", manifest("next"))  # fits only on east now
    proxy.mode = "pass"
    await until(lambda: row(service, "east")["relists"] > lists, timeout=30)
    assert row(service, "east")["stale"]
    assert used_gpus(service, "east") == 1  # the old pod, counted as found, not as the job
    requests_before = len(list(east))
    await service.schedule_once()
    assert pod(east, "train-worker-0") is None
    assert not row(service, "east")["stale"]
    assert (await service.get("team-a", "next")).cluster == "east"
    await until(lambda: pod(east, "next-worker-0") is not None, timeout=20)
    calls = [(str(r.method).upper(), r.url.path) for r in list(east)[requests_before:]]
    deleted = next(
        i for i, (m, p) in enumerate(calls) if "DELETE" in m and p.endswith("/train-worker-0")
    )
    created = next(i for i, (m, p) in enumerate(calls) if "POST" in m and p.endswith("/pods"))
    assert deleted < created
    # The ledger: train counted once (on west), east holds only next.
    await until(lambda: used_gpus(service, "east") == 1 and used_gpus(service, "west") == 1)
    assert set(service.ledger.reservations()) == {"team-a/next"}
