"""A workload shaped by a member runtime (a TrainJob's ClusterTrainingRuntime or
TrainingRuntime), resolved when it is submitted: the runtime is looked up in every
Kubernetes member's cache, each member's runtime derives the pods it would make (pure:
``broker.manifest.workloads``), and the job is admitted with the pods most members agree on
(ties: the first member by name). Only the members whose runtime makes those same pods may
take it (``Job.clusters``); explain names the others as lacking it. The runtime as admitted
is stored with the job (``spec.workload.runtime``), so a restart counts the same pods
without reading the members.

A runtime no member has (or none can be read) refuses the job at submission, naming
``spec.workload.spec.runtimeRef.name``; nothing is stored.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from broker.manifest import FederatedJob, ManifestError, stored_manifest
from broker.manifest.errors import FieldError, field_path
from broker.manifest.workloads import derive, runtime_named
from broker.service.members import KubeMembers

REF = "spec.workload.spec.runtimeRef.name"


def resolved(manifest: FederatedJob, tenant: str, members: KubeMembers) -> FederatedJob:
    """``manifest`` with its workload's runtime looked up and stored, or as it is when its
    kind has none; ManifestError naming the runtime's reference when no member has it."""
    workload = manifest.spec.workload
    if workload is None:
        return manifest
    obj = {k: v for k, v in workload.wire().items() if k != "runtime"}
    named = runtime_named(obj)
    if named is None:
        return manifest
    kind, name = named
    shapes: dict[str, list[tuple[str, Mapping[str, Any]]]] = {}
    why: list[str] = []
    for cluster, found in members.runtimes(kind, tenant, name).items():
        if isinstance(found, str):
            why.append(f"{cluster}: {found}")
            continue
        spec = found.get("spec")
        try:
            made = derive({**obj, "runtime": {"spec": spec}})
        except FieldError as exc:
            why.append(f"{cluster}: its {kind} {name}: {field_path(exc.path)}: {exc}")
            continue
        shape = json.dumps([(p.name, p.count, p.template) for p in made], sort_keys=True)
        shapes.setdefault(shape, []).append((cluster, spec if isinstance(spec, Mapping) else {}))
    if not shapes:
        listed = "; ".join(why) or "no Kubernetes member"
        raise ManifestError(f"{REF}: no member has {kind} {name!r} ({listed})", REF)
    agreed = max(shapes.values(), key=len)  # max keeps the first of equals: members by name
    runtime = {"kind": kind, "name": name, "clusters": [c for c, _ in agreed],
               "spec": agreed[0][1]}  # fmt: skip
    wire = manifest.wire()
    wire["spec"]["workload"] = {**obj, "runtime": runtime}
    return stored_manifest(wire)
