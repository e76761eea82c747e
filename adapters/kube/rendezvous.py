"""Rendezvous of a podSets gang (pure): its headless Service, each pod's hostname, subdomain
and rank, and the env that lets a PyTorch/JAX job find its peers.

Every gang gets one headless Service (``clusterIP: None``, ``publishNotReadyAddresses`` so
peers resolve before they are ready) selecting exactly its pods by the labels only they
carry (origin, tenant, job). Each pod gets ``hostname`` (its pod name, or a shortened
stable one when longer than 63) and ``subdomain`` (the Service's name), so
``<hostname>.<service>.<namespace>.svc`` resolves to it. Ranks run 0..n-1 across the gang:
pod sets in manifest order (``LaunchSpec.pod_sets``; order of first appearance in the
placement when not given), then by pod index. ``MASTER_ADDR`` is rank 0's DNS name.

The broker's variables win: a container's own ``env`` entry of one of ``ENV_NAMES`` is
replaced (and an ``envFrom`` one is shadowed, as Kubernetes gives ``env`` precedence).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from broker.ports import LaunchSpec

MAX_LABEL = 63
HASH_CHARS = 8
SERVICE_PREFIX = "rdzv-"
PORT_NAME = "rendezvous"
ENV_NAMES = (
    "WORLD_SIZE",
    "RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
    "FEDBROKER_JOB",
    "FEDBROKER_POD_SET",
    "FEDBROKER_POD_INDEX",
)


def short_label(name: str) -> str:
    """``name`` if it is a DNS label's length (<= 63), else a stable shortened form: its
    first characters and 8 hex digits of its SHA-256 (two long names never share one by
    accident, and the same name always gives the same label)."""
    if len(name) <= MAX_LABEL:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:HASH_CHARS]
    head = name[: MAX_LABEL - HASH_CHARS - 1].rstrip("-")
    return f"{head}-{digest}"


def service_name(spec: LaunchSpec) -> str:
    """The gang's Service: ``rdzv-<job>`` (a Service name is a DNS-1035 label: the prefix
    makes it start with a letter, whatever the job's first character), hash-shortened when
    longer than 63."""
    return short_label(f"{SERVICE_PREFIX}{spec.job}")


def split_pod_name(name: str, spec: LaunchSpec) -> tuple[str, int]:
    """``(pod set, index)`` of a pod named ``<job>-<podset>-<index>``."""
    head = f"{spec.job}-"
    rest = name[len(head) :] if name.startswith(head) else name
    pod_set, _, index = rest.rpartition("-")
    return (pod_set or rest), (int(index) if index.isdigit() else 0)


@dataclass(frozen=True, slots=True)
class PodRendezvous:
    """One pod's part of the gang's rendezvous."""

    hostname: str
    pod_set: str
    index: int
    rank: int


@dataclass(frozen=True, slots=True)
class Rendezvous:
    """A gang's rendezvous: its Service, namespace, port, and each pod's rank and hostname
    (keyed by pod name, ``<job>-<podset>-<index>``)."""

    service: str
    namespace: str
    master_port: int
    pods: Mapping[str, PodRendezvous]

    @staticmethod
    def of(pod_names: list[str], spec: LaunchSpec, namespace: str) -> Rendezvous:
        """Ranks for the gang's pods: pod sets in ``spec.pod_sets`` order (sets it does not
        name after those, in order of first appearance), then by index."""
        parsed = {name: split_pod_name(name, spec) for name in pod_names}
        order = {s: i for i, s in enumerate(spec.pod_sets)}
        for pod_set, _ in parsed.values():
            order.setdefault(pod_set, len(order))
        ranked = sorted(parsed, key=lambda n: (order[parsed[n][0]], parsed[n][1], n))
        pods = {
            name: PodRendezvous(short_label(name), parsed[name][0], parsed[name][1], rank)
            for rank, name in enumerate(ranked)
        }
        return Rendezvous(service_name(spec), namespace, spec.master_port, pods)

    def dns_name(self, hostname: str) -> str:
        """What the Service's DNS rule resolves to a pod: ``<hostname>.<service>.<ns>.svc``."""
        return f"{hostname}.{self.service}.{self.namespace}.svc"

    @property
    def master_addr(self) -> str:
        rank0 = next(p for p in self.pods.values() if p.rank == 0)
        return self.dns_name(rank0.hostname)

    def env(self, name: str, job: str) -> list[dict[str, str]]:
        """The env entries of pod ``name`` (values are strings, as the API wants)."""
        pod = self.pods[name]
        values = (len(self.pods), pod.rank, self.master_addr, self.master_port, job,
                  pod.pod_set, pod.index)  # fmt: skip
        return [{"name": k, "value": str(v)} for k, v in zip(ENV_NAMES, values, strict=True)]

    def apply(self, pod_spec: dict[str, Any], name: str, job: str) -> None:
        """Set the pod's hostname and subdomain and the env of every container (init
        containers included), the broker's variables replacing the user's of those names."""
        pod_spec["hostname"] = self.pods[name].hostname
        pod_spec["subdomain"] = self.service
        ours = self.env(name, job)
        for kind in ("initContainers", "containers"):
            for container in pod_spec.get(kind) or ():
                if not isinstance(container, dict):
                    continue
                env = container.get("env")
                kept = [
                    e
                    for e in (env if isinstance(env, list) else ())
                    if not (isinstance(e, Mapping) and e.get("name") in ENV_NAMES)
                ]
                container["env"] = [*kept, *ours]

    def service_body(self, labels: Mapping[str, str]) -> dict[str, Any]:
        """The headless Service selecting exactly the pods carrying ``labels`` (origin,
        tenant, job: only this gang's pods carry all three), labelled with them too."""
        port = {"name": PORT_NAME, "port": self.master_port, "targetPort": self.master_port,
                "protocol": "TCP"}  # fmt: skip
        return {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {
                "name": self.service,
                "namespace": self.namespace,
                "labels": dict(labels),
            },
            "spec": {
                "clusterIP": "None",
                "selector": dict(labels),
                "publishNotReadyAddresses": True,
                "ports": [port],
            },
        }
