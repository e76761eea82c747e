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

What the agent refuses, the broker records (its job's history, its log, /metrics'
``fedbroker_agent_refusals_total``) and the member never sees: a launch its own policy
forbids (a tenant's level stricter than the broker's; a service account the broker allows
and the agent does not) and a signed command for another cluster. ``fedbroker pods`` and
``fedbroker logs`` (the CLI against the served API) read the member through the agent. In
delegate mode a gang goes to the member's coscheduling as a PodGroup and runs to its end.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import aiomqtt
import pytest
from aiohttp.test_utils import TestClient, TestServer
from controllers import RESOURCES
from controllers.base import labels_of, phase
from controllers.schedulers import COSCHED, COSCHED_LABEL, SCHEDULER, pinned
from prometheus_client.parser import text_string_to_metric_families
from pullmode import (
    BOUND,
    CLUSTER,
    COMMAND_KEY,
    MEMBER_TOKEN,
    TENANT,
    TOKEN,
    PullMember,
    PullMode,
    launch_config_text,
    log_line,
    pull_mode,
)
from test_mqtt import Inbox, subscriber
from workload_matrix import KUBE, WORKLOADS, leftovers, made_twice, node_obj, ours, running_pods

from adapters.mqtt.commands import Command, commands_topic, decode_command, encode_command
from broker.cli.main import main
from broker.cli.podlogs import POD_HEADER
from broker.http.app import make_app
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


# -- what the agent refuses -------------------------------------------------------------------

# The agent's own policy: team-a stricter than the broker's (baseline by default), team-b
# without the service account the broker lets it name.
STRICT = "{name: team-a, podSecurity: restricted}, {name: team-b}"
TEAM_B = (
    "- {name: team-b, defaultQueue: training, serviceAccounts: [default, trainer],"
    " token: {value: tok-b-00000000000000000000000000}}\n"
)
BY_POLICY = f"launch refused by {CLUSTER}: refused by the agent's policy: "
PLAIN = {"name": "main", "image": "trainer:1.0"}  # baseline, not restricted: no securityContext


def templated(pod_spec: dict[str, Any]) -> dict[str, Any]:
    """``gang_spec``'s gang (one pod) with the pod template ``pod_spec``."""
    spec = gang_spec(pods=1)
    spec["podSets"][0]["template"] = {"spec": pod_spec}
    return spec


@contextlib.asynccontextmanager
async def api(pm: PullMode) -> AsyncIterator[TestClient[Any, Any]]:
    """The service's HTTP API, served on a loopback port."""
    client: TestClient[Any, Any] = TestClient(TestServer(make_app(pm.service, pm.service.config)))
    await client.start_server()
    try:
        yield client
    finally:
        await client.close()


async def refusals(client: TestClient[Any, Any]) -> float:
    """``fedbroker_agent_refusals_total{cluster="edge"}`` as /metrics shows it."""
    text = await (await client.get("/metrics")).text()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "fedbroker_agent_refusals_total" and sample.labels == {
                "cluster": CLUSTER
            }:
                return sample.value
    raise AssertionError(f"no agent refusals of {CLUSTER} in /metrics")


def writes(pm: PullMode) -> list[str]:
    """Every request that would create or change something in the member."""
    return [f"{m} {r.url}" for m in ("post", "put", "patch") for r in pm.k8s[m]]


async def refused(pm: PullMode, tenant: str, name: str) -> str:
    """Scheduling cycles until the job's launch was refused (it is back in the queue, on
    backoff: not placed again); the reason its history gives."""

    async def cycle() -> bool:
        await pm.service.schedule_once()
        return "launch refused" in ((await pm.service.get(tenant, name)).reason or "")

    await pm.until(cycle, f"job {name}'s launch refused")
    states = [t.state for t in await pm.service.store.history(tenant, name)]
    assert states == ["Queued", "Placed", "Queued"], states
    return (await pm.service.store.history(tenant, name))[-1].reason


async def test_the_agent_refuses_what_its_policy_or_its_cluster_forbids_and_the_broker_says_why(
    kmock: PullMember, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    text = launch_config_text(tenants=STRICT)
    async with (
        pull_mode(kmock, tmp_path, launch=True, launch_config=text, tenants=TEAM_B) as pm,
        api(pm) as client,
        subscriber(f"{pm.prefix}/{commands_topic(CLUSTER)}", port=pm.mosquitto.port) as sent,
    ):
        await pm.reported(12)
        assert await refusals(client) == 0.0
        # Admitted at the broker's baseline; refused at the agent's restricted.
        await submit(pm, "strict", templated({"containers": [PLAIN]}))
        reason = await refused(pm, TENANT, "strict")
        assert f"{BY_POLICY}podTemplates.worker.spec." in reason  # checked at restricted
        assert await refusals(client) == 1.0
        # A service account the broker allows team-b and its agent does not: the field.
        body = manifest_doc("trainer", templated({"serviceAccountName": "trainer",
                                                  "containers": [PLAIN]}))  # fmt: skip
        assert (await pm.service.submit("team-b", parse_manifest(body, None)))[1]
        reason = await refused(pm, "team-b", "trainer")
        assert f"{BY_POLICY}podTemplates.worker.spec.serviceAccountName: " in reason
        assert await refusals(client) == 2.0

        # The broker's own launch, misrouted: signed with the key, for cluster west.
        topic = f"{pm.prefix}/{commands_topic(CLUSTER)}"
        [launch] = [c for c in commands(sent, topic) if c.op == "launch" and "strict" in c.job]
        placement = {**launch.body["placement"], "cluster": "west"}
        west = replace(launch, id=uuid.uuid4().hex, cluster="west", at=time.time(),
                       body={**launch.body, "placement": placement})  # fmt: skip
        async with aiomqtt.Client("127.0.0.1", pm.mosquitto.port) as sender:
            await sender.publish(topic, encode_command(west, COMMAND_KEY.encode()), qos=1)

        async def counted() -> bool:
            return await refusals(client) == 3.0

        await pm.until(counted, "the misrouted command's refusal counted")
        said = f"command for cluster west; this agent runs cluster {CLUSTER}"
        assert f"cluster {CLUSTER}: its agent refused launch {west.id}: {said}" in caplog.text
        assert said in pm.agent.log()
        # Nothing of any of them reached the member.
        assert writes(pm) == [] and leftovers(pm.member) == []
        no_secrets(pm)
        assert COMMAND_KEY not in caplog.text


def commands(inbox: Inbox, topic: str) -> list[Command]:
    return [decode_command(p, COMMAND_KEY.encode()) for p in inbox.payloads(topic)]


# -- the CLI through the agent ---------------------------------------------------------------


async def cli(capsys: pytest.CaptureFixture[str], server: str, *argv: str) -> tuple[int, str, str]:
    """``fedbroker argv --server server`` as team-a: exit status, stdout, stderr (in a
    thread: it runs a loop of its own, and this one keeps serving the member and the API)."""
    capsys.readouterr()
    code = await asyncio.to_thread(main, [*argv, "--server", server, "--token", TOKEN])
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    return code, out, err


async def test_fedbroker_pods_and_logs_read_the_member_through_its_agent(
    kmock: PullMember,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in ("FEDBROKER_SERVER", "FEDBROKER_TOKEN", "FEDBROKER_CA_FILE"):
        monkeypatch.delenv(name, raising=False)
    async with pull_mode(kmock, tmp_path, launch=True) as pm, api(pm) as client:
        await running_gang(pm)
        server = str(client.make_url("/"))
        code, out, err = await cli(capsys, server, "pods", "gang")
        assert (code, err) == (0, "")
        header, *lines = out.splitlines()
        assert header.split() == list(POD_HEADER)
        shown = {tuple(line.split()[:5]) for line in lines}
        member = {(n, "worker", CLUSTER, p["spec"]["nodeName"], phase(p))
                  for n, p in pm.our_pods().items()}  # fmt: skip
        assert shown == member and len(shown) == 2
        assert sorted(node for *_, node, _ in shown) == placed_nodes(pm, "gang")

        first, last = sorted(pm.our_pods())
        reads = len(kmock.log_reads)
        code, out, err = await cli(capsys, server, "logs", "gang")
        assert (code, out, err) == (0, "".join(log_line(first, i) for i in (1, 2, 3)), "")
        code, out, err = await cli(capsys, server, "logs", "gang", "-p", last, "--tail", "1")
        assert (code, out, err) == (0, log_line(last, 3), "")
        assert [(pod, q.get("tailLines")) for _, pod, q in kmock.log_reads[reads:]] == [
            (first, None), (last, "1")
        ]  # read in the member, by the agent  # fmt: skip
        code, out, err = await cli(capsys, server, "logs", "gang", "-p", "not-the-jobs-0")
        assert (code, out) == (1, "") and err.startswith("fedbroker: error: no pod ")
        assert err.count("\n") == 1


# -- delegate mode ----------------------------------------------------------------------------


async def test_a_gang_delegated_to_the_members_coscheduling_runs_through_its_agent(
    kmock: PullMember, tmp_path: Path
) -> None:
    text = launch_config_text(KUBE["coscheduling"])
    async with pull_mode(
        kmock, tmp_path, launch=True, launch_config=text, mode="coscheduling"
    ) as pm:
        await pm.reported(12)
        await submit(pm, "gang", gang_spec())
        await pm.placed("gang")
        await pm.until_state("gang", "Running")
        pods = pm.our_pods()
        # The agent made a PodGroup and unpinned pods of the group, for the member's
        # gang scheduler, which bound them on nodes of its choice.
        [(group, found)] = ours(pm.member, COSCHED).items()
        assert found["spec"]["minMember"] == 2
        await pm.until(
            lambda: ours(pm.member, COSCHED)[group].get("status", {}).get("phase") == "Running",
            "the PodGroup Running",
        )
        assert len(pods) == 2 and all(
            p["spec"]["schedulerName"] == SCHEDULER["coscheduling"]
            and labels_of(p)[COSCHED_LABEL] == group
            and pinned(p) is None
            and p["spec"]["nodeName"]
            and phase(p) == "Running"
            for p in pods.values()
        ), pods
        await pm.heard(3)
        assert pm.gpus() == (12, 8.0)  # counted once, where they run
        await end_pods(pm)
        await pm.until_state("gang", "Succeeded")
        assert await history(pm, "gang") == [*RUN, "Succeeded"]
        assert not pm.service.ledger.reservations()
        assert sorted(pm.pod_writes("post")) == sorted(pods)  # each made once
