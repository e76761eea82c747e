"""``Integration``: everything the broker knows of one workload kind, in one value: the
admission half (the pod sets it makes, the ``spec`` fields a tenant may set, what its
controller injects, the defaults written in, the refusals beyond its schema) and the
runtime half a launcher reads (``broker.ports.WorkloadKind``: its resource, which label
gives a pod's index, how it ends, which pod sets its controller makes late), plus the
extra resources a launcher must read to run it (``reads``: RBAC get/list/watch) and the
cells of its row in docs/workloads.md's kinds table.

Each kind's module ends with its ``INTEGRATION``; ``broker.manifest.workloads`` registers
them, one line each. Pure."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from broker.manifest.podrequests import Violation
from broker.manifest.workloads.allowlist import Table
from broker.manifest.workloads.injection import Injection
from broker.manifest.workloads.reading import DerivedPodSet, Path
from broker.ports import MemberResource, RunEnd


def _unchanged(spec: dict[str, Any]) -> dict[str, Any]:
    return spec


def _no_rules(name: str, spec: Mapping[str, Any]) -> list[Violation]:
    return []


def _no_index(workload: Mapping[str, Any], pod: Mapping[str, Any]) -> int | None:
    return None


def _never(obj: Mapping[str, Any]) -> RunEnd | None:
    return None


@dataclass(frozen=True, slots=True)
class Integration:
    """One kind (see the module's docstring). ``pod_sets``: its pod sets from its ``spec``;
    ``fields``: the allowlist of its ``spec``; ``injections``: what its controller adds to
    the pods; ``completed``: its ``spec`` as admitted (defaults the broker must write in to
    count what the controller will make); ``rules``: what the API server, the kind's
    webhook or its controller refuse beyond the CRD's schema, given the name the object is
    created under (the job's). ``index``/``ending``: ``WorkloadKind.pod_index``/``end``
    (by default no pod carries an index and the kind runs until cancelled)."""

    group: str
    version: str
    kind: str
    plural: str
    pod_sets: Callable[[Mapping[str, Any]], list[DerivedPodSet]]
    fields: Table
    injections: tuple[Injection, ...] = ()
    completed: Callable[[dict[str, Any]], dict[str, Any]] = _unchanged
    rules: Callable[[str, Mapping[str, Any]], list[Violation]] = _no_rules
    index: Callable[[Mapping[str, Any], Mapping[str, Any]], int | None] = _no_index
    ending: Callable[[Mapping[str, Any]], RunEnd | None] = _never
    late_pod_sets: frozenset[str] = frozenset()
    reads: tuple[MemberResource, ...] = ()
    # A kind whose pods' shape is a runtime's in the member: its pod sets from its spec and
    # the runtime's spec; the object as created, and each pod set's template path in it.
    runtime_pod_sets: (
        Callable[[Mapping[str, Any], Mapping[str, Any]], list[DerivedPodSet]] | None
    ) = None
    launch_form: (
        Callable[[Mapping[str, Any]], tuple[dict[str, Any], tuple[tuple[str, Path], ...]]] | None
    ) = None
    runtime_ref: Callable[[Mapping[str, Any]], tuple[str, str]] | None = None
    # Annotations on the object its controller reads to place pods the broker's placement
    # never counted: annotation key -> why it is refused.
    refused_annotations: Mapping[str, str] = field(default_factory=dict)
    # Whether its pod templates take a schedulerName (a runtime's patches do not: in
    # delegate mode the member's runtime names the gang scheduler).
    templates_name_scheduler: bool = True
    # Its row of docs/workloads.md's kinds table: the pod sets and how each is counted.
    pod_sets_doc: str = ""
    count_doc: str = ""

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def name(self) -> str:
        return f"{self.api_version} {self.kind}"

    def pod_index(self, workload: Mapping[str, Any], pod: Mapping[str, Any]) -> int | None:
        return self.index(workload, pod)

    def end(self, obj: Mapping[str, Any]) -> RunEnd | None:
        return self.ending(obj)
