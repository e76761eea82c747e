"""Kubernetes' Pod Security Standards evaluated on a pod template (pure, no I/O).

The ``baseline`` and ``restricted`` profiles, control by control, as
https://kubernetes.io/docs/concepts/security/pod-security-standards/ defines them for the
latest version (the one the member namespaces' ``pod-security.kubernetes.io/enforce``
label asks for); ``privileged`` checks nothing. Containers, init containers and ephemeral
containers all count; a container's ``securityContext`` wins over the pod's where the
standard says a pod-level value may stand in. A field of the wrong type is a violation too:
the member would refuse the pod later, so the broker refuses it before it is stored.

One deliberate difference: ``procMount`` must be ``Default`` or unset even for pods in a
user namespace (``hostUsers: false``), the stricter reading.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from broker.manifest.errors import show
from broker.manifest.podrequests import Path, Violation

Level = Literal["privileged", "baseline", "restricted"]

CONTAINER_KINDS = ("containers", "initContainers", "ephemeralContainers")
BASELINE_CAPABILITIES = frozenset({
    "AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD",
    "NET_BIND_SERVICE", "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT",
})  # fmt: skip
SAFE_SYSCTLS = frozenset({
    "kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range", "net.ipv4.ip_unprivileged_port_start",
    "net.ipv4.tcp_syncookies", "net.ipv4.ping_group_range", "net.ipv4.ip_local_reserved_ports",
    "net.ipv4.tcp_keepalive_time", "net.ipv4.tcp_fin_timeout", "net.ipv4.tcp_keepalive_intvl",
    "net.ipv4.tcp_keepalive_probes", "net.ipv4.tcp_rmem", "net.ipv4.tcp_wmem",
})  # fmt: skip
SELINUX_TYPES = frozenset(
    {"", "container_t", "container_init_t", "container_kvm_t", "container_engine_t"}
)
PROFILE_TYPES = frozenset({"RuntimeDefault", "Localhost"})  # seccomp and AppArmor
RESTRICTED_VOLUMES = frozenset({
    "configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim",
    "projected", "secret",
})  # fmt: skip
_APPARMOR_ANNOTATION = "container.apparmor.security.beta.kubernetes.io/"
_PROBES = ("livenessProbe", "readinessProbe", "startupProbe")
_HOOKS = ("postStart", "preStop")


class Fields:
    """Typed reads of a free-form template; a value of the wrong type is recorded as a
    violation and read as absent. ``found`` collects every violation in order."""

    def __init__(self) -> None:
        self.found: list[Violation] = []

    def refuse(self, path: Path, message: str) -> None:
        self.found.append(Violation(path, message))

    def _typed(self, obj: object, key: str, path: Path, kind: type, what: str) -> Any:
        if not isinstance(obj, Mapping) or obj.get(key) is None:
            return None
        value = obj[key]
        wrong = isinstance(value, bool) and kind is not bool
        if wrong or not isinstance(value, kind):
            self.refuse((*path, key), f"must be {what}")
            return None
        return value

    def mapping(self, obj: object, key: str, path: Path) -> Mapping[str, Any] | None:
        value: Mapping[str, Any] | None = self._typed(obj, key, path, Mapping, "a mapping")
        return value

    def boolean(self, obj: object, key: str, path: Path) -> bool | None:
        value: bool | None = self._typed(obj, key, path, bool, "a boolean")
        return value

    def string(self, obj: object, key: str, path: Path) -> str | None:
        value: str | None = self._typed(obj, key, path, str, "a string")
        return value

    def integer(self, obj: object, key: str, path: Path) -> int | None:
        value: int | None = self._typed(obj, key, path, int, "an integer")
        return value

    def items(self, obj: object, key: str, path: Path) -> Iterator[tuple[Any, Path]]:
        """The list at ``key`` with each item's path (nothing if absent or not a list)."""
        value: list[Any] | None = self._typed(obj, key, path, list, "a list")
        for i, item in enumerate(value or ()):
            yield item, (*path, key, i)

    def mappings(
        self, obj: object, key: str, path: Path
    ) -> Iterator[tuple[Mapping[str, Any], Path]]:
        for item, at in self.items(obj, key, path):
            if isinstance(item, Mapping):
                yield item, at
            else:
                self.refuse(at, "must be a mapping")


@dataclass(frozen=True, slots=True)
class Container:
    """One container of any kind, its path and its ``securityContext`` (empty if none)."""

    body: Mapping[str, Any]
    path: Path
    sc: Mapping[str, Any]

    @property
    def sc_path(self) -> Path:
        return (*self.path, "securityContext")


@dataclass(frozen=True, slots=True)
class Pod:
    """A template's pod spec and metadata with their paths, read once."""

    spec: Mapping[str, Any]
    spec_path: Path
    meta: Mapping[str, Any]
    meta_path: Path
    sc: Mapping[str, Any]
    containers: tuple[Container, ...]

    @property
    def sc_path(self) -> Path:
        return (*self.spec_path, "securityContext")

    @staticmethod
    def read(template: Mapping[str, Any], base: Path, f: Fields) -> Pod:
        spec = f.mapping(template, "spec", base) or {}
        meta = f.mapping(template, "metadata", base) or {}
        spec_path = (*base, "spec")
        containers = tuple(
            Container(body, path, f.mapping(body, "securityContext", path) or {})
            for kind in CONTAINER_KINDS
            for body, path in f.mappings(spec, kind, spec_path)
        )
        sc = f.mapping(spec, "securityContext", spec_path) or {}
        return Pod(spec, spec_path, meta, (*base, "metadata"), sc, containers)


def check(pod: Pod, level: Level, f: Fields) -> None:
    """Record in ``f`` every control of ``level`` that ``pod`` breaks."""
    if level == "privileged":
        return
    _baseline_pod(pod, f)
    for c in pod.containers:
        _baseline_container(c, f)
    if level == "restricted":
        _restricted(pod, f)


def _why(what: str) -> str:
    return f"{what} (Pod Security baseline)"


def _profiles(sc: Mapping[str, Any], path: Path, f: Fields) -> None:
    """HostProcess, SELinux, seccomp and AppArmor: both the pod's and a container's."""
    windows = f.mapping(sc, "windowsOptions", path)
    if f.boolean(windows, "hostProcess", (*path, "windowsOptions")):
        f.refuse((*path, "windowsOptions", "hostProcess"), _why("must be false"))
    selinux = f.mapping(sc, "seLinuxOptions", path)
    at = (*path, "seLinuxOptions")
    kind = f.string(selinux, "type", at)
    if kind is not None and kind not in SELINUX_TYPES:
        f.refuse((*at, "type"), _why(f"{show(kind)} is not an allowed SELinux type"))
    for key in ("user", "role"):
        if f.string(selinux, key, at):
            f.refuse((*at, key), _why("custom SELinux users and roles are not allowed"))
    for key, name in (("seccompProfile", "seccomp"), ("appArmorProfile", "AppArmor")):
        profile = f.mapping(sc, key, path)
        kind = f.string(profile, "type", (*path, key))
        if kind is not None and kind not in PROFILE_TYPES:
            f.refuse(
                (*path, key, "type"), _why(f"{name} profile must be RuntimeDefault or Localhost")
            )


def _baseline_pod(pod: Pod, f: Fields) -> None:
    spec, at = pod.spec, pod.spec_path
    for key in ("hostNetwork", "hostPID", "hostIPC"):
        if f.boolean(spec, key, at):
            f.refuse((*at, key), _why("host namespaces are not allowed"))
    _profiles(pod.sc, pod.sc_path, f)
    for sysctl, path in f.mappings(pod.sc, "sysctls", pod.sc_path):
        name = f.string(sysctl, "name", path)
        if name is not None and name not in SAFE_SYSCTLS:
            f.refuse((*path, "name"), _why(f"sysctl {show(name)} is not in the safe set"))
    for volume, path in f.mappings(spec, "volumes", at):
        if volume.get("hostPath") is not None:
            f.refuse((*path, "hostPath"), _why("hostPath volumes are not allowed"))
    annotations = f.mapping(pod.meta, "annotations", pod.meta_path) or {}
    for key, value in annotations.items():
        if isinstance(key, str) and key.startswith(_APPARMOR_ANNOTATION):
            ok = value == "runtime/default" or (
                isinstance(value, str) and value.startswith("localhost/")
            )
            if not ok:
                f.refuse(
                    (*pod.meta_path, "annotations", key), _why("AppArmor must not be unconfined")
                )


def _baseline_container(c: Container, f: Fields) -> None:
    sc, at = c.sc, c.sc_path
    if f.boolean(sc, "privileged", at):
        f.refuse((*at, "privileged"), _why("privileged containers are not allowed"))
    caps = f.mapping(sc, "capabilities", at)
    for cap, path in f.items(caps, "add", (*at, "capabilities")):
        if cap not in BASELINE_CAPABILITIES:
            f.refuse(path, _why(f"capability {show(cap)} may not be added"))
    proc = f.string(sc, "procMount", at)
    if proc is not None and proc != "Default":
        f.refuse((*at, "procMount"), _why("procMount must be Default"))
    _profiles(sc, at, f)
    for port, path in f.mappings(c.body, "ports", c.path):
        if f.integer(port, "hostPort", path):
            f.refuse((*path, "hostPort"), _why("host ports are not allowed"))
    handlers = [(f.mapping(c.body, p, c.path), (*c.path, p)) for p in _PROBES]
    hooks = f.mapping(c.body, "lifecycle", c.path)
    handlers += [
        (f.mapping(hooks, h, (*c.path, "lifecycle")), (*c.path, "lifecycle", h)) for h in _HOOKS
    ]
    for handler, path in handlers:
        for action in ("httpGet", "tcpSocket"):
            if f.string(f.mapping(handler, action, path), "host", (*path, action)):
                f.refuse((*path, action, "host"), _why("probes and hooks may not name a host"))


def _why_restricted(what: str) -> str:
    return f"{what} (Pod Security restricted)"


def _restricted(pod: Pod, f: Fields) -> None:
    for volume, path in f.mappings(pod.spec, "volumes", pod.spec_path):
        for key in volume:
            if key not in RESTRICTED_VOLUMES | {"name", "hostPath"}:
                f.refuse((*path, key), _why_restricted(f"{key} volumes are not allowed"))
    os = f.mapping(pod.spec, "os", pod.spec_path)
    linux = f.string(os, "name", (*pod.spec_path, "os")) != "windows"
    pod_non_root = f.boolean(pod.sc, "runAsNonRoot", pod.sc_path)
    if pod_non_root is False:
        f.refuse((*pod.sc_path, "runAsNonRoot"), _why_restricted("must be true"))
    if f.integer(pod.sc, "runAsUser", pod.sc_path) == 0:
        f.refuse((*pod.sc_path, "runAsUser"), _why_restricted("must not be 0 (root)"))
    seccomp = f.mapping(pod.sc, "seccompProfile", pod.sc_path)
    pod_seccomp = f.string(seccomp, "type", (*pod.sc_path, "seccompProfile"))
    for c in pod.containers:
        # A pod-level profile other than RuntimeDefault/Localhost is refused at the pod (baseline);
        # a container without its own then inherits a refused one, reported there once.
        _restricted_container(c, f, linux, pod_non_root is True, pod_seccomp is not None)


def _restricted_container(
    c: Container, f: Fields, linux: bool, pod_non_root: bool, pod_seccomp: bool
) -> None:
    sc, at = c.sc, c.sc_path
    non_root = f.boolean(sc, "runAsNonRoot", at)
    if non_root is False or (non_root is None and not pod_non_root):
        f.refuse((*at, "runAsNonRoot"), _why_restricted("must be true (here or for the pod)"))
    if f.integer(sc, "runAsUser", at) == 0:
        f.refuse((*at, "runAsUser"), _why_restricted("must not be 0 (root)"))
    if not linux:  # the standard exempts Windows pods from the Linux-only controls
        return
    if f.boolean(sc, "allowPrivilegeEscalation", at) is not False:
        f.refuse((*at, "allowPrivilegeEscalation"), _why_restricted("must be false"))
    seccomp = f.mapping(sc, "seccompProfile", at)
    if f.string(seccomp, "type", (*at, "seccompProfile")) is None and not pod_seccomp:
        f.refuse(
            (*at, "seccompProfile", "type"),
            _why_restricted("must be RuntimeDefault or Localhost (here or for the pod)"),
        )
    caps = f.mapping(sc, "capabilities", at)
    drops = [cap for cap, _ in f.items(caps, "drop", (*at, "capabilities"))]
    if "ALL" not in drops:
        f.refuse((*at, "capabilities", "drop"), _why_restricted("must include ALL"))
    for cap, path in f.items(caps, "add", (*at, "capabilities")):
        if cap != "NET_BIND_SERVICE" and cap in BASELINE_CAPABILITIES:  # others: baseline's
            f.refuse(path, _why_restricted("only NET_BIND_SERVICE may be added"))


__all__ = ["Container", "Fields", "Level", "Pod", "check"]
