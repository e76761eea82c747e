"""The agent's own policy (broker/agent/policy.py) and the reading of a command
(broker/agent/intake.py), pure: what the broker's admission accepts, the agent accepts
(admitted specs of every kind, through the wire's JSON), and what the agent's launch
config forbids it refuses, naming the field."""

from __future__ import annotations

import copy
import dataclasses
import json
from typing import Any

import pytest
from workload_cluster import WORKLOADS as CLUSTER_WORKLOADS
from workload_matrix import WORKLOADS as MATRIX_WORKLOADS

from adapters.mqtt.commands import Command, placement_doc, spec_doc, spec_of
from broker.agent.intake import Refused, Stale, order_of
from broker.agent.policy import AgentPolicy, TenantPolicy, enforced_level, launch_violations
from broker.manifest import (
    NodeAccess,
    admit_templates,
    parse_manifest,
    pod_templates,
    to_job,
    workload_of,
)
from broker.manifest.podsecurity import Level
from broker.model import Placement, PodPlacement, Resources
from broker.ports import LaunchSpec

BASELINE = TenantPolicy()
RESTRICTED_POD = {
    "metadata": {"labels": {"app": "trainer"}},
    "spec": {
        "serviceAccountName": "trainer",
        "runtimeClassName": "nvidia",
        "tolerations": [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}],
        "securityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [{
            "name": "main", "image": "trainer:1",
            "securityContext": {"allowPrivilegeEscalation": False,
                                "capabilities": {"drop": ["ALL"]}},
            "resources": {"limits": {"nvidia.com/gpu": 1, "cpu": "2", "memory": "4Gi"}},
        }],
    },
}  # fmt: skip
RESTRICTED = TenantPolicy(
    "restricted", frozenset({"default", "trainer"}), NodeAccess.of(["nvidia"], ())
)


def wire(spec: LaunchSpec) -> LaunchSpec:
    """The spec as the agent reads it off the wire."""
    return spec_of(json.loads(json.dumps(spec_doc(spec))))


def admitted(
    spec_body: dict[str, Any], level: Level = "baseline", accounts: tuple[str, ...] = ("default",)
) -> LaunchSpec:
    body = {"apiVersion": "fedbroker.io/v1alpha1", "kind": "FederatedJob",
            "metadata": {"name": "train"}, "spec": spec_body}  # fmt: skip
    access = NodeAccess.of(["nvidia"], ())
    parsed = admit_templates(
        parse_manifest(json.dumps(body).encode(), None), level, accounts, access=access
    )
    job = to_job(parsed, "acme", "training")
    wire_doc = parsed.wire()
    return wire(LaunchSpec(
        tenant="acme", job="train", pod_templates=pod_templates(wire_doc), pod_security=level,
        pod_sets=tuple(p.name for p in job.pod_sets), workload=workload_of(wire_doc),
    ))  # fmt: skip


def gang(template: dict[str, Any] = RESTRICTED_POD, level: Level = "restricted") -> LaunchSpec:
    pod_set = {"name": "worker", "count": 2, "template": template}
    return admitted({"podSets": [pod_set]}, level, ("default", "trainer"))


KINDS = [
    *((f"cluster-{k}", w) for k, w in CLUSTER_WORKLOADS.items()),
    *((f"matrix-{k}", w) for k, w in MATRIX_WORKLOADS.items() if k != "TrainJob"),
]


@pytest.mark.parametrize(("name", "workload"), KINDS, ids=[k for k, _ in KINDS])
def test_every_admitted_workload_passes_the_agents_policy(name: str, workload: Any) -> None:
    spec = admitted({"workload": workload})
    assert spec.workload is not None
    assert launch_violations(spec, BASELINE) == []


def test_an_admitted_restricted_gang_passes_with_the_tenants_accounts_and_classes() -> None:
    assert launch_violations(gang(), RESTRICTED) == []
    # checked at the spec's level, which may be stricter than the agent's
    assert launch_violations(gang(), BASELINE) != []  # no account "trainer" nor class "nvidia"


def _with(path: list[Any], value: Any) -> dict[str, Any]:
    template = copy.deepcopy(RESTRICTED_POD)
    node: Any = template
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return template


PRIVILEGED = {"privileged": True}
CASES: list[tuple[str, LaunchSpec, TenantPolicy, str]] = [
    ("baseline template at the agent's restricted", gang(_with(
        ["spec", "securityContext"], {}), level="baseline"), RESTRICTED,
     "podTemplates.worker.spec"),
    ("unknown level", dataclasses.replace(gang(), pod_security="root"), RESTRICTED,
     "spec.podSecurity: 'root' is not one of"),
    ("privileged container", dataclasses.replace(gang(), pod_templates={"worker": _with(
        ["spec", "containers", 0, "securityContext"], PRIVILEGED)}), RESTRICTED,
     "podTemplates.worker.spec.containers[0].securityContext.privileged"),
    ("service account not the agent's", gang(), dataclasses.replace(
        RESTRICTED, service_accounts=frozenset({"default"})),
     "podTemplates.worker.spec.serviceAccountName: service account \"trainer\" is not one"),
    ("runtime class not the agent's", gang(), dataclasses.replace(RESTRICTED, access=NodeAccess()),
     "podTemplates.worker.spec.runtimeClassName"),
    ("reserved label", dataclasses.replace(gang(), pod_templates={"worker": _with(
        ["metadata", "labels"], {"fedbroker.io/job": "x"})}), RESTRICTED,
     "podTemplates.worker.metadata.labels.fedbroker.io/job"),
    ("hostPath", dataclasses.replace(gang(), pod_templates={"worker": _with(
        ["spec", "volumes"], [{"name": "h", "hostPath": {"path": "/"}}])}), RESTRICTED,
     "podTemplates.worker.spec.volumes[0].hostPath"),
    ("nodeName", dataclasses.replace(gang(), pod_templates={"worker": _with(
        ["spec", "nodeName"], "n1")}), RESTRICTED, "podTemplates.worker.spec.nodeName"),
]  # fmt: skip


@pytest.mark.parametrize(("name", "spec", "tenant", "expected"), CASES, ids=[c[0] for c in CASES])
def test_what_the_agents_policy_refuses(
    name: str, spec: LaunchSpec, tenant: TenantPolicy, expected: str
) -> None:
    found = launch_violations(spec, tenant)
    assert found, name
    assert any(expected in line for line in found), found


def _workload(mutate: Any) -> LaunchSpec:
    spec = admitted({"workload": CLUSTER_WORKLOADS["Job"]})
    assert spec.workload is not None
    obj = copy.deepcopy(dict(spec.workload.object))
    mutate(obj)
    return dataclasses.replace(spec, workload=dataclasses.replace(spec.workload, object=obj))


def _privileged(obj: dict[str, Any]) -> None:
    obj["spec"]["template"]["spec"]["containers"][0]["securityContext"] = PRIVILEGED


WORKLOAD_CASES = [
    ("privileged", _privileged,
     "spec.workload.spec.template.spec.containers[0].securityContext.privileged"),
    ("field off the allowlist", lambda o: o["spec"].update(manualSelector=True),
     "spec.workload.spec.manualSelector"),
    ("reserved object label", lambda o: o.setdefault("metadata", {}).update(
        labels={"fedbroker.io/tenant": "other"}),
     "spec.workload.metadata.labels.fedbroker.io/tenant"),
    ("a TrainJob", lambda o: o.update(kind="TrainJob"),
     "spec.workload.kind: this agent does not launch TrainJob"),
    ("unknown kind", lambda o: o.update(kind="CronJob"), "spec.workload.kind"),
]  # fmt: skip


@pytest.mark.parametrize(("name", "mutate", "expected"), WORKLOAD_CASES,
                         ids=[c[0] for c in WORKLOAD_CASES])  # fmt: skip
def test_what_the_agents_policy_refuses_of_a_workload(
    name: str, mutate: Any, expected: str
) -> None:
    found = launch_violations(_workload(mutate), BASELINE)
    assert any(line.startswith(expected) for line in found), found


def test_pod_set_paths_must_be_the_objects() -> None:
    spec = _workload(lambda o: None)
    assert spec.workload is not None
    moved = dataclasses.replace(spec.workload, pod_sets=(("main", ("spec", "x")),))
    found = launch_violations(dataclasses.replace(spec, workload=moved), BASELINE)
    assert found == ["spec.workload.podSets: not where the object's pod templates are"]


# -- a command read into an order ---------------------------------------------------------

NOW = 1_000_000.0
PLACEMENT = Placement("acme/train", "edge", (
    PodPlacement("acme.train-worker-0", "n1", (0,), Resources(gpus=1)),
))  # fmt: skip


def command(op: str = "launch", **kw: Any) -> Command:
    spec = kw.pop("spec", gang())
    body = kw.pop("body", {"placement": placement_doc(PLACEMENT), "spec": spec_doc(spec)})
    fields = {"id": "c1", "cluster": "edge", "op": op, "job": "acme/train", "generation": 1,
              "at": NOW, "body": body, **kw}  # fmt: skip
    return Command(**fields)


LISTED = AgentPolicy("fedbroker-{tenant}", {"acme": RESTRICTED})
INTAKE: list[tuple[str, Command, AgentPolicy, str]] = [
    ("another cluster", command(cluster="west"), LISTED,
     "command for cluster west; this agent runs cluster edge"),
    ("too old", command(at=NOW - 901), LISTED, "command.at: 901 s behind"),
    ("from the future", command(at=NOW + 901), LISTED, "command.at: 901 s ahead"),
    ("unknown tenant", command(), AgentPolicy("fedbroker-{tenant}", {"other": RESTRICTED}),
     "spec.tenant: 'acme' is not a tenant of this agent's launch config"),
    ("laxer than the agent's", command(), AgentPolicy("fedbroker-{tenant}", {
        "acme": dataclasses.replace(RESTRICTED, level="restricted")}), ""),
    ("reserved namespace", command(spec=dataclasses.replace(gang(), tenant="system"),
     job="system/train"), AgentPolicy("kube-{tenant}"),
     "spec.tenant: tenant 'system' gives namespace 'kube-system'"),
    ("not a DNS label", command(spec=dataclasses.replace(gang(), tenant="A_B"), job="A_B/train"),
     LISTED, "spec.tenant: 'A_B' is not a DNS label"),
    ("job not the command's", command(job="acme/other"), LISTED,
     "body.spec: job 'acme/train' is not the command's job 'acme/other'"),
    ("placement of another cluster", command(body={
        "placement": placement_doc(dataclasses.replace(PLACEMENT, cluster="west")),
        "spec": spec_doc(gang())}), LISTED, "body.placement.cluster: placement for cluster"),
    ("no spec", command(body={"placement": placement_doc(PLACEMENT)}), LISTED,
     "body.spec: not an object"),
    ("bad placement", command(body={"placement": {"job": 1}, "spec": spec_doc(gang())}), LISTED,
     "body.placement: not a placement"),
    ("bad live list", command("collect", body={"live": [1]}), LISTED,
     "body.live: not a list of job keys"),
    ("negative tail", command("logs", body={"spec": spec_doc(gang()),
     "request": {"pod": "p", "tailLines": -1}}), LISTED, "body.request.tailLines"),
]  # fmt: skip


@pytest.mark.parametrize(("name", "cmd", "policy", "expected"), INTAKE, ids=[c[0] for c in INTAKE])
def test_commands_the_agent_refuses(
    name: str, cmd: Command, policy: AgentPolicy, expected: str
) -> None:
    if not expected:  # the same level is not laxer: accepted
        assert order_of(cmd, "edge", policy, NOW).spec == gang()
        return
    with pytest.raises(Refused, match=None) as refused:
        order_of(cmd, "edge", policy, NOW)
    assert expected in str(refused.value)
    assert isinstance(refused.value, Stale) == ("behind" in expected)


def test_the_stricter_of_the_specs_level_and_the_agents_is_enforced() -> None:
    """A broker configured laxer than the member's owner gets the member's level: its
    templates checked at it and its namespace labelled with it, not a blanket refusal."""
    laxer = command(spec=gang(level="baseline"))
    assert enforced_level(gang(level="baseline"), RESTRICTED) == "restricted"
    assert order_of(laxer, "edge", LISTED, NOW).spec == gang(level="restricted")
    stricter = dataclasses.replace(RESTRICTED, level="baseline")
    assert enforced_level(gang(), stricter) == "restricted"  # the spec's own, stricter
    assert enforced_level(dataclasses.replace(gang(), pod_security="root"), stricter) is None


def test_a_refused_launch_names_its_first_violations() -> None:
    spec = dataclasses.replace(gang(), pod_templates={"worker": _with(
        ["spec", "containers", 0, "securityContext"], PRIVILEGED)})  # fmt: skip
    with pytest.raises(Refused) as refused:
        order_of(command(spec=spec), "edge", LISTED, NOW)
    message = str(refused.value)
    assert message.startswith("refused by the agent's policy: podTemplates.worker.spec.")
    assert "privileged" in message


def test_orders_read_what_each_op_needs() -> None:
    unlisted = AgentPolicy()
    launch = order_of(command(), "edge", LISTED, NOW)
    assert launch.placement == PLACEMENT and launch.job == "acme/train"
    # deleting or reading needs no policy beyond a usable namespace
    delete = order_of(command("delete", spec=gang(level="baseline")), "edge", unlisted, NOW)
    assert delete.spec is not None and delete.spec.pod_security == "baseline"
    assert order_of(command("collect", body={"live": ["a/b"]}), "edge", LISTED, NOW).live == {"a/b"}
    logs = order_of(command("logs", body={"spec": spec_doc(gang()), "request": {
        "pod": "p", "container": "c", "tailLines": 10}}), "edge", LISTED, NOW)  # fmt: skip
    assert logs.request is not None and logs.request.tail_lines == 10
    assert not logs.request.follow
    assert order_of(command("read_back", body={}), "edge", LISTED, NOW).job == "acme/train"
