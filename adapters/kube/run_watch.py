"""The ends of a member cluster's running gangs, from the watch of our pods there (the
``broker.ports.RunNotifier`` port of ``KubeLauncher``).

A broker holding 100,000 live jobs must neither hold a task per running job nor list every
pod of ours on a timer (a listing of 5,000 pods costs the loop about 0.1 s; polled every 2
s on each of 20 members it was 30 % of the loop in a restart): each watch here is one small
record in a dict and one entry per pod in an index, and the cluster's ``OurPods``
(list+watch, started with the first watch, stopped with the last) says which pods changed.
O(1) per watch and per cancel, O(the pod's gang) per pod event, O(watched gangs) per
relist. A gang ends as ``run_end`` says.

A pod missing from the record ends its gang (``PodDeleted``) only when the record says so
with authority: a deletion event for it, or a list that began after the gang was watched;
a pod the watch has not yet shown (created just before the watch began) is not "gone".
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from adapters.kube.objects import GangObjects, pod_name
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


@dataclass(slots=True)
class _Watched:
    namespace: str
    expected: frozenset[str]
    spec: LaunchSpec
    on_end: Callable[[RunEnd], None]
    since: int  # the record's lists begun when the watch began


class _Handle:
    """A watch's handle (``broker.ports.RunHandle``): ``cancel`` forgets it."""

    __slots__ = ("_ends", "_key")

    def __init__(self, ends: RunEnds, key: int) -> None:
        self._ends, self._key = ends, key

    def cancel(self) -> None:
        self._ends.forget(self._key)


class RunEnds(PodListener):
    """Every watched gang of one cluster, checked when one of its pods changes."""

    def __init__(self, pods: OurPods, objects: GangObjects) -> None:
        self._pods = pods
        self._objects = objects
        pods.listener = self
        self._watched: dict[int, _Watched] = {}  # watch key -> gang
        self._by_pod: dict[PodKey, int] = {}  # each watched pod -> its gang's watch key
        self._next_key = 0

    def __len__(self) -> int:
        return len(self._watched)

    @property
    def following(self) -> bool:
        """The pods' list+watch runs (it does while any gang is watched, else not)."""
        return self._pods.running

    def watch(
        self, placement: Placement, spec: LaunchSpec, on_end: Callable[[RunEnd], None]
    ) -> _Handle:
        """Call ``on_end`` once, from the event loop, when the gang ends."""
        key, self._next_key = self._next_key, self._next_key + 1
        namespace = self._objects.namespace(spec.tenant)
        expected = frozenset(pod_name(p, spec) for p in placement.pods)
        self._watched[key] = _Watched(namespace, expected, spec, on_end, self._pods.lists_begun)
        for name in expected:
            self._by_pod[namespace, name] = key
        self._pods.start()
        if self._pods.synced:  # a gang that ended already ends now
            self._check(key, authoritative=False)
        return _Handle(self, key)

    def forget(self, key: int) -> None:
        watched = self._watched.pop(key, None)
        if watched is not None:
            self._unindex(key, watched)
        if not self._watched:
            self._pods.stop()  # the last watch gone: nothing left to follow

    # -- what the record says (PodListener) ------------------------------------------------

    def changed(self, key: PodKey, pod: PodPhase | None) -> None:
        watch_key = self._by_pod.get(key)
        if watch_key is not None:
            self._check(watch_key, authoritative=pod is None)

    def relisted(self) -> None:
        begun = self._pods.lists_begun
        for key, watched in list(self._watched.items()):
            self._check(key, authoritative=watched.since < begun)

    def _check(self, key: int, *, authoritative: bool) -> None:
        watched = self._watched.get(key)
        if watched is None:
            return
        end = run_end(self._phases(watched), watched.expected)
        if end is None or (end.reason == "PodDeleted" and not authoritative):
            return
        del self._watched[key]
        self._unindex(key, watched)
        try:
            watched.on_end(end)
        except Exception:  # one gang's callback must not stop the others' ends
            log.exception("gang %s: its end could not be handled", watched.spec.key)
        if not self._watched:
            self._pods.stop()

    def _phases(self, watched: _Watched) -> Mapping[str, str]:
        phases: dict[str, str] = {}
        spec, pods = watched.spec, self._pods.pods
        for name in watched.expected:
            pod = pods.get((watched.namespace, name))
            if pod is not None and pod.tenant == spec.tenant and pod.job == spec.job:
                phases[name] = pod.phase
        return phases

    def _unindex(self, key: int, watched: _Watched) -> None:
        for name in watched.expected:
            if self._by_pod.get((watched.namespace, name)) == key:
                del self._by_pod[watched.namespace, name]


__all__ = ["RunEnds", "run_end"]
