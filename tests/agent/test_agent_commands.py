"""Pull mode, the agent's side, with real parts: the agent (``broker.agent.capacity.Agent``
with its ``CommandExecutor``) in process on the real mosquitto, its member the enforcing
test member (kmock with Namespaces, tests/kmock_namespaces.py) over real HTTP. The test
plays the broker: it publishes commands signed with the codec and reads the signed
replies; and the member's scheduler and kubelet: the launcher's poll pause binds each pod
to the node its required affinity names and runs it (``Kubelet``), or holds it."""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import itertools
import os
import re
import secrets
import signal
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import aiohttp.web
import aiomqtt
import kmock as kmocklib
import pytest
from builders import until
from kmock_namespaces import NamespacedEmulator
from kubernetes.aio.client import ApiClient
from tenacity import wait_none
from test_agent import CANARY, write_kubeconfig
from test_mqtt import (
    MQTT_HOST,
    MQTT_PORT,
    ROOT,
    Inbox,
    require_mqtt,
    subscriber,
    unique_prefix,
)
from workload_cluster import PODS, admitted, client_config, cluster, emulator, node_of, stored
from workload_matrix import node_obj

from adapters.mqtt.commands import (
    MAX_LOG_BYTES,
    Command,
    Reply,
    decode_reply,
    encode_command,
    end_of,
    log_request_doc,
    placement_doc,
    row_of,
    spec_doc,
)
from adapters.mqtt.publisher import MqttSettings
from broker.agent.capacity import Agent
from broker.agent.commands import SUPERSEDED
from broker.agent.config import parse_launch_config
from broker.agent.launching import executor_factory
from broker.agent.policy import LAUNCHED_KINDS
from broker.model import Placement, PodPlacement, Resources
from broker.ports import LaunchSpec, LogRequest

KEY = secrets.token_bytes(32)
NODES = kmocklib.resource("", "v1", "nodes")
NS = "team-acme"
_LOG = re.compile(r"/api/v1/namespaces/([^/]+)/pods/([^/]+)/log")
ONE = Resources(gpus=1, cpu_milli=1000, memory_mib=1024)
TEMPLATE: dict[str, Any] = {"metadata": {"labels": {"app": "trainer"}}, "spec": {"containers": [{
    "name": "main", "image": "trainer:1",
    "resources": {"limits": {"nvidia.com/gpu": "1", "cpu": "1", "memory": "1Gi"}}}]}}  # fmt: skip
PLACEMENT = Placement("acme/train", "edge", (
    PodPlacement("acme.train-worker-0", "n1", (0,), ONE),
    PodPlacement("acme.train-worker-1", "n2", (1,), ONE),
))  # fmt: skip
SPEC = LaunchSpec(tenant="acme", job="train", pod_templates={"worker": TEMPLATE},
                  pod_sets=("worker",), generation=1)  # fmt: skip
CONFIG = """
namespacePattern: "team-{tenant}"
launchMode: pin
podPollSeconds: 0.01
tenants: [{name: acme, podSecurity: %s}]
"""


class Member(NamespacedEmulator):
    """The enforcing member, plus a pod log endpoint serving ``log`` whole."""

    log: bytes = b""

    async def __call__(self, raw: aiohttp.web.BaseRequest) -> aiohttp.web.StreamResponse:
        if _LOG.fullmatch(raw.path) is None:
            return await super().__call__(raw)
        return aiohttp.web.Response(body=self.log, content_type="text/plain")


pytestmark = pytest.mark.kmock(cls=Member)


@pytest.fixture
async def k8s(kmock: Any) -> Member:
    member = cast(Member, await emulator(kmock))
    member.resources["v1/nodes"] = kmocklib.ResourceInfo(namespaced=False)
    for name in ("n1", "n2"):
        member.objects[NODES, None, name] = node_obj(name)
    return member


@pytest.fixture
async def api(k8s: Member) -> AsyncIterator[ApiClient]:
    async with ApiClient(client_config(k8s)) as client:
        yield client


class Kubelet:
    """The member's scheduler and kubelet as the launcher's poll pause: every pod bound to
    the node its affinity names, and Running; while ``held``, nothing moves."""

    def __init__(self, k8s: Member) -> None:
        self.k8s = k8s
        self.free = asyncio.Event()
        self.free.set()

    async def step(self, _: float) -> None:
        await self.free.wait()
        for (res, ns, name), obj in list(self.k8s.objects.items()):
            phase = (obj.raw.get("status") or {}).get("phase")
            if res == PODS and not obj.deleted and phase in (None, "Pending"):
                node = node_of(obj.raw) or "n1"
                patch = {"spec": {"nodeName": node}, "status": {"phase": "Running"}}
                await self.k8s.patch_pod(str(ns), name, patch)


@dataclass
class Broker:
    """The test as the broker: signed commands out, replies (decoded) in."""

    client: aiomqtt.Client
    seen: Inbox
    prefix: str
    agent: Agent
    ids: itertools.count[int] = dataclasses.field(default_factory=itertools.count)

    def command(self, op: str, body: dict[str, Any], **kw: Any) -> Command:
        fields = {"id": f"c{next(self.ids)}", "cluster": "edge", "op": op, "job": "acme/train",
                  "generation": 1, "at": time.time(), "body": body, **kw}  # fmt: skip
        return Command(**fields)

    async def send(self, command: Command, key: bytes = KEY) -> Command:
        topic = f"{self.prefix}/agents/edge/commands"
        await self.client.publish(topic, encode_command(command, key), qos=1)
        return command

    def replies(self, ident: str | None = None) -> list[Reply]:
        found = [
            decode_reply(p, KEY) for p in self.seen.payloads(f"{self.prefix}/agents/edge/replies")
        ]
        return [r for r in found if ident is None or r.id == ident]

    async def final(self, command: Command) -> Reply:
        await self.seen.wait(lambda: any(r.final for r in self.replies(command.id)), 20)
        return next(r for r in self.replies(command.id) if r.final)

    def statuses(self, command: Command) -> list[str]:
        return [r.status for r in self.replies(command.id)]


def job_body(placement: Placement = PLACEMENT, spec: LaunchSpec = SPEC) -> dict[str, Any]:
    return {"placement": placement_doc(placement), "spec": spec_doc(spec)}


def creates(k8s: Member) -> list[str]:
    return [str(r.url) for r in k8s["post"][PODS] if r.subresource is None]


@asynccontextmanager
async def broker(k8s: Member, api: ApiClient, level: str = "baseline") -> AsyncIterator[Broker]:
    """The agent of cluster ``edge`` running, the test's broker connected to mosquitto."""
    await require_mqtt()
    prefix = unique_prefix()
    settings = MqttSettings(MQTT_HOST, MQTT_PORT, prefix=prefix,
                            client_id=f"fbtest-agent-{secrets.token_hex(4)}")  # fmt: skip
    kubelet = Kubelet(k8s)
    config = parse_launch_config(CONFIG % level, "launch.yaml")
    factory = executor_factory("edge", api, config, KEY, retry_wait=wait_none(), sleep=kubelet.step)
    agent = Agent("edge", api, settings, interval=3600, commands=factory)
    agent.kubelet = kubelet  # type: ignore[attr-defined]
    async with subscriber(f"{prefix}/agents/edge/#") as seen:
        task = asyncio.create_task(agent.run())
        try:
            async with aiomqtt.Client(MQTT_HOST, MQTT_PORT, timeout=5) as client:
                async with asyncio.timeout(10):
                    await agent.publisher.wait_connected()
                yield Broker(client, seen, prefix, agent)
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


async def test_a_pinned_gang_is_created_once_runs_on_its_nodes_and_is_followed(
    k8s: Member, api: ApiClient
) -> None:
    async with broker(k8s, api) as b:
        caps = f"{b.prefix}/agents/edge/capabilities"
        await b.seen.wait(lambda: bool(b.seen.json(caps)))
        assert b.seen.json(caps)[-1] == {"v": 1, "launch": True, "kinds": list(LAUNCHED_KINDS),
                                         "mode": "pin"}  # fmt: skip
        assert "TrainJob" not in LAUNCHED_KINDS and "Job" in LAUNCHED_KINDS
        launch = b.command("launch", job_body())
        await b.send(launch)
        await b.send(launch)  # the same id twice: carried out once
        done = await b.final(launch)
        assert (done.status, done.op, done.cluster) == ("done", "launch", "edge"), done.error
        pods = stored(k8s, PODS)
        assert {n: p["spec"]["nodeName"] for n, p in pods.items()} == {
            "train-worker-0": "n1", "train-worker-1": "n2"}  # fmt: skip
        assert len(creates(k8s)) == 2
        await b.send(launch)  # after its end: the cached final again, nothing made
        await b.seen.wait(lambda: b.statuses(launch).count("done") >= 2)
        assert b.statuses(launch)[0] == "accepted" and len(creates(k8s)) == 2

        # The agent's node reports carry our pods apart, under their ledger names.
        report = f"{b.prefix}/agents/edge/nodes/n1"
        await b.seen.wait(lambda: any(r.get("ours") for r in b.seen.json(report)))
        [ours] = b.seen.json(report)[-1]["ours"]
        assert ours["pod"] == "acme.train-worker-0" and ours["gpus"] == [0]

        # Pods and logs, bounded.
        rows = await b.final(await b.send(b.command("pods", {"spec": spec_doc(SPEC)})))
        assert [(r.name, r.node, r.phase) for r in map(row_of, rows.result["pods"])] == [
            ("train-worker-0", "n1", "Running"), ("train-worker-1", "n2", "Running")]  # fmt: skip
        k8s.log = b"x" * (MAX_LOG_BYTES + 10)
        request = log_request_doc(LogRequest("train-worker-0", tail_lines=5, follow=True))
        logs = await b.final(await b.send(b.command("logs", {"spec": spec_doc(SPEC),
                                                             "request": request})))  # fmt: skip
        assert logs.status == "done" and logs.result["truncated"] is True
        assert len(logs.result["data"]) == MAX_LOG_BYTES
        request = log_request_doc(LogRequest("not-ours-0"))
        missing = await b.final(await b.send(b.command("logs", {"spec": spec_doc(SPEC),
                                                                "request": request})))  # fmt: skip
        assert missing.status == "failed" and missing.result == {"notFound": True}

        # Followed until it ends: the end is the watch's final.
        watch = await b.send(b.command("watch", job_body()))
        await b.seen.wait(lambda: "accepted" in b.statuses(watch))
        for name in pods:
            await k8s.patch_pod(NS, name, {"status": {"phase": "Succeeded"}})
        end = await b.final(watch)
        assert end.status == "done" and end_of(end.result["end"]).succeeded


async def test_a_deletion_voids_the_launches_of_its_generation(k8s: Member, api: ApiClient) -> None:
    async with broker(k8s, api) as b:
        kubelet: Kubelet = b.agent.kubelet  # type: ignore[attr-defined]
        kubelet.free.clear()  # the pods never start
        launch = await b.send(b.command("launch", job_body()))
        await until(lambda: len(stored(k8s, PODS)) == 2)
        delete = await b.send(b.command("delete", job_body()))
        assert (await b.final(delete)).status == "done"
        voided = await b.final(launch)
        assert (voided.status, voided.error, voided.permanent) == ("failed", SUPERSEDED, True)
        assert stored(k8s, PODS) == {}
        made = len(creates(k8s))
        late = await b.final(await b.send(b.command("launch", job_body())))  # same generation
        assert (late.status, late.error) == ("failed", SUPERSEDED)
        assert len(creates(k8s)) == made
        kubelet.free.set()
        again = dataclasses.replace(SPEC, generation=2)  # a new attempt launches
        launched = await b.final(await b.send(b.command("launch", job_body(spec=again),
                                                        generation=2)))  # fmt: skip
        assert launched.status == "done" and len(stored(k8s, PODS)) == 2
        # Garbage collection: every job the broker does not list as live goes.
        kept = await b.final(await b.send(b.command("collect", {"live": ["acme/train"]}, job="")))
        assert kept.result == {"deleted": []} and len(stored(k8s, PODS)) == 2
        gone = await b.final(await b.send(b.command("collect", {"live": []}, job="")))
        assert sorted(gone.result["deleted"]) == [
            "Pod/team-acme/train-worker-0", "Pod/team-acme/train-worker-1",
            "Service/team-acme/rdzv-train"]  # fmt: skip
        assert stored(k8s, PODS) == {}


async def test_what_the_agent_refuses_creates_nothing(k8s: Member, api: ApiClient) -> None:
    async with broker(k8s, api, level="restricted") as b:
        other = await b.final(await b.send(b.command("launch", job_body(), cluster="west")))
        assert other.status == "refused" and other.permanent
        assert other.error == "command for cluster west; this agent runs cluster edge"
        forged = await b.send(b.command("launch", job_body()), key=b"k" * 32)
        privileged = copy.deepcopy(TEMPLATE)
        privileged["spec"]["containers"][0]["securityContext"] = {"privileged": True}
        spec = dataclasses.replace(SPEC, pod_security="restricted",
                                   pod_templates={"worker": privileged})  # fmt: skip
        refused = await b.final(await b.send(b.command("launch", job_body(spec=spec))))
        assert refused.status == "refused"
        assert refused.error.startswith("refused by the agent's policy: podTemplates.worker.spec.")
        assert "privileged" in refused.error
        # baseline at the broker, restricted here: checked (and refused) at restricted
        laxer = await b.final(await b.send(b.command("launch", job_body())))
        assert laxer.status == "refused"
        assert laxer.error.startswith("refused by the agent's policy: podTemplates.worker.spec")
        # A copy kept while the agent was away: ignored, and its fresh resend carried out.
        pods = b.command("pods", {"spec": spec_doc(SPEC)})
        await b.send(dataclasses.replace(pods, at=pods.at - 1000))
        assert (await b.final(await b.send(pods))).status == "done"
        # commands are handled in order: the forged and stale ones were met before those
        assert b.replies(forged.id) == [] and b.agent.commands is not None
        assert b.agent.commands.counts.forged == 1 and b.agent.commands.counts.stale == 1
        assert b.statuses(pods) == ["accepted", "done"]
        assert creates(k8s) == [] and k8s.stored_namespace(NS) is None


async def test_a_batch_job_is_launched_through_its_controller(k8s: Member, api: ApiClient) -> None:
    placement, spec = admitted("Job", nodes="n")
    placement = dataclasses.replace(placement, cluster="edge")
    spec = dataclasses.replace(spec, generation=1)
    controller = cluster(k8s, "Job", placement, spec)
    async with broker(k8s, api) as b:
        assert b.agent.commands is not None
        b.agent.commands.launcher.pause = controller.step
        done = await b.final(await b.send(b.command("launch", job_body(placement, spec))))
        assert done.status == "done", done.error
        [job] = stored(k8s, kmocklib.resource("batch", "v1", "jobs")).values()
        assert job["metadata"]["namespace"] == NS
        running = [p for p in stored(k8s, PODS).values() if p["status"].get("phase") == "Running"]
        assert len(running) == len(placement.pods)
        back = await b.final(await b.send(b.command("read_back", {}, job="")))
        assert set(back.result["workloads"]) == {"acme/train"}
        assert len(back.result["pods"]["acme/train"]) == len(placement.pods)


async def test_the_agent_command_launches_given_a_launch_config_and_its_key(
    k8s: Member, tmp_path: Path
) -> None:
    """``fedbroker agent --launch-config`` as a process: it says it launches, carries out a
    signed command, and its log never shows the key or the member's token."""
    await require_mqtt()
    prefix = unique_prefix()
    kubeconfig = write_kubeconfig(tmp_path / "kc", str(k8s.url).rstrip("/"))
    launch_config = tmp_path / "launch.yaml"
    launch_config.write_text(CONFIG % "baseline")
    key = secrets.token_hex(32)
    env = {**os.environ, "FEDBROKER_AGENT_KEY": key}
    async with subscriber(f"{prefix}/agents/edge/#") as seen:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "broker.cli", "agent", "--cluster", "edge",
            "--kubeconfig", str(kubeconfig), "--mqtt-host", MQTT_HOST,
            "--mqtt-port", str(MQTT_PORT), "--topic-prefix", prefix,
            "--client-id", f"fbtest-agent-{secrets.token_hex(4)}",
            "--launch-config", str(launch_config),
            cwd=ROOT, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        try:
            caps = f"{prefix}/agents/edge/capabilities"
            await seen.wait(lambda: bool(seen.json(caps)), 30)
            assert seen.json(caps)[-1]["launch"] is True
            async with aiomqtt.Client(MQTT_HOST, MQTT_PORT, timeout=5) as client:
                command = Command("p1", "edge", "pods", "acme/train", 1, time.time(),
                                  {"spec": spec_doc(SPEC)})  # fmt: skip
                topic = f"{prefix}/agents/edge/commands"
                await client.publish(topic, encode_command(command, key.encode()), qos=1)
                replies = f"{prefix}/agents/edge/replies"

                def finals() -> list[Reply]:
                    found = [decode_reply(p, key.encode()) for p in seen.payloads(replies)]
                    return [r for r in found if r.final]

                await seen.wait(lambda: bool(finals()), 30)
                assert finals()[0].status == "done" and finals()[0].result == {"pods": []}
        finally:
            proc.send_signal(signal.SIGTERM)
            out, err = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == 0, err.decode()[-2000:]
    text = (out + err).decode()
    assert "launching" in text
    assert key not in text and CANARY not in text
