"""Pull mode end to end (``tests/pullmode.py``): a member the broker cannot reach, whose
agent (``fedbroker agent``, a subprocess) reports it over a private mosquitto and, with a
command key and a launch config, launches, follows and reports the broker's jobs in it.

The harness proof runs the agent as a capacity reporter through its faults: a ``kill -9``
of the agent and of mosquitto. Staleness by time is driven by the broker's
injected clock; a killed agent's staleness comes from its last will, which mosquitto sends
as soon as the kernel closes the dead process's connection.

With a command key and a launch config the agent launches: a gang and a batch Job
created by the agent, run on the placed nodes and ended Succeeded, their pods and logs read
through it; mosquitto restarted during a launch (nothing made twice); the agent killed while
a job runs (it keeps running, its end is heard after the restart); a job cancelled while
the agent is away (deleted when it returns); a gang that never starts (rolled back through
the agent, requeued with backoff on the broker's clock).
"""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path
from typing import Any

import pytest
from controllers import RESOURCES
from controllers.base import phase
from pullmode import (
    BOUND,
    CLUSTER,
    COMMAND_KEY,
    MEMBER_TOKEN,
    TENANT,
    PullMember,
    PullMode,
    log_line,
    pull_mode,
)
from workload_matrix import WORKLOADS, leftovers, made_twice, node_obj, ours, running_pods

from broker.manifest import parse_manifest
from broker.ports import PodNotFound

pytestmark = pytest.mark.kmock(cls=PullMember)
RUN = ["Queued", "Placed", "Running"]


def foreign_pod(name: str, node: str, gpus: int) -> dict[str, object]:
    """A pod of someone else's, bound to ``node`` (the member's kubelet runs it)."""
    limits = {"nvidia.com/gpu": str(gpus), "cpu": "1", "memory": "1Gi"}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "ml"},
            "spec": {"nodeName": node, "restartPolicy": "Never", "containers": [
                {"name": "c", "image": "other:1", "resources": {"limits": limits}}]}}  # fmt: skip


async def post(k8s: PullMember, path: str, body: dict[str, object]) -> None:
    async with k8s.post(path, json=body) as r:
        assert r.status < 300, f"POST {path}: {r.status} {await r.text()}"


# Once the agent is told to stop, paho may still have its socket's writer scheduled on the
# loop when the socket closes: asyncio logs that callback's EBADF (the exit is clean).
STOPPING_RACE = '"logger": "asyncio", "msg": "Exception in callback <bound method Loop.add_'


def tracebacks(log: str) -> list[str]:
    """The agent's log lines with a traceback, but the stopping race above."""
    found, stopping = [], False
    for line in log.splitlines():
        if line.startswith("--- start"):
            stopping = False
        stopping = stopping or '"msg": "shutdown requested"' in line
        if "Traceback" in line and not (stopping and STOPPING_RACE in line):
            found.append(line)
    return found


def no_secrets(pm: PullMode) -> None:
    """Nothing secret in the agent's log, and no traceback."""
    log = pm.agent.log()
    assert tracebacks(log) == [], log[-4000:]
    assert MEMBER_TOKEN not in log and COMMAND_KEY not in log


async def test_harness_the_agent_reports_through_its_faults(
    kmock: PullMember, tmp_path: Path
) -> None:
    async with pull_mode(kmock, tmp_path) as pm:
        # The agent (a subprocess) reports the member's three nodes of 4 GPUs.
        await pm.reported(12)
        assert pm.online() and pm.broker_connected()

        # No heartbeat for staleAfterSeconds of the broker's clock: stale; the next: fresh.
        assert pm.go_stale_by_clock()
        await pm.until(lambda: not pm.stale(), "edge fresh on the agent's next heartbeat")

        # kill -9: its will says offline, stale at once (the clock does not move).
        await pm.agent.kill9()
        await pm.until(pm.stale, "edge stale after the agent's kill", agent_up=False)
        assert not pm.online() and pm.gpus() == (12, 0.0)  # the last capacity, kept
        # What changes while it is away is reported once it is back.
        await post(kmock, "/api/v1/namespaces", {"metadata": {"name": "ml"}})
        await post(kmock, "/api/v1/namespaces/ml/pods", foreign_pod("other", "n1", 2))
        await pm.agent.start()
        await pm.reported(12, 2.0)
        assert pm.online()

        # mosquitto killed: the broker hears nothing more, stale by its clock.
        pm.mosquitto.kill()
        await pm.until(lambda: not pm.broker_connected(), "the broker's MQTT connection down")
        assert pm.go_stale_by_clock()
        await post(kmock, "/api/v1/nodes", node_obj("n4"))  # while no report can travel
        # mosquitto back (empty: no retained messages, no sessions): both reconnect, the
        # agent reports everything again, including what changed meanwhile.
        await pm.mosquitto.start()
        await pm.reported(16, 2.0)
        assert pm.online() and pm.broker_connected()

        # SIGTERM: it says offline and exits cleanly.
        assert await pm.agent.stop() == 0
        await pm.until(pm.stale, "edge stale after the agent's stop", agent_up=False)
        assert not pm.online()
        no_secrets(pm)
        assert pm.agent.starts == 2


# -- the agent launches --------------------------------------------------------------------


def job_key(name: str) -> str:
    return f"{TENANT}/{name}"


def manifest_doc(name: str, spec: dict[str, Any]) -> bytes:
    body = {"apiVersion": "fedbroker.io/v1alpha1", "kind": "FederatedJob",
            "metadata": {"name": name}, "spec": spec}  # fmt: skip
    return json.dumps(body).encode()


def gang_spec(pods: int = 2, gpus: int = 4, timeout: int = 30) -> dict[str, Any]:
    """A podSets gang of ``pods`` pods of ``gpus`` GPUs each (one node each, in pin mode)."""
    return {
        "podSets": [{"name": "worker", "count": pods,
                     "resources": {"nvidia.com/gpu": gpus, "cpu": "1", "memory": "1Gi"}}],
        "gang": {"scheduleTimeoutSeconds": timeout},
    }  # fmt: skip


async def submit(pm: PullMode, name: str, spec: dict[str, Any]) -> None:
    _, created = await pm.service.submit(TENANT, parse_manifest(manifest_doc(name, spec), None))
    assert created


async def history(pm: PullMode, name: str) -> list[str]:
    return [t.state for t in await pm.service.store.history(TENANT, name)]


def placed_nodes(pm: PullMode, name: str) -> list[str]:
    launch = pm.service.lifecycle.get(job_key(name))
    assert launch is not None, f"job {name} is not placed"
    return sorted(p.node for p in launch.placement.pods)


def uids(pm: PullMode) -> dict[str, str]:
    """Our pods in the member by name: their uids (a pod made again has a new one)."""
    return {n: p["metadata"]["uid"] for n, p in pm.our_pods().items()}


def pod_nodes(pm: PullMode) -> list[str]:
    return sorted(str(p["spec"].get("nodeName")) for p in pm.our_pods().values())


async def running_gang(pm: PullMode, name: str = "gang") -> dict[str, str]:
    """A gang of two 4-GPU pods submitted, placed, made by the agent and Running; the
    uids of its pods in the member."""
    await pm.reported(12)
    await submit(pm, name, gang_spec())
    await pm.placed(name)
    await pm.until_state(name, "Running")
    pods = pm.our_pods()
    assert len(pods) == 2 and all(phase(p) == "Running" for p in pods.values())
    assert pod_nodes(pm) == placed_nodes(pm, name)  # released on the placed nodes
    return uids(pm)


async def read_log(pm: PullMode, name: str, pod: str | None, **request: Any) -> str:
    stream = await pm.service.logs(TENANT, name, pod, **request)
    try:
        return b"".join([chunk async for chunk in stream]).decode()
    finally:
        await stream.aclose()


async def end_pods(pm: PullMode, to: str = "Succeeded") -> None:
    """The kubelet ends every running pod of ours."""
    await pm.member.schedulers.end(running_pods(pm.member), to)


async def gang_through_the_agent(pm: PullMode) -> None:
    """A gang runs, its pods and logs are read through the agent, it ends Succeeded."""
    await running_gang(pm)
    # Our pods are counted once: the gang's reservation, not again as someone's use.
    await pm.heard(3)
    assert pm.gpus() == (12, 8.0)

    rows = await pm.service.pods(TENANT, "gang")
    member = {n: (p["spec"]["nodeName"], phase(p)) for n, p in pm.our_pods().items()}
    assert {r.name: (r.node, r.phase) for r in rows} == member
    assert {r.cluster for r in rows} == {CLUSTER}
    first, last = sorted(member)
    assert await read_log(pm, "gang", None) == "".join(log_line(first, i) for i in (1, 2, 3))
    assert await read_log(pm, "gang", last, tail_lines=1) == log_line(last, 3)
    # A follow is answered with what the log holds so far (the agent never follows).
    assert await read_log(pm, "gang", last, follow=True) == "".join(
        log_line(last, i) for i in (1, 2, 3)
    )
    assert [q.get("follow") in (None, "false") for _, _, q in pm.k8s.log_reads] == [True] * 3
    with pytest.raises(PodNotFound):
        await read_log(pm, "gang", "not-the-jobs-0")

    await end_pods(pm)
    await pm.until_state("gang", "Succeeded")
    assert await history(pm, "gang") == [*RUN, "Succeeded"]
    assert not pm.service.ledger.reservations()
    assert sorted(pm.pod_writes("post")) == sorted(member)  # each made once


async def batch_through_the_agent(pm: PullMode) -> None:
    """An Indexed batch Job (four completions, two at a time) runs and ends Succeeded."""
    await submit(pm, "batch", {"workload": WORKLOADS["Job"]})
    await pm.placed("batch")
    await pm.until_state("batch", "Running")
    assert ours(pm.member, RESOURCES["Job"])  # made by the agent in the member
    rows = await pm.service.pods(TENANT, "batch")
    assert rows and {r.cluster for r in rows} == {CLUSTER}
    # The kubelet ends what runs until the broker has heard the Job's end from the agent.
    key = job_key("batch")
    while pm.service.lifecycle.get(key) is not None:
        await pm.until(
            lambda: bool(running_pods(pm.member)) or pm.service.lifecycle.get(key) is None,
            "a pod of the Job running, or its end heard",
        )
        await end_pods(pm)
    await pm.until_state("batch", "Succeeded")
    record = await pm.service.get(TENANT, "batch")
    assert record.reason.startswith("CompletionsReached")
    assert made_twice(pm.member) == []


async def test_a_gang_and_a_batch_job_run_in_the_member_through_its_agent(
    kmock: PullMember, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    async with pull_mode(kmock, tmp_path, launch=True) as pm:
        await gang_through_the_agent(pm)
        await batch_through_the_agent(pm)
        no_secrets(pm)
        assert COMMAND_KEY not in caplog.text  # nor does the broker log its key


# -- faults ---------------------------------------------------------------------------------


@pytest.mark.parametrize("when", ["before the agent has it", "while its pods wait"])
async def test_mosquitto_restarted_during_a_launch_makes_nothing_twice(
    kmock: PullMember, tmp_path: Path, when: str
) -> None:
    async with pull_mode(kmock, tmp_path, launch=True) as pm:
        await pm.reported(12)
        pm.schedulers.paused = True  # the gang's pods wait: its launch stays in flight
        await submit(pm, "gang", gang_spec())
        if when == "before the agent has it":
            pm.mosquitto.kill()
            await pm.until(lambda: not pm.broker_connected(), "the broker's MQTT down")
            await pm.placed("gang")  # the launch command waits in the broker
        else:
            await pm.placed("gang")
            await pm.until(lambda: len(pm.our_pods()) == 2, "the gang's pods made")
            made = uids(pm)
            pm.mosquitto.kill()
            await pm.until(lambda: not pm.broker_connected(), "the broker's MQTT down")
        await pm.mosquitto.start()  # empty: the broker resends what is unanswered
        await pm.until(pm.broker_connected, "the broker's MQTT back")
        await pm.until(lambda: len(pm.our_pods()) == 2, "the gang's pods made")
        if when == "before the agent has it":
            made = uids(pm)
        await pm.heard(3)  # the agent is back too: the resent launch has reached it
        pm.schedulers.paused = False
        await pm.until_state("gang", "Running")
        assert uids(pm) == made  # the same pods: none deleted, none made again
        assert pm.pod_writes("delete") == []
        assert pod_nodes(pm) == placed_nodes(pm, "gang")
        await end_pods(pm)
        await pm.until_state("gang", "Succeeded")
        assert await history(pm, "gang") == [*RUN, "Succeeded"]  # placed once


async def test_a_job_outlives_its_agents_kill_and_its_end_is_heard(
    kmock: PullMember, tmp_path: Path
) -> None:
    async with pull_mode(kmock, tmp_path, launch=True) as pm:
        made = await running_gang(pm)
        await pm.agent.kill9()
        await pm.until(pm.stale, "edge stale after the agent's kill", agent_up=False)
        # The member keeps running it; the broker keeps it Running (no failover asked).
        pm.clock.now += 60
        await pm.service.schedule_once()
        assert await pm.state("gang") == "Running"
        assert uids(pm) == made
        assert all(phase(p) == "Running" for p in pm.our_pods().values())
        # Back: it reports the pods again (counted once) and follows the job to its end.
        await pm.agent.start()
        await pm.reported(12, 8.0)
        await pm.heard(3)
        assert await pm.state("gang") == "Running"
        await end_pods(pm)
        await pm.until_state("gang", "Succeeded")
        assert await history(pm, "gang") == [*RUN, "Succeeded"]
        assert pm.pod_writes("delete") == [] and len(pm.pod_writes("post")) == 2
        no_secrets(pm)


async def test_a_job_cancelled_while_its_agent_is_away_is_deleted_when_it_returns(
    kmock: PullMember, tmp_path: Path
) -> None:
    async with pull_mode(kmock, tmp_path, launch=True) as pm:
        await running_gang(pm)
        await pm.agent.kill9()
        await pm.until(pm.stale, "edge stale after the agent's kill", agent_up=False)
        # The cancel is recorded at once; its deletion waits for the agent.
        cancelling = asyncio.create_task(pm.service.cancel(TENANT, "gang"))
        await pm.until_state("gang", "Cancelled", timeout=5, agent_up=False)
        assert len(pm.our_pods()) == 2  # nobody to delete them yet
        await pm.agent.start()
        await pm.until(lambda: not leftovers(pm.member), "the cancelled gang deleted")
        async with asyncio.timeout(BOUND):
            record = await cancelling
        assert record.state == "Cancelled"
        await pm.reported(12, 0.0)
        assert not pm.service.ledger.reservations()


async def test_a_gang_that_does_not_start_is_rolled_back_through_the_agent(
    kmock: PullMember, tmp_path: Path
) -> None:
    async with pull_mode(kmock, tmp_path, launch=True) as pm:
        await pm.reported(12)
        pm.schedulers.paused = True  # nothing is bound: the gang never starts
        await submit(pm, "gang", gang_spec(timeout=30))
        await pm.placed("gang")
        await pm.until(lambda: len(pm.our_pods()) == 2, "the gang's pods made")
        pm.clock.now += 31  # past its scheduleTimeoutSeconds, on the broker's clock
        await pm.service.schedule_once()
        await pm.until(lambda: not leftovers(pm.member), "the gang's objects deleted")
        await pm.until_state("gang", "Queued")
        record = await pm.service.get(TENANT, "gang")
        assert "gang did not start within 30s" in record.reason
        assert (record.attempts, record.not_before) == (1, pm.clock.now + 60)
        assert not pm.service.ledger.reservations()
        await pm.service.schedule_once()
        assert await pm.state("gang") == "Queued"  # backed off
        # The backoff over and the member's scheduler back: placed again, it runs.
        pm.schedulers.paused = False
        pm.clock.now = record.not_before or 0.0
        await pm.placed("gang")
        await pm.until_state("gang", "Running")
        assert pod_nodes(pm) == placed_nodes(pm, "gang")
