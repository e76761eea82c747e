"""``KubeLauncher.watch`` (``adapters.kube.run_watch``): the ends of a member's running gangs
from one poll for all of them, against kmock over real HTTP. Each gang ends as its pods say
(every pod Succeeded; one Failed; one deleted behind our back), a gang still running is
left alone, a cancelled watch is never called, and however many gangs are watched, one task
polls them (a broker with 100,000 live jobs holds no task per running job)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest
from kmock_namespaces import NamespacedEmulator
from kubernetes.aio.client import ApiClient
from test_kube_launch import PODS, Emulator, api, k8s, kubelet, launcher, placement

from adapters.kube.run_watch import run_end
from broker.ports import RunEnd

pytestmark = pytest.mark.kmock(cls=NamespacedEmulator)
__all__ = ["api", "k8s"]  # the fixtures, imported for pytest

# What the fake kubelet does to each gang's pods once they run: phase, or None (deleted).
SCRIPT: dict[str, str | None] = {"ok": "Succeeded", "bad": "Failed", "gone": None}


def scripted(k8s: Emulator, running: set[str]) -> Callable[[float], object]:
    """A poll pause that, once ``running`` is filled, moves each scripted gang's pods."""

    async def step(_: float) -> None:
        if not running:
            await kubelet(k8s)(0.0)  # launching: bind every pod and set it Running
            return
        for (res, _ns, name), obj in list(k8s.objects.items()):
            job = name.split("-")[0]
            if res != PODS or obj.deleted or job not in SCRIPT:
                continue
            phase = SCRIPT[job]
            if phase is None:
                if name.endswith("-0"):  # one pod of the gang vanishes
                    obj.delete()
            else:
                obj.patch({"status": {"phase": phase}})

    return step


async def test_one_poll_ends_each_gang_as_its_pods_say(api: ApiClient, k8s: Emulator) -> None:
    running: set[str] = set()
    kube = launcher(api, k8s, sleep=scripted(k8s, running))
    names = ["ok", "bad", "gone", "busy", "cancelled"]
    gangs = {name: placement(name) for name in names}
    for gang in gangs.values():
        await kube.launch(gang)
    ended: dict[str, RunEnd] = {}
    done = asyncio.Event()

    def on_end(name: str) -> Callable[[RunEnd], None]:
        def record(end: RunEnd) -> None:
            assert name not in ended, f"{name} ended twice"
            ended[name] = end
            if set(SCRIPT) <= ended.keys():
                done.set()

        return record

    tasks_before = len(asyncio.all_tasks())
    handles = {name: kube.watch(gang, on_end(name)) for name, gang in gangs.items()}
    assert len(asyncio.all_tasks()) - tasks_before == 1  # one poll, not one task per gang
    assert len(kube.runs) == len(names) and kube.runs.polling
    handles["cancelled"].cancel()
    running.update(names)
    await asyncio.wait_for(done.wait(), timeout=30)

    assert ended["ok"] == RunEnd(True)
    assert (ended["bad"].succeeded, ended["bad"].reason) == (False, "PodFailed")
    assert (ended["gone"].succeeded, ended["gone"].reason) == (False, "PodDeleted")
    assert "ok-worker-0" not in (ended["bad"].message or "")
    assert "busy" not in ended and "cancelled" not in ended
    assert len(kube.runs) == 1  # only "busy" is still watched
    handles["busy"].cancel()
    assert len(kube.runs) == 0
    assert not kube.runs.polling  # the last watch gone, its poll is cancelled


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
