"""The API server's pod update rules, as the test member applies them to a pod's stored
and updated bodies (both decoded and defaulted): ``ValidatePodUpdate`` of
kubernetes/kubernetes ``pkg/apis/core/validation/validation.go``.

The new pod must be valid (``kube_pod_rules.pod_spec``); name and namespace are immutable;
labels and annotations may change. The spec may not change except: container and init
container images; ``activeDeadlineSeconds`` (set, or lowered, never unset); tolerations
added, existing ones keeping all but ``tolerationSeconds`` (``validateOnlyAddedTolerations``);
``terminationGracePeriodSeconds`` to 1 from a negative value; scheduling gates removed,
never added (``validateOnlyDeletedSchedulingGates``); and, while the stored pod still has
scheduling gates (Kubernetes 1.27+, mutable scheduling directives for gated pods),
``nodeSelector`` entries added (``validateNodeSelectorMutation``), required node affinity
narrowed -- the same number of terms, each term's old requirements kept in place with new
ones after them (``validateNodeAffinityMutation``) -- and preferred node affinity changed
freely. Ephemeral containers have their own subresource and are not compared. The
comparison is semantic: an empty list or map equals an absent one.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from kube_pod_rules import metadata, pod_spec
from kube_schema import Cause, forbidden, invalid

SPEC_FROZEN = (
    "pod updates may not change fields other than `spec.containers[*].image`,"
    "`spec.initContainers[*].image`,`spec.activeDeadlineSeconds`,`spec.tolerations` "
    "(only additions to existing tolerations),`spec.terminationGracePeriodSeconds` "
    "(allow it to be set to 1 if it was previously negative)"
)
_TERMS = "requiredDuringSchedulingIgnoredDuringExecution"


def semantic(value: Any) -> Any:
    """``apiequality.Semantic``'s view: empty lists, maps and nulls are absent."""
    if isinstance(value, Mapping):
        return {k: semantic(v) for k, v in value.items() if v not in (None, [], {})}
    if isinstance(value, list):
        return [semantic(v) for v in value]
    return value


def pod_update(new: Mapping[str, Any], old: Mapping[str, Any]) -> list[Cause]:
    """The causes refusing the update of pod ``old`` to ``new`` ([] when it is allowed)."""
    new_meta, old_meta = new.get("metadata") or {}, old.get("metadata") or {}
    out = [
        invalid(f"metadata.{key}", new_meta.get(key), "field is immutable")
        for key in ("name", "namespace")
        if new_meta.get(key) != old_meta.get(key)
    ]
    out += metadata(new_meta) + pod_spec(new.get("spec") or {}, "spec")
    new_spec, old_spec = new.get("spec") or {}, old.get("spec") or {}
    for kind in ("containers", "initContainers"):
        if len(new_spec.get(kind) or ()) != len(old_spec.get(kind) or ()):
            return [*out, forbidden(f"spec.{kind}", "pod updates may not add or remove containers")]
    munged = copy.deepcopy(dict(new_spec))
    for kind in ("containers", "initContainers"):
        for mine, theirs in zip(munged.get(kind) or (), old_spec.get(kind) or (), strict=True):
            mine["image"] = theirs.get("image")
    out += _deadline(munged, old_spec)
    out += _tolerations(munged, old_spec)
    old_grace = old_spec.get("terminationGracePeriodSeconds")
    if old_grace is not None and old_grace < 0 and munged.get("terminationGracePeriodSeconds") == 1:
        munged["terminationGracePeriodSeconds"] = old_grace
    out += _gates(munged, old_spec)
    munged.pop("ephemeralContainers", None)
    before = {k: v for k, v in old_spec.items() if k != "ephemeralContainers"}
    if semantic(munged) != semantic(before):
        out.append(forbidden("spec", SPEC_FROZEN))
    return out


def _deadline(munged: dict[str, Any], old: Mapping[str, Any]) -> list[Cause]:
    new_value, old_value = munged.get("activeDeadlineSeconds"), old.get("activeDeadlineSeconds")
    out: list[Cause] = []
    if old_value is not None and new_value is None:
        out.append(
            invalid(
                "spec.activeDeadlineSeconds",
                None,
                "must not update from a positive integer to nil value",
            )
        )
    elif old_value is not None and new_value is not None and new_value > old_value:
        out.append(
            invalid(
                "spec.activeDeadlineSeconds",
                new_value,
                "must be less than or equal to previous value",
            )
        )
    munged["activeDeadlineSeconds"] = old_value
    return out


def _without_seconds(toleration: Mapping[str, Any]) -> Any:
    return semantic({k: v for k, v in toleration.items() if k != "tolerationSeconds"})


def _tolerations(munged: dict[str, Any], old: Mapping[str, Any]) -> list[Cause]:
    new_set = [_without_seconds(t) for t in munged.get("tolerations") or ()]
    munged["tolerations"] = old.get("tolerations")
    for toleration in old.get("tolerations") or ():
        if _without_seconds(toleration) not in new_set:
            return [
                forbidden(
                    "spec.tolerations",
                    "existing toleration can not be modified except its tolerationSeconds",
                )
            ]
    return []


def _gates(munged: dict[str, Any], old: Mapping[str, Any]) -> list[Cause]:
    """Gates only removed; a gated pod's node selector and node affinity only narrowed."""
    out: list[Cause] = []
    old_gates = {g.get("name") for g in old.get("schedulingGates") or ()}
    for i, gate in enumerate(munged.get("schedulingGates") or ()):
        if gate.get("name") not in old_gates:
            out.append(
                forbidden(
                    f"spec.schedulingGates[{i}].name",
                    f"only deletion is allowed, but found new scheduling gate '{gate.get('name')}'",
                )
            )
    munged["schedulingGates"] = old.get("schedulingGates")
    if not old_gates:
        return out
    selector, old_selector = munged.get("nodeSelector") or {}, old.get("nodeSelector") or {}
    if any(selector.get(k) != v for k, v in old_selector.items()):
        out.append(
            invalid(
                "spec.nodeSelector",
                selector,
                "only additions to spec.nodeSelector are allowed (no mutations or deletions)",
            )
        )
    munged["nodeSelector"] = old.get("nodeSelector")
    out += _affinity(munged, old)
    return out


def _affinity(munged: dict[str, Any], old: Mapping[str, Any]) -> list[Cause]:
    path = f"spec.affinity.nodeAffinity.{_TERMS}.nodeSelectorTerms"
    new_node = (munged.get("affinity") or {}).get("nodeAffinity") or {}
    old_node = (old.get("affinity") or {}).get("nodeAffinity") or {}
    old_terms = (old_node.get(_TERMS) or {}).get("nodeSelectorTerms") or []
    new_terms = (new_node.get(_TERMS) or {}).get("nodeSelectorTerms") or []
    out: list[Cause] = []
    if old_terms and len(old_terms) != len(new_terms):
        out.append(
            invalid(
                path,
                new_terms,
                "no additions/deletions to non-empty NodeSelectorTerms list are allowed",
            )
        )
    elif old_terms:
        for i, (mine, theirs) in enumerate(zip(new_terms, old_terms, strict=True)):
            if not _only_additions(mine, theirs):
                out.append(
                    invalid(
                        f"{path}[{i}]",
                        mine,
                        "only additions are allowed (no mutations or deletions)",
                    )
                )
    affinity = dict(munged.get("affinity") or {})
    if old.get("affinity", {}).get("nodeAffinity") is None:
        affinity.pop("nodeAffinity", None)
    else:
        affinity["nodeAffinity"] = old["affinity"]["nodeAffinity"]
    munged["affinity"] = affinity or None
    return out


def _only_additions(new: Mapping[str, Any], old: Mapping[str, Any]) -> bool:
    for key in ("matchExpressions", "matchFields"):
        mine, theirs = new.get(key) or [], old.get(key) or []
        if len(theirs) > len(mine) or semantic(mine[: len(theirs)]) != semantic(theirs):
            return False
    return True
