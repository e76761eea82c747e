"""ray.io/v1 RayCluster: the pod sets of its spec, a Ray cluster (``raycommon``: ``head``
and one per worker group), with KubeRay's name rule (``MAX_RAY_CLUSTER_NAME``) and what
KubeRay adds to its workers. A RayCluster runs until cancelled: no status of its ends it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from broker.manifest.podrequests import Violation
from broker.manifest.workloads.integration import Integration
from broker.manifest.workloads.raycommon import (
    CLUSTER,
    COUNT_DOC,
    GROUP,
    HEAD,
    MAX_RAY_CLUSTER_NAME,
    POD_SETS_DOC,
    VERSION,
    cluster_pod_sets,
    injections,
    name_rules,
)
from broker.manifest.workloads.reading import DerivedPodSet

KIND = "RayCluster"
FIELDS = CLUSTER


def rules(name: str, spec: Mapping[str, Any]) -> list[Violation]:
    return name_rules(name, MAX_RAY_CLUSTER_NAME, KIND)


def pod_sets(spec: Mapping[str, Any]) -> list[DerivedPodSet]:
    return cluster_pod_sets(spec, ("spec",), reserved=(HEAD,))


INTEGRATION = Integration(
    GROUP, VERSION, KIND, "rayclusters", pod_sets, FIELDS, injections(""), rules=rules,
    pod_sets_doc=POD_SETS_DOC, count_doc=COUNT_DOC,
)  # fmt: skip
