"""RemoteLauncher (adapters/mqtt/remote.py) against a fake agent answering over a real
mosquitto with the real codec: launches done, failed and refused; a resend after the MQTT
broker's restart keeps the command's id, a cancelled launch is never resent; a deletion the
agent does not answer stays pending; a run's end comes as the watch's final reply; pods,
logs and a pod that is not the job's; read back and garbage collection; replies the
cluster's key did not sign are ignored. Then the capabilities' checks, table-tested."""

from __future__ import annotations

import asyncio
import itertools
import secrets
import signal
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
from builders import until
from fake_agent import FakeAgent, done
from services import PrivateMosquitto
from test_mqtt import MQTT_PORT, require_mqtt, unique_prefix

from adapters.mqtt.capabilities import Capabilities, parse_capabilities
from adapters.mqtt.commands import (
    Command,
    Reply,
    bound_doc,
    decode_command,
    end_doc,
    found_doc,
    log_request_doc,
    log_request_of,
    placement_of,
    replies_topic,
    row_doc,
    spec_of,
)
from adapters.mqtt.publisher import Backoff, MqttSettings, Publisher
from adapters.mqtt.remote import RemoteLauncher, Timeouts
from broker.model import Placement, PodBound, PodPlacement, Resources
from broker.ports import (
    LaunchError,
    LaunchSpec,
    LogRequest,
    PodNotFound,
    PodReadError,
    PodRow,
    ReportError,
    RunEnd,
    WorkloadFound,
)

KEY = b"edge-command-key-0123456789abcdef"
PLACEMENT = Placement(
    "team-a/train", "edge", (PodPlacement("team-a.train-w-0", "n1", (0,), Resources(gpus=1)),)
)
SPEC = LaunchSpec(tenant="team-a", job="train", generation=3)


@dataclass
class Pair:
    remote: RemoteLauncher
    agent: FakeAgent
    broker: Publisher
    refused: list[Reply]


@asynccontextmanager
async def pair(port: int = MQTT_PORT) -> AsyncIterator[Pair]:
    """A RemoteLauncher for ``edge`` on its own MQTT connection (resending on every
    connect, as the service does), and the fake agent of ``edge``."""
    prefix = unique_prefix()
    refused: list[Reply] = []
    remotes: list[RemoteLauncher] = []  # made below, over the connection
    sends = itertools.count(1)

    def resend() -> None:
        for remote in remotes:
            remote.resend_all()

    settings = MqttSettings(
        "127.0.0.1", port, client_id=f"fbtest-broker-{secrets.token_hex(4)}", prefix=prefix,
        keepalive=5, timeout=3.0,
    )  # fmt: skip
    broker = Publisher(settings, backoff=Backoff(base=0.05, cap=0.5), on_connect=resend)
    remote = RemoteLauncher(
        "edge", KEY, broker.publish_nowait, lambda placement: SPEC,
        timeouts=Timeouts(delete=0.3, read=0.3), on_refused=refused.append,
        clock=lambda: float(next(sends)),  # each send's ``at`` tells it apart
    )  # fmt: skip
    remotes.append(remote)

    def on_reply(topic: str, payload: bytes, retained: bool) -> None:
        remote.on_reply(payload)

    broker.subscribe(f"{prefix}/{replies_topic('edge')}", on_reply)
    agent = FakeAgent("edge", KEY, prefix, port)
    await agent.start()
    broker.start()
    await broker.wait_connected()
    try:
        yield Pair(remote, agent, broker, refused)
    finally:
        await broker.close()
        await agent.close()


async def test_launch_done_failed_and_refused() -> None:
    await require_mqtt()
    async with pair() as p:
        p.agent.auto["launch"] = done()
        await p.remote.launch(PLACEMENT)
        [command] = p.agent.ops("launch")
        assert (command.cluster, command.job, command.generation) == ("edge", "team-a/train", 3)
        assert placement_of(command.body["placement"]) == PLACEMENT
        assert spec_of(command.body["spec"]) == SPEC
        assert not p.remote.pending

        p.agent.auto["launch"] = lambda c: None
        launching = asyncio.create_task(p.remote.launch(PLACEMENT))
        await p.agent.heard(lambda: len(p.agent.ops("launch")) == 2)
        p.agent.reply(p.agent.ops("launch")[1], "failed", error="quota exceeded")
        with pytest.raises(LaunchError, match="quota exceeded") as failed:
            await launching
        assert not failed.value.permanent

        launching = asyncio.create_task(p.remote.launch(PLACEMENT))
        await p.agent.heard(lambda: len(p.agent.ops("launch")) == 3)
        third = p.agent.ops("launch")[2]
        p.agent.reply(third, "refused", error="spec.podTemplates.w.spec.hostNetwork: refused")
        with pytest.raises(LaunchError, match="hostNetwork") as refused:
            await launching
        assert refused.value.permanent
        assert p.remote.refusals == 1 and [r.id for r in p.refused] == [third.id]
        # A refusal of a command no longer waited for is recorded all the same.
        p.agent.reply(Command("gone", "edge", "launch"), "refused", error="not mine")
        await until(lambda: p.remote.refusals == 2)
        assert not p.remote.pending


async def test_a_reply_not_signed_with_the_clusters_key_is_ignored() -> None:
    await require_mqtt()
    async with pair() as p:
        launching = asyncio.create_task(p.remote.launch(PLACEMENT))
        await p.agent.heard(lambda: bool(p.agent.ops("launch")))
        [command] = p.agent.ops("launch")
        p.agent.reply(command, "done", key=b"someone-else's-key")
        await until(lambda: p.remote.rejected == 1)
        assert not launching.done() and command.id in p.remote.pending
        p.agent.reply(command, "done")
        await launching


async def test_a_resend_after_the_mqtt_brokers_restart_keeps_the_id(tmp_path: Path) -> None:
    # With persistence, as deployed: the agent's session (its subscription, and what comes
    # for it while it reconnects) outlives the restart.
    mosquitto = PrivateMosquitto(tmp_path, persistence=True)
    await mosquitto.start()
    try:
        async with pair(mosquitto.port) as p:
            launching = asyncio.create_task(p.remote.launch(PLACEMENT))
            cancelled = asyncio.create_task(p.remote.launch(PLACEMENT))
            await p.agent.heard(lambda: len(p.agent.ops("launch")) == 2)
            first, second = p.agent.ops("launch")
            cancelled.cancel()  # the gang timeout: forgotten, never resent
            await asyncio.gather(cancelled, return_exceptions=True)
            assert list(p.remote.pending) == [first.id]
            connects = p.broker.connects
            mosquitto.kill(signal.SIGTERM)  # saves the sessions
            await mosquitto.start()
            await until(lambda: p.broker.connects > connects and p.agent.publisher.connected)
            sent = {first.at, second.at}

            def resent() -> list[Command]:  # by the broker (MQTT may redeliver the others)
                return [c for c in p.agent.ops("launch") if c.at not in sent]

            await p.agent.heard(lambda: bool(resent()))
            assert [c.id for c in resent()] == [first.id]  # the same id; never the cancelled
            p.agent.reply(resent()[0], "done")
            await launching
            assert [c.id for c in resent()] == [first.id]
    finally:
        mosquitto.kill(signal.SIGTERM)


async def test_an_unanswered_deletion_stays_pending_and_is_resent() -> None:
    await require_mqtt()
    async with pair() as p:
        with pytest.raises(LaunchError, match="did not answer the deletion; it is resent"):
            await p.remote.delete(PLACEMENT)
        [command] = p.agent.ops("delete")
        assert list(p.remote.pending) == [command.id]
        assert p.remote.resend_all() == 1
        await p.agent.heard(lambda: len(p.agent.ops("delete")) == 2)
        assert p.agent.ops("delete")[1].id == command.id
        p.agent.reply(command, "done")  # late, and no one waits: it is no longer pending
        await until(lambda: not p.remote.pending)


async def test_a_run_ends_by_the_watchs_final_reply_and_cancel_forgets_it() -> None:
    await require_mqtt()
    async with pair() as p:
        ends: list[RunEnd] = []
        p.remote.watch(PLACEMENT, ends.append)
        handle = p.remote.watch(PLACEMENT, ends.append)
        await p.agent.heard(lambda: len(p.agent.ops("watch")) == 2)
        first, second = p.agent.ops("watch")
        handle.cancel()  # nothing sent: the agent's watch ends with the job's deletion
        assert list(p.remote.pending) == [first.id] and len(p.agent.commands) == 2
        end = RunEnd(False, "BackoffLimitExceeded", "2 pods failed")
        p.agent.reply(first, "done", {"end": end_doc(end)})
        p.agent.reply(second, "done", {"end": end_doc(RunEnd(True))})  # cancelled: ignored
        await until(lambda: bool(ends))
        assert ends == [end]
        # A watch the agent lost comes back as a follow that failed.
        p.remote.watch(PLACEMENT, ends.append)
        await p.agent.heard(lambda: len(p.agent.ops("watch")) == 3)
        p.agent.reply(p.agent.ops("watch")[2], "failed", error="pods unreadable")
        await until(lambda: len(ends) == 2)
        assert ends[1].error is not None and "pods unreadable" in str(ends[1].error)


async def test_pods_logs_and_a_pod_that_is_not_the_jobs() -> None:
    await require_mqtt()
    async with pair() as p:
        row = PodRow("train-w-0", "w", "edge", "n1", "Running", 0, "w-0")
        p.agent.auto["pods"] = done({"pods": [row_doc(row)]})
        assert await p.remote.pods("edge", SPEC) == [row]
        p.agent.auto["logs"] = done({"data": "step 1\nstep 2\n", "truncated": False})
        stream = await p.remote.logs("edge", SPEC, LogRequest("train-w-0", follow=True))
        assert [chunk async for chunk in stream] == [b"step 1\nstep 2\n"]
        await stream.aclose()
        [logs] = p.agent.ops("logs")
        assert logs.body["request"] == {
            "pod": "train-w-0", "container": None, "tailLines": None, "timestamps": False,
            "previous": False,
        }  # fmt: skip

        def not_found(command: Command) -> None:
            p.agent.reply(command, "failed", {"notFound": True}, error="pod x is not the job's")

        p.agent.auto["logs"] = not_found
        with pytest.raises(PodNotFound, match="pod x"):
            await p.remote.logs("edge", SPEC, LogRequest("x"))
        del p.agent.auto["pods"]  # unanswered
        with pytest.raises(PodReadError, match=r"cluster edge: its agent did not answer in 0.3"):
            await p.remote.pods("edge", SPEC)
        assert not p.remote.pending  # a bounded read is forgotten past its bound


async def test_read_back_and_garbage_collection_through_the_agent() -> None:
    await require_mqtt()
    async with pair() as p:
        bound = PodBound("edge", "team-a.train-w-0", "n1", Resources(gpus=1), (0,))
        found = WorkloadFound(plan=None, delegated=True)
        p.agent.auto["read_back"] = done({
            "pods": {"team-a/train": [bound_doc(bound)]},
            "workloads": {"team-a/sweep": found_doc(found)},
        })  # fmt: skip
        assert await p.remote.read_back() == {"team-a/train": [bound]}
        assert await p.remote.read_back_workloads() == {"team-a/sweep": found}
        assert len(p.agent.ops("read_back")) == 1  # one command answers both
        p.agent.auto["collect"] = done({"deleted": ["pods/team-a.old-w-0"]})
        assert await p.remote.collect_garbage({"team-a/train", "team-a/a"}) == [
            "pods/team-a.old-w-0"
        ]
        assert p.agent.ops("collect")[0].body == {"live": ["team-a/a", "team-a/train"]}
        del p.agent.auto["read_back"]
        with pytest.raises(LaunchError, match="did not answer"):
            await p.remote.read_back()


@pytest.mark.parametrize(
    ("payload", "expected"),
    [
        (b"", Capabilities(False)),
        (b'{"v": 1, "launch": false, "kinds": ["Pod"]}', Capabilities(False)),
        (b'{"v": 1, "launch": true, "kinds": ["Pod", "Job"], "mode": "pin"}',
         Capabilities(True, frozenset({"Pod", "Job"}), "pin")),
        (b'{"v": 1, "launch": true, "kinds": []}', Capabilities(True, frozenset(), "")),
        (b"{", "capabilities: not JSON"),
        (b"[]", "capabilities: not an object"),
        (b'{"v": 2, "launch": true}', "capabilities.v"),
        (b'{"v": 1, "launch": "yes"}', "capabilities.launch"),
        (b'{"v": 1, "launch": true}', "capabilities.kinds"),
        (b'{"v": 1, "launch": true, "kinds": "Pod"}', "capabilities.kinds"),
        (b'{"v": 1, "launch": true, "kinds": ["Pod", "job/../x"]}', r"capabilities.kinds\[1\]"),
        (b'{"v": 1, "launch": true, "kinds": [1]}', r"capabilities.kinds\[0\]"),
        (b'{"v": 1, "launch": true, "kinds": ["Pod"], "mode": "push"}', "capabilities.mode"),
        (b'{"v": 1, "launch": true, "kinds": ["Pod"], "x": "' + b"a" * 70_000 + b'"}', "larger"),
    ],
)  # fmt: skip
def test_capabilities_are_checked(payload: bytes, expected: Capabilities | str) -> None:
    if isinstance(expected, Capabilities):
        assert parse_capabilities(payload) == expected
        return
    with pytest.raises(ReportError, match=expected):
        parse_capabilities(payload)


def test_a_resend_goes_oldest_first_and_stops_at_a_full_outbox() -> None:
    sent: list[Command] = []
    room = [10]

    def publish(suffix: str, payload: bytes) -> bool:
        if not room[0]:
            return False
        room[0] -= 1
        sent.append(decode_command(payload, KEY))
        return True

    remote = RemoteLauncher("edge", KEY, publish, lambda placement: SPEC)
    for _ in range(3):
        remote.watch(PLACEMENT, lambda end: None)
    ids = [c.id for c in sent]
    sent.clear()
    room[0] = 2
    assert remote.resend_all() == 2
    assert [c.id for c in sent] == ids[:2]  # the third waits, still pending
    room[0] = 10
    sent.clear()
    assert remote.resend_all() == 3
    assert [c.id for c in sent] == ids


def test_a_log_request_crosses_to_the_agent_whole() -> None:
    """What ``logs --timestamps --previous`` asks reaches a pull-mode member's agent."""
    request = LogRequest("train-w-0", "main", 3, timestamps=True, previous=True)
    assert log_request_of(log_request_doc(request)) == request
    assert log_request_of({"pod": "p"}) == LogRequest("p")  # an older broker's request
