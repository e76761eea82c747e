"""Topology in the vocabulary: what a pod set asks of the domains it runs in, and where a
placed pod set must stay when a member's gang scheduler picks its nodes (pure values).

``broker.model`` re-exports ``TopologyRequest`` (a ``PodSet`` field); ``broker.ports``
re-exports ``Domains`` (a ``LaunchSpec`` field). Below both, like ``broker.taints``."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class TopologyRequest:
    """Where a pod set's pods sit together: inside one domain of ``required`` (a node label
    key; never spanning), or of ``preferred`` (falling back to wider levels, then the
    cluster); both (KAI's two annotations): the narrower ``preferred`` first, falling back
    no wider than ``required``. And in slices of ``slice_size`` pods, each inside one domain
    of ``slice_level``. Empty strings: no such constraint (all empty: unconstrained)."""

    required: str = ""
    preferred: str = ""
    slice_size: int = 0
    slice_level: str = ""

    def check(self, pod_set: str, count: int) -> None:
        """A request the placement could never honour is refused where the pod set is
        made (``ValueError``)."""
        if self.slice_size < 0 or bool(self.slice_size) != bool(self.slice_level):
            raise ValueError(
                f"pod set {pod_set}: topology sliceSize and its slice level go together"
            )
        if self.slice_size and count % self.slice_size:
            raise ValueError(
                f"pod set {pod_set}: count {count} is not a multiple of topology sliceSize "
                f"{self.slice_size}"
            )


@dataclass(frozen=True, slots=True)
class Domains:
    """Where a pod set with a topology request must stay when the member's gang scheduler
    picks the nodes (delegate mode), as its placed nodes' labels say: ``shared``
    ``{level key: value}`` all its pods share; with ``slice_size``, ``slices``: each slice's
    (pod index // slice_size) ``{slice level: value}`` when they differ. ``unresolved``: a
    required level the placed nodes do not share as read now: no launch without it."""

    shared: Mapping[str, str] = field(default_factory=dict)
    slice_size: int = 0
    slices: tuple[Mapping[str, str], ...] = ()
    unresolved: str = ""

    def of_pod(self, index: int) -> dict[str, str]:
        """The ``{level key: value}`` pod ``index`` of the pod set must stay in."""
        out = dict(self.shared)
        if self.slices and self.slice_size:
            out.update(self.slices[min(index // self.slice_size, len(self.slices) - 1)])
        return out


__all__ = ["Domains", "TopologyRequest"]
