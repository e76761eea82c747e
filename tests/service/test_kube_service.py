"""The Service with a Kubernetes member cluster served by kmock (real HTTP, the real
``kubernetes.aio`` client from a kubeconfig file, no monkey-patching; Namespaces served by
``tests/kmock_namespaces.py``): listed before readiness, a job placed and launched into its
tenant's namespace, and reservations rebuilt after a restart."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any, cast

import kmock
import kmock as kmocklib
import pytest
from builders import until
from kmock_namespaces import NamespacedEmulator

from broker.config import Config, ConfigError, parse_config
from broker.manifest import parse_manifest
from broker.ports import KubeconfigError
from broker.service.facade import Service

NODES = kmock.resource("", "v1", "nodes")
PODS = kmock.resource("", "v1", "pods")
NS = "fedbroker-team-a"  # team-a's namespace under the default pattern fedbroker-{tenant}
CANARY = "canary-token-kube-service-51c2"

CONFIG = """
store: {{url: "sqlite:///{db}"}}
scheduler: {{{scheduler}}}
clusters:
- name: east
  source:
    kube: {{kubeconfig: "{kubeconfig}", context: east, {kube}}}
queues:
- {{name: training, policy: gang}}
tenants:
- {{name: team-a, defaultQueue: training, token: {{value: tok-a-00000000000000000000000000}}}}
"""


def node_obj(name: str, gpus: int = 4) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {"nvidia.com/gpu.product": "A100"}},
        "spec": {},
        "status": {
            "allocatable": {"nvidia.com/gpu": str(gpus), "cpu": "64", "memory": "256Gi"},
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }


def foreign_pod(name: str, node: str, gpus: int) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "ml"},
        "spec": {
            "nodeName": node,
            "containers": [{"name": "c", "resources": {"requests": {"nvidia.com/gpu": str(gpus)}}}],
        },
        "status": {"phase": "Running"},
    }


def kubeconfig_doc(server: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": "east",
        "contexts": [{"name": "east", "context": {"cluster": "c-east", "user": "u"}}],
        "clusters": [{"name": "c-east", "cluster": {"server": server}}],
        "users": [{"name": "u", "user": {"token": CANARY}}],
    }


def make_config(
    tmp_path: Path, server: str, kube: str = "launchMode: pin", scheduler: str = ""
) -> Config:
    """The test federation: one Kubernetes member ``east`` (``kube``: more keys of its
    source, ``scheduler``: of the scheduler section)."""
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(json.dumps(kubeconfig_doc(server)))
    text = CONFIG.format(
        db=tmp_path / "jobs.db", kubeconfig=kubeconfig, kube=kube, scheduler=scheduler
    )
    return parse_config(text, "test config")


def manifest(
    name: str,
    gpus: int = 1,
    count: int = 1,
    template: dict[str, Any] | None = None,
    placement: dict[str, Any] | None = None,
) -> Any:
    pod_set: dict[str, Any] = {
        "name": "worker", "count": count,
        "resources": {"nvidia.com/gpu": gpus, "cpu": "1", "memory": "1Gi"},
    }  # fmt: skip
    if template is not None:
        pod_set["template"] = template
    body = {
        "apiVersion": "fedbroker.io/v1alpha1",
        "kind": "FederatedJob",
        "metadata": {"name": name},
        "spec": {"podSets": [pod_set], "placement": placement or {}},
    }
    return parse_manifest(json.dumps(body).encode(), "application/json")


async def kubelet(
    k8s: kmock.KubernetesEmulator, name: str, phase: str, node: str | None = None
) -> None:
    """The kubelet moves one of our pods (bound to ``node``, in ``phase``), through the
    API: the broker hears its pods by a watch."""
    patch: dict[str, Any] = {"status": {"phase": phase}}
    if node is not None:
        patch["spec"] = {"nodeName": node}
    await cast(NamespacedEmulator, k8s).patch_pod(NS, name, patch)


def used_gpus(service: Service, cluster: str = "east") -> float:
    view = service.ledger.snapshot().clusters[cluster]
    return view.gpus_total() - view.free_milli() / 1000


pytestmark = pytest.mark.kmock(cls=NamespacedEmulator)


@pytest.fixture
def k8s(kmock: kmock.KubernetesEmulator) -> kmock.KubernetesEmulator:
    kmock.resources["v1/pods"] = kmocklib.ResourceInfo(namespaced=True)
    kmock.resources["v1/nodes"] = kmocklib.ResourceInfo(namespaced=False)
    # Served, as by any API server: a member back from staleness is garbage-collected
    # (pods and rendezvous Services) before it is trusted again.
    kmock.resources["v1/services"] = kmocklib.ResourceInfo(namespaced=True)
    kmock.objects[NODES, None, "n1"] = node_obj("n1")
    kmock.objects[PODS, "ml", "other"] = foreign_pod("other", "n1", gpus=2)
    return kmock


def our_pod(k8s: kmock.KubernetesEmulator, name: str) -> Any:
    for (res, ns, obj_name), obj in list(k8s.objects.items()):
        if res == PODS and ns == NS and obj_name == name and not obj.deleted:
            return obj
    return None


def ledger_state(service: Service) -> tuple[Any, ...]:
    """Everything the ledger holds about ``east``: each node's free CPU, memory and per-GPU
    milli, the reservations (job -> pods and nodes and GPUs) and which jobs run."""
    nodes = dict(service.ledger.snapshot().clusters["east"].nodes)
    reservations = {
        job: sorted((p.pod, p.node, p.gpus) for p in pl.pods)
        for job, pl in service.ledger.reservations().items()
    }
    running = sorted(
        launch.placement.job for launch in service.lifecycle.launches() if launch.running
    )
    return nodes, reservations, running


async def test_kube_member_listed_placed_and_restored(
    k8s: kmock.KubernetesEmulator, tmp_path: Path
) -> None:
    k8s.objects[NODES, None, "n1"] = node_obj("n1", gpus=8)
    config = make_config(
        tmp_path, str(k8s.url).rstrip("/"), "launchMode: pin, podPollSeconds: 0.02"
    )
    service = Service(config)
    await service.start()
    try:
        # Listed before readiness: the node and the foreign pod's 2 GPUs.
        assert service.ready
        assert set(service.ledger.snapshot().clusters["east"].nodes) == {"n1"}
        assert used_gpus(service) == 2
        assert not service.ledger.snapshot().clusters["east"].stale

        _, created = await service.submit("team-a", manifest("train"))
        assert created
        await service.schedule_once()
        assert (await service.get("team-a", "train")).state == "Placed"
        await until(lambda: our_pod(k8s, "train-worker-0") is not None)
        pod = our_pod(k8s, "train-worker-0").raw
        affinity = pod["spec"]["affinity"]["nodeAffinity"]
        terms = affinity["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
        assert terms[0]["matchFields"][0]["values"] == ["n1"]
        assert pod["metadata"]["labels"]["fedbroker.io/job"] == "train"
        # The kubelet: bound where the broker pinned it, and running.
        await kubelet(k8s, "train-worker-0", "Running", node="n1")
        await service.launches_done(timeout=10)
        assert (await service.get("team-a", "train")).state == "Running"
        assert used_gpus(service) == 3  # the foreign pod's 2 and ours, not counted twice

        # A gang still starting when the broker stops: one pod bound, one not yet.
        await service.submit("team-a", manifest("gang", count=2))
        await service.schedule_once()
        await until(lambda: our_pod(k8s, "gang-worker-1") is not None)
        our_pod(k8s, "gang-worker-0").patch({"spec": {"nodeName": "n1"}})
        await until(lambda: used_gpus(service) == 5)
        assert (await service.get("team-a", "gang")).state == "Placed"
        before = ledger_state(service)
        assert set(before[1]) == {"team-a/gang"} and before[2] == ["team-a/train"]
    finally:
        await service.close()

    restarted = Service(
        make_config(tmp_path, str(k8s.url).rstrip("/"), "launchMode: pin, podPollSeconds: 0.02")
    )
    await restarted.start()
    try:
        # Rebuilt from our labelled pods before any placement: the same ledger.
        assert ledger_state(restarted) == before
        assert (await restarted.get("team-a", "train")).state == "Running"
        assert (await restarted.get("team-a", "gang")).state == "Placed"
        assert restarted.queue.get("team-a/train") is None
        assert restarted.queue.get("team-a/gang") is None
        # The restored Running job is watched: its pod ending ends it and frees its GPU.
        await kubelet(k8s, "train-worker-0", "Succeeded")
        await restarted.runs_done(timeout=10)
        assert (await restarted.get("team-a", "train")).state == "Succeeded"
        await until(lambda: used_gpus(restarted) == 4)
        # Cancelling deletes the pods and frees their GPUs.
        await restarted.cancel("team-a", "gang")
        assert our_pod(k8s, "gang-worker-0") is None and our_pod(k8s, "gang-worker-1") is None
        await until(lambda: used_gpus(restarted) == 2)
    finally:
        await restarted.close()


@pytest.mark.parametrize(("phase", "state"), [("Succeeded", "Succeeded"), ("Failed", "Failed")])
async def test_pods_ending_end_the_job_and_free_the_gpus(
    k8s: kmock.KubernetesEmulator, tmp_path: Path, phase: str, state: str
) -> None:
    config = make_config(
        tmp_path, str(k8s.url).rstrip("/"), "launchMode: pin, podPollSeconds: 0.02"
    )
    service = Service(config)
    await service.start()
    try:
        await service.submit("team-a", manifest("job", count=2))
        await service.schedule_once()
        await until(lambda: our_pod(k8s, "job-worker-1") is not None)
        for i in range(2):
            await kubelet(k8s, f"job-worker-{i}", "Running", node="n1")
        await service.launches_done(timeout=10)
        assert (await service.get("team-a", "job")).state == "Running"
        assert used_gpus(service) == 4
        # One pod ends first: the job runs on until the other does (or one fails).
        await kubelet(k8s, "job-worker-0", "Succeeded")
        await kubelet(k8s, "job-worker-1", phase)
        await service.runs_done(timeout=10)
        record = await service.get("team-a", "job")
        assert record.state == state
        await until(lambda: used_gpus(service) == 2)  # the foreign pod's only
        assert service.lifecycle.get("team-a/job") is None
        assert not service.ledger.reservations()
    finally:
        await service.close()


async def test_delegate_mode_coscheduling_names_the_configured_scheduler(
    k8s: kmock.KubernetesEmulator, tmp_path: Path
) -> None:
    # member config -> broker.service.members -> KubeLauncher: the pods name the second
    # scheduler scheduler-plugins runs as, the one that honours their PodGroup.
    cosched = kmock.resource("scheduling.x-k8s.io", "v1alpha1", "podgroups")
    k8s.resources["scheduling.x-k8s.io/v1alpha1/podgroups"] = kmocklib.ResourceInfo(namespaced=True)
    kube = "launchMode: delegate, podPollSeconds: 0.02, schedulerName: scheduler-plugins-scheduler"
    service = Service(make_config(tmp_path, str(k8s.url).rstrip("/"), kube))
    await service.start()
    try:
        await service.submit("team-a", manifest("train", count=2))
        await service.schedule_once()
        await until(lambda: our_pod(k8s, "train-worker-1") is not None)
        for name in ("train-worker-0", "train-worker-1"):
            pod = our_pod(k8s, name).raw
            assert pod["spec"]["schedulerName"] == "scheduler-plugins-scheduler"
            assert pod["metadata"]["labels"]["scheduling.x-k8s.io/pod-group"] == "train"
        assert any(r == cosched and ns == NS for (r, ns, _) in k8s.objects)
    finally:
        await service.close()


async def test_delegate_mode_volcano_through_the_service(
    k8s: kmock.KubernetesEmulator, tmp_path: Path
) -> None:
    volcano = kmock.resource("scheduling.volcano.sh", "v1beta1", "podgroups")
    k8s.resources["scheduling.volcano.sh/v1beta1/podgroups"] = kmocklib.ResourceInfo(
        namespaced=True
    )
    # The job's queue "training" -> the Volcano Queue "ml" (a PodGroup naming a Queue that
    # does not exist is refused by Volcano's admission webhook).
    kube = (
        "launchMode: delegate, podGroup: volcano, podPollSeconds: 0.02, "
        "volcanoQueues: {training: ml}"
    )
    service = Service(make_config(tmp_path, str(k8s.url).rstrip("/"), kube))
    await service.start()
    template = {
        "metadata": {"labels": {"app": "trainer"}},
        "spec": {"containers": [{"name": "trainer", "image": "pytorch:2", "args": ["train"]}]},
    }
    try:
        await service.submit("team-a", manifest("train", count=2, template=template))
        await service.schedule_once()
        await until(lambda: our_pod(k8s, "train-worker-1") is not None)
        groups = [o for (r, ns, _), o in k8s.objects.items() if r == volcano and ns == NS]
        assert len(groups) == 1
        group = groups[0]
        assert group.raw["metadata"]["name"] == "train"
        assert group.raw["spec"] == {"minMember": 2, "queue": "ml"}
        pod = our_pod(k8s, "train-worker-0").raw
        assert pod["metadata"]["annotations"]["scheduling.k8s.io/group-name"] == "train"
        assert pod["metadata"]["labels"]["app"] == "trainer"  # the manifest's template
        assert pod["metadata"]["labels"]["fedbroker.io/tenant"] == "team-a"
        assert pod["spec"]["schedulerName"] == "volcano"
        assert "affinity" not in pod["spec"]  # the gang scheduler picks the nodes
        container = pod["spec"]["containers"][0]
        assert (container["name"], container["image"], container["args"]) == (
            "trainer", "pytorch:2", ["train"],
        )  # fmt: skip
        assert container["resources"]["requests"]["nvidia.com/gpu"] == "1"
        # Volcano reports the gang running on its PodGroup.
        group.patch({"status": {"phase": "Running"}})
        await service.launches_done(timeout=10)
        assert (await service.get("team-a", "train")).state == "Running"
        await service.cancel("team-a", "train")
        assert our_pod(k8s, "train-worker-0") is None
        assert all(o.deleted for (r, ns, _), o in k8s.objects.items() if r == volcano)
    finally:
        await service.close()


def ours(name: str, job: str) -> dict[str, Any]:
    """A pod with our labels, as a broker would have created it for ``job``."""
    pod = foreign_pod(name, "n1", gpus=1)
    pod["metadata"] = {
        "name": name,
        "namespace": NS,
        "labels": {"fedbroker.io/origin": "fedbroker", "fedbroker.io/tenant": "team-a",
                   "fedbroker.io/job": job},
    }  # fmt: skip
    return pod


async def test_garbage_collector_deletes_ours_of_no_live_job_only(
    k8s: kmock.KubernetesEmulator, tmp_path: Path
) -> None:
    k8s.objects[PODS, NS, "left-worker-0"] = ours("left-worker-0", "left")
    k8s.objects[PODS, NS, "theirs"] = foreign_pod("theirs", "n1", gpus=1) | {
        "metadata": {"name": "theirs", "namespace": NS}
    }
    scheduler = "cycleSeconds: 0.02, garbageCollectSeconds: 0.05"
    service = Service(make_config(tmp_path, str(k8s.url).rstrip("/"), scheduler=scheduler))
    await service.start()
    try:
        # At start: a leftover of a job the store does not know is gone before readiness.
        assert service.ready
        assert our_pod(k8s, "left-worker-0") is None
        # Later: one appearing while the broker runs goes at the next collection.
        k8s.objects[PODS, NS, "late-worker-0"] = ours("late-worker-0", "late")
        await until(lambda: our_pod(k8s, "late-worker-0") is None)
        assert our_pod(k8s, "theirs") is not None  # no origin label: never ours to delete
    finally:
        await service.close()


async def test_stale_member_takes_nothing_until_relisted(
    k8s: kmock.KubernetesEmulator, tmp_path: Path
) -> None:
    down = asyncio.Event()
    down.set()
    k8s["list", NODES, down] << 503  # the API server answers nothing useful while down
    service = Service(make_config(tmp_path, str(k8s.url).rstrip("/")))
    await service.start()
    try:
        assert service.ready
        [east] = service.clusters()
        assert east["stale"] and not east["connected"] and east["relists"] == 0
        await service.submit("team-a", manifest("train"))
        await service.schedule_once()
        assert (await service.get("team-a", "train")).state == "Queued"
        explained = await service.explain("team-a", "train")
        [reason] = explained["clusters"][0]["reasons"]
        assert reason["code"] == "ClusterStale"
        down.clear()
        # Back: trusted only once relisted (capacity known), then placed as usual.
        await until(lambda: not service.kube.stale("east"), timeout=20)
        [east] = service.clusters()
        assert east["relists"] >= 1 and east["connected"]
        await service.schedule_once()
        assert (await service.get("team-a", "train")).state == "Placed"
        assert service.ledger.snapshot().clusters["east"].nodes["n1"].node.allocatable.gpus == 4
    finally:
        await service.close()


async def test_unreachable_member_is_stale(tmp_path: Path) -> None:
    service = Service(make_config(tmp_path, "http://127.0.0.1:9"))
    await service.start()
    try:
        assert service.ready
        assert service.ledger.snapshot().clusters["east"].stale
    finally:
        await service.close()


def test_kube_source_errors_name_the_key(tmp_path: Path) -> None:
    def text(kube: str) -> str:
        return CONFIG.format(db=tmp_path / "jobs.db", kubeconfig="kc", kube=kube, scheduler="")

    with pytest.raises(ConfigError, match=r"clusters\[0\]\.source\.kube\.launchMode"):
        parse_config(text("launchMode: pinned"), "test config")
    with pytest.raises(ConfigError, match=r"clusters\[0\]\.source\.kube\.kubeconfig: give exactly"):
        parse_config(text("kubeconfigInline: {apiVersion: v1}"), "test config")
    with pytest.raises(ConfigError, match=r"clusters\[0\]\.source\.kube\.podPollSeconds"):
        parse_config(text("podPollSeconds: 0"), "test config")
    no_context = text("launchMode: pin").replace(", context: east", "")
    with pytest.raises(ConfigError, match=r"clusters\[0\]\.source\.kube\.context"):
        parse_config(no_context, "test config")


def test_example_federation_config_is_valid() -> None:
    example = Path(__file__).resolve().parents[2] / "deploy" / "examples" / "federation.yaml"
    config = parse_config(
        example.read_text(encoding="utf-8"), str(example), {"FEDBROKER_TOKEN_TEAM_A": "t" * 32}
    )
    sources = [cc.source.kube for cc in config.clusters]
    assert [s.context for s in sources if s is not None] == ["gpu-east", "gpu-west"]
    [pool] = config.burst_pools
    assert pool.cluster == "gpu-west" and pool.source.capi is not None
    assert pool.source.capi.context == "capi-management" and pool.max_nodes is None


async def test_inline_kubeconfig_and_its_secrets(
    k8s: kmock.KubernetesEmulator, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    inline = json.dumps(kubeconfig_doc(str(k8s.url).rstrip("/")))
    text = CONFIG.format(
        db=tmp_path / "jobs.db", kubeconfig="unused", kube="launchMode: pin", scheduler=""
    ).replace('kubeconfig: "unused"', f"kubeconfigInline: {inline}")
    service = Service(parse_config(text, "test config"))
    await service.start()
    try:
        assert set(service.ledger.snapshot().clusters["east"].nodes) == {"n1"}
        assert not service.ledger.snapshot().clusters["east"].stale
    finally:
        await service.close()
    # A context the inline kubeconfig lacks: a one-line error naming it, without the token.
    broken = Service(parse_config(text.replace("context: east", "context: west"), "test config"))
    with pytest.raises(KubeconfigError) as info:
        await broken.start()
    await broken.close()
    assert str(info.value) == "kubeconfig (inline): no context 'west'"
    assert CANARY not in caplog.text


def test_serve_with_a_broken_kubeconfig_exits_2_with_one_line(tmp_path: Path) -> None:
    """The kubeconfig has no context ``east`` (but a user token): ``fedbroker serve`` says so
    in one line naming the file, exits 2, and never shows the token."""
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(json.dumps(kubeconfig_doc("http://127.0.0.1:9") | {"contexts": []}))
    path = tmp_path / "config.yaml"
    path.write_text(
        CONFIG.format(
            db=tmp_path / "jobs.db", kubeconfig=kubeconfig, kube="launchMode: pin", scheduler=""
        )
    )
    done = subprocess.run(
        [sys.executable, "-m", "broker.cli", "serve", "--config", str(path), "--port", "0"],
        cwd=Path(__file__).resolve().parents[2], capture_output=True, text=True,
        timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    lines = [line for line in done.stderr.splitlines() if "kubeconfig" in line]
    assert len(lines) == 1 and f"kubeconfig {kubeconfig}: no context 'east'" in lines[0]
    assert "Traceback" not in done.stderr
    assert CANARY not in done.stderr + done.stdout


async def test_a_submitted_jobs_pods_carry_its_rendezvous(
    k8s: kmock.KubernetesEmulator, tmp_path: Path
) -> None:
    """Issue 14: the manifest's pod set order and ``spec.rendezvous.masterPort`` reach the
    pods through the service (``Pending`` -> ``LaunchSpec``); cancel deletes the Service."""
    k8s.objects[NODES, None, "n1"] = node_obj("n1", gpus=8)
    config = make_config(tmp_path, str(k8s.url).rstrip("/"), "launchMode: pin")
    service = Service(config)
    await service.start()
    try:
        res = {"nvidia.com/gpu": 1, "cpu": "1", "memory": "1Gi"}
        body = {
            "apiVersion": "fedbroker.io/v1alpha1", "kind": "FederatedJob",
            "metadata": {"name": "ddp"},
            "spec": {"podSets": [{"name": "worker", "count": 2, "resources": res},
                                 {"name": "chief", "count": 1, "resources": res}],
                     "rendezvous": {"masterPort": 12345}},
        }  # fmt: skip
        await service.submit("team-a", parse_manifest(json.dumps(body).encode(), None))
        await service.schedule_once()
        names = ["ddp-worker-0", "ddp-worker-1", "ddp-chief-0"]
        await until(lambda: all(our_pod(k8s, n) is not None for n in names))
        envs = {}
        for name in names:
            container = our_pod(k8s, name).raw["spec"]["containers"][0]
            envs[name] = {e["name"]: e["value"] for e in container["env"]}
        assert [envs[n]["RANK"] for n in names] == ["0", "1", "2"]  # manifest order
        assert {envs[n]["MASTER_PORT"] for n in names} == {"12345"}
        assert {envs[n]["MASTER_ADDR"] for n in names} == {f"ddp-worker-0.rdzv-ddp.{NS}.svc"}
        services = kmock.resource("", "v1", "services")

        def service_names() -> list[str]:
            return [n for (r, ns, n), o in k8s.objects.items()
                    if r == services and ns == NS and not o.deleted]  # fmt: skip

        assert service_names() == ["rdzv-ddp"]
        await service.cancel("team-a", "ddp")
        assert service_names() == []
    finally:
        await service.close()
