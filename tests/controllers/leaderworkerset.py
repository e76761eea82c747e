"""LeaderWorkerSet's controllers (kubernetes-sigs/lws ``pkg/controllers``, its pod webhook
``pkg/webhooks``) and the StatefulSet controller under them, played.

* The LWS controller: the headless Service ``<name>`` (selects ``leaderworkerset.sigs.k8s.io/
  name``) and the leader StatefulSet ``<name>`` (``replicas`` groups), both owned by the LWS;
  the StatefulSet controller makes its pods ``<name>-<group>`` from ``leaderTemplate`` (else
  ``workerTemplate``), owned by it. Once a group's leader pod exists (``startupPolicy:
  LeaderCreated``) the pod controller makes the group's worker StatefulSet ``<name>-<group>``
  (``size - 1`` replicas, owned by the leader pod), whose pods are
  ``<name>-<group>-<worker>``, ordinals from 1. So deleting the LWS collects everything.
* Every pod: ``leaderworkerset.sigs.k8s.io/{name,group-index,worker-index,group-key}``, the
  StatefulSet controller's ``controller-revision-hash``, ``statefulset.kubernetes.io/pod-name``
  and ``apps.kubernetes.io/pod-index``; the ``size`` annotation (and ``leader-name`` on a
  worker); the webhook's env ``LWS_LEADER_ADDRESS``, ``LWS_GROUP_SIZE``, ``LWS_WORKER_INDEX``;
  ``hostname`` the pod's name, ``subdomain`` the LWS's.
* Status: ``replicas``, ``readyReplicas`` (groups whose every pod runs) and ``Available``
  (``AllGroupsReady``) True once every group is ready. It never ends.

``pod`` (one pod as the StatefulSet controller and the webhook make it) is pure, and
tests/adapters/workload_players.py plays it in its own member too.
"""

from __future__ import annotations

import copy
import hashlib
from collections.abc import Mapping
from typing import Any

import kmock as kmocklib

from controllers.base import PODS, Controllers, Obj, labels_of, phase

KIND = "LeaderWorkerSet"
RESOURCE = kmocklib.resource("leaderworkerset.x-k8s.io", "v1", "leaderworkersets")
STATEFULSETS = kmocklib.resource("apps", "v1", "statefulsets")
LABEL = "leaderworkerset.sigs.k8s.io/"


def _hash(text: str) -> str:
    return hashlib.sha1(text.encode()).hexdigest()[:10]  # a name, not a secret


def pod(obj: Mapping[str, Any], namespace: str, group: int, worker: int) -> tuple[str, Obj]:
    """Pod ``worker`` (0: the leader) of ``group``: (name, its whole template)."""
    name, lwt = obj["metadata"]["name"], obj["spec"]["leaderWorkerTemplate"]
    size = int(lwt.get("size", 1))
    leader = worker == 0
    use_leader = leader and lwt.get("leaderTemplate") is not None
    template = copy.deepcopy(lwt["leaderTemplate" if use_leader else "workerTemplate"])
    meta = template.setdefault("metadata", {})
    sts = name if leader else f"{name}-{group}"
    pod_name = f"{name}-{group}" if leader else f"{name}-{group}-{worker}"
    meta["labels"] = {
        **meta.get("labels", {}), f"{LABEL}name": name, f"{LABEL}group-index": str(group),
        f"{LABEL}worker-index": str(worker), f"{LABEL}group-key": _hash(f"{namespace}/{sts}"),
        "controller-revision-hash": f"{sts}-{_hash(sts)}",
        "statefulset.kubernetes.io/pod-name": pod_name,
        "apps.kubernetes.io/pod-index": str(group if leader else worker),
    }  # fmt: skip
    notes = {f"{LABEL}size": str(size)}
    if not leader:
        notes[f"{LABEL}leader-name"] = f"{name}-{group}"
    meta["annotations"] = {**meta.get("annotations", {}), **notes}
    env = {"LWS_LEADER_ADDRESS": f"{name}-{group}.{name}.{namespace}",
           "LWS_GROUP_SIZE": str(size), "LWS_WORKER_INDEX": str(worker)}  # fmt: skip
    for c in template["spec"]["containers"]:
        c["env"] = [*c.get("env", ()), *({"name": k, "value": v} for k, v in env.items())]
    template["spec"] |= {"hostname": pod_name, "subdomain": name}
    return pod_name, template


def groups_ready(obj: Mapping[str, Any], pods: Mapping[str, Mapping[str, Any]]) -> int:
    """The groups whose every pod runs (``pods``: by name)."""
    name, spec = obj["metadata"]["name"], obj["spec"]
    size = int(spec["leaderWorkerTemplate"].get("size", 1))
    return sum(
        1 for g in range(int(spec.get("replicas", 1)))
        if all(phase(pods.get(f"{name}-{g}" + (f"-{w}" if w else ""), {})) == "Running"
               for w in range(size))
    )  # fmt: skip


def status(obj: Mapping[str, Any], ready: int, now: str) -> Obj:
    groups = int(obj["spec"].get("replicas", 1))
    available = "True" if ready == groups else "False"
    message = "All replicas are ready" if ready == groups else "Replicas are not ready"
    found = {"type": "Available", "status": available, "reason": "AllGroupsReady",
             "message": message, "lastTransitionTime": now}  # fmt: skip
    return {"conditions": [found], "replicas": groups, "readyReplicas": ready}


class LeaderWorkerSetController:
    """Reconciles every LeaderWorkerSet of the member (see the module's docstring)."""

    def __init__(self, c: Controllers) -> None:
        self.c = c

    async def reconcile(self) -> None:
        for obj in self.c.live(RESOURCE):
            await self._lws(obj)

    async def _lws(self, obj: Obj) -> None:
        name, ns = obj["metadata"]["name"], obj["metadata"]["namespace"]
        await self.c.service(obj, name, {f"{LABEL}name": name})
        groups = int(obj["spec"].get("replicas", 1))
        size = int(obj["spec"]["leaderWorkerTemplate"].get("size", 1))
        leaders = await self._set(obj, name, name, groups)
        pods = {p["metadata"]["name"]: p for p in self.c.stored(PODS, ns).values()
                if labels_of(p).get(f"{LABEL}name") == name}  # fmt: skip
        for g in range(groups):
            await self._pods(obj, leaders, [(g, 0)], pods)
            leader = pods.get(f"{name}-{g}")
            if leader is not None and size > 1:
                workers = await self._set(leader, f"{name}-{g}", name, size - 1)
                await self._pods(obj, workers, [(g, w) for w in range(1, size)], pods)
        old = obj.get("status") or {}
        found = status(obj, groups_ready(obj, pods), self.c.now)
        [available] = found["conditions"]
        if (old.get("conditions") or [{}])[0].get("status") == available["status"]:
            found["conditions"] = old["conditions"]  # unchanged: its time kept
        if any(old.get(k) != v for k, v in found.items()):
            await self.c.status(RESOURCE, obj, found)

    async def _set(self, owner: Obj, name: str, lws: str, replicas: int) -> Obj:
        """The StatefulSet ``name`` of LWS ``lws``, owned by ``owner``, made once."""
        for found in self.c.owned(STATEFULSETS, owner):
            if found["metadata"]["name"] == name:
                return found
        selector = {f"{LABEL}name": lws}
        return await self.c.create(STATEFULSETS, owner, {
            "apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": name},
            "spec": {"replicas": replicas, "serviceName": lws,
                     "selector": {"matchLabels": selector}, "podManagementPolicy": "Parallel"},
        })  # fmt: skip

    async def _pods(
        self, obj: Obj, owner: Obj, which: list[tuple[int, int]], pods: dict[str, Obj]
    ) -> None:
        """The StatefulSet controller: each missing pod of ``which`` made, owned by it."""
        ns = obj["metadata"]["namespace"]
        for group, worker in which:
            name, template = pod(obj, ns, group, worker)
            if name not in pods:
                pods[name] = await self.c.pod(owner, template, name, {})
