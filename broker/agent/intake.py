"""A verified command read into what the agent carries out, or refused (pure, no I/O).

The signature was checked by the codec (``adapters.mqtt.commands.decode_command``); what
the broker signed is still checked before anything happens in the member: the command is
for this cluster, its ``at`` is within ``MAX_SKEW_SECONDS`` of the agent's clock (an old
command is ``Stale``: a replay, or a copy kept while the agent was away), its body reads
as the op needs (a placement of this cluster and the command's job, a launch spec of that
job, a bounded log request), the tenant's namespace is usable, and a launch passes the
agent's own policy (``broker.agent.policy``). A refusal is a ``Refused`` naming the field.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from adapters.mqtt.commands import (
    MAX_SKEW_SECONDS,
    Command,
    CommandError,
    log_request_of,
    placement_of,
    spec_of,
)
from broker.agent.policy import AgentPolicy, enforced_level, launch_violations
from broker.model import Placement
from broker.ports import LaunchSpec, LogRequest

MAX_LIVE_JOBS = 1_000_000
MAX_TAIL_LINES = 1_000_000
_SHOWN = 3  # violations named in one refusal; the rest counted


class Refused(Exception):
    """The agent will not carry the command out (message: why, naming the field)."""


class Stale(Refused):
    """A command whose ``at`` is too far behind the agent's clock: a replay, or a copy the
    MQTT broker kept for the agent while it was away. Never answered: the broker resends
    every command it still waits for, freshly signed, when the agent returns, and an
    answer to the old copy would end the wait of the fresh one."""


@dataclass(frozen=True, slots=True)
class Order:
    """A command as the agent carries it out: what its op needs, read and checked."""

    command: Command
    placement: Placement | None = None
    spec: LaunchSpec | None = None
    live: frozenset[str] = frozenset()
    request: LogRequest | None = None

    @property
    def job(self) -> str:
        return self.spec.key if self.spec is not None else self.command.job


def _object(body: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    value = body.get(key)
    if not isinstance(value, dict):
        raise Refused(f"body.{key}: not an object")
    return value


def _spec(command: Command, policy: AgentPolicy) -> LaunchSpec:
    spec = spec_of(_object(command.body, "spec"))
    if command.job and command.job != spec.key:
        raise Refused(f"body.spec: job {spec.key!r} is not the command's job {command.job!r}")
    problem = policy.namespace_problem(spec.tenant)
    if problem is not None:
        raise Refused(problem)
    return spec


def _placement(command: Command, cluster: str, spec: LaunchSpec) -> Placement:
    placement = placement_of(_object(command.body, "placement"))
    if placement.cluster != cluster:
        raise Refused(
            f"body.placement.cluster: placement for cluster {placement.cluster!r}; this "
            f"agent runs cluster {cluster!r}"
        )
    if placement.job != spec.key:
        raise Refused(f"body.placement.job: {placement.job!r} is not the spec's {spec.key!r}")
    return placement


def _request(body: Mapping[str, Any]) -> LogRequest:
    try:
        request = log_request_of(_object(body, "request"))
    except (KeyError, TypeError, ValueError):
        raise Refused("body.request: not a log request") from None
    tail = request.tail_lines
    if tail is not None and not 0 <= tail <= MAX_TAIL_LINES:
        raise Refused(f"body.request.tailLines: not within 0..{MAX_TAIL_LINES}")
    return request


def _live(body: Mapping[str, Any]) -> frozenset[str]:
    live = body.get("live")
    if (
        not isinstance(live, list)
        or len(live) > MAX_LIVE_JOBS
        or not all(isinstance(j, str) and j for j in live)
    ):
        raise Refused("body.live: not a list of job keys")
    return frozenset(live)


def refusal(violations: list[str]) -> str:
    """The agent's refusal of a launch: its first few violations, the rest counted."""
    shown = "; ".join(violations[:_SHOWN])
    more = len(violations) - _SHOWN
    return f"refused by the agent's policy: {shown}" + (f" (and {more} more)" if more > 0 else "")


def order_of(command: Command, cluster: str, policy: AgentPolicy, now: float) -> Order:
    """The order of a verified command; ``Refused`` naming why it is not carried out."""
    if command.cluster != cluster:
        raise Refused(f"command for cluster {command.cluster}; this agent runs cluster {cluster}")
    skew = command.at - now
    if abs(skew) > MAX_SKEW_SECONDS:
        why = (
            f"command.at: {abs(skew):.0f} s {'ahead of' if skew > 0 else 'behind'} this "
            f"agent's clock (at most {MAX_SKEW_SECONDS:.0f} s)"
        )
        raise Refused(why) if skew > 0 else Stale(why)
    op, body = command.op, command.body
    try:
        if op == "read_back":
            return Order(command)
        if op == "collect":
            return Order(command, live=_live(body))
        spec = _spec(command, policy)
        if op == "pods":
            return Order(command, spec=spec)
        if op == "logs":
            return Order(command, spec=spec, request=_request(body))
        placement = _placement(command, cluster, spec)
    except CommandError as exc:
        raise Refused(str(exc)) from None
    if op == "launch":
        tenant = policy.tenant(spec.tenant)
        if isinstance(tenant, str):
            raise Refused(tenant)
        violations = launch_violations(spec, tenant)
        if violations:
            raise Refused(refusal(violations))
        level = enforced_level(spec, tenant)
        if level is not None and level != spec.pod_security:
            # the tenant's namespace is labelled with the level its templates passed
            spec = dataclasses.replace(spec, pod_security=level)
    return Order(command, placement=placement, spec=spec)


__all__ = ["Order", "Refused", "Stale", "order_of", "refusal"]
