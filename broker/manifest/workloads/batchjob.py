"""batch/v1 Job: one pod set ``main`` (Kueue's default pod set name) of the pods the Job
runs at once: ``parallelism`` (default 1), or ``completions`` when that is smaller, Indexed
or not (Kueue's ``podsCount``). The pod template is ``spec.template``; the API server's
rules for a Job hold (``rules``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from broker.manifest.apirules import job_spec_problems
from broker.manifest.podrequests import Violation
from broker.manifest.workloads.reading import DerivedPodSet, bounded, pod_template, pods_of_job

API_VERSION = "batch/v1"
KIND = "Job"
POD_SET = "main"


def pod_sets(spec: Mapping[str, Any]) -> list[DerivedPodSet]:
    at = ("spec",)
    template, path = pod_template(spec, "template", at)
    return [bounded(DerivedPodSet(POD_SET, pods_of_job(spec, at), template, path), at)]


def rules(name: str, spec: Mapping[str, Any]) -> list[Violation]:
    """The Job API's own rules (``validateJobSpec``): the object is created as is."""
    return job_spec_problems(spec, ("spec",))
