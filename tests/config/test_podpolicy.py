"""The template policy (broker.manifest.podpolicy) as a table: hostile pod templates against
the three Pod Security levels and the broker's own rules, each refused at its exact field
path from the manifest root; and every container's requests counted as Kubernetes does."""

from __future__ import annotations

import copy
from fractions import Fraction
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from broker.manifest import (
    FederatedJob,
    ManifestError,
    PolicyViolation,
    admit_templates,
    field_path,
    pod_requests,
    template_violations,
    to_job,
)
from broker.manifest.podsecurity import Level
from broker.model import Resources

LEVELS: tuple[Level, ...] = ("privileged", "baseline", "restricted")
ALL = frozenset(LEVELS)
BASELINE = frozenset({"baseline", "restricted"})
RESTRICTED = frozenset({"restricted"})
ROOT = "spec.podSets[0].template"
ACCOUNTS = ["default", "trainer"]

# A template every level admits: the restricted profile's requirements, nothing more. Each
# hostile row changes one thing of it, so the row's field is the ONLY one refused.
LEGAL: dict[str, Any] = {
    "metadata": {"labels": {"app": "trainer"}},
    "spec": {
        "securityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [{
            "name": "main",
            "image": "trainer:1.0",
            "securityContext": {"allowPrivilegeEscalation": False,
                                "capabilities": {"drop": ["ALL"]}},
            "resources": {"limits": {"nvidia.com/gpu": 1, "cpu": "2", "memory": "8Gi"}},
        }],
    },
}  # fmt: skip
RESOURCES = {"nvidia.com/gpu": 1, "cpu": "2", "memory": "8Gi"}
DELETE = object()


def edit(*changes: tuple[str, object]) -> dict[str, Any]:
    """LEGAL with each ``(dotted path, value)`` set (DELETE removes it); ``[n]`` indexes a
    list, and a path one past a list's end appends. Keys with dots go in the value."""
    template = copy.deepcopy(LEGAL)
    for path, value in changes:
        parts: list[str | int] = []
        for part in path.split("."):
            name, _, index = part.partition("[")
            parts.append(name)
            if index:
                parts.append(int(index.rstrip("]")))
        node: Any = template
        for key in parts[:-1]:
            if isinstance(key, int):
                while len(node) <= key:
                    node.append({})
                node = node[key]
            else:
                node = node.setdefault(key, {})
        last = parts[-1]
        if value is DELETE:
            del node[last]
        elif isinstance(last, int) and len(node) == last:
            node.append(value)
        else:
            node[last] = value
    return template


C0 = "spec.containers[0]"
SC0 = f"{C0}.securityContext"
PSC = "spec.securityContext"
SECRET = "fedbroker-broker-token"
RESTRICTED_INIT: dict[str, Any] = {"name": "init", "image": "x", "securityContext": {
    "allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}}  # fmt: skip
CONFIG_MAP_KEY = {"name": "settings", "key": "gpus"}
SECOND_GPU_CONTAINER = {**RESTRICTED_INIT, "name": "side",
                        "resources": {"limits": {"nvidia.com/gpu": 8}}}  # fmt: skip

# (id, template, path under the template, fragment of the message, levels that refuse it)
HOSTILE: list[tuple[str, dict[str, Any], str, str, frozenset[str]]] = [
    # --- the issue's own list, refused on every level (the broker's rules, the requests)
    ("hostPath /", edit(("spec.volumes", [{"name": "root", "hostPath": {"path": "/"}}])),
     "spec.volumes[0].hostPath", "hostPath", ALL),
    ("nodeName", edit(("spec.nodeName", "gpu-node-1")), "spec.nodeName", "places pods", ALL),
    ("schedulerName", edit(("spec.schedulerName", "mine")), "spec.schedulerName", "scheduler",
     ALL),
    ("the broker's service account", edit(("spec.serviceAccountName", "fedbroker-broker")),
     "spec.serviceAccountName", "not one of the tenant's (default, trainer)", ALL),
    ("the deprecated serviceAccount", edit(("spec.serviceAccount", "fedbroker-broker")),
     "spec.serviceAccount", "not one of the tenant's", ALL),
    ("automount + the broker's token Secret", edit(
        ("spec.automountServiceAccountToken", True),
        ("spec.volumes", [{"name": "t", "secret": {"secretName": SECRET}}])),
     "spec.volumes[0].secret.secretName", "reserved for the broker", ALL),
    ("the broker's Secret projected", edit(("spec.volumes", [
        {"name": "t", "projected": {"sources": [{"secret": {"name": SECRET}}]}}])),
     "spec.volumes[0].projected.sources[0].secret.name", "reserved for the broker", ALL),
    ("a token for another audience", edit(("spec.volumes", [{"name": "t", "projected": {
        "sources": [{"serviceAccountToken": {"audience": "fedbroker", "path": "t"}}]}}])),
     "spec.volumes[0].projected.sources[0].serviceAccountToken.audience", "audiences", ALL),
    ("the broker's Secret in an env var", edit((f"{C0}.env", [{"name": "T", "valueFrom": {
        "secretKeyRef": {"name": SECRET, "key": "token"}}}])),
     f"{C0}.env[0].valueFrom.secretKeyRef.name", "reserved", ALL),
    ("the broker's Secret as envFrom", edit((f"{C0}.envFrom", [{"secretRef": {"name": SECRET}}])),
     f"{C0}.envFrom[0].secretRef.name", "reserved", ALL),
    ("the broker's Secret to pull images",
     edit(("spec.imagePullSecrets", [{"name": "fedbroker-pull"}])),
     "spec.imagePullSecrets[0].name", "reserved", ALL),
    ("fedbroker.io label", edit(("metadata.labels", {"fedbroker.io/tenant": "team-b"})),
     "metadata.labels.fedbroker.io/tenant", "broker's", ALL),
    ("fedbroker.io annotation", edit(("metadata.annotations", {"fedbroker.io/pod": "x"})),
     "metadata.annotations.fedbroker.io/pod", "broker's", ALL),
    ("sub.fedbroker.io label", edit(("metadata.labels", {"x.fedbroker.io/origin": "y"})),
     "metadata.labels.x.fedbroker.io/origin", "broker's", ALL),
    ("member priority class", edit(("spec.priorityClassName", "system-node-critical")),
     "spec.priorityClassName", "orders jobs", ALL),
    ("DRA claims for the pod", edit(("spec.resourceClaims", [{"name": "gpu"}])),
     "spec.resourceClaims", "not counted", ALL),
    ("second container asks nvidia.com/gpu: 8", edit(("spec.containers[1]", SECOND_GPU_CONTAINER)),
     "spec.containers[1].resources.limits.nvidia.com/gpu", "request 9, but the pod set", ALL),
    ("init container over-asking", edit(("spec.initContainers", [{**RESTRICTED_INIT,
        "resources": {"requests": {"cpu": "16"}}}])),
     "spec.initContainers[0].resources.requests.cpu", "request 16", ALL),
    ("sidecar GPU not counted", edit(("spec.initContainers", [{**RESTRICTED_INIT,
        "restartPolicy": "Always", "resources": {"limits": {"nvidia.com/gpu": 1}}}])),
     "spec.initContainers[0].resources.limits.nvidia.com/gpu", "request 2", ALL),
    ("an overhead of the pod's own", edit(("spec.overhead", {"cpu": "250m"})),
     "spec.overhead", "RuntimeClass", ALL),
    ("an uncounted MIG slice",
     edit((f"{C0}.resources.limits", {**RESOURCES, "nvidia.com/mig-1g.5gb": 1})),
     f"{C0}.resources.limits.nvidia.com/mig-1g.5gb", "not a resource the broker counts", ALL),
    ("DRA claims for a container", edit((f"{C0}.resources.claims", [{"name": "gpu"}])),
     f"{C0}.resources.claims", "not counted", ALL),
    ("GPU requests below limits", edit((f"{C0}.resources.requests", {"nvidia.com/gpu": 0})),
     f"{C0}.resources.requests.nvidia.com/gpu", "must equal limits", ALL),
    # --- devices and scheduling (broker.manifest.noderules, podrequests' pod-level resources)
    ("NVIDIA_VISIBLE_DEVICES=all with no GPU asked", edit((f"{C0}.env", [
        {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}])),
     f"{C0}.env[0].name", "selects the GPUs the NVIDIA runtime", ALL),
    ("NVIDIA_DRIVER_CAPABILITIES in an init container", edit(("spec.initContainers", [
        {**RESTRICTED_INIT, "env": [{"name": "NVIDIA_DRIVER_CAPABILITIES", "value": "all"}]}])),
     "spec.initContainers[0].env[0].name", "driver libraries", ALL),
    ("a device variable from a ConfigMap key", edit((f"{C0}.env", [{"name": "A", "value": "1"},
        {"name": "AMD_VISIBLE_DEVICES", "valueFrom": {"configMapKeyRef": CONFIG_MAP_KEY}}])),
     f"{C0}.env[1].name", "AMD container runtime", ALL),
    ("an ephemeral container asking 8 GPUs", edit(("spec.ephemeralContainers", [{
        **RESTRICTED_INIT, "resources": {"limits": {"nvidia.com/gpu": 8}}}])),
     "spec.ephemeralContainers", "debugging a running pod", ALL),
    ("the template's own scheduling gate", edit(("spec.schedulingGates", [{"name": "x.io/hold"}])),
     "spec.schedulingGates", "until the timeout", ALL),
    ("a runtime class the tenant was not given", edit(("spec.runtimeClassName", "nvidia")),
     "spec.runtimeClassName", '"nvidia" is not one of the tenant\'s (none)', ALL),
    ("a keyless Exists toleration", edit(("spec.tolerations", [{"operator": "Exists"}])),
     "spec.tolerations[0].operator", "tolerates every taint", ALL),
    ("tolerating the control plane", edit(("spec.tolerations", [
        {"key": "gpu", "operator": "Exists"},
        {"key": "node-role.kubernetes.io/control-plane", "effect": "NoSchedule"}])),
     "spec.tolerations[1].key", "a taint the operator reserves", ALL),
    ("a toleration the API server refuses", edit(("spec.tolerations", [{"value": "x"}])),
     "spec.tolerations[0].operator", "must be Exists when key is empty", ALL),
    ("GPUs asked for the whole pod", edit(("spec.resources", {"limits": {"nvidia.com/gpu": 8}})),
     "spec.resources.limits.nvidia.com/gpu", "asked per container", ALL),
    ("a pod-level request below the containers'", edit(("spec.resources", {"requests": {
        "cpu": "1"}})), "spec.resources.requests.cpu", "what the containers request (2)", ALL),
    ("500 CPUs for the whole pod", edit(("spec.resources", {"requests": {"cpu": "500"}})),
     "spec.resources.requests.cpu", "request 500, but the pod set's resources say 2", ALL),
    # --- Pod Security baseline, one control per row (restricted includes baseline)
    ("privileged", edit((f"{SC0}.privileged", True)), f"{SC0}.privileged", "privileged",
     BASELINE),
    ("privileged init container", edit(("spec.initContainers", [{**RESTRICTED_INIT,
        "securityContext": {**RESTRICTED_INIT["securityContext"], "privileged": True}}])),
     "spec.initContainers[0].securityContext.privileged", "privileged", BASELINE),
    ("hostNetwork", edit(("spec.hostNetwork", True)), "spec.hostNetwork", "host namespaces",
     BASELINE),
    ("hostPID", edit(("spec.hostPID", True)), "spec.hostPID", "host namespaces", BASELINE),
    ("hostIPC", edit(("spec.hostIPC", True)), "spec.hostIPC", "host namespaces", BASELINE),
    ("HostProcess", edit((f"{PSC}.windowsOptions", {"hostProcess": True})),
     f"{PSC}.windowsOptions.hostProcess", "must be false", BASELINE),
    ("capability SYS_ADMIN", edit((f"{SC0}.capabilities.add", ["SYS_ADMIN"])),
     f"{SC0}.capabilities.add[0]", '"SYS_ADMIN" may not be added', BASELINE),
    ("hostPort", edit((f"{C0}.ports", [{"containerPort": 80, "hostPort": 80}])),
     f"{C0}.ports[0].hostPort", "host ports", BASELINE),
    ("AppArmor unconfined", edit((f"{SC0}.appArmorProfile", {"type": "Unconfined"})),
     f"{SC0}.appArmorProfile.type", "AppArmor", BASELINE),
    ("AppArmor annotation unconfined", edit(("metadata.annotations", {
        "container.apparmor.security.beta.kubernetes.io/main": "unconfined"})),
     "metadata.annotations.container.apparmor.security.beta.kubernetes.io/main", "AppArmor",
     BASELINE),
    ("SELinux type spc_t", edit((f"{PSC}.seLinuxOptions", {"type": "spc_t"})),
     f"{PSC}.seLinuxOptions.type", "SELinux type", BASELINE),
    ("SELinux user", edit((f"{SC0}.seLinuxOptions", {"user": "system_u"})),
     f"{SC0}.seLinuxOptions.user", "SELinux users", BASELINE),
    ("SELinux role", edit((f"{SC0}.seLinuxOptions", {"role": "sysadm_r"})),
     f"{SC0}.seLinuxOptions.role", "SELinux users and roles", BASELINE),
    ("/proc unmasked", edit((f"{SC0}.procMount", "Unmasked")), f"{SC0}.procMount", "Default",
     BASELINE),
    ("seccomp Unconfined", edit((f"{PSC}.seccompProfile.type", "Unconfined")),
     f"{PSC}.seccompProfile.type", "seccomp", BASELINE),
    ("unsafe sysctl", edit((f"{PSC}.sysctls", [{"name": "kernel.msgmax", "value": "1"}])),
     f"{PSC}.sysctls[0].name", "safe set", BASELINE),
    ("probe to a host",
     edit((f"{C0}.livenessProbe", {"httpGet": {"host": "10.0.0.1", "port": 80}})),
     f"{C0}.livenessProbe.httpGet.host", "name a host", BASELINE),
    ("hook to a host",
     edit((f"{C0}.lifecycle", {"preStop": {"tcpSocket": {"host": "node", "port": 22}}})),
     f"{C0}.lifecycle.preStop.tcpSocket.host", "name a host", BASELINE),
    # A value of the wrong type: the pod's schema refuses it, whatever the level.
    ("privileged as text", edit((f"{SC0}.privileged", "true")), f"{SC0}.privileged",
     "must be a boolean", ALL),
    # --- what baseline allows and restricted refuses
    ("runAsNonRoot missing", edit((f"{PSC}.runAsNonRoot", DELETE)), f"{SC0}.runAsNonRoot",
     "must be true", RESTRICTED),
    ("runAsNonRoot false in a container", edit((f"{SC0}.runAsNonRoot", False)),
     f"{SC0}.runAsNonRoot", "must be true", RESTRICTED),
    ("runAsUser 0", edit((f"{PSC}.runAsUser", 0)), f"{PSC}.runAsUser", "root", RESTRICTED),
    ("capabilities not dropped", edit((f"{SC0}.capabilities.drop", [])),
     f"{SC0}.capabilities.drop", "must include ALL", RESTRICTED),
    ("capability CHOWN added", edit((f"{SC0}.capabilities.add", ["CHOWN"])),
     f"{SC0}.capabilities.add[0]", "only NET_BIND_SERVICE", RESTRICTED),
    ("privilege escalation allowed", edit((f"{SC0}.allowPrivilegeEscalation", True)),
     f"{SC0}.allowPrivilegeEscalation", "must be false", RESTRICTED),
    ("seccomp profile missing", edit((f"{PSC}.seccompProfile", DELETE)),
     f"{SC0}.seccompProfile.type", "RuntimeDefault or Localhost", RESTRICTED),
    ("nfs volume", edit(("spec.volumes", [{"name": "d", "nfs": {"server": "s", "path": "/"}}])),
     "spec.volumes[0].nfs", "nfs volumes", RESTRICTED),
]  # fmt: skip


def federated(
    template: dict[str, Any], resources: dict[str, Any] | None = RESOURCES
) -> FederatedJob:
    pod_set: dict[str, Any] = {"name": "worker", "count": 2, "template": template}
    if resources is not None:
        pod_set["resources"] = resources
    return FederatedJob.model_validate({
        "apiVersion": "fedbroker.io/v1alpha1", "kind": "FederatedJob",
        "metadata": {"name": "job"}, "spec": {"podSets": [pod_set]},
    })  # fmt: skip


def refusals(template: dict[str, Any], level: Level) -> list[str]:
    """The full field paths ``admit_templates`` refuses (all policy violations, or the one
    requests error), [] if it admits the template."""
    try:
        admit_templates(federated(template), level, ACCOUNTS)
    except PolicyViolation as exc:
        return [field_path(v.path) for v in exc.violations]
    except ManifestError as exc:
        return [exc.path]
    return []


def test_the_table_is_big_enough_and_the_legal_template_passes_every_level() -> None:
    assert len(HOSTILE) >= 30
    assert len({row[0] for row in HOSTILE}) == len(HOSTILE)
    for level in LEVELS:
        assert refusals(LEGAL, level) == []


@pytest.mark.parametrize(
    ("template", "path", "fragment", "refused_by"),
    [r[1:] for r in HOSTILE],
    ids=[r[0] for r in HOSTILE],
)
@pytest.mark.parametrize("level", LEVELS)
def test_hostile_template_is_refused_exactly_where_its_profile_says(
    level: Level, template: dict[str, Any], path: str, fragment: str, refused_by: frozenset[str]
) -> None:
    if level not in refused_by:
        assert refusals(template, level) == []
        return
    assert refusals(template, level) == [f"{ROOT}.{path}"]
    with pytest.raises(ManifestError) as caught:
        admit_templates(federated(template), level, ACCOUNTS)
    message = str(caught.value)
    assert message.startswith(f"{ROOT}.{path}: ")
    assert fragment in message
    assert "\n" not in message


def test_all_violations_are_listed_and_the_message_counts_them() -> None:
    template = edit(("spec.hostNetwork", True), ("spec.nodeName", "n"), (f"{SC0}.privileged", True))
    with pytest.raises(PolicyViolation) as caught:
        admit_templates(federated(template), "baseline", ACCOUNTS)
    assert [field_path(v.path) for v in caught.value.violations] == [
        f"{ROOT}.spec.hostNetwork", f"{ROOT}.{SC0}.privileged", f"{ROOT}.spec.nodeName",
    ]  # fmt: skip
    assert str(caught.value).endswith("(and 2 more)")


def test_the_pod_set_path_is_the_right_one() -> None:
    job = federated(LEGAL).wire()
    job["spec"]["podSets"].insert(0, {"name": "driver", "count": 1, "resources": {"cpu": "1"}})
    job["spec"]["podSets"][1]["template"] = edit(("spec.hostPID", True))
    with pytest.raises(PolicyViolation, match=r"^spec\.podSets\[1\]\.template\.spec\.hostPID: "):
        admit_templates(FederatedJob.model_validate(job), "baseline", ACCOUNTS)


SA_ROWS = [
    # (template changes, tenant's accounts, refused path or None)
    ((("spec.serviceAccountName", "trainer"),), ["default", "trainer"], None),
    ((("spec.serviceAccountName", "trainer"),), ["default"], "spec.serviceAccountName"),
    ((), ["trainer"], "spec.serviceAccountName"),  # runs as "default", not listed
    ((("spec.automountServiceAccountToken", False),), ["trainer"], None),
    ((("spec.automountServiceAccountToken", True),), ["default"], None),
    ((("spec.automountServiceAccountToken", "yes"),), ["default"],
     "spec.automountServiceAccountToken"),
]  # fmt: skip


@pytest.mark.parametrize(("changes", "accounts", "refused"), SA_ROWS)
def test_service_accounts_only_from_the_tenants_list(
    changes: tuple[tuple[str, object], ...], accounts: list[str], refused: str | None
) -> None:
    paths = [
        field_path(v.path)
        for v in template_violations(edit(*changes), "privileged", frozenset(accounts), ())
    ]
    assert paths == ([] if refused is None else [refused])


WINDOWS = edit(
    ("spec.os", {"name": "windows"}),
    (f"{PSC}.seccompProfile", DELETE),
    (f"{SC0}.allowPrivilegeEscalation", DELETE),
    (f"{SC0}.capabilities", DELETE),
)


def test_windows_pods_are_exempt_from_the_linux_only_restricted_controls() -> None:
    assert refusals(WINDOWS, "restricted") == []
    linux = {**WINDOWS, "spec": {**WINDOWS["spec"], "os": {"name": "linux"}}}
    assert sorted(refusals(linux, "restricted")) == sorted(
        f"{ROOT}.{SC0}.{f}" for f in ("allowPrivilegeEscalation", "seccompProfile.type",
                                      "capabilities.drop")
    )  # fmt: skip


# --- every container's requests, as Kubernetes counts them --------------------------------


def container(name: str, requests: dict[str, Any] | None = None,
              limits: dict[str, Any] | None = None, **extra: Any) -> dict[str, Any]:  # fmt: skip
    resources = {k: v for k, v in (("requests", requests), ("limits", limits)) if v is not None}
    return {"name": name, "image": "x", "resources": resources, **extra}


SIDECAR: dict[str, Any] = {"restartPolicy": "Always"}
REQUESTS: list[tuple[str, dict[str, Any], dict[str, Fraction]]] = [
    ("nothing asked", {"containers": [{"name": "a"}]}, {}),
    ("containers add up", {"containers": [container("a", {"cpu": "1"}),
                                          container("b", {"cpu": "500m"})]},
     {"cpu": Fraction(3, 2)}),
    ("limits only: requests default to limits", {"containers": [
        container("a", limits={"nvidia.com/gpu": 2, "memory": "1Gi"})]},
     {"nvidia.com/gpu": Fraction(2), "memory": Fraction(2**30)}),
    ("requests below limits count the requests", {"containers": [
        container("a", {"cpu": "1"}, {"cpu": "4"})]}, {"cpu": Fraction(1)}),
    ("an init container larger than the sum wins", {
        "initContainers": [container("i", {"cpu": "8"})],
        "containers": [container("a", {"cpu": "1"}), container("b", {"cpu": "2"})]},
     {"cpu": Fraction(8)}),
    ("a smaller init container does not add", {
        "initContainers": [container("i", {"cpu": "2"})],
        "containers": [container("a", {"cpu": "1"}), container("b", {"cpu": "2"})]},
     {"cpu": Fraction(3)}),
    ("a sidecar adds to the containers", {
        "initContainers": [container("s", {"cpu": "1"}, **SIDECAR)],
        "containers": [container("a", {"cpu": "2"})]},
     {"cpu": Fraction(3)}),
    ("an init container after a sidecar runs beside it", {
        "initContainers": [container("s", {"cpu": "1"}, **SIDECAR), container("i", {"cpu": "4"})],
        "containers": [container("a", {"cpu": "2"})]},
     {"cpu": Fraction(5)}),
    ("an init container before a sidecar does not", {
        "initContainers": [container("i", {"cpu": "4"}), container("s", {"cpu": "1"}, **SIDECAR)],
        "containers": [container("a", {"cpu": "2"})]},
     {"cpu": Fraction(4)}),
    ("overhead is added last", {
        "initContainers": [container("i", {"memory": "2Gi"})],
        "containers": [container("a", {"memory": "1Gi"})], "overhead": {"memory": "128Mi"}},
     {"memory": Fraction(2**31 + 2**27)}),
    ("shared GPUs and node-local resources", {"containers": [
        container("a", {"fedbroker.io/gpu-milli": 250, "ephemeral-storage": "1Gi",
                        "hugepages-2Mi": "4Mi"})]},
     {"fedbroker.io/gpu-milli": Fraction(250)}),
    # The pod's own spec.resources (KEP-2837), as PodRequests in component-helpers counts it.
    ("a pod-level request replaces the containers'", {"resources": {"requests": {"cpu": "8"}},
        "containers": [container("a", {"cpu": "1", "memory": "1Gi"})]},
     {"cpu": Fraction(8), "memory": Fraction(2**30)}),
    ("a pod-level request replaces an init container's peak too", {
        "resources": {"requests": {"cpu": "20"}},
        "initContainers": [container("i", {"cpu": "16"})], "containers": [container("a")]},
     {"cpu": Fraction(20)}),
    ("a pod-level limit stands for a request no container makes", {
        "resources": {"limits": {"memory": "4Gi"}}, "containers": [container("a", {"cpu": "1"})]},
     {"cpu": Fraction(1), "memory": Fraction(4 * 2**30)}),
    ("a pod-level limit leaves the containers' requests as they are", {
        "resources": {"limits": {"cpu": "4"}}, "containers": [container("a", {"cpu": "1"})]},
     {"cpu": Fraction(1)}),
    ("the overhead is added to a pod-level request", {"resources": {"requests": {"cpu": "2"}},
        "overhead": {"cpu": "250m"}, "containers": [container("a")]},
     {"cpu": Fraction(9, 4)}),
    ("pod-level hugepages are the node's", {"resources": {"limits": {"hugepages-2Mi": "4Mi"}},
        "containers": [container("a", {"cpu": "1"})]}, {"cpu": Fraction(1)}),
]  # fmt: skip


@pytest.mark.parametrize(
    ("spec", "effective"), [r[1:] for r in REQUESTS], ids=[r[0] for r in REQUESTS]
)
def test_effective_request(spec: dict[str, Any], effective: dict[str, Fraction]) -> None:
    requests, problems = pod_requests(spec, ("spec",))
    assert problems == []
    assert requests.effective == effective


# (id, pod spec, refused path under spec, fragment): the API server refuses each
# (validatePodResourceConsistency, and only cpu, memory, hugepages-* for the whole pod).
POD_LEVEL_REFUSED: list[tuple[str, dict[str, Any], str, str]] = [
    ("GPUs for the whole pod", {"resources": {"limits": {"nvidia.com/gpu": 8}},
        "containers": [container("a")]}, "resources.limits.nvidia.com/gpu", "per container"),
    ("ephemeral storage for the whole pod", {"resources": {"requests": {
        "ephemeral-storage": "1Gi"}}, "containers": [container("a")]},
     "resources.requests.ephemeral-storage", "only cpu, memory and hugepages-*"),
    ("a request below the containers'", {"resources": {"requests": {"memory": "1Gi"}},
        "containers": [container("a", {"memory": "1Gi"}), container("b", {"memory": "1Mi"})]},
     "resources.requests.memory", "at least what the containers request (1074790400)"),
    ("a request above the pod's limit", {"resources": {"requests": {"cpu": "4"},
        "limits": {"cpu": "2"}}, "containers": [container("a")]},
     "resources.requests.cpu", "must not exceed limits.cpu"),
    ("a limit below the containers' requests", {"resources": {"limits": {"cpu": "1"}},
        "containers": [container("a", {"cpu": "1500m"})]},
     "resources.limits.cpu", "at least what the containers request (1.5)"),
    ("a container's limit above the pod's", {"resources": {"limits": {"memory": "1Gi"}},
        "containers": [container("a", {"memory": "1Gi"}, {"memory": "2Gi"})]},
     "containers[0].resources.limits.memory", "must not exceed the pod's limits.memory"),
    ("claims for the whole pod", {"resources": {"claims": [{"name": "gpu"}]},
        "containers": [container("a")]}, "resources.claims", "not counted"),
    ("not a mapping", {"resources": ["cpu"], "containers": [container("a")]}, "resources",
     "must be a mapping"),
    ("a negative amount", {"resources": {"requests": {"cpu": "-1"}},
        "containers": [container("a")]}, "resources.requests.cpu", "must not be negative"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("spec", "path", "fragment"),
    [r[1:] for r in POD_LEVEL_REFUSED],
    ids=[r[0] for r in POD_LEVEL_REFUSED],
)
def test_pod_level_resources_are_refused_where_the_api_server_refuses_them(
    spec: dict[str, Any], path: str, fragment: str
) -> None:
    _, problems = pod_requests(spec, ("spec",))
    assert [field_path(v.path) for v in problems] == [f"spec.{path}"]
    assert fragment in problems[0].message


amounts = st.lists(st.integers(min_value=0, max_value=64), max_size=5)


@given(amounts, amounts, st.integers(min_value=0, max_value=4))
def test_without_sidecars_the_pod_asks_the_larger_of_sum_and_largest_init(
    regular: list[int], init: list[int], overhead: int
) -> None:
    spec = {
        "containers": [container(f"c{i}", {"cpu": n}) for i, n in enumerate(regular)],
        "initContainers": [container(f"i{i}", {"cpu": n}) for i, n in enumerate(init)],
        "overhead": {"cpu": overhead},
    }
    requests, problems = pod_requests(spec, ())
    assert problems == []
    assert requests.effective["cpu"] == max(sum(regular), max(init, default=0)) + overhead


def test_resources_are_derived_from_the_template_when_the_pod_set_gives_none() -> None:
    template = edit((f"{C0}.resources", {"limits": {"nvidia.com/gpu": 2, "cpu": "1500m"}}),
                    ("spec.containers[1]", container("b", {"memory": "1Gi", "cpu": "1"})),
                    ("spec.containers[2]", container("c", {"memory": "512Mi"})))  # fmt: skip
    admitted = admit_templates(federated(template, resources=None), "baseline", ACCOUNTS)
    wire = admitted.wire()["spec"]["podSets"][0]
    assert wire["resources"] == {"nvidia.com/gpu": 2, "cpu": "2500m", "memory": "1536Mi"}
    # The template is stored as sent, its quantities written as Kubernetes writes them.
    assert wire["template"] == edit(
        *[
            (path, value)
            for path, value in [
                (f"{C0}.resources", {"limits": {"nvidia.com/gpu": "2", "cpu": "1500m"}}),
                ("spec.containers[1]", container("b", {"memory": "1Gi", "cpu": "1"})),
                ("spec.containers[2]", container("c", {"memory": "512Mi"})),
            ]
        ]
    )
    job = to_job(admitted, "team-a", "training")
    assert job.pod_sets[0].resources == Resources(gpus=2, cpu_milli=2500, memory_mib=1536)
    again = admit_templates(FederatedJob.model_validate(admitted.wire()), "baseline", ACCOUNTS)
    assert again == admitted  # what is stored admits unchanged


def test_resources_are_derived_only_where_the_pod_set_is_silent() -> None:
    admitted = admit_templates(federated(LEGAL, {"cpu": "2"}), "baseline", ACCOUNTS)
    assert admitted.wire()["spec"]["podSets"][0]["resources"] == RESOURCES


def test_a_pod_set_asking_more_than_its_containers_names_the_pod_set() -> None:
    with pytest.raises(ManifestError) as caught:
        admit_templates(federated(LEGAL, {**RESOURCES, "cpu": "3"}), "baseline", ACCOUNTS)
    assert caught.value.path == "spec.podSets[0].resources.cpu"
    assert "is 3, but the template's containers request 2 in all" in str(caught.value)


def test_derived_resources_keep_the_pod_sets_bounds() -> None:
    template = edit((f"{C0}.resources", {"limits": {"nvidia.com/gpu": 17}}))
    with pytest.raises(ManifestError, match=r"^spec\.podSets\[0\]\.resources\.nvidia\.com/gpu: "
                       r"must be <= 16 \(derived from the template\)$"):  # fmt: skip
        admit_templates(federated(template, resources=None), "baseline", ACCOUNTS)


def test_a_template_without_requests_keeps_the_pod_sets_resources() -> None:
    template = {"spec": {"containers": [{"name": "main", "image": "trainer:1.0"}]}}
    manifest = federated(template)
    assert admit_templates(manifest, "baseline", ACCOUNTS) is manifest


# --- the profiles are cumulative: privileged <= baseline <= restricted -------------------

maybe_bool = st.sampled_from([None, False, True])
security_contexts = st.fixed_dictionaries(
    {},
    optional={
        "privileged": maybe_bool,
        "runAsNonRoot": maybe_bool,
        "allowPrivilegeEscalation": maybe_bool,
        "runAsUser": st.sampled_from([0, 1000]),
        "procMount": st.sampled_from(["Default", "Unmasked"]),
        "seccompProfile": st.fixed_dictionaries(
            {"type": st.sampled_from(["RuntimeDefault", "Localhost", "Unconfined"])}
        ),
        "capabilities": st.fixed_dictionaries(
            {},
            optional={
                "add": st.lists(st.sampled_from(["CHOWN", "NET_BIND_SERVICE", "SYS_ADMIN"])),
                "drop": st.lists(st.sampled_from(["ALL", "NET_RAW"])),
            },
        ),
    },
)
volumes = st.lists(
    st.sampled_from([
        {"name": "v", "emptyDir": {}},
        {"name": "v", "nfs": {"server": "s", "path": "/"}},
        {"name": "v", "hostPath": {"path": "/"}},
        {"name": "v", "secret": {"secretName": "fedbroker-x"}},
    ]),
    max_size=3,
)  # fmt: skip
containers = st.fixed_dictionaries(
    {"name": st.just("c")}, optional={"securityContext": security_contexts}
)
pod_specs = st.fixed_dictionaries(
    {"containers": st.lists(containers, min_size=1, max_size=3)},
    optional={
        "hostNetwork": maybe_bool,
        "hostPID": maybe_bool,
        "nodeName": st.just("n"),
        "serviceAccountName": st.sampled_from(["default", "fedbroker-broker"]),
        "securityContext": security_contexts,
        "volumes": volumes,
        "os": st.fixed_dictionaries({"name": st.sampled_from(["linux", "windows"])}),
    },
)  # fmt: skip


@given(pod_specs)
def test_each_level_refuses_all_that_a_laxer_one_refuses(spec: dict[str, Any]) -> None:
    refused = [
        {v.path for v in template_violations({"spec": spec}, level, frozenset({"default"}), ())}
        for level in LEVELS
    ]
    assert refused[0] <= refused[1] <= refused[2]
