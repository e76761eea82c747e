"""The template policy's rules on what a pod reaches of its node beyond what the placement
counts: devices and scheduling (pure, no I/O; ``podpolicy`` runs them on every level).

* No environment variable that makes the container runtime select or expose devices, in a
  container of any kind, whatever its value or source (``DEVICE_ENV``): the NVIDIA
  container toolkit reads them for unprivileged containers unless the node says otherwise
  (``accept-nvidia-visible-devices-envvar-when-unprivileged``), so a pod asking 0 GPUs could
  use them all. ``envFrom`` of a ConfigMap cannot be read here: the member's side is in
  docs/security.md.
* No ``ephemeralContainers`` (the API server adds them to a running pod only, through the
  ``ephemeralcontainers`` subresource; in a template they would never be counted).
* No ``schedulingGates`` of the template's own: the broker lifts only its own gate, so a
  pod held by another is never released and its capacity stays reserved until the timeout.
* ``runtimeClassName`` only from the tenant's ``runtimeClassNames`` (none by default): a
  runtime class chooses the OCI runtime that starts the containers, and may add overhead,
  a node selector and tolerations the placement never sees.
* ``tolerations``: none that tolerates a taint the operator reserves (``reservedTaints``:
  by key, whatever its value, with a blocking effect); a keyless ``Exists`` tolerates
  every taint, reserved ones too. Their syntax is the API server's rule, refused before
  this policy runs (``broker.manifest.apirules``). ``toleration_of`` reads one entry for
  the placement (``broker.taints``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from broker.manifest.errors import show
from broker.manifest.podrequests import Path
from broker.manifest.podsecurity import Fields, Pod
from broker.taints import BLOCKING_EFFECTS, Toleration, TolerationOperator

# Checked in the NVIDIA container toolkit's runtime hook (cmd/nvidia-container-runtime-hook:
# container_config.go, internal/config/image/cuda_image.go) and its feature flags
# (internal/config/features.go), and in the AMD container toolkit. CUDA_VISIBLE_DEVICES,
# ROCR_VISIBLE_DEVICES and HIP_VISIBLE_DEVICES stay allowed: the CUDA and ROCm libraries
# read them inside the process, to narrow what the container was already given.
DEVICE_ENV: Mapping[str, str] = {
    "NVIDIA_VISIBLE_DEVICES": "selects the GPUs the NVIDIA runtime gives the container",
    "NVIDIA_DRIVER_CAPABILITIES": "selects the driver libraries and devices the NVIDIA "
    "runtime mounts",
    "NVIDIA_MIG_CONFIG_DEVICES": "lets the container reconfigure MIG on the node's GPUs",
    "NVIDIA_MIG_MONITOR_DEVICES": "lets the container monitor MIG on the node's GPUs",
    "NVIDIA_IMEX_CHANNELS": "selects the IMEX channels the NVIDIA runtime gives the container",
    "NVIDIA_GDS": "makes the NVIDIA runtime add GPUDirect Storage devices",
    "NVIDIA_MOFED": "makes the NVIDIA runtime add the node's InfiniBand devices",
    "NVIDIA_NVSWITCH": "makes the NVIDIA runtime add the node's NVSwitch devices",
    "NVIDIA_GDRCOPY": "makes the NVIDIA runtime add the gdrdrv device",
    "CUDA_VERSION": "without NVIDIA_REQUIRE_CUDA, makes the NVIDIA runtime treat the image "
    "as a legacy one and give it every GPU",
    "AMD_VISIBLE_DEVICES": "selects the GPUs the AMD container runtime gives the container",
}
# The toolkit's ``swarm-resource`` option names more device variables; Docker's are these.
DEVICE_ENV_PREFIX = "DOCKER_RESOURCE_"
# The control plane's taint; its name before Kubernetes 1.24, still on clusters upgraded since.
DEFAULT_RESERVED_TAINTS = (
    "node-role.kubernetes.io/control-plane",
    "node-role.kubernetes.io/master",
)
_OPERATORS: Mapping[str, TolerationOperator] = {"": "Equal", "Equal": "Equal", "Exists": "Exists"}
_EFFECTS = frozenset({"", "NoSchedule", "PreferNoSchedule", "NoExecute"})
_EPHEMERAL = "ephemeral containers are for debugging a running pod, not for a template"
_GATES = (
    "the broker releases its pods itself: a gate of the template's own would hold its pods "
    "(and their capacity) until the timeout"
)


@dataclass(frozen=True, slots=True)
class NodeAccess:
    """What the operator lets a tenant's pods reach of a node: the runtime classes they may
    name, and the taints (by key) no pod of theirs may tolerate."""

    runtime_classes: frozenset[str] = frozenset()
    reserved_taints: tuple[str, ...] = DEFAULT_RESERVED_TAINTS

    @staticmethod
    def of(runtime_classes: Iterable[str], reserved_taints: Iterable[str]) -> NodeAccess:
        return NodeAccess(frozenset(runtime_classes), tuple(reserved_taints))


DEFAULT_ACCESS = NodeAccess()


def toleration_of(item: object) -> Toleration | None:
    """One ``spec.tolerations`` entry as the placement matches it; None for an entry the
    API server would refuse (and ``node_rules`` refuses)."""
    if not isinstance(item, Mapping):
        return None
    fields = [item.get(name) or "" for name in ("key", "operator", "value", "effect")]
    if not all(isinstance(field, str) for field in fields):
        return None
    key, given, value, effect = fields
    operator = _OPERATORS.get(given)
    if operator is None or effect not in _EFFECTS or (not key and operator != "Exists"):
        return None
    if operator == "Exists" and value:
        return None
    return Toleration(key, operator, value, effect)


def node_rules(pod: Pod, f: Fields, access: NodeAccess) -> None:
    """Record in ``f`` every device and scheduling field of ``pod`` the tenant may not set."""
    spec, at = pod.spec, pod.spec_path
    for c in pod.containers:
        for env, path in f.mappings(c.body, "env", c.path):
            name = f.string(env, "name", path)
            if name is not None and (name in DEVICE_ENV or name.startswith(DEVICE_ENV_PREFIX)):
                why = DEVICE_ENV.get(name, "names a device resource for the container runtime")
                f.refuse((*path, "name"), f"{name} {why}: ask for devices in resources")
    if _given(spec.get("ephemeralContainers")):
        f.refuse((*at, "ephemeralContainers"), _EPHEMERAL)
    if _given(spec.get("schedulingGates")):
        f.refuse((*at, "schedulingGates"), _GATES)
    runtime = f.string(spec, "runtimeClassName", at)
    if runtime is not None and runtime not in access.runtime_classes:
        listed = ", ".join(sorted(access.runtime_classes)) or "none"
        message = f"runtime class {show(runtime)} is not one of the tenant's ({listed})"
        f.refuse((*at, "runtimeClassName"), message)
    for toleration, path in f.mappings(spec, "tolerations", at):
        _toleration(toleration, path, f, access.reserved_taints)


def _given(value: Any) -> bool:
    return value is not None and value != []


def _toleration(item: Mapping[str, Any], path: Path, f: Fields, reserved: tuple[str, ...]) -> None:
    """A toleration of a reserved taint is refused. Its syntax is the API server's rule,
    checked before this policy runs (``broker.manifest.apirules``)."""
    key = f.string(item, "key", path) or ""
    effect = f.string(item, "effect", path) or ""
    if effect and effect not in BLOCKING_EFFECTS:
        return  # tolerating PreferNoSchedule only steers the scheduler
    if key in reserved:
        f.refuse((*path, "key"), f"tolerates {key}, a taint the operator reserves")
    elif (
        not key and reserved and _OPERATORS.get(f.string(item, "operator", path) or "") == "Exists"
    ):
        f.refuse((*path, "operator"), f"Exists without a key tolerates every taint, {reserved[0]} "
                 "(reserved by the operator) too: name the keys to tolerate")  # fmt: skip


__all__ = ["DEFAULT_ACCESS", "DEFAULT_RESERVED_TAINTS", "DEVICE_ENV", "DEVICE_ENV_PREFIX",
           "NodeAccess", "node_rules", "toleration_of"]  # fmt: skip
