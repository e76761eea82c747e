"""The delegate-mode PodGroups (coscheduling ``scheduling.x-k8s.io/v1alpha1``, Volcano
``scheduling.volcano.sh/v1beta1``) as ``GangObjects`` builds them validate against the real
CRDs' ``openAPIV3Schema`` (tests/crds.py); and that check refuses bodies the API server
would refuse or prune, so a pass means something."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from crds import schema_problems

from adapters.kube.objects import Flavor, GangObjects
from broker.model import Placement, PodPlacement, Resources
from broker.ports import LaunchSpec

FILES: dict[Flavor, str] = {
    "coscheduling": "scheduling.x-k8s.io_podgroups.yaml",
    "volcano": "scheduling.volcano.sh_podgroups.yaml",
}
PLACEMENT = Placement(
    job="acme/train", cluster="east",
    pods=tuple(PodPlacement(f"acme.train-w-{i}", "n", (0,), Resources(gpus=1)) for i in range(3)),
)  # fmt: skip


def body(flavor: Flavor, min_member: int = 0, queue: str = "training") -> dict[str, Any]:
    objects = GangObjects(
        "fedbroker-{tenant}", "delegate", flavor, "fedbroker", cluster="east",
        gpu_resource="nvidia.com/gpu", shared_gpu_resource=None, scheduler_name=None,
        default_image="busybox", volcano_queues={"training": "ml"},
    )  # fmt: skip
    spec = LaunchSpec(tenant="acme", job="train", min_member=min_member, queue=queue,
                      schedule_timeout_seconds=300)  # fmt: skip
    return objects.pod_group_body(PLACEMENT, spec)


@pytest.mark.parametrize("flavor", ["coscheduling", "volcano"])
@pytest.mark.parametrize(("min_member", "queue"), [(0, "training"), (2, "other")])
def test_pod_groups_validate_against_their_crds(
    flavor: Flavor, min_member: int, queue: str
) -> None:
    group = body(flavor, min_member, queue)
    assert schema_problems(group, FILES[flavor]) == []
    assert group["spec"]["minMember"] == (min_member or 3)
    if flavor == "volcano":
        assert group["spec"]["queue"] == {"training": "ml"}.get(queue, "default")


def _set(obj: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    out = copy.deepcopy(obj)
    *head, last = path.split(".")
    node = out
    for key in head:
        node = node[key]
    node[last] = value
    return out


# (flavor, field path, bad value, the problem's path)
BAD: list[tuple[Flavor, str, Any, str]] = [
    ("coscheduling", "spec.minMember", "2", "spec.minMember"),
    ("coscheduling", "spec.scheduleTimeoutSeconds", 1.5, "spec.scheduleTimeoutSeconds"),
    ("coscheduling", "spec.minMembers", 2, "spec"),  # misspelled: would be pruned
    ("volcano", "spec.queue", 7, "spec.queue"),
    ("volcano", "spec.minMember", [2], "spec.minMember"),
    ("volcano", "spec.queueName", "ml", "spec"),
]


@pytest.mark.parametrize(("flavor", "path", "value", "where"), BAD)
def test_the_check_refuses_what_the_api_server_would(
    flavor: Flavor, path: str, value: Any, where: str
) -> None:
    problems = schema_problems(_set(body(flavor), path, value), FILES[flavor])
    assert problems
    assert all(p.startswith(f"{where}: ") for p in problems), problems


def test_absent_crds_skip_with_a_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FEDBROKER_CRDS", "/nonexistent/crds")
    monkeypatch.delenv("FEDBROKER_REQUIRE_SERVICES", raising=False)
    with pytest.raises(pytest.skip.Exception, match="FEDBROKER_CRDS"):
        schema_problems(body("volcano"), FILES["volcano"])
