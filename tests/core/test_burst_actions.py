"""The one burst action executor: each action becomes its pool call, a port failure comes
back as a message, and ``run_now`` runs a synchronous port without an event loop."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

import pytest

from broker.core.burst import POOL_LABEL, Action, LabelNode, RemoveNode, ScaleTo
from broker.core.burst_actions import OnClock, carry_out, run_now


class Recorder:
    """A timed pool that records its calls; ``fail`` makes every call raise."""

    def __init__(self, fail: bool = False) -> None:
        self.calls: list[tuple[object, ...]] = []
        self.fail = fail

    def _call(self, *call: object) -> int:
        if self.fail:
            raise ValueError(f"{call[0]} refused")
        self.calls.append(call)
        return 0

    def scale_to(self, replicas: int, now: float) -> int:
        return self._call("scale_to", replicas, now)

    def cancel_coming(self, count: int, now: float) -> int:
        return self._call("cancel_coming", count, now)

    def remove_node(self, node: str, now: float) -> int:
        return self._call("remove_node", node, now)

    def label_node(self, node: str, labels: Mapping[str, str]) -> None:
        self._call("label_node", node, dict(labels))


ACTIONS: list[tuple[Action, tuple[object, ...]]] = [
    (ScaleTo("p", 3, 2, "for g", "g"), ("scale_to", 3, 7.0)),
    (ScaleTo("p", 1, -2, "not needed"), ("cancel_coming", 2, 7.0)),
    (RemoveNode("p", "c", "n-1"), ("remove_node", "n-1", 7.0)),
    (LabelNode("p", "c", "n-2"), ("label_node", "n-2", {POOL_LABEL: "p"})),
]


@pytest.mark.parametrize(("action", "call"), ACTIONS)
def test_each_action_becomes_its_pool_call(action: Action, call: tuple[object, ...]) -> None:
    pool = Recorder()
    assert run_now(carry_out(action, OnClock(pool, lambda: 7.0), (ValueError,))) is None
    assert pool.calls == [call]


def test_a_port_failure_comes_back_as_its_message() -> None:
    port = OnClock(Recorder(fail=True), lambda: 0.0)
    failure = run_now(carry_out(ScaleTo("p", 1, 1, "x"), port, (ValueError,)))
    assert failure == "scale_to refused"


def test_the_same_executor_runs_on_an_event_loop() -> None:
    pool = Recorder()
    done = asyncio.run(carry_out(RemoveNode("p", "c", "n"), OnClock(pool, lambda: 1.0), ()))
    assert done is None and pool.calls == [("remove_node", "n", 1.0)]


def test_run_now_refuses_a_coroutine_that_suspends() -> None:
    async def suspends() -> None:
        await asyncio.sleep(0)

    with pytest.raises(RuntimeError, match="suspended"):
        run_now(suspends())
