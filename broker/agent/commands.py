"""Pull mode, the agent's side: the broker's signed commands for this cluster carried out
with the same launcher the broker uses for ``kube`` members, and answered.

``CommandExecutor`` subscribes (through the agent's ``Publisher``) to
``<prefix>/agents/<cluster>/commands`` and publishes every reply, signed with the same key,
on ``<prefix>/agents/<cluster>/replies`` (``adapters.mqtt.commands`` has the wire). Per
command, in order:

1. The signature (``FEDBROKER_AGENT_KEY``): a command not signed with it is logged and
   counted (``forged``), never answered: whoever holds the key can read no reply to it,
   and a signed answer to an unsigned command would let anyone end a real command's wait.
2. Dedupe by ``id``: a command in flight gets ``accepted`` again, one finished its cached
   final (the last ``FINALS_KEPT``); the broker resends until it has a final.
3. ``broker.agent.intake``: this cluster's, recent, well formed, the tenant's namespace
   usable, a launch passing the agent's own policy; else ``refused`` naming why. A command
   too far behind the agent's clock is logged and counted (``stale``), never answered: the
   broker resends a fresh copy of every command it waits for when the agent returns, and
   the MQTT broker may hand over old copies first.
4. ``accepted``, then exactly one final: ``launch`` (``KubeLauncher.launch``: done once every
   pod runs), ``delete``, ``read_back``, ``collect``, ``pods`` and ``logs`` run one task
   each; ``watch`` is a ``KubeLauncher.watch`` callback (no task per followed job), its
   final ``done`` with the job's end.

Generations: a ``delete`` of job J at generation g cancels the launches and the watch of
J at g or before (their final: ``failed``, permanent, superseded by its deletion) and is
remembered (the last ``TOMBSTONES_KEPT`` jobs): a later launch or watch of J at g or
before is answered the same way. A new attempt (a higher generation) launches.

A log read is bounded: never followed, at most ``MAX_LOG_BYTES`` (then ``truncated``), within
``read_timeout`` seconds. Errors in replies and logs name objects and statuses, never the
key or the member's credentials.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from adapters.kube.launch import KubeLauncher
from adapters.kube.pods import KubePods
from adapters.kubeapi.calls import describe
from adapters.mqtt.commands import (
    MAX_LOG_BYTES,
    MAX_PAYLOAD,
    Command,
    CommandError,
    Reply,
    bound_doc,
    commands_topic,
    decode_command,
    encode_reply,
    end_doc,
    found_doc,
    replies_topic,
    row_doc,
    sign,
)
from adapters.mqtt.publisher import Publisher
from broker.agent.intake import Order, Refused, Stale, order_of
from broker.agent.policy import LAUNCHED_KINDS, AgentPolicy
from broker.model import Placement
from broker.ports import (
    LaunchError,
    LaunchSpec,
    PodNotFound,
    PodReadError,
    RunEnd,
    RunHandle,
)

log = logging.getLogger("broker.agent")

FINALS_KEPT = 10_000
TOMBSTONES_KEPT = 10_000
SUPERSEDED = "superseded by its deletion"


@dataclass(slots=True, eq=False)
class _Work:
    order: Order
    task: asyncio.Task[None] | None = None
    handle: RunHandle | None = None
    superseded: bool = False

    @property
    def command(self) -> Command:
        return self.order.command


@dataclass(slots=True)
class Counts:
    """What the executor met, for logs and tests."""

    forged: int = 0
    stale: int = 0
    refused: int = 0
    duplicates: int = 0
    finals: dict[str, int] = field(default_factory=dict)


class CommandExecutor:
    """One cluster's commands carried out (see the module's docstring)."""

    def __init__(
        self,
        cluster: str,
        publisher: Publisher,
        key: bytes,
        launcher: KubeLauncher,
        pods: KubePods,
        policy: AgentPolicy,
        *,
        clock: Callable[[], float] = time.time,
        read_timeout: float = 60.0,
    ) -> None:
        self.cluster = cluster
        self.publisher = publisher
        self._key = key
        self.launcher = launcher
        self.pods = pods
        self.policy = policy
        self._clock = clock
        self.read_timeout = read_timeout
        self.inflight: dict[str, _Work] = {}
        self.finals: OrderedDict[str, Reply] = OrderedDict()
        self.deleted: OrderedDict[str, int] = OrderedDict()  # job -> generation deleted
        self.watching: dict[str, _Work] = {}  # job -> its watch
        self.specs: dict[str, LaunchSpec] = {}  # job -> the spec its watch follows with
        self.counts = Counts()
        self._outbox: asyncio.Queue[Reply] = asyncio.Queue()

    def __repr__(self) -> str:  # the key stays out of every repr
        return f"CommandExecutor({self.cluster!r})"

    def subscribe(self) -> None:
        """Before the publisher starts: this cluster's commands topic."""
        self.publisher.subscribe(
            self.publisher.topic(commands_topic(self.cluster)), self.on_message
        )

    def spec_for(self, placement: Placement) -> LaunchSpec:
        """The launcher's ``spec_for``: a followed job's spec from its watch command."""
        return self.specs.get(placement.job) or LaunchSpec.of(placement)

    async def run(self) -> None:
        """Publish the replies, oldest first (``Publisher.publish`` waits for room)."""
        topic = replies_topic(self.cluster)
        while True:
            reply = await self._outbox.get()
            await self.publisher.publish(topic, encode_reply(reply, self._key))

    async def close(self) -> None:
        """Stop every launch, read and watch (the agent is stopping)."""
        tasks = [w.task for w in self.inflight.values() if w.task is not None]
        for work in list(self.inflight.values()):
            if work.handle is not None:
                work.handle.cancel()
            if work.task is not None:
                work.task.cancel()
        self.inflight.clear()
        self.watching.clear()
        await asyncio.gather(*tasks, return_exceptions=True)

    # -- intake ------------------------------------------------------------------------------

    def on_message(self, _topic: str, payload: bytes, _retained: bool) -> None:
        try:
            command = decode_command(payload, self._key)
        except CommandError as exc:
            self._undecodable(payload, exc)
            return
        if command.id in self.inflight:
            self.counts.duplicates += 1
            self._send(self._reply(command, "accepted"))
            return
        final = self.finals.get(command.id)
        if final is not None:
            self.counts.duplicates += 1
            self.finals.move_to_end(command.id)
            self._send(final)
            return
        try:
            order = order_of(command, self.cluster, self.policy, self._clock())
        except Stale as exc:
            self.counts.stale += 1
            log.warning("cluster %s: %s command %s ignored: %s", self.cluster, command.op,
                        command.id, exc)  # fmt: skip
            return
        except Refused as exc:
            self.counts.refused += 1
            log.warning("cluster %s: %s command %s for %s refused: %s", self.cluster,
                        command.op, command.id, command.job or "-", exc)  # fmt: skip
            self._final(command, self._reply(command, "refused", str(exc), permanent=True))
            return
        self._start(order)

    def _undecodable(self, payload: bytes, exc: CommandError) -> None:
        """A bad signature: logged and counted, never answered. A signed command that
        breaks the schema: refused, when its id can be read."""
        doc = _loose(payload)
        sig = doc.pop("sig", None)
        signed = isinstance(sig, str) and hmac.compare_digest(sig, sign(doc, self._key))
        if not signed:
            self.counts.forged += 1
            log.warning("cluster %s: a command not signed with this agent's key ignored: %s",
                        self.cluster, exc)  # fmt: skip
            return
        self.counts.refused += 1
        log.warning("cluster %s: command refused: %s", self.cluster, exc)
        ident, op = doc.get("id"), doc.get("op")
        if isinstance(ident, str) and 0 < len(ident) <= 1024 and ident not in self.inflight:
            op = op if isinstance(op, str) and len(op) <= 64 else "?"
            self._send(Reply(ident, self.cluster, op, "refused", str(exc), permanent=True))

    def _start(self, order: Order) -> None:
        command, job = order.command, order.job
        work = _Work(order)
        if command.op in ("launch", "watch") and self.deleted.get(job, -1) >= command.generation:
            self._final(command, self._reply(command, "failed", SUPERSEDED, permanent=True))
            return
        self.inflight[command.id] = work
        self._send(self._reply(command, "accepted"))
        match command.op:
            case "delete":
                ending = self._supersede(job, command.generation)
                self._spawn(work, lambda order: self._delete(order, ending))
            case "watch":
                self._watch(work)
            case "launch":
                self._spawn(work, self._launch)
            case "read_back":
                self._spawn(work, self._read_back)
            case "collect":
                self._spawn(work, self._collect)
            case "pods":
                self._spawn(work, self._pods)
            case "logs":
                self._spawn(work, self._logs)

    def _supersede(self, job: str, generation: int) -> list[asyncio.Task[None]]:
        """A deletion at ``generation``: the job's launches and watch at it or before end;
        returns the launches cancelled (the deletion waits for them to stop creating)."""
        ending: list[asyncio.Task[None]] = []
        self.deleted[job] = max(generation, self.deleted.get(job, -1))
        self.deleted.move_to_end(job)
        while len(self.deleted) > TOMBSTONES_KEPT:
            self.deleted.popitem(last=False)
        for work in list(self.inflight.values()):
            command = work.command
            if (
                command.op in ("launch", "watch")
                and work.order.job == job
                and command.generation <= generation
            ):
                work.superseded = True
                if work.task is not None:
                    work.task.cancel()  # its final is sent as the task ends
                    ending.append(work.task)
                if work.handle is not None:
                    work.handle.cancel()
                    self._finish(work, "failed", SUPERSEDED, permanent=True)
        return ending

    # -- carrying out ------------------------------------------------------------------------

    def _spawn(
        self, work: _Work, body: Callable[[Order], Awaitable[Mapping[str, Any] | None]]
    ) -> None:
        command = work.command
        work.task = asyncio.create_task(
            self._carry(work, body), name=f"agent {command.op} {command.id}"
        )

    async def _carry(
        self, work: _Work, body: Callable[[Order], Awaitable[Mapping[str, Any] | None]]
    ) -> None:
        try:
            result = await body(work.order)
        except asyncio.CancelledError:
            if not work.superseded:
                raise
            self._finish(work, "failed", SUPERSEDED, permanent=True)
        except LaunchError as exc:
            self._finish(work, "failed", str(exc), permanent=exc.permanent)
        except PodNotFound as exc:
            self._finish(work, "failed", str(exc), permanent=True, result={"notFound": True})
        except PodReadError as exc:  # cluster, object and HTTP status only
            self._finish(work, "failed", str(exc))
        except TimeoutError:
            why = f"cluster {self.cluster}: the agent's {work.command.op} took over "
            self._finish(work, "failed", f"{why}{self.read_timeout:g} s")
        except Exception as exc:  # the member's answer, never its credentials
            log.warning("cluster %s: %s of %s failed: %s", self.cluster, work.command.op,
                        work.order.job or "-", describe(exc))  # fmt: skip
            self._finish(work, "failed", describe(exc))
        else:
            self._finish(work, "done", result=result or {})

    async def _launch(self, order: Order) -> None:
        assert order.placement is not None and order.spec is not None
        await self.launcher.launch(order.placement, order.spec)

    async def _delete(self, order: Order, ending: list[asyncio.Task[None]]) -> None:
        assert order.placement is not None and order.spec is not None
        if ending:  # no create of a cancelled launch may land after the deletion
            await asyncio.wait(ending)
        await self.launcher.delete(order.placement, order.spec)

    async def _read_back(self, _order: Order) -> Mapping[str, Any]:
        async with asyncio.timeout(self.read_timeout):
            pods = await self.launcher.read_back()
            workloads = await self.launcher.read_back_workloads()
        return {
            "pods": {job: [bound_doc(p) for p in bound] for job, bound in pods.items()},
            "workloads": {job: found_doc(found) for job, found in workloads.items()},
        }

    async def _collect(self, order: Order) -> Mapping[str, Any]:
        return {"deleted": await self.launcher.collect_garbage(set(order.live))}

    async def _pods(self, order: Order) -> Mapping[str, Any]:
        assert order.spec is not None
        async with asyncio.timeout(self.read_timeout):
            rows = await self.pods.pods(self.cluster, order.spec)
        return {"pods": [row_doc(r) for r in rows]}

    async def _logs(self, order: Order) -> Mapping[str, Any]:
        """What the log holds now, at most ``MAX_LOG_BYTES`` of it (never followed)."""
        assert order.spec is not None and order.request is not None
        data, truncated = bytearray(), False
        async with asyncio.timeout(self.read_timeout):
            stream = await self.pods.logs(self.cluster, order.spec, order.request)
            try:
                async for chunk in stream:
                    room = MAX_LOG_BYTES - len(data)
                    data += chunk[:room]
                    if len(chunk) > room:
                        truncated = True
                        break
            finally:
                await stream.aclose()
        return {"data": data.decode("utf-8", errors="replace"), "truncated": truncated}

    def _watch(self, work: _Work) -> None:
        """Follow the running job: one watch per job (a newer command's replaces it)."""
        order = work.order
        assert order.placement is not None and order.spec is not None
        job = order.job
        old = self.watching.pop(job, None)
        if old is not None and old.handle is not None:
            old.handle.cancel()
            self.inflight.pop(old.command.id, None)  # the broker follows the newer one
        self.specs[job] = order.spec
        self.watching[job] = work

        def on_end(end: RunEnd) -> None:
            self._finish(work, "done", result={"end": end_doc(end)})

        work.handle = self.launcher.watch(order.placement, on_end)

    # -- replies -----------------------------------------------------------------------------

    def _reply(self, command: Command, status: Any, error: str = "", **kw: Any) -> Reply:
        return Reply(command.id, self.cluster, command.op, status, error, **kw)

    def _finish(self, work: _Work, status: Any, error: str = "", **kw: Any) -> None:
        """The work's one final, unless it was dropped meanwhile."""
        command = work.command
        if self.inflight.get(command.id) is not work:
            return
        del self.inflight[command.id]
        if self.watching.get(work.order.job) is work:
            del self.watching[work.order.job]
            self.specs.pop(work.order.job, None)
        self._final(command, self._reply(command, status, error, **kw))

    def _final(self, command: Command, reply: Reply) -> None:
        self.finals[command.id] = reply
        while len(self.finals) > FINALS_KEPT:
            self.finals.popitem(last=False)
        self.counts.finals[reply.status] = self.counts.finals.get(reply.status, 0) + 1
        self._send(reply)

    def _send(self, reply: Reply) -> None:
        self._outbox.put_nowait(reply)

    def capabilities(self) -> dict[str, Any]:
        """The retained capabilities document of a launching agent."""
        return {"v": 1, "launch": True, "kinds": list(LAUNCHED_KINDS),
                "mode": self.launcher.settings.mode}  # fmt: skip


def _loose(payload: bytes) -> dict[str, Any]:
    """The payload's JSON object, or an empty one (for reading an id only)."""
    if len(payload) > MAX_PAYLOAD:
        return {}
    try:
        doc = json.loads(payload)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return {}
    return doc if isinstance(doc, dict) else {}


__all__ = ["FINALS_KEPT", "SUPERSEDED", "TOMBSTONES_KEPT", "CommandExecutor", "Counts"]
