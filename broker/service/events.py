"""In-process pub/sub of job state changes and capacity changes (the source of ``/v1/events``).

``EventBus.publish`` never blocks and never fails: every subscriber has a bounded
``asyncio.Queue``; when a slow subscriber's queue is full its OLDEST event is dropped and
counted (``Subscription.dropped``, ``EventBus.dropped``), so the service never waits for a
reader. A subscription sees job events of its own tenant only (``tenant=None``: all of
them, for an admin); capacity events go to everyone (capacity is not a tenant's secret:
``/v1/clusters`` shows it to every tenant).

``PublishingStore`` is how job transitions reach the bus without the Service knowing: it
wraps the Store the Service writes through and publishes after every committed
``create_job`` (when created) and ``transition``. Every write of the Service goes through
its store, so no transition can be missed, and an event is published only after its commit.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from broker.service.active import ActiveCounts
from broker.store import (
    FINAL_STATES,
    Generation,
    JobRecord,
    JobState,
    Placing,
    Store,
    Transition,
)

EventKind = Literal["job", "capacity"]
DEFAULT_QUEUE_SIZE = 256
# A transition to or from these states changes reservations or allocations.
_HOLDS_CAPACITY: frozenset[str] = frozenset({"Placed", "Running"})
_QUEUED: tuple[JobState, ...] = ("Queued",)


@dataclass(frozen=True, slots=True)
class Event:
    id: int
    kind: EventKind
    tenant: str | None  # the job's tenant; None for capacity events (everyone sees them)
    data: Mapping[str, Any]


_CLOSED = object()  # put in a subscriber's queue when the bus closes


@dataclass(eq=False)
class Subscription:
    """One reader's bounded queue; ``tenant=None`` sees every tenant's job events."""

    tenant: str | None
    queue: asyncio.Queue[object]
    dropped: int = 0
    closed: bool = False

    def wants(self, event: Event) -> bool:
        return event.tenant is None or self.tenant is None or event.tenant == self.tenant

    def offer(self, item: object) -> bool:
        """Put without blocking; when full, drop the oldest. True when one was dropped."""
        dropped = False
        while True:
            try:
                self.queue.put_nowait(item)
                return dropped
            except asyncio.QueueFull:
                self.queue.get_nowait()
                if not dropped:
                    self.dropped += 1
                dropped = True

    async def next(self, timeout: float | None = None) -> Event | None:
        """The next event; None when the bus closed or ``timeout`` passed first."""
        if self.closed:
            return None
        try:
            item = self.queue.get_nowait()
        except asyncio.QueueEmpty:
            try:  # not wait_for: on 3.11 it may swallow a cancellation (see Cycles.run)
                async with asyncio.timeout(timeout):
                    item = await self.queue.get()
            except TimeoutError:
                return None
        if item is _CLOSED:
            self.closed = True
            return None
        assert isinstance(item, Event)
        return item


@dataclass(eq=False)
class EventBus:
    queue_size: int = DEFAULT_QUEUE_SIZE
    dropped: int = 0  # events dropped across all subscribers (for the metrics)
    published: int = 0
    _subscribers: set[Subscription] = field(default_factory=set)
    _ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1))
    _closed: bool = False

    def subscribe(self, tenant: str | None, *, queue_size: int | None = None) -> Subscription:
        """``queue_size`` 0: unbounded (a benchmark's probe, which must see every event and
        drains its queue at once); default: the bus's bound."""
        size = self.queue_size if queue_size is None else queue_size
        sub = Subscription(tenant, asyncio.Queue(maxsize=size))
        if self._closed:
            sub.closed = True
        else:
            self._subscribers.add(sub)
        return sub

    def unsubscribe(self, sub: Subscription) -> None:
        self._subscribers.discard(sub)

    @property
    def subscribers(self) -> int:
        return len(self._subscribers)

    def publish(self, kind: EventKind, tenant: str | None, data: Mapping[str, Any]) -> Event:
        event = Event(next(self._ids), kind, tenant, data)
        self.published += 1
        for sub in self._subscribers:
            if sub.wants(event) and sub.offer(event):
                self.dropped += 1
        return event

    def close(self) -> None:
        """Wake every subscriber with end-of-stream (server shutdown)."""
        self._closed = True
        for sub in self._subscribers:
            sub.offer(_CLOSED)
        self._subscribers.clear()


def job_event(record: JobRecord) -> dict[str, Any]:
    return {
        "tenant": record.tenant,
        "name": record.name,
        "queue": record.queue,
        "state": record.state,
        "cluster": record.cluster,
        "reason": record.reason,
        "attempts": record.attempts,
        "at": record.updated_at,
    }


class PublishingStore:
    """A Store that publishes each committed job change to an EventBus (a decorator)."""

    def __init__(self, inner: Store, bus: EventBus, active: ActiveCounts | None = None) -> None:
        self.inner = inner
        self.bus = bus
        self.url_for_logs = inner.url_for_logs
        # Active jobs per tenant, moved by every write below (broker.service.active).
        self.active = active if active is not None else ActiveCounts()

    def _published(self, record: JobRecord, before: JobState | None) -> None:
        self.bus.publish("job", record.tenant, job_event(record))
        if record.state in _HOLDS_CAPACITY or before in _HOLDS_CAPACITY:
            self.bus.publish("capacity", None, {"cause": f"{record.state} {record.queue}"})

    async def open(self) -> None:
        await self.inner.open()

    async def close(self) -> None:
        await self.inner.close()

    async def ping(self) -> bool:
        return await self.inner.ping()

    async def create_job(
        self,
        tenant: str,
        name: str,
        queue: str,
        priority: int,
        manifest: Mapping[str, Any],
        now: float,
        *,
        reuse_finished: bool = False,
    ) -> tuple[JobRecord, bool]:
        record, created = await self.inner.create_job(
            tenant, name, queue, priority, manifest, now, reuse_finished=reuse_finished
        )
        if created:
            self.active.created(tenant)
            self._published(record, None)
        return record, created

    async def purge_finished(self, before: float, limit: int = 1000) -> int:
        return await self.inner.purge_finished(before, limit)

    async def generations(self, tenant: str, name: str) -> list[Generation]:
        return await self.inner.generations(tenant, name)

    async def count_active(self, tenant: str) -> int:
        """O(1) once the tenant's count has been read from the store (ActiveCounts)."""
        known = self.active.get(tenant)
        if known is not None:
            return known
        counted = await self.inner.count_active(tenant)
        self.active.seed(tenant, counted)
        return counted

    async def get_job(self, tenant: str, name: str) -> JobRecord | None:
        return await self.inner.get_job(tenant, name)

    async def list_jobs(
        self,
        *,
        tenant: str | None = None,
        queue: str | None = None,
        state: JobState | Collection[JobState] | None = None,
        cluster: str | None = None,
        limit: int = 100,
        after_seq: int | None = None,
    ) -> list[JobRecord]:
        return await self.inner.list_jobs(
            tenant=tenant, queue=queue, state=state, cluster=cluster, limit=limit,
            after_seq=after_seq,
        )  # fmt: skip

    async def transition(
        self,
        tenant: str,
        name: str,
        state: JobState,
        reason: str,
        now: float,
        *,
        cluster: str | None = None,
        placement: Mapping[str, Any] | None = None,
        expect: Collection[JobState] | None = None,
        attempts: int | None = None,
        not_before: float | None = None,
    ) -> JobRecord:
        # The previous state is not returned by the store; a move into a final state or
        # back to Queued may have released capacity, so those count as capacity changes.
        record = await self.inner.transition(
            tenant, name, state, reason, now, cluster=cluster, placement=placement,
            expect=expect, attempts=attempts, not_before=not_before,
        )  # fmt: skip
        self.active.moved(tenant, state, expect)
        before: JobState | None = None
        if state in FINAL_STATES or state == "Queued":
            before = "Placed"
        self._published(record, before)
        return record

    async def history(self, tenant: str, name: str) -> list[Transition]:
        return await self.inner.history(tenant, name)

    async def transition_many(
        self, jobs: Sequence[JobRecord], state: JobState, reason: str, now: float
    ) -> list[JobRecord]:
        records = await self.inner.transition_many(jobs, state, reason, now)
        was = {job.seq: job.state for job in jobs}
        for record in records:  # as transition does, per job moved
            self.active.moved(record.tenant, state, (was[record.seq],))
            self.bus.publish("job", record.tenant, job_event(record))
        # One capacity change for the batch: it says "look again", not what changed.
        if records and (state in _HOLDS_CAPACITY or state in FINAL_STATES or state == "Queued"):
            self.bus.publish("capacity", None, {"cause": f"{state} {len(records)} jobs"})
        return records

    async def place_many(self, placings: Sequence[Placing], now: float) -> list[JobRecord]:
        records = await self.inner.place_many(placings, now)
        for record in records:  # as transition does, per job moved
            self.active.moved(record.tenant, "Placed", _QUEUED)
            self.bus.publish("job", record.tenant, job_event(record))
        if records:  # one capacity change for the cycle, as transition_many
            self.bus.publish("capacity", None, {"cause": f"Placed {len(records)} jobs"})
        return records

    async def active_jobs(
        self, *, after_seq: int | None = None, limit: int | None = None
    ) -> list[JobRecord]:
        return await self.inner.active_jobs(after_seq=after_seq, limit=limit)

    async def finished_since(self, since: float, limit: int) -> list[JobRecord]:
        return await self.inner.finished_since(since, limit)


__all__ = ["Event", "EventBus", "PublishingStore", "Subscription", "job_event"]
