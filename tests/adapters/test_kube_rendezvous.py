"""Rendezvous of podSets gangs (issue 14, acceptance 4): the pure derivation of ranks,
hostnames and env (table and hypothesis tests), then KubeLauncher against kmock with
Namespaces (real HTTP, the real ``kubernetes.aio`` client): the headless Service selects
exactly its job's pods, every pod's hostname/subdomain make MASTER_ADDR rank 0's DNS name,
ranks cover 0..n-1 once, and the Service goes with the gang (cancel, rollback, garbage
collection) and is adopted on relaunch."""

from __future__ import annotations

import random
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import kmock as kmocklib
import pytest
from hypothesis import given
from hypothesis import strategies as st
from kmock_namespaces import NamespacedEmulator
from kubernetes.aio.client import ApiClient, Configuration
from tenacity import wait_none

from adapters.kube.launch import KubeLauncher
from adapters.kube.objects import KubeLaunchError, Mode
from adapters.kube.rendezvous import ENV_NAMES, Rendezvous, service_name, short_label
from adapters.kube.settings import LaunchSettings
from broker.manifest import master_port
from broker.manifest.workloads import INTEGRATIONS
from broker.model import Placement, PodPlacement, Resources
from broker.ports import LaunchSpec

pytestmark = pytest.mark.kmock(cls=NamespacedEmulator)

PODS = kmocklib.resource("", "v1", "pods")
SERVICES = kmocklib.resource("", "v1", "services")
NAMESPACES = kmocklib.resource("", "v1", "namespaces")
NS = "fedbroker-acme"
GPU = Resources(gpus=1, cpu_milli=1000, memory_mib=1024)
LONG_JOB = "j" * 60  # pods "<60 j>-worker-0": 69 characters, longer than a hostname may be


# -- the pure derivation -----------------------------------------------------------------------


def spec(job: str = "train", pod_sets: tuple[str, ...] = (), port: int = 29500) -> LaunchSpec:
    return LaunchSpec(tenant="acme", job=job, pod_sets=pod_sets, master_port=port)


LABELS = [
    ("train-worker-0", "train-worker-0"),
    ("a" * 63, "a" * 63),
    ("a" * 64, "a" * 54 + "-" + "ffe054fe"),
    # A cut ending in "-" drops it, so the label never holds "--" before the hash.
    ("a" * 53 + "-" + "b" * 20, "a" * 53 + "-" + "af3ec493"),
]


@pytest.mark.parametrize(("name", "label"), LABELS)
def test_short_label_keeps_short_names_and_hashes_long_ones(name: str, label: str) -> None:
    assert short_label(name) == label
    assert len(short_label(name)) <= 63


@pytest.mark.parametrize(
    ("job", "service"),
    [("train", "rdzv-train"), ("7b-sft", "rdzv-7b-sft"), ("x" * 58, "rdzv-" + "x" * 58),
     ("x" * 63, short_label("rdzv-" + "x" * 63))],
)  # fmt: skip
def test_service_name_is_a_dns_1035_label_from_the_job(job: str, service: str) -> None:
    name = service_name(spec(job))
    assert name == service
    assert len(name) <= 63 and name[0].isalpha()


# (pod names in placement order, manifest pod sets) -> expected (name, rank, hostname)
RANKS: list[tuple[str, list[str], tuple[str, ...], list[tuple[str, int, str]]]] = [
    ("one set by index", ["train-w-1", "train-w-0"], (),
     [("train-w-0", 0, "train-w-0"), ("train-w-1", 1, "train-w-1")]),
    ("index is numeric", ["train-w-10", "train-w-2", "train-w-0"], ("w",),
     [("train-w-0", 0, "train-w-0"), ("train-w-2", 1, "train-w-2"),
      ("train-w-10", 2, "train-w-10")]),
    ("manifest order, not placement order", ["train-worker-0", "train-master-0"],
     ("master", "worker"),
     [("train-master-0", 0, "train-master-0"), ("train-worker-0", 1, "train-worker-0")]),
    ("first appearance without a manifest order", ["train-worker-0", "train-master-0"], (),
     [("train-worker-0", 0, "train-worker-0"), ("train-master-0", 1, "train-master-0")]),
    ("pod set names with dashes", ["train-a-b-1", "train-a-b-0"], ("a-b",),
     [("train-a-b-0", 0, "train-a-b-0"), ("train-a-b-1", 1, "train-a-b-1")]),
]  # fmt: skip


@pytest.mark.parametrize(
    ("names", "pod_sets", "expected"), [r[1:] for r in RANKS], ids=[r[0] for r in RANKS]
)
def test_ranks_and_hostnames(
    names: list[str], pod_sets: tuple[str, ...], expected: list[tuple[str, int, str]]
) -> None:
    rdzv = Rendezvous.of(names, spec(pod_sets=pod_sets), NS)
    assert [(n, rdzv.pods[n].rank, rdzv.pods[n].hostname) for n in sorted(
        rdzv.pods, key=lambda n: rdzv.pods[n].rank)] == expected  # fmt: skip


def test_env_of_a_pod() -> None:
    rdzv = Rendezvous.of(
        ["train-worker-0", "train-master-0", "train-worker-1"],
        spec(pod_sets=("master", "worker"), port=23456),
        NS,
    )
    env = {e["name"]: e["value"] for e in rdzv.env("train-worker-1", "train")}
    assert env == {
        "WORLD_SIZE": "3",
        "RANK": "2",
        "MASTER_ADDR": f"train-master-0.rdzv-train.{NS}.svc",
        "MASTER_PORT": "23456",
        "FEDBROKER_JOB": "train",
        "FEDBROKER_POD_SET": "worker",
        "FEDBROKER_POD_INDEX": "1",
    }


def test_a_long_pod_name_gets_a_short_stable_hostname_and_master_addr_uses_it() -> None:
    names = [f"{LONG_JOB}-worker-{i}" for i in range(2)]
    rdzv = Rendezvous.of(names, spec(LONG_JOB), NS)
    hostnames = [rdzv.pods[n].hostname for n in names]
    assert all(len(h) <= 63 for h in hostnames)
    assert len(set(hostnames)) == 2
    assert rdzv.master_addr == f"{hostnames[0]}.{service_name(spec(LONG_JOB))}.{NS}.svc"
    assert Rendezvous.of(names[::-1], spec(LONG_JOB), NS) == rdzv  # stable


def test_the_brokers_variables_replace_the_users_of_the_same_names() -> None:
    rdzv = Rendezvous.of(["train-w-0"], spec(), NS)
    pod_spec: dict[str, Any] = {
        "hostname": "mine",
        "initContainers": [{"name": "wait", "env": [{"name": "RANK", "value": "7"}]}],
        "containers": [{"name": "main", "env": [{"name": "LR", "value": "0.1"},
                                               {"name": "WORLD_SIZE", "value": "99"}]}],
    }  # fmt: skip
    rdzv.apply(pod_spec, "train-w-0", "train")
    assert pod_spec["hostname"] == "train-w-0"
    assert pod_spec["subdomain"] == "rdzv-train"
    for container in (*pod_spec["initContainers"], *pod_spec["containers"]):
        names = [e["name"] for e in container["env"]]
        assert sorted(n for n in names if n in ENV_NAMES) == sorted(ENV_NAMES)
        env = {e["name"]: e["value"] for e in container["env"]}
        assert (env["RANK"], env["WORLD_SIZE"]) == ("0", "1")
    assert pod_spec["containers"][0]["env"][0] == {"name": "LR", "value": "0.1"}


@given(
    counts=st.lists(st.integers(1, 12), min_size=1, max_size=4),
    seed=st.integers(0, 2**16),
)
def test_ranks_are_a_permutation_whatever_the_placement_order(counts: list[int], seed: int) -> None:
    sets = tuple(f"s{i}" for i in range(len(counts)))
    names = [f"train-{s}-{i}" for s, c in zip(sets, counts, strict=True) for i in range(c)]
    shuffled = names[:]
    random.Random(seed).shuffle(shuffled)
    rdzv = Rendezvous.of(shuffled, spec(pod_sets=sets), NS)
    assert sorted(p.rank for p in rdzv.pods.values()) == list(range(len(names)))
    # Manifest order, then index: exactly the order the names were generated in.
    assert sorted(rdzv.pods, key=lambda n: rdzv.pods[n].rank) == names


@pytest.mark.parametrize(
    ("wire", "port"),
    [({"spec": {}}, 29500), ({"spec": {"rendezvous": {}}}, 29500),
     ({"spec": {"rendezvous": {"masterPort": 1234}}}, 1234), ({}, 29500)],
)  # fmt: skip
def test_master_port_from_the_stored_manifest(wire: dict[str, Any], port: int) -> None:
    assert master_port(wire) == port


# -- against kmock -----------------------------------------------------------------------------


@pytest.fixture
async def k8s(kmock: Any) -> NamespacedEmulator:
    emulator: NamespacedEmulator = kmock
    info = kmocklib.ResourceInfo(namespaced=True)
    for resource in ("v1/pods", "v1/services", "scheduling.x-k8s.io/v1alpha1/podgroups"):
        emulator.resources[resource] = info
    return emulator


@pytest.fixture
async def api(k8s: NamespacedEmulator) -> AsyncIterator[ApiClient]:
    async with ApiClient(Configuration(host=str(k8s.url).rstrip("/"))) as client:
        yield client


def two_sets(job: str = "train", workers: int = 3) -> Placement:
    """A master and ``workers`` workers, the workers listed first (placement order is not
    rank order)."""
    pods = [PodPlacement(f"acme.{job}-worker-{i}", f"n{i}", (0,), GPU) for i in range(workers)]
    pods.append(PodPlacement(f"acme.{job}-master-0", "n9", (0,), GPU))
    return Placement(f"acme/{job}", "east", tuple(pods))


def kubelet(k8s: NamespacedEmulator, phase: str = "Running") -> Callable[[float], Awaitable[None]]:
    async def step(_: float) -> None:
        await k8s.run_pods("n0", phase)

    return step


def launcher(
    api: ApiClient, k8s: NamespacedEmulator, mode: Mode = "pin", phase: str = "Running"
) -> KubeLauncher:
    def spec_for(p: Placement) -> LaunchSpec:
        template = {"spec": {"containers": [
            {"name": "main", "image": "pytorch:2", "env": [{"name": "RANK", "value": "5"}]},
            {"name": "sidecar", "image": "busybox"}]}}  # fmt: skip
        return LaunchSpec(
            tenant="acme", job=p.job.split("/")[1], pod_templates={"worker": template},
            pod_sets=("master", "worker"), master_port=23456,
        )  # fmt: skip

    return KubeLauncher(
        api, LaunchSettings("fedbroker-{tenant}", mode, cluster="east", retry_wait=wait_none()),
        kinds=INTEGRATIONS,
        sleep=kubelet(k8s, phase), spec_for=spec_for,
    )  # fmt: skip


def stored(k8s: NamespacedEmulator, res: Any) -> dict[str, dict[str, Any]]:
    return {
        name: obj.raw
        for (r, ns, name), obj in k8s.objects.items()
        if r == res and ns == NS and not obj.deleted
    }


def selects(selector: dict[str, str], pod: dict[str, Any]) -> bool:
    labels = pod["metadata"].get("labels") or {}
    return all(labels.get(k) == v for k, v in selector.items())


def env_of(container: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e["value"] for e in container.get("env") or ()}


@pytest.mark.parametrize("mode", ["pin", "delegate"])
async def test_service_selects_exactly_the_jobs_pods_and_master_addr_resolves_to_rank_0(
    api: ApiClient, k8s: NamespacedEmulator, mode: Mode
) -> None:
    kube = launcher(api, k8s, mode)
    await kube.launch(two_sets("train"))
    await kube.launch(two_sets("other", workers=1))
    services = stored(k8s, SERVICES)
    assert sorted(services) == ["rdzv-other", "rdzv-train"]
    service = services["rdzv-train"]
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["publishNotReadyAddresses"] is True
    assert service["metadata"]["labels"]["fedbroker.io/origin"] == "fedbroker"
    pods = stored(k8s, PODS)
    selected = sorted(n for n, pod in pods.items() if selects(service["spec"]["selector"], pod))
    assert selected == ["train-master-0", "train-worker-0", "train-worker-1", "train-worker-2"]
    # The Service DNS rule: <hostname>.<subdomain = the Service>.<namespace>.svc
    dns = {}
    for name in selected:
        spec_ = pods[name]["spec"]
        assert spec_["subdomain"] == service["metadata"]["name"]
        namespace = pods[name]["metadata"]["namespace"]
        dns[name] = f"{spec_['hostname']}.{spec_['subdomain']}.{namespace}.svc"
    envs = [env_of(c) for n in selected for c in pods[n]["spec"]["containers"]]
    assert len(envs) == 7  # the workers' two containers, the master's default one
    assert all(set(ENV_NAMES) <= env.keys() for env in envs)
    ranks = {n: int(env_of(pods[n]["spec"]["containers"][0])["RANK"]) for n in selected}
    assert sorted(ranks.values()) == [0, 1, 2, 3]
    assert ranks["train-master-0"] == 0  # manifest order: master before worker
    for env in envs:
        assert env["MASTER_ADDR"] == dns["train-master-0"]
        assert (env["WORLD_SIZE"], env["MASTER_PORT"], env["FEDBROKER_JOB"]) == (
            "4", "23456", "train",
        )  # fmt: skip
    worker2 = env_of(pods["train-worker-2"]["spec"]["containers"][1])
    assert (worker2["FEDBROKER_POD_SET"], worker2["FEDBROKER_POD_INDEX"]) == ("worker", "2")


async def test_the_service_goes_with_cancel_rollback_and_garbage_collection(
    api: ApiClient, k8s: NamespacedEmulator
) -> None:
    kube = launcher(api, k8s)
    for job in ("a", "b", "c"):
        await kube.launch(two_sets(job, workers=1))
    assert sorted(stored(k8s, SERVICES)) == ["rdzv-a", "rdzv-b", "rdzv-c"]
    await kube.delete(two_sets("a", workers=1))  # cancel
    assert sorted(stored(k8s, SERVICES)) == ["rdzv-b", "rdzv-c"]
    deleted = await kube.collect_garbage({"acme/c"})  # b is orphaned
    assert f"Service/{NS}/rdzv-b" in deleted
    assert sorted(stored(k8s, SERVICES)) == ["rdzv-c"]
    failing = launcher(api, k8s, phase="Failed")
    with pytest.raises(KubeLaunchError, match="Failed before the gang ran"):
        await failing.launch(two_sets("d"))
    assert sorted(stored(k8s, SERVICES)) == ["rdzv-c"]  # rolled back with its pods
    assert not [n for n in stored(k8s, PODS) if n.startswith("d-")]


async def test_relaunch_adopts_our_service_and_refuses_anothers(
    api: ApiClient, k8s: NamespacedEmulator
) -> None:
    kube = launcher(api, k8s)
    await kube.launch(two_sets())
    before = stored(k8s, SERVICES)["rdzv-train"]
    await kube.launch(two_sets())  # idempotent: AlreadyExists with our labels is success
    assert stored(k8s, SERVICES) == {"rdzv-train": before}
    assert len(stored(k8s, PODS)) == 4
    foreign = {"metadata": {"name": "rdzv-x", "namespace": NS, "labels": {"app": "x"}},
               "spec": {"clusterIP": "None"}}  # fmt: skip
    k8s.objects[SERVICES, NS, "rdzv-x"] = foreign
    with pytest.raises(KubeLaunchError, match="service rdzv-x already exists and does not belong"):
        await kube.launch(two_sets("x"))
    assert stored(k8s, SERVICES)["rdzv-x"]["metadata"]["labels"] == {"app": "x"}
    await kube.collect_garbage(set())
    assert sorted(stored(k8s, SERVICES)) == ["rdzv-x"]  # not ours: never deleted
