"""Where a pod set's pods sit together, as the gang schedulers' annotations on a pod
template say it: Kueue's topology-aware scheduling (``kueue.x-k8s.io/podset-*-topology``,
``podset-slice-size``) and KAI's (``kai.scheduler/topology-*-placement``), read into the
model's ``TopologyRequest`` beside a pod set's own ``topology``, so workloads keep their
existing manifests. Pure: FieldError naming the annotation on anything wrong."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from broker.manifest.errors import FieldError
from broker.model import TopologyRequest

KUEUE_REQUIRED = "kueue.x-k8s.io/podset-required-topology"
KUEUE_PREFERRED = "kueue.x-k8s.io/podset-preferred-topology"
KUEUE_UNCONSTRAINED = "kueue.x-k8s.io/podset-unconstrained-topology"
KUEUE_SLICE_REQUIRED = "kueue.x-k8s.io/podset-slice-required-topology"
KUEUE_SLICE_SIZE = "kueue.x-k8s.io/podset-slice-size"
KAI_REQUIRED = "kai.scheduler/topology-required-placement"
KAI_PREFERRED = "kai.scheduler/topology-preferred-placement"
ANNOTATIONS = (KUEUE_REQUIRED, KUEUE_PREFERRED, KUEUE_UNCONSTRAINED, KUEUE_SLICE_REQUIRED,
               KUEUE_SLICE_SIZE, KAI_REQUIRED, KAI_PREFERRED)  # fmt: skip

_PREFIX = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_NAME = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")
# Go's strconv.ParseBool, which Kueue parses the unconstrained annotation with.
_TRUE = frozenset({"1", "t", "T", "TRUE", "true", "True"})
_FALSE = frozenset({"0", "f", "F", "FALSE", "false", "False"})
_SIZE = re.compile(r"[0-9]{1,9}")  # ASCII digits only (str.isdigit takes '²'), int32 as Kueue

Path = tuple[str | int, ...]


def qualified_key(key: str) -> str:
    """``key`` if it is a node label key (a qualified name: an optional DNS subdomain
    prefix of at most 253 characters and ``/``, then a name of at most 63), else
    ValueError saying what it must be."""
    prefix, slash, name = key.rpartition("/")
    if (
        len(name) > 63
        or not _NAME.fullmatch(name)
        or (slash and (len(prefix) > 253 or not _PREFIX.fullmatch(prefix)))
    ):
        raise ValueError(
            f"{key[:80]!r} is not a label key ([prefix/]name: a DNS subdomain prefix, a name "
            "of at most 63 letters, digits, '-', '_' and '.')"
        )
    return key


def check_slices(count: int, slice_size: int, where: Path) -> None:
    if slice_size > count or count % slice_size:
        raise FieldError(where, f"a slice of {slice_size} must divide the pod set's {count} pods")


def _level(annotations: Mapping[str, Any], key: str, at: Path) -> str:
    value = annotations.get(key)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise FieldError((*at, key), "must be a string (a node label key)")
    try:
        return qualified_key(value)
    except ValueError as exc:
        raise FieldError((*at, key), str(exc)) from None


def _kueue(annotations: Mapping[str, Any], count: int, at: Path) -> TopologyRequest | None:
    given = [k for k in (KUEUE_REQUIRED, KUEUE_PREFERRED, KUEUE_UNCONSTRAINED) if k in annotations]
    if len(given) > 1:
        raise FieldError((*at, given[1]), f"conflicts with {given[0]}: give one of them")
    unconstrained = annotations.get(KUEUE_UNCONSTRAINED)
    if unconstrained is not None and (
        not isinstance(unconstrained, str) or unconstrained not in _TRUE | _FALSE
    ):
        raise FieldError((*at, KUEUE_UNCONSTRAINED), "must be a boolean (true or false)")
    required = _level(annotations, KUEUE_REQUIRED, at)
    preferred = _level(annotations, KUEUE_PREFERRED, at)
    slice_level = _level(annotations, KUEUE_SLICE_REQUIRED, at)
    size_text = annotations.get(KUEUE_SLICE_SIZE)
    if bool(slice_level) != (size_text is not None):
        missing = KUEUE_SLICE_SIZE if slice_level else KUEUE_SLICE_REQUIRED
        raise FieldError((*at, missing), f"required with {KUEUE_SLICE_REQUIRED.rpartition('/')[2]}"
                         f" and {KUEUE_SLICE_SIZE.rpartition('/')[2]} together")  # fmt: skip
    size = 0
    if size_text is not None:
        if not isinstance(size_text, str) or not _SIZE.fullmatch(size_text) or int(size_text) < 1:
            raise FieldError((*at, KUEUE_SLICE_SIZE), "must be a whole number of pods, >= 1")
        size = int(size_text)
        check_slices(count, size, (*at, KUEUE_SLICE_SIZE))
    if not (required or preferred or slice_level or unconstrained in _TRUE):
        return None
    # Unconstrained: topology-aware but in no one domain, which the empty request says.
    return TopologyRequest(required, preferred, size, slice_level)


def _kai(annotations: Mapping[str, Any], at: Path) -> tuple[str, str]:
    """KAI's required level (the widest the gang may span) and preferred one (narrower):
    both may be given together."""
    return _level(annotations, KAI_REQUIRED, at), _level(annotations, KAI_PREFERRED, at)


def annotated(
    template: Mapping[str, Any],
    count: int,
    at: Path,
    owner: Mapping[str, Any] | None = None,
    owner_at: Path = (),
) -> TopologyRequest | None:
    """The request a pod template's annotations make (``at``: the template's path), or
    None. KAI's annotations may sit on the workload object itself (``owner``, where KAI's
    pod grouper reads them), for every pod set whose template has none of its own."""
    meta = template.get("metadata")
    found = meta.get("annotations") if isinstance(meta, Mapping) else None
    annotations: Mapping[str, Any] = found if isinstance(found, Mapping) else {}
    where = (*at, "metadata", "annotations")
    kueue = _kueue(annotations, count, where)
    kai, kai_at = _kai(annotations, where), where
    if not any(kai) and owner:
        kai, kai_at = _kai(owner, owner_at), owner_at
    if not any(kai):
        return kueue
    if kueue is not None and (kueue.required, kueue.preferred) != kai:
        key = KAI_REQUIRED if kai[0] else KAI_PREFERRED
        raise FieldError((*kai_at, key), "conflicts with the pod set's Kueue topology annotation")
    if kueue is not None:
        return kueue
    return TopologyRequest(required=kai[0], preferred=kai[1])


__all__ = [
    "ANNOTATIONS",
    "KAI_PREFERRED",
    "KAI_REQUIRED",
    "KUEUE_PREFERRED",
    "KUEUE_REQUIRED",
    "KUEUE_SLICE_REQUIRED",
    "KUEUE_SLICE_SIZE",
    "KUEUE_UNCONSTRAINED",
    "annotated",
    "check_slices",
    "qualified_key",
]
