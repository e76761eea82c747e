"""``KubeLauncher.watch`` (``adapters.kube.run_watch`` on ``adapters.kube.our_pods``): the
ends of a member's running gangs from one list+watch of our pods, against kmock over real
HTTP. Each gang ends as its pods say (every pod Succeeded; one Failed; one deleted behind
our back), a gang still running is left alone, a cancelled watch is never called; however
many gangs are watched, one task follows them and our pods are listed once (a broker with
100,000 live jobs holds no task per running job and lists nothing on a timer). A deletion
the watch never showed is caught by the next resync's list; a pod the watch has not shown
yet is not taken for gone. Starting gangs are confirmed from the same record
(``GangPods.started``), without a listing per poll."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest
from kmock_namespaces import NamespacedEmulator
from kubernetes.aio.client import ApiClient
from test_kube_launch import NS, PODS, Emulator, api, k8s, launcher, placement

from adapters.kube.launch import KubeLauncher
from adapters.kube.objects import KubeLaunchError
from adapters.kube.run_watch import run_end, run_start
from broker.model import Placement
from broker.ports import RunEnd

pytestmark = pytest.mark.kmock(cls=NamespacedEmulator)
__all__ = ["api", "k8s"]  # the fixtures, imported for pytest


class Ends:
    """``on_end`` callbacks that record each gang's end and wake a waiter."""

    def __init__(self) -> None:
        self.ended: dict[str, RunEnd] = {}
        self._changed = asyncio.Event()

    def on_end(self, name: str) -> Callable[[RunEnd], None]:
        def record(end: RunEnd) -> None:
            assert name not in self.ended, f"{name} ended twice"
            self.ended[name] = end
            self._changed.set()

        return record

    async def until(self, *names: str) -> None:
        async with asyncio.timeout(30):
            while not set(names) <= self.ended.keys():
                self._changed.clear()
                await self._changed.wait()


def pod_lists(k8s: Emulator) -> int:
    """LIST requests for pods across namespaces (watches not counted)."""
    return sum(
        1
        for r in k8s
        if r.method == "GET"
        and r.url.path == "/api/v1/pods"
        and str(r.params.get("watch", "")).lower() != "true"
    )


async def following(k8s: Emulator, kube: KubeLauncher) -> None:
    """Wait until the pods' record is listed and its watch subscribed (yields only)."""
    async with asyncio.timeout(5):
        while not (kube.our_pods.synced and k8s._buses[PODS].consumer_count):
            await asyncio.sleep(0)


async def set_phase(k8s: Emulator, pod: str, phase: str) -> None:
    await k8s.patch_pod(NS, pod, {"status": {"phase": phase}})


async def launched(kube: KubeLauncher, *names: str) -> dict[str, Placement]:
    gangs = {name: placement(name) for name in names}
    for gang in gangs.values():
        await kube.launch(gang)  # the test's kubelet (the poll pause) sets them Running
    return gangs


async def test_each_gang_ends_as_its_pods_say(api: ApiClient, k8s: Emulator) -> None:
    kube = launcher(api, k8s)
    names = ["ok", "bad", "gone", "busy", "cancelled"]
    gangs = await launched(kube, *names)
    ends = Ends()
    tasks_before = len(asyncio.all_tasks())
    lists_before = pod_lists(k8s)
    handles = {name: kube.watch(gang, ends.on_end(name)) for name, gang in gangs.items()}
    assert len(asyncio.all_tasks()) - tasks_before == 1  # one list+watch, not a task a gang
    assert len(kube.runs) == len(names) and kube.runs.following
    handles["cancelled"].cancel()
    await following(k8s, kube)

    for pod in ("ok-worker-0", "ok-worker-1", "cancelled-worker-0", "cancelled-worker-1"):
        await set_phase(k8s, pod, "Succeeded")
    await set_phase(k8s, "bad-worker-1", "Failed")
    await set_phase(k8s, "busy-worker-0", "Succeeded")  # its other pod still runs
    await k8s.request("DELETE", f"/api/v1/namespaces/{NS}/pods/gone-worker-0")
    await ends.until("ok", "bad", "gone")

    assert ends.ended["ok"] == RunEnd(True)
    assert ends.ended["bad"] == RunEnd(False, "PodFailed", "pod bad-worker-1 failed")
    assert ends.ended["gone"] == RunEnd(False, "PodDeleted", "pod gone-worker-0 disappeared")
    assert "busy" not in ends.ended and "cancelled" not in ends.ended
    assert pod_lists(k8s) - lists_before == 1  # listed once, then only watched
    assert len(kube.runs) == 1  # only "busy" is still watched
    handles["busy"].cancel()
    assert len(kube.runs) == 0
    assert not kube.runs.following  # the last watch gone, so is the list+watch


async def test_a_deletion_the_watch_never_showed_ends_the_gang_at_the_resync(
    api: ApiClient, k8s: Emulator
) -> None:
    kube = launcher(api, k8s, resync_seconds=0.05)
    gangs = await launched(kube, "lost")
    ends = Ends()
    kube.watch(gangs["lost"], ends.on_end("lost"))
    await following(k8s, kube)
    lists = pod_lists(k8s)
    k8s.objects[PODS, NS, "lost-worker-1"].delete()  # in the store only: no watch event
    await ends.until("lost")
    assert ends.ended["lost"] == RunEnd(False, "PodDeleted", "pod lost-worker-1 disappeared")
    assert pod_lists(k8s) > lists


async def test_pods_the_watch_has_not_shown_yet_are_not_gone(api: ApiClient, k8s: Emulator) -> None:
    kube = launcher(api, k8s)
    gangs = await launched(kube, "first")
    ends = Ends()
    kube.watch(gangs["first"], ends.on_end("first"))
    await following(k8s, kube)
    later = placement("later")  # watched before its pods exist (as a pod created just now
    kube.watch(later, ends.on_end("later"))  # whose ADDED event has not arrived yet)
    await set_phase(k8s, "first-worker-0", "Succeeded")
    await set_phase(k8s, "first-worker-1", "Succeeded")
    await ends.until("first")
    assert "later" not in ends.ended and len(kube.runs) == 1

    await kube.create(later)  # its pods arrive through the watch, then end
    for pod in ("later-worker-0", "later-worker-1"):
        await set_phase(k8s, pod, "Succeeded")
    await ends.until("later")
    assert ends.ended["later"] == RunEnd(True)


async def test_finished_waits_for_the_watch(api: ApiClient, k8s: Emulator) -> None:
    kube = launcher(api, k8s)
    gangs = await launched(kube, "train")
    end = asyncio.ensure_future(kube.finished(gangs["train"]))
    await following(k8s, kube)
    assert not end.done()
    await set_phase(k8s, "train-worker-1", "Failed")
    failed = RunEnd(False, "PodFailed", "pod train-worker-1 failed")
    assert await asyncio.wait_for(end, 30) == failed
    assert not kube.runs.following  # its watch was cancelled once it returned


async def test_a_failing_callback_leaves_the_other_gangs_followed(
    api: ApiClient, k8s: Emulator, caplog: pytest.LogCaptureFixture
) -> None:
    kube = launcher(api, k8s)
    gangs = await launched(kube, "broken", "fine")
    ends = Ends()

    def broken(_: RunEnd) -> None:
        raise RuntimeError("the service's handler failed")

    kube.watch(gangs["broken"], broken)
    kube.watch(gangs["fine"], ends.on_end("fine"))
    await following(k8s, kube)
    await set_phase(k8s, "broken-worker-0", "Failed")
    await set_phase(k8s, "fine-worker-0", "Failed")
    await ends.until("fine")
    assert "gang acme/broken: what its pods did could not be handled" in caplog.text


@pytest.mark.parametrize(
    ("phases", "expected"),
    [
        ({"a": "Succeeded", "b": "Succeeded"}, RunEnd(True)),
        ({"a": "Running", "b": "Succeeded"}, None),
        ({"a": "Failed", "b": "Running"}, RunEnd(False, "PodFailed", "pod a failed")),
        ({"a": "Succeeded"}, RunEnd(False, "PodDeleted", "pod b disappeared")),
        ({"a": "Pending", "b": "Running"}, None),
    ],
)
def test_run_end(phases: dict[str, str], expected: RunEnd | None) -> None:
    assert run_end(phases, frozenset({"a", "b"})) == expected


async def test_starting_gangs_are_confirmed_from_the_record_without_listing(
    api: ApiClient, k8s: Emulator
) -> None:
    kube = launcher(api, k8s)
    gangs = await launched(kube, "first")
    ends = Ends()
    kube.watch(gangs["first"], ends.on_end("first"))  # keeps the record up, as in service
    await following(k8s, kube)
    lists = pod_lists(k8s)
    await launched(kube, "second", "third")
    assert pod_lists(k8s) == lists  # confirmed by watch events, not by listing every pod
    # A pod that ends before its gang ran fails the launch, as the watch tells it.
    with pytest.raises(KubeLaunchError, match="gang acme/fifth: pod fifth-worker-0 Failed"):
        await launcher(api, k8s, sleep=kubelet_failing(k8s, "fifth-worker-0")).launch(
            placement("fifth")
        )


def kubelet_failing(k8s: Emulator, pod: str) -> Callable[[float], object]:
    async def step(_: float) -> None:
        await k8s.run_pods("node-x", "Failed", only=pod)

    return step


@pytest.mark.parametrize(
    ("phases", "authoritative", "expected"),
    [
        ({"a": "Running", "b": "Running"}, False, True),
        ({"a": "Running", "b": "Pending"}, True, False),
        ({"a": "Running"}, False, False),  # b not seen yet
        ({"a": "Running"}, True, "gang t/j: pod b disappeared"),
        (
            {"a": "Succeeded", "b": "Running"},
            False,
            "gang t/j: pod a Succeeded before the gang ran",
        ),
        ({"a": "Running", "b": "Failed"}, False, "gang t/j: pod b Failed before the gang ran"),
    ],
)
def test_run_start(phases: dict[str, str], authoritative: bool, expected: bool | str) -> None:
    state = run_start(phases, frozenset({"a", "b"}), authoritative, "t/j")
    if isinstance(expected, str):
        assert isinstance(state, KubeLaunchError) and str(state) == expected
    else:
        assert state is expected
