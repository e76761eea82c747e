"""An agent-fed cluster takes only the job kinds its agent launches (``Ledger.set_launchable``,
checked by the placement's filter): a gang of pods is kind ``Pod``, a workload job its
workload's kind; a cluster whose launcher takes any kind (None) is never asked."""

from __future__ import annotations

import dataclasses

import pytest

from broker.core.ledger import Ledger
from broker.core.shapes import shape_of
from broker.model import Cluster, GpuType, Job, Node, PodSet, ReasonCode, Resources
from policies.framework import filter_cluster

BIG = Resources(gpus=8, cpu_milli=64000, memory_mib=262144)
GANG = Job("train", (PodSet("w", 1, Resources(gpus=1)),), tenant="team-a")
JOBSET = dataclasses.replace(GANG, kind="JobSet")


@pytest.mark.parametrize(
    ("launchable", "job", "refused"),
    [
        (None, GANG, None),
        (None, JOBSET, None),
        (frozenset(), GANG, "Pod"),
        (frozenset({"Pod"}), GANG, None),
        (frozenset({"Pod"}), JOBSET, "JobSet"),
        (frozenset({"JobSet", "Job"}), JOBSET, None),
        (frozenset({"JobSet"}), GANG, "Pod"),
    ],
)
def test_the_filter_takes_only_what_the_agent_launches(
    launchable: frozenset[str] | None, job: Job, refused: str | None
) -> None:
    ledger = Ledger()
    ledger.add_cluster(Cluster("edge"), [Node("n1", GpuType("A100"), BIG)])
    ledger.set_launchable("edge", launchable)
    reasons = filter_cluster(job, ledger.snapshot().clusters["edge"])
    if refused is None:
        assert reasons == []
        return
    [reason] = reasons
    assert (reason.code, reason.cluster) == (ReasonCode.MISSING, "edge")
    assert reason.message == f"cluster edge is agent-fed; its agent does not launch {refused}"


def test_a_wider_agent_is_growth_and_kinds_are_part_of_a_shape() -> None:
    ledger = Ledger()
    ledger.add_cluster(Cluster("edge"))
    ledger.set_launchable("edge", frozenset())
    growth = ledger.growth
    ledger.set_launchable("edge", frozenset())  # unchanged: nothing to look at again
    assert ledger.growth == growth
    ledger.set_launchable("edge", frozenset({"Pod"}))  # unplaceable shapes are decided again
    assert ledger.growth > growth
    assert shape_of(GANG, "gang", None) != shape_of(JOBSET, "gang", None)
