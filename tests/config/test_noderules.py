"""What a pod template reaches of its node (broker.manifest.noderules) with the tenant's
``NodeAccess``: device variables, runtime classes, scheduling gates and tolerations, each
row admitted or refused at its exact field path; and tolerations read for the placement."""

from __future__ import annotations

from typing import Any

import pytest

from broker.manifest import NodeAccess, field_path, template_violations
from broker.manifest.noderules import DEFAULT_RESERVED_TAINTS, DEVICE_ENV, toleration_of
from broker.taints import Toleration

BASE = NodeAccess()
KATA = NodeAccess.of(["kata", "gvisor"], DEFAULT_RESERVED_TAINTS)
OPEN = NodeAccess.of([], [])
INFRA = NodeAccess.of([], ["dedicated"])
CONTROL = "node-role.kubernetes.io/control-plane"


def template(**spec: Any) -> dict[str, Any]:
    return {"spec": {"containers": [{"name": "main", "image": "x"}], **spec}}


def env(*names: str) -> dict[str, Any]:
    return template(containers=[{"name": "m", "image": "x", "env": [{"name": n} for n in names]}])


def refused(tpl: dict[str, Any], access: NodeAccess) -> list[str]:
    found = template_violations(tpl, "privileged", frozenset({"default"}), (), access=access)
    return [field_path(v.path) for v in found]


# (id, template, access, refused paths)
ROWS: list[tuple[str, dict[str, Any], NodeAccess, list[str]]] = [
    ("nothing of the node", template(), BASE, []),
    ("CUDA_VISIBLE_DEVICES narrows inside the process", env("CUDA_VISIBLE_DEVICES"), BASE, []),
    ("ROCR_ and HIP_VISIBLE_DEVICES too", env("ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES"),
     BASE, []),
    ("NVIDIA_REQUIRE_* constrain, select nothing",
     env("NVIDIA_REQUIRE_CUDA", "NVIDIA_TF32_OVERRIDE"), BASE, []),
    ("a lower-case name is not the toolkit's", env("nvidia_visible_devices"), BASE, []),
    ("the legacy image rule", env("PATH", "CUDA_VERSION"), BASE,
     ["spec.containers[0].env[1].name"]),
    ("a swarm resource variable", env("DOCKER_RESOURCE_GPU"), BASE,
     ["spec.containers[0].env[0].name"]),
    ("every device variable, each at its path", env(*DEVICE_ENV), BASE,
     [f"spec.containers[0].env[{i}].name" for i in range(len(DEVICE_ENV))]),
    ("an empty list of gates or ephemeral containers", template(
        schedulingGates=[], ephemeralContainers=[]), BASE, []),
    ("a runtime class of the tenant's", template(runtimeClassName="kata"), KATA, []),
    ("a runtime class of no tenant's", template(runtimeClassName="nvidia"), KATA,
     ["spec.runtimeClassName"]),
    ("an empty runtime class", template(runtimeClassName=""), KATA, ["spec.runtimeClassName"]),
    ("a runtime class that is no string", template(runtimeClassName=["kata"]), KATA,
     ["spec.runtimeClassName"]),
    ("a keyless Exists for PreferNoSchedule only steers",
     template(tolerations=[{"operator": "Exists", "effect": "PreferNoSchedule"}]), BASE, []),
    ("the reserved key for PreferNoSchedule", template(tolerations=[
        {"key": CONTROL, "operator": "Exists", "effect": "PreferNoSchedule"}]), BASE, []),
    ("the reserved key with a value, for NoExecute", template(tolerations=[
        {"key": CONTROL, "operator": "Equal", "value": "x", "effect": "NoExecute"}]), BASE,
     ["spec.tolerations[0].key"]),
    ("the pre-1.24 control plane taint", template(tolerations=[
        {"key": "node-role.kubernetes.io/master", "operator": "Exists"}]), BASE,
     ["spec.tolerations[0].key"]),
    ("a keyless Exists where nothing is reserved", template(tolerations=[{"operator": "Exists"}]),
     OPEN, []),
    ("the control plane where the operator reserves another taint",
     template(tolerations=[{"key": CONTROL, "operator": "Exists"}]), INFRA, []),
    ("the operator's own reserved taint", template(tolerations=[
        {"key": "dedicated", "operator": "Equal", "value": "infra"}]), INFRA,
     ["spec.tolerations[0].key"]),
    ("a toleration that is no mapping", template(tolerations=["k"]), OPEN,
     ["spec.tolerations[0]"]),
    ("tolerations that are no list", template(tolerations={"key": "k"}), OPEN,
     ["spec.tolerations"]),
]  # fmt: skip


@pytest.mark.parametrize(
    ("tpl", "access", "paths"), [r[1:] for r in ROWS], ids=[r[0] for r in ROWS]
)
def test_what_the_tenant_may_reach_of_a_node(
    tpl: dict[str, Any], access: NodeAccess, paths: list[str]
) -> None:
    assert refused(tpl, access) == paths


# (id, entry, what the placement matches it as; None: tolerates nothing)
READ: list[tuple[str, object, Toleration | None]] = [
    ("keyless Exists", {"operator": "Exists"}, Toleration("", "Exists")),
    ("no operator: Equal", {"key": "k", "value": "v"}, Toleration("k", "Equal", "v")),
    ("with its effect", {"key": "k", "operator": "Exists", "effect": "NoExecute",
                         "tolerationSeconds": 30}, Toleration("k", "Exists", "", "NoExecute")),
    ("null fields are absent", {"key": "k", "operator": None, "value": None, "effect": None},
     Toleration("k", "Equal", "")),
    ("keyless Equal", {"value": "v"}, None),
    ("Exists with a value", {"key": "k", "operator": "Exists", "value": "v"}, None),
    ("an alpha operator", {"key": "k", "operator": "Lt", "value": "3"}, None),
    ("a key that is no string", {"key": ["k"], "operator": "Exists"}, None),
    ("an operator that is no string", {"key": "k", "operator": {"x": 1}}, None),
    ("an unknown effect", {"key": "k", "effect": "Soon"}, None),
    ("no mapping", "k", None),
]  # fmt: skip


@pytest.mark.parametrize(("item", "expected"), [r[1:] for r in READ], ids=[r[0] for r in READ])
def test_a_toleration_is_read_as_the_api_server_would_keep_it(
    item: object, expected: Toleration | None
) -> None:
    assert toleration_of(item) == expected
