"""The burst action executor: carries out one controller action through a pool's port.

``BurstController.tick`` only decides; ``carry_out`` turns each of its actions into the one
``broker.ports.ScalePool`` call it stands for, for every driver alike: the service awaits it
on the event loop for a Cluster API or wall-clock simulated pool, the replay runs it to
completion at once (``run_now``) for a simulated pool on its virtual clock.

Why one async executor and ``run_now`` rather than a sync and an async copy: the port is
async because real pools do I/O; a port whose calls never suspend (the replay's simulated
pool) completes on the coroutine's first step, so ``run_now`` drives it without an event
loop and the executor stays written once. A port that does suspend is a programming error
there, and ``run_now`` says so instead of hanging.

A failure is the port's error (after its own bounded retries): the executor returns its
message and the caller reports it with ``BurstController.failed`` (under its lock, if any).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Coroutine, Mapping
from typing import Any, Protocol, TypeVar, assert_never

from broker.core.burst import POOL_LABEL, Action, LabelNode, RemoveNode, ScaleTo
from broker.ports import ScalePool

log = logging.getLogger(__name__)

T = TypeVar("T")


async def carry_out(
    action: Action, port: ScalePool, errors: tuple[type[Exception], ...]
) -> str | None:
    """Carry out ``action`` on ``port``; None when done, else why not (one of ``errors``,
    the port's failures, was raised)."""
    try:
        if isinstance(action, ScaleTo) and action.delta < 0:
            # Only machines not up yet: never a node that may run pods.
            await port.cancel_coming(-action.delta)
        elif isinstance(action, ScaleTo):
            await port.scale_to(action.replicas)
            log.info("pool %s scaled to %d: %s", action.pool, action.replicas, action.reason)
        elif isinstance(action, LabelNode):
            await port.label_node(action.node, {POOL_LABEL: action.pool})
        elif isinstance(action, RemoveNode):
            await port.remove_node(action.node)
            log.info("pool %s: node %s removed", action.pool, action.node)
        else:
            assert_never(action)
    except errors as exc:
        log.warning("pool %s: %s", action.pool, exc)
        return str(exc)
    return None


def run_now(call: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine that never suspends (a synchronous port behind the async one) to
    completion, without an event loop."""
    try:
        call.send(None)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]
    call.close()
    raise RuntimeError("run_now: the coroutine suspended; its port is not synchronous")


class TimedPool(Protocol):
    """A pool whose calls take the time (``adapters.simulated.SimulatedPool``)."""

    def scale_to(self, replicas: int, now: float) -> int: ...

    def cancel_coming(self, count: int, now: float) -> int: ...

    def remove_node(self, node: str, now: float) -> int: ...

    def label_node(self, node: str, labels: Mapping[str, str]) -> None: ...


class OnClock:
    """A ``TimedPool`` behind the async ``ScalePool`` port, on a clock: the wall clock in
    the service, the virtual one in the replay. Its calls never suspend (see ``run_now``)."""

    def __init__(self, pool: TimedPool, clock: Callable[[], float]) -> None:
        self.pool = pool
        self._clock = clock

    async def scale_to(self, replicas: int) -> int:
        return self.pool.scale_to(replicas, self._clock())

    async def cancel_coming(self, count: int) -> int:
        return self.pool.cancel_coming(count, self._clock())

    async def remove_node(self, node: str) -> None:
        self.pool.remove_node(node, self._clock())

    async def label_node(self, node: str, labels: Mapping[str, str]) -> None:
        self.pool.label_node(node, labels)
