"""The domains a delegate-mode launch passes to the member's gang scheduler (pure): read
from the placed nodes' labels (``broker.service.launch_domains``), then ANDed into each
pod's nodeSelector (``adapters.kube.objects.confine``), a pod gang's slices each their own;
what cannot be said is refused (a tenant's selector naming another domain, for good;
slices of one workload template in different domains, for good; a required level the
placed nodes no longer show, for now). Pin mode adds nothing: its pods are pinned. An
agent-fed member's launch gets them on the wire."""

from __future__ import annotations

import json
from typing import Any

import pytest

from adapters.kube.objects import Flavor, GangObjects, KubeLaunchError, Mode
from adapters.kube.workloads import workload_body
from adapters.mqtt.commands import CommandError, spec_doc, spec_of
from broker.manifest.workloads import INTEGRATIONS
from broker.model import Job, Placement, PodPlacement, PodSet, Resources, TopologyRequest
from broker.ports import Domains, LaunchSpec, WorkloadSpec
from broker.service.launch_domains import launch_domains

BLOCK, RACK, HOST = "x/block", "x/rack", "kubernetes.io/hostname"
LEVELS = (BLOCK, RACK, HOST)
# node -> (block, rack)
NODES = {"a1": ("b1", "r1"), "a2": ("b1", "r1"), "b1": ("b1", "r2"), "c1": ("b2", "r3")}
GPU = Resources(gpus=1)


def labels(node: str) -> dict[str, str] | None:
    if node not in NODES:
        return None
    block, rack = NODES[node]
    return {BLOCK: block, RACK: rack, HOST: node}


def derive(topo: TopologyRequest, nodes: list[str], name: str = "w") -> dict[str, Domains]:
    job = Job("train", (PodSet(name, len(nodes), GPU, topology=topo),
                        PodSet("other", 1, GPU)), tenant="acme")  # fmt: skip
    pods = [PodPlacement(f"acme.train-{name}-{i}", n, (0,), GPU) for i, n in enumerate(nodes)]
    pods.append(PodPlacement("acme.train-other-0", "c1", (0,), GPU))
    return launch_domains(job, Placement("acme/train", "east", tuple(pods)), LEVELS, labels)


DERIVED = [
    pytest.param(TopologyRequest(required=RACK), ["a1", "a2"], Domains({RACK: "r1"}),
                 id="required"),
    pytest.param(TopologyRequest(required=BLOCK, preferred=RACK), ["a1", "a2"],
                 Domains({RACK: "r1", BLOCK: "b1"}), id="kai-both-resolved-narrow"),
    pytest.param(TopologyRequest(required=BLOCK, preferred=RACK), ["a1", "b1"],
                 Domains({BLOCK: "b1"}), id="kai-both-fell-back"),
    pytest.param(TopologyRequest(preferred=RACK), ["a1", "c1"], Domains({}),
                 id="preferred-resolved-to-the-cluster"),
    pytest.param(TopologyRequest(required=BLOCK, slice_size=1, slice_level=RACK), ["a1", "b1"],
                 Domains({BLOCK: "b1"}, 1, ({RACK: "r1"}, {RACK: "r2"})), id="slices-apart"),
    pytest.param(TopologyRequest(required=BLOCK, slice_size=1, slice_level=RACK), ["a1", "a2"],
                 Domains({BLOCK: "b1", RACK: "r1"}), id="slices-together"),
    pytest.param(TopologyRequest(required=RACK), ["a1", "gone"],
                 Domains({}, unresolved=RACK), id="node-gone"),
]  # fmt: skip


@pytest.mark.parametrize(("topo", "nodes", "want"), DERIVED)
def test_the_domains_come_from_the_placed_nodes(
    topo: TopologyRequest, nodes: list[str], want: Domains
) -> None:
    assert derive(topo, nodes) == {"w": want}  # "other" has no request: nothing


def test_a_pod_set_whose_name_ends_another_ones_is_not_mixed_up() -> None:
    job = Job("train", (PodSet("x", 1, GPU, topology=TopologyRequest(required=RACK)),
                        PodSet("w-x", 1, GPU)), tenant="acme")  # fmt: skip
    pods = (PodPlacement("acme.train-x-0", "a1", (0,), GPU),
            PodPlacement("acme.train-w-x-0", "c1", (0,), GPU))  # fmt: skip
    found = launch_domains(job, Placement("acme/train", "east", pods), LEVELS, labels)
    assert found == {"x": Domains({RACK: "r1"})}


def objects(mode: Mode = "delegate", flavor: Flavor = "coscheduling") -> GangObjects:
    return GangObjects(
        "fedbroker-{tenant}", mode, flavor, "fedbroker", cluster="east",
        gpu_resource="nvidia.com/gpu", shared_gpu_resource=None, scheduler_name=None,
        default_image="busybox",
    )  # fmt: skip


def spec(domains: Domains, selector: dict[str, str] | None = None) -> LaunchSpec:
    template: dict[str, Any] = {"spec": {"containers": [{"name": "m", "image": "t:1"}]}}
    if selector is not None:
        template["spec"]["nodeSelector"] = selector
    return LaunchSpec(tenant="acme", job="train", pod_templates={"w": template},
                      domains={"w": domains})  # fmt: skip


def selector_of(
    pod: int, s: LaunchSpec, mode: Mode = "delegate", flavor: Flavor = "volcano"
) -> Any:
    placed = PodPlacement(f"acme.train-w-{pod}", "a1", (0,), GPU)
    return objects(mode, flavor).pod_body(placed, s)["spec"].get("nodeSelector")


def test_a_delegated_pod_gang_is_kept_in_its_domains_slice_by_slice() -> None:
    s = spec(Domains({BLOCK: "b1"}, 2, ({RACK: "r1"}, {RACK: "r2"})), {"pool": "gpu"})
    assert selector_of(1, s) == {"pool": "gpu", BLOCK: "b1", RACK: "r1"}
    assert selector_of(2, s, flavor="coscheduling") == {"pool": "gpu", BLOCK: "b1", RACK: "r2"}
    assert selector_of(2, s, mode="pin") == {"pool": "gpu"}  # pinned to its node instead


def test_a_tenant_selector_naming_another_domain_is_refused_for_good() -> None:
    assert selector_of(0, spec(Domains({RACK: "r1"}), {RACK: "r1"})) == {RACK: "r1"}
    with pytest.raises(KubeLaunchError) as refused:
        selector_of(0, spec(Domains({RACK: "r1"}), {RACK: "r9"}))
    assert refused.value.permanent
    said = "pod set w: template spec.nodeSelector[x/rack] is 'r9', but the gang was placed in"
    assert str(refused.value).startswith(said)


def job_workload(domains: Domains) -> dict[str, Any]:
    template = {"spec": {"containers": [{"name": "m", "image": "t:1"}]}}
    workload = WorkloadSpec({"apiVersion": "batch/v1", "kind": "Job",
                             "spec": {"parallelism": 2, "template": template}},
                            (("w", ("spec", "template")),))  # fmt: skip
    s = LaunchSpec(tenant="acme", job="train", workload=workload, domains={"w": domains})
    kind = next(k for k in INTEGRATIONS if k.kind == "Job")
    return workload_body(objects(), s, kind)


def test_a_delegated_workload_template_carries_its_domain_or_is_refused() -> None:
    body = job_workload(Domains({RACK: "r1"}))
    assert body["spec"]["template"]["spec"]["nodeSelector"] == {RACK: "r1"}
    with pytest.raises(KubeLaunchError) as apart:
        job_workload(Domains({}, 1, ({RACK: "r1"}, {RACK: "r2"})))
    assert apart.value.permanent and "slices were placed in different domains" in str(apart.value)
    with pytest.raises(KubeLaunchError) as gone:
        job_workload(Domains({}, unresolved=RACK))
    assert not gone.value.permanent and "no one domain of x/rack" in str(gone.value)


def test_the_domains_travel_to_an_agent_and_bad_ones_are_refused() -> None:
    domains = {"w": Domains({BLOCK: "b1"}, 2, ({RACK: "r1"}, {RACK: "r2"})),
               "v": Domains({}, unresolved=RACK)}  # fmt: skip
    sent = LaunchSpec(tenant="acme", job="train", domains=domains)
    assert spec_of(json.loads(json.dumps(spec_doc(sent)))).domains == domains
    bad = {**spec_doc(sent), "domains": {"w": {"shared": {RACK: 3}}}}
    with pytest.raises(CommandError, match=r"body\.spec: not a launch spec"):
        spec_of(bad)
