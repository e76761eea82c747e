"""Leader election: with several replicas on one store, exactly one places jobs.

This module owns who may place. ``Elector`` is the interface (acquire, renew, release, and
the last holder seen); three implementations:

- ``PostgresLease``: a lease row in the ``leases`` table (store migration 3: name, holder,
  expires_at). Acquiring is ONE statement, an upsert that takes the row only when it has
  expired or is already ours, timed by the DATABASE's clock (``now()``), so the replicas'
  clocks never matter. Renewing is an UPDATE of our own unexpired row only: a lease that
  was lost (stolen after expiry, deleted) is never silently taken back by a renewal.
- ``FileLock``: SQLite (one machine). An exclusive ``flock`` on ``<db file>.leader``; the
  kernel drops it the moment the holding process dies, so a restarted broker leads at once
  and a second process on the same file is a follower (reads only) instead of a second
  writer. No lease timings apply.
- ``AlwaysLeader``: one replica by construction (an in-memory SQLite store, tests, or
  ``leaderElection.enabled: false``, where the operator promises a single replica).

``Leadership`` drives an elector: a candidate tries to acquire every ``renew`` seconds; a
leader renews every ``renew`` seconds and steps down at once when the lease is lost, or when
no renewal has succeeded for ``stop_after`` seconds (counted from the START of the last
successful renewal, so before the database's lease, which runs from a later ``now()``,
expires: a partitioned old leader stops at 10 s, a new one can start only after 15 s). Each
call to the store is bounded by a timeout; the clock (monotonic seconds) and sleep are
injected for tests.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import socket
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Final, Protocol

from broker.store import StoreUnavailable

log = logging.getLogger(__name__)

LEASE_NAME: Final = "scheduler"


class Elector(Protocol):
    """Who holds the right to place. ``holder`` is the last holder seen (None: nobody, or
    not known yet); ``identity`` names this replica (its advertised address when known)."""

    identity: str
    holder: str | None
    # True: the right lapses unless renewed (a lease); False: held until released or the
    # process dies (a file lock, a single replica).
    expires: bool

    async def acquire(self) -> bool:
        """Take the lease if it is free, expired or ours already; True when we hold it."""
        ...

    async def renew(self) -> bool:
        """Extend our unexpired lease; False when it is no longer ours (raises when the
        store cannot be reached: the caller keeps trying until its stop-after limit)."""
        ...

    async def release(self) -> None:
        """Give the lease up (clean shutdown): another replica can take it at once."""
        ...


class LeaseStore(Protocol):
    """What PostgresLease needs from the store (broker.store.postgres.PostgresStore)."""

    async def acquire_lease(self, name: str, holder: str, seconds: float) -> str | None: ...
    def fence(self, lease: str, holder: str) -> None: ...
    async def renew_lease(self, name: str, holder: str, seconds: float) -> str | None: ...
    async def release_lease(self, name: str, holder: str) -> None: ...


def default_identity(port: int | None = None) -> str:
    """``hostname:port`` (the advertised address): unique per live replica, since two
    processes cannot listen on one host and port, and stable across a restart of the same
    replica, which may then take its own lease back without waiting for it to expire.
    ``FEDBROKER_ADVERTISE_HOST`` replaces the hostname where other replicas cannot resolve
    it (a Kubernetes pod: its IP, from the downward API), so followers can forward writes."""
    host = os.environ.get("FEDBROKER_ADVERTISE_HOST") or socket.gethostname() or "localhost"
    return f"{host}:{port}" if port else f"{host}:pid{os.getpid()}"


class AlwaysLeader:
    """A single replica: always the leader."""

    expires = False

    def __init__(self, identity: str) -> None:
        self.identity = identity
        self.holder: str | None = identity

    async def acquire(self) -> bool:
        return True

    async def renew(self) -> bool:
        return True

    async def release(self) -> None:
        return None


class PostgresLease:
    """A lease row in PostgreSQL, timed by the database's clock."""

    expires = True

    def __init__(
        self, store: LeaseStore, identity: str, lease_seconds: float, name: str = LEASE_NAME
    ) -> None:
        self._store = store
        self.identity = identity
        self.lease_seconds = lease_seconds
        self.name = name
        self.holder: str | None = None

    async def acquire(self) -> bool:
        self.holder = await self._store.acquire_lease(self.name, self.identity, self.lease_seconds)
        won = self.holder == self.identity
        if won:  # the store refuses job writes from now on unless the lease is still ours
            self._store.fence(self.name, self.identity)
        return won

    async def renew(self) -> bool:
        self.holder = await self._store.renew_lease(self.name, self.identity, self.lease_seconds)
        return self.holder == self.identity

    async def release(self) -> None:
        await self._store.release_lease(self.name, self.identity)
        self.holder = None


class FileLock:
    """An exclusive ``flock`` next to a SQLite file; the holder's identity is written in it."""

    expires = False

    def __init__(self, path: str, identity: str) -> None:
        self.path = path
        self.identity = identity
        self.holder: str | None = None
        self._fd: int | None = None

    async def acquire(self) -> bool:
        if self._fd is not None:
            return True
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self.holder = self._read(fd) or None
            os.close(fd)
            return False
        except BaseException:
            os.close(fd)
            raise
        os.ftruncate(fd, 0)
        os.pwrite(fd, self.identity.encode(), 0)
        self._fd, self.holder = fd, self.identity
        return True

    async def renew(self) -> bool:
        return self._fd is not None  # the kernel keeps it for as long as we live

    async def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, 0)
            os.close(fd)  # closing the descriptor drops the lock
        self.holder = None

    @staticmethod
    def _read(fd: int) -> str:
        with contextlib.suppress(OSError):
            return os.pread(fd, 512, 0).decode(errors="replace").strip()
        return ""


@dataclass(frozen=True, slots=True)
class Timings:
    lease_seconds: float = 15.0
    renew_seconds: float = 2.0
    stop_after_seconds: float = 10.0


class Leadership:
    """Drives an Elector; calls ``on_elected`` once the lease is ours (the service rebuilds
    its state there, before it places anything) and ``on_deposed`` when it is lost."""

    def __init__(
        self,
        elector: Elector,
        timings: Timings,
        on_elected: Callable[[], Awaitable[None]],
        on_deposed: Callable[[str], Awaitable[None]],
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
    ) -> None:
        self.elector = elector
        self.timings = timings
        self._on_elected = on_elected
        self._on_deposed = on_deposed
        self._clock = clock
        self._sleep = sleep
        self.held = False  # the lease is ours (the service's ``leading`` adds: state rebuilt)
        self._deadline = 0.0  # monotonic: stop placing at this time unless renewed

    @property
    def identity(self) -> str:
        return self.elector.identity

    @property
    def holder(self) -> str | None:
        return self.elector.holder

    def valid(self) -> bool:
        """The lease held, and the last renewal is recent enough to place on it."""
        if not self.elector.expires:
            return self.held
        return self.held and self._clock() < self._deadline

    async def step(self) -> None:
        """One attempt: acquire as a candidate, renew as the leader."""
        started = self._clock()
        if not self.held:
            try:
                async with asyncio.timeout(self.timings.renew_seconds):
                    won = await self.elector.acquire()
            except Exception as exc:
                log.warning("leader election: cannot reach the lease: %s", _short(exc))
                return
            if not won:
                return
            self.held = True
            self._deadline = started + self.timings.stop_after_seconds
            log.info("leader election: %s is the leader", self.identity)
            renewing = asyncio.ensure_future(self._renew_while_taking_over())
            try:
                await self._on_elected()
            except StoreUnavailable as exc:  # the database went away again: expected
                log.warning("leader election: taking over failed (%s); stepping down", exc)
                await self._step_down("taking over failed", release=True)
            except Exception:
                log.exception("leader election: taking over failed; stepping down")
                await self._step_down("taking over failed", release=True)
            finally:
                renewing.cancel()
                await asyncio.gather(renewing, return_exceptions=True)
            return
        budget = min(self.timings.renew_seconds, self._deadline - started)
        renewed: bool | None = None
        if budget > 0:
            try:
                async with asyncio.timeout(budget):
                    renewed = await self.elector.renew()
            except Exception as exc:
                log.warning("leader election: renewal failed: %s", _short(exc))
        if renewed:
            self._deadline = started + self.timings.stop_after_seconds
        elif renewed is False:
            await self._step_down(f"lease lost to {self.holder or 'nobody'}")
        elif self._clock() >= self._deadline:
            await self._step_down(f"lease not renewed within {self.timings.stop_after_seconds:g}s")

    async def _renew_while_taking_over(self) -> None:
        """Renewals every ``renew_seconds`` while ``on_elected`` rebuilds the state, which can
        outlast ``stop_after_seconds`` (100,000 jobs restored from Kubernetes members: 40-50
        s): without them the new leader stepped down as soon as it was ready, and took over
        again, and never led. A renewal that finds the lease lost ends them; the next step
        sees it and steps down."""
        while True:
            await self._sleep(self.timings.renew_seconds)
            started = self._clock()
            try:
                async with asyncio.timeout(self.timings.renew_seconds):
                    renewed = await self.elector.renew()
            except Exception as exc:
                log.warning("leader election: renewal while taking over failed: %s", _short(exc))
                continue
            if not renewed:
                return
            self._deadline = started + self.timings.stop_after_seconds

    def next_delay(self) -> float:
        if not self.held:
            return self.timings.renew_seconds
        left = self._deadline - self._clock()
        return max(0.0, min(self.timings.renew_seconds, left))

    async def run(self) -> None:
        """Campaign and renew until cancelled; the lease is released on the way out."""
        try:
            while True:
                await self.step()
                await self._sleep(self.next_delay())
        finally:
            if self.held:
                self.held = False
                with contextlib.suppress(Exception):
                    async with asyncio.timeout(self.timings.renew_seconds):
                        await self.elector.release()

    async def _step_down(self, why: str, release: bool = False) -> None:
        self.held = False
        log.warning("leader election: %s stops placing: %s", self.identity, why)
        if release:
            with contextlib.suppress(Exception):
                async with asyncio.timeout(self.timings.renew_seconds):
                    await self.elector.release()
        await self._on_deposed(why)


def _short(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


__all__ = [
    "LEASE_NAME",
    "AlwaysLeader",
    "Elector",
    "FileLock",
    "Leadership",
    "LeaseStore",
    "PostgresLease",
    "Timings",
    "default_identity",
]
