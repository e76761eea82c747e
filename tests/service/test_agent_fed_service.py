"""Pull mode, the broker's side, in the Service, with fake agents answering over the real
mosquitto with the real codec: a job placed on an agent-fed cluster is launched, shown
(pods, logs) and followed through its agent and ends Succeeded; a cluster whose agent does
not launch the job's kind is unfit for it, explain says why, and nothing is simulated
there; no member kind but the simulated one is ever run by the simulated launcher (a
federation of every kind: simulated, Kubernetes served by kmock, agent-fed with and
without a launching agent, and without a command key). Faults: a refusal says why and is
counted; an agent away fails its jobs over and is collected before it is trusted again; a
job cancelled while its agent is away is deleted when it returns; a restarted broker
reads running jobs back through the agent, and an agent silent then is a member down.
Last, the command key's config errors and secrecy."""

from __future__ import annotations

import asyncio
import json
import secrets
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import kmock as kmocklib
import pytest
from builders import Clock, until
from fake_agent import FakeAgent, done
from kmock_namespaces import NamespacedEmulator
from test_kube_service import NODES, kubeconfig_doc, kubelet, manifest, node_obj, our_pod
from test_mqtt import MQTT_HOST, MQTT_PORT, require_mqtt, unique_prefix

from adapters.mqtt.commands import Command, bound_doc, end_doc, placement_of, row_doc
from adapters.mqtt.remote import Timeouts
from adapters.simulated import SimulatedLauncher
from broker.config import ConfigError, parse_config
from broker.model import Placement, PodBound
from broker.ports import LaunchError, PodRow, RunEnd
from broker.service.facade import Service

KEY = "edge-command-key-0123456789abcdef0123"
TIMEOUTS = Timeouts(delete=2.0, read=2.0)

CONFIG = """
store: {{url: "sqlite:///{db}"}}
scheduler: {{cycleSeconds: 0.05}}
events:
  mqtt: {{host: "{host}", port: {port}, clientId: fbtest-{client}, topicPrefix: "{prefix}"}}
clusters:
{clusters}
queues:
- {{name: training, policy: gang}}
tenants:
- {{name: team-a, defaultQueue: training, token: {{value: tok-a-00000000000000000000000000}}}}
"""


def agent_fed(name: str, key: str | None = KEY) -> str:
    command_key = f", commandKey: {{value: {key}}}" if key is not None else ""
    return f"- {{name: {name}, labels: {{at: {name}}}, source: {{mqtt: {{{command_key[2:]}}}}}}}"


def config_text(tmp_path: Path, prefix: str, clusters: list[str]) -> str:
    return CONFIG.format(
        db=tmp_path / "jobs.db", host=MQTT_HOST, port=MQTT_PORT, client=secrets.token_hex(4),
        prefix=prefix, clusters="\n".join(clusters),
    )  # fmt: skip


class Recording(SimulatedLauncher):
    """The simulated launcher, noting every cluster it was asked to launch into."""

    def __init__(self) -> None:
        super().__init__()
        self.asked: list[str] = []

    async def launch(self, placement: Placement) -> None:
        self.asked.append(placement.cluster)
        await super().launch(placement)


@asynccontextmanager
async def agents(
    prefix: str, kinds: dict[str, list[str] | None]
) -> AsyncIterator[dict[str, FakeAgent]]:
    """A fake agent per cluster, launching ``kinds`` (None: it only reports; ``usable``
    has it report); every launch, read back and collection answered done at once."""
    made = {name: FakeAgent(name, KEY.encode(), prefix, MQTT_PORT) for name in kinds}
    for agent in made.values():
        agent.auto.update(launch=done(), read_back=done(), collect=done())
        agent.kinds = kinds[agent.cluster]
        await agent.start()
    try:
        yield made
    finally:
        for agent in made.values():
            await agent.close()


async def usable(service: Service, agents: dict[str, FakeAgent]) -> None:
    """The agents report (once the service listens), and their clusters take placements:
    each agent heard, and garbage collected through it when it launches."""
    assert service.mqtt is not None
    await service.mqtt.publisher.wait_connected()  # subscribed before it says connected
    for agent in agents.values():
        agent.report(kinds=agent.kinds)

    def ready(name: str, agent: FakeAgent) -> bool:
        view = service.ledger.snapshot().clusters[name]
        kinds = frozenset(agent.kinds or ())
        return not view.stale and view.launchable == kinds and "n1" in view.nodes

    await until(lambda: all(ready(name, agent) for name, agent in agents.items()))


async def test_a_job_on_an_agent_fed_cluster_runs_through_its_agent(tmp_path: Path) -> None:
    await require_mqtt()
    prefix = unique_prefix()
    config = parse_config(config_text(tmp_path, prefix, [agent_fed("edge")]), "test config")
    async with agents(prefix, {"edge": ["Pod"]}) as fake:
        service = Service(config, clock=Clock(), agent_timeouts=TIMEOUTS)
        await service.start()
        try:
            await usable(service, fake)
            assert fake["edge"].ops("collect")  # trusted only once collected through it
            assert service.ledger.snapshot().clusters["edge"].launchable == frozenset({"Pod"})
            await service.submit("team-a", manifest("train", gpus=2))
            await service.schedule_once()
            await service.launches_done(timeout=10)
            record = await service.get("team-a", "train")
            assert (record.state, record.cluster) == ("Running", "edge")
            [launch] = fake["edge"].ops("launch")
            assert launch.job == "team-a/train" and launch.body["spec"]["job"] == "train"
            # Its pods and logs, read through the agent.
            row = PodRow("train-worker-0", "worker", "edge", "n1", "Running", 0, "worker-0")
            fake["edge"].auto["pods"] = done({"pods": [row_doc(row)]})
            fake["edge"].auto["logs"] = done({"data": "epoch 1\n", "truncated": False})
            assert await service.pods("team-a", "train") == [row]
            stream = await service.logs("team-a", "train", None)
            assert [chunk async for chunk in stream] == [b"epoch 1\n"]
            await stream.aclose()
            assert fake["edge"].ops("logs")[0].body["request"]["pod"] == "train-worker-0"
            await fake["edge"].heard(lambda: bool(fake["edge"].ops("watch")))
            [watch] = fake["edge"].ops("watch")
            fake["edge"].reply(watch, "done", {"end": end_doc(RunEnd(True))})
            await service.runs_done(timeout=10)
            assert (await service.get("team-a", "train")).state == "Succeeded"
        finally:
            await service.close()


async def test_a_kind_the_agent_does_not_launch_is_explained_never_simulated(
    tmp_path: Path,
) -> None:
    await require_mqtt()
    prefix = unique_prefix()
    text = config_text(tmp_path, prefix, [agent_fed("edge"), agent_fed("bare", key=None)])
    launcher = Recording()
    config = parse_config(text, "test config")
    async with agents(prefix, {"edge": ["Job"]}) as fake:
        service = Service(config, clock=Clock(), launcher=launcher, agent_timeouts=TIMEOUTS)
        await service.start()
        try:
            await usable(service, fake)
            await service.submit("team-a", manifest("train"))
            await service.schedule_once()
            assert (await service.get("team-a", "train")).state == "Queued"
            explained = await service.explain("team-a", "train")
            said = {c["cluster"]: c["reasons"][0]["message"] for c in explained["clusters"]}
            assert said["edge"] == "cluster edge is agent-fed; its agent does not launch Pod"
            assert not fake["edge"].ops("launch") and launcher.asked == []
            # Whatever gets there all the same is refused for good, never simulated.
            stray = Placement("team-a/stray", "bare", ())
            with pytest.raises(LaunchError, match=r"bare is agent-fed.*no commandKey") as info:
                await service.shared.launcher.launch(stray)
            assert info.value.permanent and launcher.asked == []
        finally:
            await service.close()


# -- acceptance: nothing simulated for a cluster that is not simulated ------------------------


@pytest.fixture
def k8s(kmock: kmocklib.KubernetesEmulator) -> kmocklib.KubernetesEmulator:
    kmock.resources["v1/pods"] = kmocklib.ResourceInfo(namespaced=True)
    kmock.resources["v1/nodes"] = kmocklib.ResourceInfo(namespaced=False)
    kmock.resources["v1/services"] = kmocklib.ResourceInfo(namespaced=True)
    kmock.objects[NODES, None, "n1"] = node_obj("n1", gpus=8)
    return kmock


def placed(service: Service) -> dict[str, Any]:
    return {
        launch.placement.job: launch.placement.cluster for launch in service.lifecycle.launches()
    }


@pytest.mark.kmock(cls=NamespacedEmulator)
async def test_the_simulated_launcher_runs_simulated_clusters_only(
    tmp_path: Path, k8s: kmocklib.KubernetesEmulator
) -> None:
    await require_mqtt()
    prefix = unique_prefix()
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(json.dumps(kubeconfig_doc(str(k8s.url).rstrip("/"))))
    clusters = [
        "- {name: sim, labels: {at: sim}, source: {simulated: {shapes: "
        '[{gpuType: A100, gpus: 8, cpu: "64", memory: 256Gi, count: 1}]}}}',
        f'- {{name: east, labels: {{at: east}}, source: {{kube: {{kubeconfig: "{kubeconfig}", '
        "context: east, launchMode: pin, podPollSeconds: 0.02}}}",
        agent_fed("edge"), agent_fed("quiet"), agent_fed("bare", key=None),
    ]  # fmt: skip
    config = parse_config(config_text(tmp_path, prefix, clusters), "test config")
    launcher = Recording()
    async with agents(prefix, {"edge": ["Pod"], "quiet": None, "bare": None}) as fake:
        service = Service(config, clock=Clock(), launcher=launcher, agent_timeouts=TIMEOUTS)
        await service.start()
        try:
            await usable(service, fake)
            for name in ("sim", "east", "edge", "quiet", "bare"):
                body = manifest(name, placement={"clusterSelector": {"at": name}})
                await service.submit("team-a", body)
            await service.schedule_once()
            await until(lambda: our_pod(k8s, "east-worker-0") is not None)
            await kubelet(k8s, "east-worker-0", "Running", node="n1")
            await service.launches_done(timeout=10)
            states = {
                name: (await service.get("team-a", name)).state
                for name in ("sim", "east", "edge", "quiet", "bare")
            }
            assert states == {
                "sim": "Running", "east": "Running", "edge": "Running",
                "quiet": "Queued", "bare": "Queued",
            }  # fmt: skip
            assert launcher.asked == ["sim"] and set(launcher.running) == {"team-a/sim"}
            assert placed(service) == {f"team-a/{c}": c for c in ("sim", "east", "edge")}
        finally:
            await service.close()


# -- refusals, failover, a restart ---------------------------------------------------------------


async def test_a_refused_launch_says_why_and_is_counted(tmp_path: Path) -> None:
    await require_mqtt()
    prefix = unique_prefix()
    config = parse_config(config_text(tmp_path, prefix, [agent_fed("edge")]), "test config")
    async with agents(prefix, {"edge": ["Pod"]}) as fake:
        edge = fake["edge"]

        def refuse(command: Command) -> None:
            error = "spec.podTemplates.worker.spec.hostNetwork: not allowed for team-a"
            edge.reply(command, "refused", error=error)

        edge.auto["launch"] = refuse
        service = Service(config, clock=Clock(), agent_timeouts=TIMEOUTS)
        await service.start()
        try:
            await usable(service, fake)
            await service.submit("team-a", manifest("train"))
            await service.schedule_once()
            await service.launches_done(timeout=10)
            record = await service.get("team-a", "train")
            assert record.state == "Queued"
            assert "launch refused by edge: spec.podTemplates.worker.spec.hostNetwork" in (
                record.reason or ""
            )
            assert service.mqtt is not None and service.mqtt.agents is not None
            [family] = list(service.mqtt.agents.metrics())
            samples = {(s.name, s.labels["cluster"]): s.value for s in family.samples}
            assert samples == {("fedbroker_agent_refusals_total", "edge"): 1.0}
        finally:
            await service.close()


async def test_an_agent_away_fails_over_and_is_collected_before_it_is_trusted(
    tmp_path: Path,
) -> None:
    await require_mqtt()
    prefix = unique_prefix()
    text = config_text(tmp_path, prefix, [agent_fed("edge")]).replace(
        "policy: gang}", "policy: gang, failoverAfterSeconds: 60}"
    )
    clock = Clock()
    async with agents(prefix, {"edge": ["Pod"]}) as fake:
        edge = fake["edge"]
        service = Service(parse_config(text, "test config"), clock=clock, agent_timeouts=TIMEOUTS)
        await service.start()
        try:
            await usable(service, fake)
            await service.submit("team-a", manifest("train"))
            await service.schedule_once()
            await service.launches_done(timeout=10)
            assert (await service.get("team-a", "train")).state == "Running"
            status = "agents/edge/status"
            edge.publisher.publish_nowait(status, "offline", retain=True)  # as its will
            await until(lambda: service.ledger.snapshot().clusters["edge"].stale)
            clock.now += 61
            await service.schedule_once()
            record = await service.get("team-a", "train")
            assert record.state == "Queued" and (record.reason or "").startswith("FailedOver:")
            collected = len(edge.ops("collect"))
            edge.publisher.publish_nowait(status, "online", retain=True)
            edge.report(kinds=["Pod"])  # a heartbeat on the moved clock
            await usable(service, fake)  # trusted again only once collected through it
            [collect] = edge.ops("collect")[collected:]
            assert collect.body == {"live": []}  # the failed-over job's leftovers go
            await service.schedule_once()
            await service.launches_done(timeout=10)
            assert (await service.get("team-a", "train")).state == "Running"
            assert edge.commands.index(collect) < edge.commands.index(edge.ops("launch")[-1])
        finally:
            await service.close()


async def test_a_restarted_broker_reads_running_jobs_back_through_the_agent(
    tmp_path: Path,
) -> None:
    await require_mqtt()
    prefix = unique_prefix()
    text = config_text(tmp_path, prefix, [agent_fed("edge")])
    async with agents(prefix, {"edge": ["Pod"]}) as fake:
        edge = fake["edge"]
        service = Service(parse_config(text, "test config"), agent_timeouts=TIMEOUTS)
        await service.start()
        try:
            await usable(service, fake)
            await service.submit("team-a", manifest("train", gpus=2))
            await service.schedule_once()
            await service.launches_done(timeout=10)
            assert (await service.get("team-a", "train")).state == "Running"
        finally:
            await service.close()
        [pod] = placement_of(edge.ops("launch")[0].body["placement"]).pods
        bound = PodBound("edge", pod.pod, pod.node, pod.resources, pod.gpus)
        edge.auto["read_back"] = done({"pods": {"team-a/train": [bound_doc(bound)]}})
        watches = len(edge.ops("watch"))
        restarted = Service(parse_config(text, "test config"), agent_timeouts=TIMEOUTS)
        await restarted.start()
        try:
            assert (await restarted.get("team-a", "train")).state == "Running"
            assert restarted.queue.get("team-a/train") is None  # restored, not requeued
            await edge.heard(lambda: len(edge.ops("watch")) > watches)  # followed again
            edge.reply(edge.ops("watch")[-1], "done", {"end": end_doc(RunEnd(True))})
            await restarted.runs_done(timeout=10)
            assert (await restarted.get("team-a", "train")).state == "Succeeded"
        finally:
            await restarted.close()


async def test_a_job_cancelled_while_its_agent_is_away_is_deleted_when_it_returns(
    tmp_path: Path,
) -> None:
    await require_mqtt()
    prefix = unique_prefix()
    config = parse_config(config_text(tmp_path, prefix, [agent_fed("edge")]), "test config")
    async with agents(prefix, {"edge": ["Pod"]}) as fake:
        edge = fake["edge"]
        service = Service(config, clock=Clock(), agent_timeouts=Timeouts(delete=30, read=2))
        await service.start()
        try:
            await usable(service, fake)
            await service.submit("team-a", manifest("train"))
            await service.schedule_once()
            await service.launches_done(timeout=10)
            assert service.mqtt is not None and service.mqtt.agents is not None
            remote = service.mqtt.agents.remotes["edge"]
            # Its watch acknowledged first: any signed reply says the agent is there.
            await until(lambda: all(p.accepted for p in remote.pending.values()))
            edge.publisher.publish_nowait("agents/edge/status", "offline", retain=True)
            await until(lambda: service.ledger.snapshot().clusters["edge"].stale)
            async with asyncio.timeout(5):  # never the 30 s a deletion may wait for an answer
                await service.cancel("team-a", "train")
            assert (await service.get("team-a", "train")).state == "Cancelled"
            deletes = edge.ops("delete")  # heard by the agent's connection, unanswered
            assert [p.command.op for p in remote.pending.values()] == ["delete"]
            edge.auto["delete"] = done()
            edge.publisher.publish_nowait("agents/edge/status", "online", retain=True)
            await edge.heard(lambda: len(edge.ops("delete")) > len(deletes))
            await until(lambda: not remote.pending)
            assert edge.ops("delete")[-1].job == "team-a/train"
        finally:
            await service.close()


async def test_an_agent_silent_at_the_election_is_a_member_down(tmp_path: Path) -> None:
    """Its jobs are requeued (not adopted), and it takes nothing until a collection through
    it succeeded, so the old gang is gone before the job runs again."""
    await require_mqtt()
    prefix = unique_prefix()
    text = config_text(tmp_path, prefix, [agent_fed("edge")])
    async with agents(prefix, {"edge": ["Pod"]}) as fake:
        edge = fake["edge"]
        service = Service(parse_config(text, "test config"), agent_timeouts=TIMEOUTS)
        await service.start()
        try:
            await usable(service, fake)
            await service.submit("team-a", manifest("train"))
            await service.schedule_once()
            await service.launches_done(timeout=10)
        finally:
            await service.close()
        edge.silent.add("read_back")  # it will not answer
        collected = len(edge.ops("collect"))
        timeouts = Timeouts(delete=2.0, read=0.3)
        restarted = Service(parse_config(text, "test config"), agent_timeouts=timeouts)
        await restarted.start()
        try:
            record = await restarted.get("team-a", "train")
            assert record.state == "Queued" and restarted.queue.get("team-a/train") is not None
            assert "edge" in restarted.kube.dirty
            assert restarted.ledger.snapshot().clusters["edge"].stale
            await usable(restarted, fake)  # heard again: collected, then trusted
            [collect] = edge.ops("collect")[collected:]
            assert collect.body == {"live": []}
            await restarted.schedule_once()
            await restarted.launches_done(timeout=10)
            assert (await restarted.get("team-a", "train")).state == "Running"
            assert edge.commands.index(collect) < edge.commands.index(edge.ops("launch")[-1])
        finally:
            await restarted.close()


# -- the command key in the config ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("key", "message"),
    [
        ("{env: FEDBROKER_TEST_NO_SUCH_KEY}", "commandKey.env: environment variable"),
        ("{file: /nonexistent/key}", "commandKey.file: cannot read /nonexistent/key"),
        ("{value: k, env: K}", "commandKey: give exactly one of: env, value, file"),
        ('{value: ""}', "commandKey.value: token is empty"),
    ],
)
def test_a_bad_command_key_is_one_line_naming_it(key: str, message: str) -> None:
    cluster = f"- {{name: e, source: {{mqtt: {{commandKey: {key}}}}}}}"
    text = f"events: {{mqtt: {{host: h}}}}\nclusters:\n{cluster}\n"
    with pytest.raises(ConfigError) as info:
        parse_config(text, "cfg.yaml", {})
    assert str(info.value).startswith(f"cfg.yaml: clusters[0].source.mqtt.{message}")
    assert "\n" not in str(info.value)


def test_the_command_key_from_a_file_stays_secret(tmp_path: Path) -> None:
    (tmp_path / "key").write_text(KEY + "\n")
    text = (
        "events: {mqtt: {host: h}}\nclusters:\n"
        f"- {{name: e, source: {{mqtt: {{commandKey: {{file: {tmp_path / 'key'}}}}}}}}}\n"
    )
    config = parse_config(text, "cfg.yaml", {})
    assert config.command_keys["e"].get_secret_value() == KEY
    assert KEY not in repr(config) + str(config.model_dump())
