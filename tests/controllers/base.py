"""What every controller player shares: reading the member's stored objects, making a child
through the member's controller path (validated as the API server validates, announced to
watches, owned by its parent so garbage collection removes it), random name suffixes as
``k8s.io/apimachinery/pkg/util/rand.String`` draws them, and status writes through the
``/status`` subresource."""

from __future__ import annotations

import copy
import random
from collections.abc import Mapping
from typing import Any

import kmock as kmocklib
from kmock_namespaces import NamespacedEmulator

Obj = dict[str, Any]
PODS = kmocklib.resource("", "v1", "pods")
SERVICES = kmocklib.resource("", "v1", "services")
JOBS = kmocklib.resource("batch", "v1", "jobs")
# rand.String's alphabet: no vowels, no 0/1/3 (no words, nothing confusable)
_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"
TERMINAL = ("Succeeded", "Failed")


class Controllers:
    """The shared state of the controllers played on one member: the emulator, a seeded
    random source for name suffixes, and the time their status writes stamp."""

    def __init__(self, k8s: NamespacedEmulator, seed: int = 34) -> None:
        self.k8s = k8s
        self.random = random.Random(seed)
        self.now = "2026-01-01T00:00:00Z"
        self.made: list[Obj] = []  # every pod the controllers made, in order

    def suffix(self) -> str:
        return "".join(self.random.choice(_ALPHABET) for _ in range(5))

    def stored(self, resource: Any, namespace: str | None = None) -> dict[str, Obj]:
        """Name -> body of the live objects of ``resource`` in ``namespace`` (None: the
        cluster-scoped ones). A name is unique only within its namespace: two tenants'
        namespaces may each hold a Job ``w0``."""
        return {
            name: obj.raw
            for (res, ns, name), obj in list(self.k8s.objects.items())
            if res == resource and not obj.deleted and ns == namespace
        }

    def live(self, resource: Any) -> list[Obj]:
        """Every live object of ``resource``, in every namespace (as a controller's informer
        lists them: keyed by namespace/name, never by name alone)."""
        return [
            obj.raw
            for (res, _, _), obj in list(self.k8s.objects.items())
            if res == resource and not obj.deleted
        ]

    def owned(self, resource: Any, owner: Mapping[str, Any]) -> list[Obj]:
        """The live objects of ``resource`` that ``owner`` controls (by uid)."""
        uid = owner["metadata"]["uid"]
        return [
            o
            for o in self.stored(resource, owner["metadata"]["namespace"]).values()
            if any(r.get("uid") == uid and r.get("controller") for r in _refs(o))
        ]

    async def create(self, resource: Any, owner: Mapping[str, Any], body: Obj) -> Obj:
        """``body`` made by the owner's controller in the owner's namespace: validated,
        stored, announced; returns the stored object."""
        namespace = owner["metadata"]["namespace"]
        meta = body.setdefault("metadata", {})
        meta["namespace"] = namespace
        meta["ownerReferences"] = [owner_reference(owner)]
        meta.setdefault("creationTimestamp", self.now)
        name = self.k8s.controller_create(resource, namespace, body)
        await self.k8s.announce(resource, namespace, name)
        return self.stored(resource, namespace)[name]

    async def pod(
        self, owner: Mapping[str, Any], template: Mapping[str, Any], name: str, labels: Obj
    ) -> Obj:
        """One pod from ``template`` (a deep copy: labels, annotations, gates, PodGroup
        labels and all), with the controller's ``labels`` added."""
        given = copy.deepcopy(dict(template))
        meta = given.get("metadata") or {}
        made = await self.create(PODS, owner, {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {**meta, "name": name, "labels": {**(meta.get("labels") or {}), **labels}},
            "spec": given.get("spec") or {},
        })  # fmt: skip
        self.made.append(made)
        return made

    async def service(self, owner: Mapping[str, Any], name: str, selector: Obj) -> None:
        """A headless Service (the controllers' rendezvous), once."""
        if name in self.stored(SERVICES, owner["metadata"]["namespace"]):
            return
        await self.create(SERVICES, owner, {
            "apiVersion": "v1", "kind": "Service", "metadata": {"name": name},
            "spec": {"clusterIP": "None", "selector": selector},
        })  # fmt: skip

    async def delete(self, resource: Any, obj: Mapping[str, Any]) -> None:
        """A controller's DELETE of one object, through the API (watches hear it)."""
        path = path_of(resource, obj["metadata"])
        async with self.k8s.delete(path, params={"propagationPolicy": "Background"}) as r:
            assert r.status < 300 or r.status == 404, f"DELETE {path}: {r.status}"

    async def status(self, resource: Any, obj: Mapping[str, Any], status: Obj) -> None:
        """A status write through the ``/status`` subresource."""
        meta = obj["metadata"]
        await self.write("PATCH", f"{path_of(resource, meta)}/status", {"status": status})

    async def write(self, method: str, path: str, body: Obj) -> None:
        """A controller's write to one object: an object deleted since the controller read
        it (404) is no failure, as for the real ones (their next pass no longer sees it)."""
        async with self.k8s.request(method, path, json=body) as r:
            assert r.status < 300 or r.status == 404, (
                f"{method} {path}: {r.status} {await r.text()}"
            )


def path_of(resource: Any, meta: Mapping[str, Any]) -> str:
    """The API path of one namespaced object of ``resource``."""
    prefix = f"/apis/{resource.group}/{resource.version}" if resource.group else "/api/v1"
    return f"{prefix}/namespaces/{meta['namespace']}/{resource.plural}/{meta['name']}"


def owner_reference(owner: Mapping[str, Any]) -> Obj:
    meta = owner["metadata"]
    return {"apiVersion": owner["apiVersion"], "kind": owner["kind"], "name": meta["name"],
            "uid": meta["uid"], "controller": True, "blockOwnerDeletion": True}  # fmt: skip


def _refs(obj: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return list((obj.get("metadata") or {}).get("ownerReferences") or ())


def phase(pod: Mapping[str, Any]) -> str:
    return str((pod.get("status") or {}).get("phase") or "Pending")


def labels_of(obj: Mapping[str, Any]) -> dict[str, str]:
    return dict((obj.get("metadata") or {}).get("labels") or {})


def condition(kind: str, reason: str, message: str, now: str, stamp: str = "lastProbeTime") -> Obj:
    """A condition as the batch API (``lastProbeTime``) and Kubeflow's (``lastUpdateTime``:
    pass ``stamp``) write them."""
    return {"type": kind, "status": "True", "reason": reason, "message": message,
            stamp: now, "lastTransitionTime": now}  # fmt: skip


def has_condition(obj: Mapping[str, Any], kind: str) -> bool:
    found = (obj.get("status") or {}).get("conditions") or ()
    return any(c.get("type") == kind and c.get("status") == "True" for c in found)
