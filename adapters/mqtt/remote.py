"""The broker's side of pull mode: one agent-fed cluster's launcher, run watch, recovery
and pod reader, carried out by that cluster's agent through signed commands over MQTT
(the wire: ``adapters.mqtt.commands``).

``RemoteLauncher`` implements ``Launcher``, ``RunNotifier``, ``GangRecovery`` and
``PodReader`` for its cluster. Each call sends one ``Command`` (``publish``: the service's
MQTT connection, never waiting) and keeps it pending by id until the agent's final reply
(``on_reply``, from the subscription to the cluster's replies topic). A pending command is
sent again, same id, by ``resend_all`` (oldest first): the service calls it after its own
MQTT (re)connect and when the agent comes back. Nothing else is periodic.

What waits for how long: ``launch`` for as long as the caller lets it (the gang timeout
cancels it; a cancelled launch is forgotten, never resent); ``delete`` up to
``Timeouts.delete``, not at all while ``heard`` says the agent is away (past it a
``LaunchError``, the command kept pending and resent); ``read_back``, ``collect``,
``pods`` and ``logs`` up to ``Timeouts.read`` (forgotten past it); a ``watch`` until the
job ends (kept pending, so a restarted agent is asked again to follow every running job;
``cancel`` on its handle forgets it, sending nothing).

A reply is trusted only when signed with the cluster's command key and naming this
cluster; a final reply for an id no longer waited for is ignored, except a refusal, which
is always recorded (``refusals``, ``on_refused``, one warning line without secrets).
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from adapters.mqtt.commands import (
    Command,
    CommandError,
    Op,
    Reply,
    bound_of,
    commands_topic,
    decode_reply,
    encode_command,
    end_of,
    found_of,
    log_request_doc,
    placement_doc,
    row_of,
    spec_doc,
)
from broker.model import Placement, PodBound
from broker.ports import (
    LaunchError,
    LaunchSpec,
    LogRequest,
    PodNotFound,
    PodReadError,
    PodRow,
    RunEnd,
    WorkloadFound,
)

log = logging.getLogger(__name__)

Publish = Callable[[str, bytes], object]
"""Queue ``payload`` on the topic ``suffix`` (below the service's prefix), never waiting;
False when it could not (a full outbox)."""


@dataclass(frozen=True, slots=True)
class Timeouts:
    """Seconds the broker waits for an agent's final reply (see the module doc)."""

    delete: float = 30.0
    read: float = 30.0


class AgentError(LaunchError):
    """The agent answered ``failed`` or ``refused``, or did not answer in time;
    ``not_found``: the pod or container named is not the job's."""

    def __init__(self, message: str, *, permanent: bool = False, not_found: bool = False):
        super().__init__(message, permanent=permanent)
        self.not_found = not_found


@dataclass(slots=True)
class _Pending:
    command: Command
    future: asyncio.Future[Reply] | None = None  # a caller awaiting the final reply
    on_end: Callable[[RunEnd], None] | None = None  # a run watch
    accepted: bool = False


class _Watch:
    """A run watch's handle: ``cancel`` forgets the pending watch (nothing is sent)."""

    __slots__ = ("id", "remote")

    def __init__(self, remote: RemoteLauncher, command_id: str) -> None:
        self.remote, self.id = remote, command_id

    def cancel(self) -> None:
        self.remote.pending.pop(self.id, None)


class _Text:
    """A log read through the agent: its text, at once (the agent never follows)."""

    def __init__(self, data: bytes) -> None:
        self._data = data

    async def _chunks(self) -> AsyncIterator[bytes]:
        if self._data:
            yield self._data

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self._chunks()

    async def aclose(self) -> None:
        self._data = b""


class RemoteLauncher:
    """One agent-fed cluster's launcher, run watch, recovery and pod reader (see the
    module doc). ``spec_for``: what a launch needs besides the placement (the service's
    ``Binding.launch_spec``)."""

    def __init__(
        self,
        cluster: str,
        key: bytes,
        publish: Publish,
        spec_for: Callable[[Placement], LaunchSpec],
        *,
        timeouts: Timeouts = Timeouts(),
        clock: Callable[[], float] = time.time,
        on_refused: Callable[[Reply], None] | None = None,
        heard: Callable[[], bool] | None = None,
    ) -> None:
        self.cluster = cluster
        self._key = key
        self._publish = publish
        self._spec_for = spec_for
        self.timeouts = timeouts
        self._clock = clock
        self._on_refused = on_refused
        # Whether the agent is heard now (None: assume so): a deletion does not wait for an
        # agent known to be away (the caller may hold the broker's lock), it is resent.
        self._heard = heard
        self.pending: dict[str, _Pending] = {}  # by id, oldest first
        self.refusals = 0
        self.rejected = 0  # replies unsigned, malformed, or for another cluster
        self._workloads: dict[str, WorkloadFound] | None = None  # from the last read_back

    # -- the wire ------------------------------------------------------------------------

    def _send(self, command: Command) -> bool:
        """False when the connection's outbox is full (the command stays pending)."""
        fresh = replace(command, at=self._clock())
        return (
            self._publish(commands_topic(self.cluster), encode_command(fresh, self._key))
            is not False
        )

    def _command(self, op: Op, job: str = "", generation: int = 0, **body: Any) -> Command:
        return Command(uuid.uuid4().hex, self.cluster, op, job, generation, 0.0, body)

    def resend_all(self) -> int:
        """Send every pending command again, oldest first (same ids); how many went. Once
        the outbox is full the rest wait (pending) for the next resend, said once."""
        sent = 0
        for pending in list(self.pending.values()):
            if not self._send(pending.command):
                log.warning(
                    "cluster %s: MQTT outbox full; %d commands wait for the next resend",
                    self.cluster, len(self.pending) - sent,
                )  # fmt: skip
                break
            sent += 1
        return sent

    def on_reply(self, payload: bytes) -> bool:
        """One message of the cluster's replies topic; True when it answers a command
        pending now (signed with the cluster's key, naming it): proof the agent is there
        (an old reply replayed, say by a persistent session, proves nothing)."""
        try:
            reply = decode_reply(payload, self._key)
        except CommandError as exc:
            self.rejected += 1
            log.warning("cluster %s: reply rejected: %s", self.cluster, exc)
            return False
        if reply.cluster != self.cluster:
            self.rejected += 1
            log.warning("cluster %s: reply names cluster %r", self.cluster, reply.cluster[:64])
            return False
        pending = self.pending.get(reply.id)
        if reply.status == "refused":
            self._refused(reply, pending)
        if pending is None or pending.command.op != reply.op:
            return False  # no longer waited for (or not this command's)
        if not reply.final:
            pending.accepted = True
            return True
        del self.pending[reply.id]
        if pending.future is not None and not pending.future.done():
            pending.future.set_result(reply)
        elif pending.on_end is not None:
            pending.on_end(self._end(reply))
        return True

    def _refused(self, reply: Reply, pending: _Pending | None) -> None:
        self.refusals += 1
        job = pending.command.job if pending is not None else ""
        log.warning(
            "cluster %s: its agent refused %s %s: %s",
            self.cluster, reply.op[:32], job or reply.id[:64], reply.error[:512],
        )  # fmt: skip
        if self._on_refused is not None:
            self._on_refused(reply)

    def _end(self, reply: Reply) -> RunEnd:
        """A watch's final reply as the run's end; a failure is a lost follow."""
        if reply.status == "done":
            end = reply.result.get("end")
            if isinstance(end, Mapping):
                try:
                    return end_of(end, AgentError)
                except (TypeError, ValueError):
                    pass
            return RunEnd(False, error=AgentError(f"cluster {self.cluster}: a malformed end"))
        return RunEnd(False, error=self._error(reply))

    def _error(self, reply: Reply) -> AgentError:
        """The agent's own words (the job's history names the cluster already)."""
        said = reply.error or f"its agent answered {reply.status}"
        permanent = reply.permanent or reply.status == "refused"
        return AgentError(said, permanent=permanent, not_found=reply.result.get("notFound") is True)

    async def _ask(self, command: Command, timeout: float | None, *, keep: bool = False) -> Reply:
        """Send ``command`` and await its final reply. Past ``timeout`` (TimeoutError) or
        when the caller is cancelled the command is forgotten, unless ``keep``: it stays
        pending (resent) with no one awaiting it."""
        future: asyncio.Future[Reply] = asyncio.get_running_loop().create_future()
        self.pending[command.id] = _Pending(command, future)
        self._send(command)
        try:
            done, _ = await asyncio.wait({future}, timeout=timeout)
        except asyncio.CancelledError:
            self.pending.pop(command.id, None)
            raise
        if done:
            return future.result()
        if keep and command.id in self.pending:
            self.pending[command.id].future = None
        else:
            self.pending.pop(command.id, None)
        raise TimeoutError

    async def _read(self, op: Op, **body: Any) -> Mapping[str, Any]:
        """A bounded request's result; ``AgentError`` when it failed or timed out."""
        try:
            reply = await self._ask(self._command(op, **body), self.timeouts.read)
        except TimeoutError:
            raise AgentError(f"its agent did not answer in {self.timeouts.read:g} s") from None
        if reply.status != "done":
            raise self._error(reply)
        return reply.result

    # -- Launcher, RunNotifier ------------------------------------------------------------

    def _job_command(self, op: Op, placement: Placement) -> Command:
        spec = self._spec_for(placement)
        body = {"placement": placement_doc(placement), "spec": spec_doc(spec)}
        return self._command(op, placement.job, spec.generation, **body)

    async def launch(self, placement: Placement) -> None:
        reply = await self._ask(self._job_command("launch", placement), None)
        if reply.status != "done":
            raise self._error(reply)

    async def delete(self, placement: Placement) -> None:
        command = self._job_command("delete", placement)
        away = self._heard is not None and not self._heard()
        try:
            reply = await self._ask(command, 0 if away else self.timeouts.delete, keep=True)
        except TimeoutError:
            raise AgentError(
                f"cluster {self.cluster}: its agent did not answer the deletion; it is "
                "resent when the agent returns"
            ) from None
        if reply.status != "done":
            raise self._error(reply)

    def watch(self, placement: Placement, on_end: Callable[[RunEnd], None]) -> _Watch:
        command = self._job_command("watch", placement)
        self.pending[command.id] = _Pending(command, on_end=on_end)
        self._send(command)
        return _Watch(self, command.id)

    # -- GangRecovery ---------------------------------------------------------------------

    async def read_back(self) -> dict[str, list[PodBound]]:
        result = await self._read("read_back")
        try:
            pods = {
                str(job): [bound_of(self.cluster, p) for p in bound]
                for job, bound in result.get("pods", {}).items()
            }
            self._workloads = {
                str(job): found_of(self.cluster, doc)
                for job, doc in result.get("workloads", {}).items()
            }
        except (AttributeError, KeyError, TypeError, ValueError) as exc:
            raise AgentError(f"cluster {self.cluster}: a malformed read_back ({exc})") from None
        return pods

    async def read_back_workloads(self) -> dict[str, WorkloadFound]:
        """The workloads of the last ``read_back`` (one command answers both)."""
        if self._workloads is None:
            await self.read_back()
        found, self._workloads = self._workloads or {}, None
        return found

    async def collect_garbage(self, live_jobs: set[str]) -> list[str]:
        result = await self._read("collect", live=sorted(live_jobs))
        deleted = result.get("deleted", [])
        return [str(x) for x in deleted] if isinstance(deleted, list) else []

    # -- PodReader ------------------------------------------------------------------------

    async def pods(self, cluster: str, spec: LaunchSpec) -> list[PodRow]:
        try:
            result = await self._read("pods", spec=spec_doc(spec))
        except AgentError as exc:
            raise PodReadError(f"cluster {self.cluster}: {exc}") from None
        try:
            return [row_of(doc) for doc in result.get("pods", [])]
        except (AttributeError, KeyError, TypeError, ValueError):
            raise PodReadError(f"cluster {self.cluster}: a malformed pod list") from None

    async def logs(self, cluster: str, spec: LaunchSpec, request: LogRequest) -> _Text:
        body = {"spec": spec_doc(spec), "request": log_request_doc(request)}
        try:
            result = await self._read("logs", **body)
        except AgentError as exc:
            if exc.not_found:
                raise PodNotFound(str(exc)) from None
            raise PodReadError(f"cluster {self.cluster}: {exc}") from None
        data = result.get("data", "")
        return _Text(data.encode("utf-8", "replace") if isinstance(data, str) else b"")


__all__ = ["AgentError", "Publish", "RemoteLauncher", "Timeouts"]
