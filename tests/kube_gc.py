"""The test member's garbage collector: what kube-controller-manager's garbage collector
does once an owner is deleted, for ``kmock_namespaces.NamespacedEmulator``.

From kubernetes/kubernetes ``pkg/controller/garbagecollector``: a dependent (an object whose
``metadata.ownerReferences`` names the owner's uid) is deleted once none of its owners is
left; a dependent that still has another live owner only loses the reference to the deleted
one. With ``propagationPolicy: Orphan`` the dependents lose the reference and stay. The
policy comes from the DELETE request (``?propagationPolicy=`` or the ``DeleteOptions``
body); without one, the resource's default: ``Orphan`` for a batch/v1 Job
(``pkg/registry/batch/job/strategy.go``, ``DefaultGarbageCollectionPolicy``), ``Background``
for everything else. ``Foreground`` is collected here as ``Background`` is: the owner goes
first, which only changes how long a client sees it with a ``deletionTimestamp``.

The collection runs right after the owner's deletion, recursively (a JobSet's Jobs, then
their pods). Pure bookkeeping over the emulator's object array; the emulator publishes the
DELETED events.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

ORPHAN = "Orphan"
BACKGROUND = "Background"


@dataclass(frozen=True, slots=True)
class Stored:
    """One live stored object: its key in the emulator's array and its body."""

    key: tuple[Any, str | None, str]
    raw: Mapping[str, Any]

    @property
    def uid(self) -> str:
        return str((self.raw.get("metadata") or {}).get("uid") or "")

    @property
    def owners(self) -> list[Mapping[str, Any]]:
        return list((self.raw.get("metadata") or {}).get("ownerReferences") or ())


def policy_of(group: str, plural: str, query: Mapping[str, str], body: Any) -> str:
    """The propagation policy of one DELETE (see the module's docstring)."""
    given = query.get("propagationPolicy")
    if not given and isinstance(body, Mapping):
        given = body.get("propagationPolicy")
        if not given and body.get("orphanDependents") is True:
            given = ORPHAN
    if given:
        return str(given)
    return ORPHAN if (group, plural) == ("batch", "jobs") else BACKGROUND


@dataclass(frozen=True, slots=True)
class Step:
    """What the collector does to one dependent: delete it, or set its owner references."""

    key: tuple[Any, str | None, str]
    delete: bool
    owners: list[Mapping[str, Any]]
    uid: str


def steps(gone_uid: str, policy: str, live: Iterable[Stored]) -> list[Step]:
    """What deleting the owner ``gone_uid`` does to the live objects (one level)."""
    objects = list(live)
    live_uids = {o.uid for o in objects if o.uid and o.uid != gone_uid}
    out: list[Step] = []
    for obj in objects:
        refs = obj.owners
        if not any(r.get("uid") == gone_uid for r in refs):
            continue
        kept = [r for r in refs if r.get("uid") != gone_uid]
        others_live = any(r.get("uid") in live_uids for r in kept)
        delete = policy != ORPHAN and not others_live
        out.append(Step(obj.key, delete, kept, obj.uid))
    return out
