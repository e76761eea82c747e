"""Agent-fed members whose agent launches (pull mode): one ``RemoteLauncher`` each, what
each agent says it launches, and the agents' replies and refusals.

``AgentLaunchers`` is built by ``broker.service.compose`` next to ``MqttEvents`` when the
config has agent-fed clusters. A cluster with ``source.mqtt.commandKey`` gets a
``RemoteLauncher`` (in ``ClusterLauncher``: its launcher and pod reader) and becomes a
member like a Kubernetes one (``KubeMembers.add_agent``): stale while its agent is unheard,
failed over after ``failoverAfterSeconds``, read back at an election, and kept out of
placements once back until a garbage collection through its agent succeeded.

Every agent-fed cluster takes only the job kinds its agent launches
(``Ledger.set_launchable``): none without a command key, none until its agent published
capabilities, none when those say ``launch: false``. Pending commands are sent again after
the broker's MQTT (re)connect, when an agent's status goes ``online`` again and when it
publishes capabilities (a restarted agent); the retained ones a (re)subscription hands
over are covered by the reconnect's resend.

Metrics: ``fedbroker_agent_refusals_total{cluster}`` (commands an agent refused).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator

from prometheus_client.metrics_core import CounterMetricFamily, Metric

from adapters.mqtt.capabilities import NONE, Capabilities, parse_capabilities
from adapters.mqtt.remote import Publish, RemoteLauncher, Timeouts
from broker.config import Config
from broker.core.ledger import Ledger
from broker.model import Placement
from broker.ports import LaunchSpec, ReportError
from broker.service.members import KubeMembers

log = logging.getLogger(__name__)


def no_launch(cluster: str, what: str = "jobs") -> str:
    return f"cluster {cluster} is agent-fed; its agent does not launch {what}"


class AgentLaunchers:
    """The launching agents of one service (see the module doc). ``changed`` wakes the
    scheduler (a cluster's launchable kinds changed); ``check_stale`` re-reads every
    member's staleness into the ledger."""

    def __init__(
        self,
        config: Config,
        publish: Publish,
        spec_for: Callable[[Placement], LaunchSpec],
        ledger: Ledger,
        members: KubeMembers,
        changed: Callable[[], None],
        check_stale: Callable[[], None],
        timeouts: Timeouts | None = None,
    ) -> None:
        self._ledger = ledger
        self._members = members
        self._changed = changed
        self._check_stale = check_stale
        self.remotes: dict[str, RemoteLauncher] = {}
        self.capabilities: dict[str, Capabilities] = {}
        self.fed: list[str] = []  # every agent-fed cluster
        keys = config.command_keys
        for cc in config.clusters:
            if cc.source.mqtt is None:
                continue
            self.fed.append(cc.name)
            ledger.set_launchable(cc.name, frozenset())  # until its agent says what
            key = keys.get(cc.name)
            if key is None:
                continue
            remote = RemoteLauncher(
                cc.name, key.get_secret_value().encode(), publish, spec_for,
                timeouts=timeouts or Timeouts(), heard=self._heard(cc.name),
            )  # fmt: skip
            self.remotes[cc.name] = remote
            members.add_agent(cc.name, remote)

    def _heard(self, cluster: str) -> Callable[[], bool]:
        return lambda: not self._members.down(cluster)

    def refusals(self) -> dict[str, str]:
        """Why nothing launches into the agent-fed clusters without a command key."""
        return {
            name: f"{no_launch(name)} (its source.mqtt has no commandKey)"
            for name in self.fed
            if name not in self.remotes
        }

    # -- what the agents publish ---------------------------------------------------------

    def on_reply(self, cluster: str, payload: bytes) -> bool:
        """True when the reply answers a command pending now: the agent is heard then."""
        remote = self.remotes.get(cluster)
        return remote is not None and remote.on_reply(payload)

    def on_capabilities(self, cluster: str, payload: bytes, *, fresh: bool = True) -> None:
        """An agent's ``capabilities``: the kinds placed there from now on; ``fresh`` (just
        published, not the retained one a subscription hands over: a restarted agent) also
        has the pending commands sent again."""
        try:
            found = parse_capabilities(payload)
        except ReportError as exc:
            log.warning("cluster %s: bad agent capabilities: %s", cluster, exc)
            found = NONE
        self.capabilities[cluster] = found
        remote = self.remotes.get(cluster)
        kinds = found.launchable if remote is not None else frozenset()
        if self._ledger.snapshot().clusters[cluster].launchable != kinds:
            log.info("cluster %s: its agent launches %s", cluster, sorted(kinds) or "nothing")
            self._ledger.set_launchable(cluster, kinds)
            self._changed()
        if remote is not None and payload and fresh:
            remote.resend_all()

    def agent_back(self, cluster: str) -> None:
        """An agent's status went ``online`` again: what it has not answered, once more."""
        remote = self.remotes.get(cluster)
        if remote is not None:
            remote.resend_all()

    def resend_all(self) -> None:
        """After the broker's own MQTT (re)connect."""
        for remote in self.remotes.values():
            remote.resend_all()

    def set_stale(self, cluster: str, stale: bool) -> bool:
        """A launching agent's cluster went stale or came back: a member's staleness (with
        its garbage collection on return); False for other clusters (the caller's)."""
        if cluster not in self.remotes:
            return False
        self._members.agent_down(cluster, stale)
        self._check_stale()
        return True

    def metrics(self) -> Iterator[Metric]:
        refusals = CounterMetricFamily(
            "fedbroker_agent_refusals",
            "Commands an agent-fed cluster's agent refused (another cluster's, a bad "
            "signature or time, a template its policy refuses)",
            labels=["cluster"],
        )
        for name, remote in sorted(self.remotes.items()):
            refusals.add_metric([name], float(remote.refusals))
        yield refusals


__all__ = ["AgentLaunchers", "no_launch"]
