"""The ends of a member cluster's running gangs, from one poll for all of them (the
``broker.ports.RunNotifier`` port of ``KubeLauncher``).

A broker holding 100,000 live jobs must not hold a task per running job: each watch here is
one small record in a dict, and one task per cluster (started with the first watch, gone
with the last) reads our pods once every ``run_poll_seconds`` (the listing shared with every
other reader, ``NamespaceApi.shared_listing``) and checks each watched gang against it:
O(pods listed + pods watched) per poll, O(1) per watch and per cancel. An API error is
logged and polled again (an unreachable cluster does not end a job). A gang ends as
``run_end`` says, the same rule ``KubeLauncher.finished`` waits for.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from adapters.kube.objects import GangObjects, KubeLaunchError, pod_name
from broker.model import Placement
from broker.ports import LaunchSpec, RunEnd

log = logging.getLogger(__name__)

Listing = list[dict[str, Any]]


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


class PodSource(Protocol):
    """What the poller needs of its launcher."""

    cluster: str
    objects: GangObjects
    run_poll_seconds: float

    async def listing(self) -> Listing: ...

    def pause(self, seconds: float) -> Awaitable[None]: ...


@dataclass(slots=True)
class _Watched:
    expected: frozenset[str]
    spec: LaunchSpec
    on_end: Callable[[RunEnd], None]


class _Handle:
    """A watch's handle (``broker.ports.RunHandle``): ``cancel`` forgets it."""

    __slots__ = ("_key", "_poller")

    def __init__(self, poller: RunPoller, key: int) -> None:
        self._poller, self._key = poller, key

    def cancel(self) -> None:
        self._poller.forget(self._key)


class RunPoller:
    """Every watched gang of one cluster, checked on one listing per poll."""

    def __init__(self, source: PodSource) -> None:
        self._source = source
        self._watched: dict[int, _Watched] = {}
        self._next_key = 0
        self._task: asyncio.Task[None] | None = None

    def __len__(self) -> int:
        return len(self._watched)

    @property
    def polling(self) -> bool:
        """A poll task is alive (there is one while any gang is watched, else none)."""
        return self._task is not None and not self._task.done()

    def watch(
        self, placement: Placement, spec: LaunchSpec, on_end: Callable[[RunEnd], None]
    ) -> _Handle:
        """Call ``on_end`` once, from the event loop, when the gang ends."""
        key, self._next_key = self._next_key, self._next_key + 1
        expected = frozenset(pod_name(p, spec) for p in placement.pods)
        self._watched[key] = _Watched(expected, spec, on_end)
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._poll(), name=f"run-ends-{self._source.cluster}")
        return _Handle(self, key)

    def forget(self, key: int) -> None:
        self._watched.pop(key, None)
        if not self._watched and self._task is not None:
            self._task.cancel()  # the last watch gone: no poll left waiting for nothing
            self._task = None

    async def _poll(self) -> None:
        source = self._source
        while self._watched:
            await source.pause(source.run_poll_seconds)
            try:
                listing = await source.listing()
            except KubeLaunchError as exc:
                log.warning("cannot read the pods of %d running gangs (%s); polling again",
                            len(self._watched), exc)  # fmt: skip
                continue
            self._check(listing)

    def _check(self, listing: Listing) -> None:
        # Indexed once per poll: each gang then looks up its own pods' names, so a poll is
        # O(pods listed + pods watched), not O(pods listed x gangs watched).
        by_name: dict[str, list[dict[str, Any]]] = {}
        for pod in listing:
            by_name.setdefault(pod["metadata"]["name"], []).append(pod)
        for key, watched in list(self._watched.items()):
            mine = [pod for name in watched.expected for pod in by_name.get(name, ())]
            try:
                phases = self._source.objects.phases(mine, watched.expected, watched.spec)
            except KubeLaunchError as exc:
                log.warning("gang %s: cannot read its pods (%s); polling again",
                            watched.spec.key, exc)  # fmt: skip
                continue
            end = run_end(phases, watched.expected)
            if end is not None and self._watched.pop(key, None) is not None:
                watched.on_end(end)


__all__ = ["PodSource", "RunPoller", "run_end"]
