"""Our gangs' pods in a member cluster, followed through the watch of our pods there: a
starting gang confirmed running (``KubeLauncher.wait_running``) and a running gang's end
(the ``broker.ports.RunNotifier`` port of ``KubeLauncher``).

A broker holding 100,000 live jobs must neither hold a task per running job nor list every
pod of ours on a timer (a listing of 5,000 pods costs the loop about 0.1 s; polled every 2
s on each of 20 members it was 30 % of the loop in a restart): each followed gang is one
small record in a dict and one entry per pod in an index, and the cluster's ``OurPods``
(list+watch, started with the first followed gang, stopped with the last) says which pods
changed. O(1) per follow and per cancel, O(the pod's gang) per pod event, O(followed gangs)
per relist. A gang ends as ``run_end`` says, and has started as ``run_start`` says.

A pod missing from the record counts as gone only when the record says so with authority:
a deletion event for it, or a list that began after the gang was followed; a pod the watch
has not shown yet (created just before) is not "gone".

The record itself is kept whatever fails (``OurPods`` retries with backoff, relisting: a
gang is never left with nothing following it); a decision on one gang's pods that raises
ends that follow with the error (a starting gang's launch fails with it, a running gang's
``on_end`` gets a ``RunEnd.error``), so the service rolls that job back.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from adapters.kube.objects import GangObjects, KubeLaunchError, pod_name
from adapters.kube.our_pods import OurPods, PodKey, PodListener, PodPhase
from broker.model import Placement
from broker.ports import LaunchSpec, RunEnd

log = logging.getLogger(__name__)


def run_end(phases: Mapping[str, str], expected: frozenset[str]) -> RunEnd | None:
    """A running gang's end from its pods' phases, or None while it runs: failed as soon as
    one pod Failed or vanished (deleted behind our back), succeeded once every pod did."""
    failed = sorted(n for n, phase in phases.items() if phase == "Failed")
    if failed:
        return RunEnd(False, "PodFailed", f"pod {failed[0]} failed")
    missing = sorted(expected - phases.keys())
    if missing:
        return RunEnd(False, "PodDeleted", f"pod {missing[0]} disappeared")
    if all(phase == "Succeeded" for phase in phases.values()):
        return RunEnd(True)
    return None


def run_start(
    phases: Mapping[str, str], expected: frozenset[str], authoritative: bool, key: str
) -> KubeLaunchError | bool:
    """A starting gang's state from its pods' phases: True once every pod is Running, False
    while it starts, the error that fails its launch once a pod ended (Failed or Succeeded)
    before the gang ran or, by an ``authoritative`` record, vanished."""
    ended = sorted(n for n, phase in phases.items() if phase in ("Failed", "Succeeded"))
    if ended:
        return KubeLaunchError(f"gang {key}: pod {ended[0]} {phases[ended[0]]} before the gang ran")
    missing = sorted(expected - phases.keys())
    if missing:
        return (
            KubeLaunchError(f"gang {key}: pod {missing[0]} disappeared") if authoritative else False
        )
    return all(phase == "Running" for phase in phases.values())


# What a follower does with its gang's pods' phases (of the pods expected), told whether
# the record is authoritative about missing pods; True when it is done following.
Decide = Callable[[Mapping[str, str], frozenset[str], bool], bool]
# What a follower is told when deciding raised (the follow then ends).
Failed = Callable[[Exception], None]


@dataclass(slots=True)
class _Followed:
    namespace: str
    expected: frozenset[str]
    spec: LaunchSpec
    decide: Decide
    failed: Failed
    since: int  # the record's lists begun when following began


class _Handle:
    """A follow's handle (``broker.ports.RunHandle``): ``cancel`` forgets it."""

    __slots__ = ("_gangs", "_key")

    def __init__(self, gangs: GangPods, key: int) -> None:
        self._gangs, self._key = gangs, key

    def cancel(self) -> None:
        self._gangs.forget(self._key)


class GangPods(PodListener):
    """Every followed gang of one cluster, decided again when one of its pods changes."""

    def __init__(self, pods: OurPods, objects: GangObjects) -> None:
        self._pods = pods
        self._objects = objects
        pods.listener = self
        self._followed: dict[int, _Followed] = {}  # follow key -> gang
        self._by_pod: dict[PodKey, int] = {}  # each followed pod -> its gang's follow key
        self._next_key = 0

    def __len__(self) -> int:
        return len(self._followed)

    @property
    def following(self) -> bool:
        """The pods' list+watch runs (it does while any gang is followed, else not)."""
        return self._pods.running

    def watch(
        self, placement: Placement, spec: LaunchSpec, on_end: Callable[[RunEnd], None]
    ) -> _Handle:
        """Call ``on_end`` once, from the event loop, when the running gang ends."""

        def decide(
            phases: Mapping[str, str], expected: frozenset[str], authoritative: bool
        ) -> bool:
            end = run_end(phases, expected)
            if end is None or (end.reason == "PodDeleted" and not authoritative):
                return False
            on_end(end)
            return True

        def failed(exc: Exception) -> None:
            on_end(RunEnd(False, error=exc))

        return self.follow(placement, spec, decide, failed)

    def started(
        self, placement: Placement, spec: LaunchSpec
    ) -> tuple[asyncio.Future[None], _Handle]:
        """A future done when the starting gang runs (every pod Running), failed with
        ``KubeLaunchError`` as ``run_start`` says; cancel the handle when done with it."""
        running: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        def decide(
            phases: Mapping[str, str], expected: frozenset[str], authoritative: bool
        ) -> bool:
            if running.done():  # the waiter gave up (cancelled)
                return True
            state = run_start(phases, expected, authoritative, spec.key)
            if state is False:
                return False
            if isinstance(state, KubeLaunchError):
                running.set_exception(state)
            else:
                running.set_result(None)
            return True

        def failed(exc: Exception) -> None:
            if not running.done():
                running.set_exception(exc)

        return running, self.follow(placement, spec, decide, failed)

    def follow(
        self, placement: Placement, spec: LaunchSpec, decide: Decide, failed: Failed
    ) -> _Handle:
        """Call ``decide`` with the gang's pods' phases whenever one of them changes (and
        after every list) until it returns True or the handle is cancelled; ``failed``
        (and no more) if it raises."""
        key, self._next_key = self._next_key, self._next_key + 1
        namespace = self._objects.namespace(spec.tenant)
        expected = frozenset(pod_name(p, spec) for p in placement.pods)
        self._followed[key] = _Followed(
            namespace, expected, spec, decide, failed, self._pods.lists_begun
        )
        for name in expected:
            self._by_pod[namespace, name] = key
        self._pods.start()
        if self._pods.synced:  # a gang already where it is going is done now
            self._check(key, authoritative=False)
        return _Handle(self, key)

    def forget(self, key: int) -> None:
        followed = self._followed.pop(key, None)
        if followed is not None:
            self._unindex(key, followed)
        if not self._followed:
            self._pods.stop()  # the last follow gone: nothing left to follow

    # -- what the record says (PodListener) ------------------------------------------------

    def changed(self, key: PodKey, pod: PodPhase | None) -> None:
        follow_key = self._by_pod.get(key)
        if follow_key is not None:
            self._check(follow_key, authoritative=pod is None)

    def relisted(self) -> None:
        begun = self._pods.lists_begun
        for key, followed in list(self._followed.items()):
            self._check(key, authoritative=followed.since < begun)

    def _check(self, key: int, *, authoritative: bool) -> None:
        followed = self._followed.get(key)
        if followed is None:
            return
        try:
            done = followed.decide(self._phases(followed), followed.expected, authoritative)
        except Exception as exc:  # one gang's handler must not stop the others' being followed
            self.forget(key)
            try:
                followed.failed(exc)  # its owner says it (the service's one failure path)
            except Exception:
                log.exception("gang %s: what its pods did could not be handled", followed.spec.key)
            return
        if done:
            self.forget(key)

    def _phases(self, followed: _Followed) -> Mapping[str, str]:
        phases: dict[str, str] = {}
        spec, pods = followed.spec, self._pods.pods
        for name in followed.expected:
            pod = pods.get((followed.namespace, name))
            if pod is not None and pod.tenant == spec.tenant and pod.job == spec.job:
                phases[name] = pod.phase
        return phases

    def _unindex(self, key: int, followed: _Followed) -> None:
        for name in followed.expected:
            if self._by_pod.get((followed.namespace, name)) == key:
                del self._by_pod[followed.namespace, name]


__all__ = ["GangPods", "run_end", "run_start"]
