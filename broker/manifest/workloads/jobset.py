"""jobset.x-k8s.io/v1alpha2 JobSet: one pod set per ``spec.replicatedJobs[i]``, named as
the replicated job, of ``replicas`` (default 1) times the pods each of its Jobs runs at
once (``parallelism``, default 1, capped by ``completions``: Kueue's ``podsCount``). The
pod template is ``spec.replicatedJobs[i].template.spec.template``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from broker.manifest.errors import FieldError, show
from broker.manifest.workloads.reading import (
    DerivedPodSet,
    bounded,
    count,
    items,
    mapping,
    pod_set_name,
    pod_template,
    pods_of_job,
    text,
)

API_VERSION = "jobset.x-k8s.io/v1alpha2"
KIND = "JobSet"


def pod_sets(spec: Mapping[str, Any]) -> list[DerivedPodSet]:
    at = ("spec",)
    replicated = items(spec, "replicatedJobs", at)
    if not replicated:
        raise FieldError((*at, "replicatedJobs"), "required: at least one replicated job")
    out: list[DerivedPodSet] = []
    for rj, where in replicated:
        name = pod_set_name(text(rj, "name", where), (*where, "name"))
        replicas = count(rj, "replicas", where, default=1, least=1)
        job = mapping(rj, "template", where)
        job_spec = mapping(job, "spec", (*where, "template"))
        job_at = (*where, "template", "spec")
        template, path = pod_template(job_spec, "template", job_at)
        pods = replicas * pods_of_job(job_spec, job_at)
        if any(ps.name == name for ps in out):
            raise FieldError((*where, "name"), f"duplicate replicated job name {show(name)}")
        out.append(bounded(DerivedPodSet(name, pods, template, path), where))
    return out
