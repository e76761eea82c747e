"""``Binding.retried``: a store write tried bare first, then retried while leading with the
same doubling waits as before the fast path (``STORE_RETRY_SECONDS``)."""

from __future__ import annotations

import logging
import re
from types import SimpleNamespace
from typing import cast

import pytest

from broker.service.binding import STORE_RETRY_SECONDS, Binding
from broker.service.state import Shared
from broker.store import StateConflict, StoreUnavailable


class Flaky:
    """A store call failing ``failures`` times with ``error``, then succeeding."""

    def __init__(self, failures: int, error: Exception) -> None:
        self.failures, self.error, self.calls = failures, error, 0

    async def __call__(self) -> None:
        self.calls += 1
        if self.calls <= self.failures:
            raise self.error


def binding(*, rebuilt: bool) -> Binding:
    return Binding(cast(Shared, SimpleNamespace(rebuilt=rebuilt)))


def waits(caplog: pytest.LogCaptureFixture) -> list[float]:
    return [float(m.group(1)) for r in caplog.records
            if (m := re.search(r"retrying in ([0-9.]+) s", r.getMessage()))]  # fmt: skip


async def test_a_write_that_succeeds_at_once_is_called_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    call = Flaky(0, StoreUnavailable("down"))
    await binding(rebuilt=True).retried(call, StoreUnavailable, "write")
    assert call.calls == 1 and waits(caplog) == []


async def test_failed_writes_are_retried_with_the_doubling_waits(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING)
    call = Flaky(3, StoreUnavailable("down"))
    await binding(rebuilt=True).retried(call, StoreUnavailable, "Succeeded of t/j")
    first, cap = STORE_RETRY_SECONDS
    assert call.calls == 4
    assert waits(caplog) == [first, min(cap, 2 * first), min(cap, 4 * first)]
    assert all("Succeeded of t/j" in r.getMessage() for r in caplog.records)


async def test_a_replica_not_leading_does_not_retry() -> None:
    call = Flaky(1, StoreUnavailable("down"))
    with pytest.raises(StoreUnavailable):
        await binding(rebuilt=False).retried(call, StoreUnavailable, "write")
    assert call.calls == 1


async def test_other_errors_are_not_retried() -> None:
    call = Flaky(1, StateConflict("t", "j", "Cancelled", ["Running"]))
    with pytest.raises(StateConflict):
        await binding(rebuilt=True).retried(call, StoreUnavailable, "write")
    assert call.calls == 1
