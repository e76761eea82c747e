"""Job.renamed: a restart renames a cached Job once per live job, bypassing __init__."""

from __future__ import annotations

import dataclasses

import pytest

from broker.model import GpuType, Job, PodSet, Resources


def every_field_set() -> Job:
    """A Job whose every field differs from its default (a field renamed forgets shows)."""
    return Job(
        name="train", pod_sets=(PodSet("w", 2, Resources(gpus=1)),), tenant="team-a",
        queue="training", priority=7, gpu_types=frozenset({GpuType("A100")}),
        cluster_selector={"zone": "a"}, min_member=1, schedule_timeout_seconds=30,
        policy="binpack", allow_burst=True, clusters=frozenset({"east"}),
        clusters_missing="ClusterTrainingRuntime torch", kind="TrainJob",
    )  # fmt: skip


def test_renamed_is_replace_with_only_the_name_changed() -> None:
    job = every_field_set()
    defaults = Job("x", job.pod_sets)
    same = [
        f.name for f in dataclasses.fields(Job) if getattr(job, f.name) == getattr(defaults, f.name)
    ]
    assert same == ["pod_sets"]  # the fixture covers every other field
    renamed = job.renamed("train-2")
    assert renamed == dataclasses.replace(job, name="train-2")
    assert (renamed.key, job.name) == ("team-a/train-2", "train")  # the original is as it was
    assert renamed.pod_sets is job.pod_sets  # shared, as replace shares them


def test_a_renamed_job_is_as_frozen_as_any() -> None:
    renamed = every_field_set().renamed("b")
    with pytest.raises(dataclasses.FrozenInstanceError):
        renamed.name = "c"  # type: ignore[misc]
