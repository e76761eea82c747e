"""The one launch-failure path (invariant 9), through the Service with simulated clusters and
a launcher that fails on cue: any exception while launching (a ``LaunchError`` or any
other: a ValueError from a client model, a KeyError of ours), a run that can no longer be
followed (a callback's error, a watch that cannot start, a ``finished`` that raises) and a
delete that fails all end with the reservation (or bound usage) released, the job's
objects deleted and the job backed off on the injected clock, said once in the log and
counted in ``fedbroker_launch_failures_total``; a permanent refusal fails the job at the
scheduler's ``launchRefusalLimit``."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from builders import Clock, until

from adapters.simulated import SimulatedLauncher
from broker.config import parse_config
from broker.manifest import parse_manifest
from broker.model import Placement
from broker.ports import LaunchError, RunEnd, RunHandle
from broker.service.facade import Service

T0 = 10_000.0
KEY = "team-a/train"
SECRET = "s3cr3t-member-address-10.0.0.1"
CONFIG = """
store: {{url: "sqlite:///{db}"}}
scheduler: {{launchRefusalLimit: {limit}}}
clusters:
- name: a
  source:
    simulated: {{shapes: [{{gpuType: A100, gpus: 8, cpu: "96", memory: 1024Gi, count: 1}}]}}
queues:
- {{name: training, policy: gang}}
tenants:
- {{name: team-a, defaultQueue: training, token: {{value: tok-a-00000000000000000000000000}}}}
"""


class Scripted(SimulatedLauncher):
    """The simulated launcher, failing on cue: ``launch_errors`` raised by the next
    launches, ``delete_errors`` by the next deletes; ``lose`` breaks a running job's watch
    (its callback gets a ``RunEnd.error``); ``unwatchable`` jobs' watches cannot start."""

    def __init__(self) -> None:
        super().__init__()
        self.launch_errors: list[Exception] = []
        self.delete_errors: list[Exception] = []
        self.unwatchable: set[str] = set()
        self.watching: dict[str, Callable[[RunEnd], None]] = {}

    async def launch(self, placement: Placement) -> None:
        if self.launch_errors:
            raise self.launch_errors.pop(0)
        await super().launch(placement)

    async def delete(self, placement: Placement) -> None:
        await super().delete(placement)
        if self.delete_errors:
            raise self.delete_errors.pop(0)

    def watch(self, placement: Placement, on_end: Callable[[RunEnd], None]) -> RunHandle:
        if placement.job in self.unwatchable:
            raise KeyError(placement.job)
        self.watching[placement.job] = on_end
        return super().watch(placement, on_end)

    def lose(self, job: str, error: Exception) -> None:
        self.watching.pop(job)(RunEnd(False, error=error))


class Finishing:
    """A launcher that reports ends only by ``finished`` (a ``RunWatcher``, no ``watch``),
    whose ``finished`` raises when ``lose`` is called."""

    def __init__(self) -> None:
        self.lost: dict[str, asyncio.Future[None]] = {}
        self.deleted: list[str] = []

    async def launch(self, placement: Placement) -> None:
        return None

    async def delete(self, placement: Placement) -> None:
        self.deleted.append(placement.job)

    async def finished(self, placement: Placement) -> RunEnd:
        lost = self.lost.setdefault(placement.job, asyncio.get_running_loop().create_future())
        await lost
        raise AssertionError("unreachable: lost raises")  # pragma: no cover

    def lose(self, job: str, error: Exception) -> None:
        self.lost[job].set_exception(error)


def manifest() -> Any:
    body = {
        "apiVersion": "fedbroker.io/v1alpha1", "kind": "FederatedJob",
        "metadata": {"name": "train"},
        "spec": {"podSets": [{"name": "w", "count": 2,
                              "resources": {"nvidia.com/gpu": 4, "cpu": "1", "memory": "1Gi"}}]},
    }  # fmt: skip
    return parse_manifest(json.dumps(body).encode(), "application/json")


def free_gpus(service: Service) -> float:
    return service.ledger.snapshot().clusters["a"].free_milli() / 1000


def failures(service: Service, stage: str, cause: str) -> float:
    labels = {"cluster": "a", "stage": stage, "cause": cause}
    return service.metrics.registry.get_sample_value("fedbroker_launch_failures_total", labels) or 0


@pytest.fixture
def clock() -> Clock:
    return Clock(T0)


def broker(tmp_path: Path, clock: Clock, launcher: Any, limit: int = 3) -> Service:
    text = CONFIG.format(db=tmp_path / "jobs.db", limit=limit)
    return Service(parse_config(text, "test config"), clock=clock, launcher=launcher)


@pytest.fixture
async def scripted(tmp_path: Path, clock: Clock) -> AsyncIterator[tuple[Service, Scripted]]:
    launcher = Scripted()
    service = broker(tmp_path, clock, launcher)
    await service.start()
    try:
        yield service, launcher
    finally:
        await service.close()


async def placed_and_done(service: Service) -> None:
    await service.schedule_once()
    assert (await service.get("team-a", "train")).state in ("Placed", "Running", "Queued")
    await service.launches_done(timeout=10)


LAUNCH_ERRORS = [
    pytest.param(ValueError(f"limits.nvidia.com/gpu: not a string {SECRET}"),
                 "launch failed: unexpected ValueError (see the broker's log)", "error",
                 id="a client model's ValueError"),
    pytest.param(KeyError(SECRET), "launch failed: unexpected KeyError (see the broker's log)",
                 "error", id="a KeyError of ours"),
    pytest.param(LaunchError("create pod x: HTTP 503 ServiceUnavailable after 5 attempts"),
                 "launch failed: create pod x: HTTP 503 ServiceUnavailable after 5 attempts",
                 "transient", id="a transient LaunchError"),
]  # fmt: skip


@pytest.mark.parametrize(("error", "reason", "cause"), LAUNCH_ERRORS)
async def test_any_exception_while_launching_backs_the_job_off(
    scripted: tuple[Service, Scripted], clock: Clock, caplog: pytest.LogCaptureFixture,
    error: Exception, reason: str, cause: str,
) -> None:  # fmt: skip
    service, launcher = scripted
    launcher.launch_errors.append(error)
    await service.submit("team-a", manifest())
    with caplog.at_level(logging.INFO, logger="broker.service"):
        await placed_and_done(service)
    record = await service.get("team-a", "train")
    assert (record.state, record.attempts, record.not_before) == ("Queued", 1, T0 + 60)
    assert record.reason == f"{reason}; retry in 60s"
    assert SECRET not in record.reason  # only a LaunchError's text reaches the history
    assert free_gpus(service) == 8 and not service.ledger.reservations()
    assert service.lifecycle.get(KEY) is None and KEY in launcher.deleted
    assert failures(service, "launch", cause) == 1
    said = [r for r in caplog.records if r.name == "broker.service.failures"]
    assert len(said) == 1 and f"job {KEY} in a: launch {cause}" in said[0].getMessage()
    assert (said[0].exc_info is not None) == (cause == "error")  # a traceback for ours
    clock.now = T0 + 59
    await service.schedule_once()
    assert (await service.get("team-a", "train")).state == "Queued"
    clock.now = T0 + 60  # the backoff over, the launcher healthy: it runs
    await placed_and_done(service)
    assert (await service.get("team-a", "train")).state == "Running"
    assert free_gpus(service) == 0


async def test_a_permanent_refusal_fails_the_job_at_the_limit(tmp_path: Path, clock: Clock) -> None:
    launcher = Scripted()
    service = broker(tmp_path, clock, launcher, limit=2)
    refusal = "create pod train-w-0: HTTP 422 Invalid: spec.restartPolicy: Unsupported value"
    launcher.launch_errors += [LaunchError(refusal, permanent=True) for _ in range(2)]
    await service.start()
    try:
        await service.submit("team-a", manifest())
        await placed_and_done(service)
        record = await service.get("team-a", "train")
        assert record.state == "Queued" and free_gpus(service) == 8
        assert record.reason == f"launch refused by a: {refusal}; refusal 1 of 2; retry in 60s"
        clock.now = record.not_before or 0.0
        await placed_and_done(service)
        record = await service.get("team-a", "train")
        assert (record.state, record.attempts) == ("Failed", 2)
        assert record.reason == f"launch refused by a: {refusal}; refused 2 times"
        assert free_gpus(service) == 8 and service.queue.get(KEY) is None
        assert failures(service, "launch", "refused") == 2
    finally:
        await service.close()


async def running(service: Service) -> None:
    await service.submit("team-a", manifest())
    await placed_and_done(service)
    assert (await service.get("team-a", "train")).state == "Running"
    assert free_gpus(service) == 0


async def rolled_back_from_running(service: Service, clock: Clock, said: str) -> None:
    """The run watch failed: the job is back in its queue with backoff, its GPUs free."""
    await service.runs_done(timeout=10)
    record = await service.get("team-a", "train")
    assert (record.state, record.attempts, record.not_before) == ("Queued", 1, clock.now + 60)
    assert record.reason == f"run no longer followed in a: {said}; retry in 60s"
    assert free_gpus(service) == 8 and service.lifecycle.get(KEY) is None
    assert failures(service, "follow", "error") == 1


@pytest.mark.parametrize("how", ["its callback is told", "its watch cannot start"])
async def test_a_run_no_longer_followed_is_rolled_back(
    scripted: tuple[Service, Scripted], clock: Clock, how: str
) -> None:
    service, launcher = scripted
    if how == "its watch cannot start":
        launcher.unwatchable.add(KEY)
        await service.submit("team-a", manifest())
        await placed_and_done(service)  # Running, then at once no longer followed
    else:
        await running(service)
        clock.now += 30
        launcher.lose(KEY, RuntimeError(SECRET))
    await rolled_back_from_running(
        service,
        clock,
        "unexpected "
        + ("KeyError" if how == "its watch cannot start" else "RuntimeError")
        + " (see the broker's log)",
    )
    assert KEY in launcher.deleted
    launcher.unwatchable.clear()
    clock.now += 60
    await placed_and_done(service)  # placed again once the backoff is over: it runs
    assert (await service.get("team-a", "train")).state == "Running"


async def test_a_finished_that_raises_rolls_the_run_back(tmp_path: Path, clock: Clock) -> None:
    launcher = Finishing()
    service = broker(tmp_path, clock, launcher)
    await service.start()
    try:
        await running(service)
        await until(lambda: KEY in launcher.lost)
        launcher.lose(KEY, LaunchError("list pods: HTTP 403 Forbidden"))
        await service.runs_done(timeout=10)
        record = await service.get("team-a", "train")
        assert record.reason == "run no longer followed in a: list pods: HTTP 403 Forbidden; " \
            "retry in 60s"  # fmt: skip
        assert free_gpus(service) == 8 and launcher.deleted == [KEY]
        assert failures(service, "follow", "transient") == 1
    finally:
        await service.close()


async def test_a_delete_that_fails_still_releases_the_reservation(
    scripted: tuple[Service, Scripted], caplog: pytest.LogCaptureFixture
) -> None:
    service, launcher = scripted
    launcher.launch_errors.append(LaunchError("pod train-w-1 Failed before the gang ran"))
    launcher.delete_errors.append(RuntimeError("the client choked"))
    await service.submit("team-a", manifest())
    await placed_and_done(service)
    record = await service.get("team-a", "train")
    assert record.state == "Queued" and record.attempts == 1
    assert free_gpus(service) == 8 and not service.ledger.reservations()
    assert failures(service, "delete", "error") == 1
    assert "could not delete team-a/train in a now" in caplog.text
