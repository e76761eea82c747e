"""The API server's own rules for object metadata and pod specs, as the test member applies
them to a decoded body (``kube_schema``): each broken rule is a 422 cause naming the field
as the server does.

From kubernetes/kubernetes: ``staging/src/k8s.io/apimachinery/pkg/util/validation``
(``IsDNS1123Label``/``Subdomain``, ``IsQualifiedName``, ``IsValidLabelValue``,
``IsValidPortName``, ``IsValidPortNum``), ``pkg/api/validation/objectmeta.go``
(``ValidateObjectMeta``, ``ValidateAnnotations``: 256 KiB in all) and
``pkg/apis/core/validation/validation.go``: ``ValidatePodCreate`` -> ``ValidatePodSpec``
(containers required, names DNS labels unique across containers and initContainers, image
required, ports, env names -- printable ASCII but '=', relaxed since 1.34 --, volumes and
their mounts, restartPolicy, dnsPolicy, activeDeadlineSeconds, hostname/subdomain, node
selector, tolerations and node affinity (``kube_scheduling_rules``), scheduling gates, no
ephemeral containers on create, no ``nodeName`` beside gates) and
``ValidateResourceRequirements`` (standard or qualified resource names, quantities >= 0,
requests <= limits, extended resources such as ``nvidia.com/gpu`` whole numbers with
requests equal to limits and never without limits). Defaults
(``pkg/apis/core/v1/defaults.go``): ``SetDefaults_PodSpec``'s restartPolicy Always,
dnsPolicy ClusterFirst, schedulerName default-scheduler, terminationGracePeriodSeconds 30,
port protocol TCP; ``SetDefaults_Pod`` copies a limit into a missing request (pods only,
not templates). Rules for fields the broker never sets (probes, security contexts, volume
sources' insides, topology spread) are not reproduced.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import kube_quantity
from kube_names import dns_label, dns_subdomain, each, label_value, port_name, qualified_name
from kube_scheduling_rules import node_affinity, tolerations
from kube_schema import Cause, duplicate, forbidden, invalid, required, unsupported

ANNOTATIONS_BYTES = 256 * 1024
NATIVE = ("cpu", "memory", "ephemeral-storage")
PORT_RANGE = "must be between 1 and 65535, inclusive"
ENV_NAME_MSG = (
    "a valid environment variable name must consist only of printable ASCII characters "
    "other than '='"
)


# -- metadata -------------------------------------------------------------------------------


def labels(values: Any, path: str) -> list[Cause]:
    out: list[Cause] = []
    for key, value in (values or {}).items():
        out += each(f"{path}[{key}]", key, qualified_name(key))
        out += each(f"{path}[{key}]", value, label_value(str(value)))
    return out


def metadata(
    meta: Mapping[str, Any], path: str = "metadata", name_rule: Any = dns_subdomain
) -> list[Cause]:
    """``ValidateObjectMeta``: the name (when given: a template has none), labels and
    annotations."""
    out: list[Cause] = []
    name = meta.get("name")
    if name is not None:
        out += each(f"{path}.name", name, name_rule(str(name)))
    out += labels(meta.get("labels"), f"{path}.labels")
    annotations = meta.get("annotations") or {}
    for key in annotations:
        out += each(f"{path}.annotations", key, qualified_name(str(key).lower()))
    if sum(len(k) + len(str(v)) for k, v in annotations.items()) > ANNOTATIONS_BYTES:
        message = f"Too long: may not be more than {ANNOTATIONS_BYTES} bytes"
        out.append(Cause(f"{path}.annotations", "FieldValueTooLong", message))
    return out


# -- defaults ------------------------------------------------------------------------------


def default_pod_spec(spec: dict[str, Any]) -> None:
    """``SetDefaults_PodSpec`` (and its containers' ports), in place."""
    spec.setdefault("restartPolicy", "Always")
    spec.setdefault("dnsPolicy", "ClusterFirst")
    spec.setdefault("schedulerName", "default-scheduler")
    spec.setdefault("terminationGracePeriodSeconds", 30)
    for _, container in _containers(spec):
        for port in container.get("ports") or ():
            port.setdefault("protocol", "TCP")


def default_pod(pod: dict[str, Any]) -> None:
    """``SetDefaults_Pod``: a limit given without its request is requested too."""
    spec = pod.setdefault("spec", {})
    default_pod_spec(spec)
    for _, container in _containers(spec):
        resources = container.get("resources") or {}
        limits = resources.get("limits") or {}
        if limits:
            requests = resources.setdefault("requests", {})
            for name, amount in limits.items():
                requests.setdefault(name, amount)


# -- pod spec ------------------------------------------------------------------------------


def _containers(spec: Mapping[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    for kind in ("initContainers", "containers"):
        for i, container in enumerate(spec.get(kind) or ()):
            yield f"{kind}[{i}]", container


def pod_create(pod: Mapping[str, Any]) -> list[Cause]:
    """``ValidatePodCreate``: metadata, spec, and what may not be set at creation."""
    spec = pod.get("spec") or {}
    out = metadata(pod.get("metadata") or {}) + pod_spec(spec, "spec")
    if spec.get("ephemeralContainers"):
        out.append(forbidden("spec.ephemeralContainers", "cannot be set on create"))
    if spec.get("nodeName") and spec.get("schedulingGates"):
        out.append(
            forbidden("spec.nodeName", "cannot be set until all schedulingGates have been cleared")
        )
    return out


def pod_spec(spec: Mapping[str, Any], path: str) -> list[Cause]:
    """``ValidatePodSpec`` (the parts listed in the module's docstring)."""
    out: list[Cause] = []
    if not spec.get("containers"):
        out.append(required(f"{path}.containers"))
    volumes = _volumes(spec, path, out)
    names: set[str] = set()
    ports: set[str] = set()
    for where, container in _containers(spec):
        here = f"{path}.{where}"
        name = container.get("name")
        if not name:
            out.append(required(f"{here}.name"))
        elif name in names:
            out.append(duplicate(f"{here}.name", name))
        else:
            out += each(f"{here}.name", name, dns_label(name))
        names.add(str(name))
        out += container_rules(container, here, volumes, ports, init=where.startswith("init"))
    out += _pod_fields(spec, path)
    out += tolerations(spec.get("tolerations") or [], f"{path}.tolerations")
    out += node_affinity(
        (spec.get("affinity") or {}).get("nodeAffinity"), f"{path}.affinity.nodeAffinity"
    )
    gates: set[str] = set()
    for i, gate in enumerate(spec.get("schedulingGates") or ()):
        gate_name = str(gate.get("name") or "")
        here = f"{path}.schedulingGates[{i}].name"
        out += (
            [duplicate(here, gate_name)]
            if gate_name in gates
            else each(here, gate_name, qualified_name(gate_name))
        )
        gates.add(gate_name)
    return out


def _volumes(spec: Mapping[str, Any], path: str, out: list[Cause]) -> set[str]:
    seen: set[str] = set()
    for i, volume in enumerate(spec.get("volumes") or ()):
        name = str(volume.get("name") or "")
        here = f"{path}.volumes[{i}].name"
        out += [duplicate(here, name)] if name in seen else each(here, name, dns_label(name))
        seen.add(name)
    return seen


def _pod_fields(spec: Mapping[str, Any], path: str) -> list[Cause]:
    out: list[Cause] = []
    policy = spec.get("restartPolicy")
    if policy not in ("Always", "OnFailure", "Never"):
        out.append(unsupported(f"{path}.restartPolicy", policy, ["Always", "OnFailure", "Never"]))
    dns = spec.get("dnsPolicy")
    if dns not in ("ClusterFirstWithHostNet", "ClusterFirst", "Default", "None"):
        out.append(
            unsupported(
                f"{path}.dnsPolicy",
                dns,
                ["ClusterFirstWithHostNet", "ClusterFirst", "Default", "None"],
            )
        )
    deadline = spec.get("activeDeadlineSeconds")
    if deadline is not None and not 1 <= deadline <= 2**31 - 1:
        out.append(
            invalid(
                f"{path}.activeDeadlineSeconds",
                deadline,
                "must be between 1 and 2147483647, inclusive",
            )
        )
    for key, rule in (
        ("hostname", dns_label),
        ("subdomain", dns_label),
        ("serviceAccountName", dns_subdomain),
        ("schedulerName", dns_subdomain),
        ("priorityClassName", dns_subdomain),
    ):
        if spec.get(key):
            out += each(f"{path}.{key}", spec[key], rule(str(spec[key])))
    return out + labels(spec.get("nodeSelector"), f"{path}.nodeSelector")


def container_rules(
    container: Mapping[str, Any], path: str, volumes: set[str], ports: set[str], init: bool
) -> list[Cause]:
    out: list[Cause] = []
    if not container.get("image"):
        out.append(required(f"{path}.image"))
    restart = container.get("restartPolicy")
    if restart is not None and (not init or restart != "Always"):
        out.append(
            unsupported(f"{path}.restartPolicy", restart, ["Always"])
            if init
            else forbidden(f"{path}.restartPolicy", "may not be set for non-init containers")
        )
    for i, env in enumerate(container.get("env") or ()):
        name = env.get("name")
        if not name:
            out.append(required(f"{path}.env[{i}].name"))
        elif not all(32 <= ord(c) <= 126 for c in name) or "=" in name:
            out.append(
                invalid(
                    f"{path}.env[{i}].name",
                    name,
                    ENV_NAME_MSG,
                )
            )
    for i, port in enumerate(container.get("ports") or ()):
        out += _port(port, f"{path}.ports[{i}]", ports)
    for i, mount in enumerate(container.get("volumeMounts") or ()):
        if mount.get("name") not in volumes:
            out.append(
                Cause(
                    f"{path}.volumeMounts[{i}].name",
                    "FieldValueNotFound",
                    f'Not found: "{mount.get("name")}"',
                )
            )
        if not mount.get("mountPath"):
            out.append(required(f"{path}.volumeMounts[{i}].mountPath"))
    return out + resources(container.get("resources") or {}, f"{path}.resources")


def _port(port: Mapping[str, Any], path: str, names: set[str]) -> list[Cause]:
    out: list[Cause] = []
    number = port.get("containerPort")
    if not isinstance(number, int) or not 1 <= number <= 65535:
        out.append(invalid(f"{path}.containerPort", number, PORT_RANGE))
    host = port.get("hostPort") or 0
    if host and not 1 <= host <= 65535:
        out.append(invalid(f"{path}.hostPort", host, PORT_RANGE))
    if port.get("name"):
        name = str(port["name"])
        out += (
            [duplicate(f"{path}.name", name)]
            if name in names
            else each(f"{path}.name", name, port_name(name))
        )
        names.add(name)
    if port.get("protocol") not in ("TCP", "UDP", "SCTP"):
        out.append(unsupported(f"{path}.protocol", port.get("protocol"), ["SCTP", "TCP", "UDP"]))
    return out


def _resource_name(name: str, path: str) -> list[Cause]:
    if "/" not in name:
        ok = name in NATIVE or name.startswith("hugepages-")
        return [] if ok else [invalid(path, name, "must be a standard resource for containers")]
    problems = qualified_name(name)
    if problems:
        return each(path, name, problems)
    return []


def overcommits(name: str) -> bool:
    """Native resources may be requested below their limit; extended ones may not."""
    return "/" not in name or name.split("/", maxsplit=1)[0].endswith("kubernetes.io")


def resources(res: Mapping[str, Any], path: str) -> list[Cause]:
    """``ValidateResourceRequirements`` of one container."""
    out: list[Cause] = []
    limits = res.get("limits") or {}
    requests = res.get("requests") or {}
    for part, amounts in (("limits", limits), ("requests", requests)):
        for name, amount in amounts.items():
            here = f"{path}.{part}[{name}]"
            out += _resource_name(name, here)
            value = kube_quantity.value_of(amount)
            if value < 0:
                out.append(invalid(here, amount, "must be greater than or equal to 0"))
            if not overcommits(name) and value.denominator != 1:
                out.append(invalid(here, amount, "must be an integer"))
    for name, amount in requests.items():
        here = f"{path}.requests[{name}]"
        if name in limits:
            asked, cap = kube_quantity.value_of(amount), kube_quantity.value_of(limits[name])
            if not overcommits(name) and asked != cap:
                out.append(
                    invalid(here, amount, f"must be equal to {name} limit of {limits[name]}")
                )
            elif asked > cap:
                out.append(
                    invalid(
                        here,
                        amount,
                        f"must be less than or equal to {name} limit of {limits[name]}",
                    )
                )
        elif not overcommits(name):
            out.append(
                required(f"{path}.limits", "Limit must be set for non overcommitable resources")
            )
    return out
