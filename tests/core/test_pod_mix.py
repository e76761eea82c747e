"""The service's fgd family places against the pod mix it learns from the jobs it decides:
each job counted once, the oldest pods leaving the window, and the policy made again only
when the mix moves."""

from __future__ import annotations

from fractions import Fraction

import pytest

from broker.core.pod_mix import PodMix, distance
from broker.core.queue import JobQueue, Pending, QueueSpec
from broker.core.scheduler import PolicyBook
from broker.model import Job, PodSet, Resources
from policies.fgd import DEFAULT_WORKLOAD, PodShape
from policies.fgd_lp import FgdLpChooser
from policies.scoring import NodeScoringPolicy

THIRD = Resources(gpu_milli=300, cpu_milli=2000)
WHOLE = Resources(gpus=1, cpu_milli=8000)


def job(name: str, res: Resources, count: int = 1) -> Pending:
    return Pending(Job(name, (PodSet("p", count, res),)), 0, 0.0)


def test_nothing_is_published_before_enough_pods() -> None:
    mix = PodMix(least=10, every=1)
    for i in range(9):
        mix.observe(job(f"j{i}", THIRD).job)
    assert (mix.workload, mix.version) == (None, 0)
    mix.observe(job("j9", THIRD).job)
    assert mix.workload == ((PodShape.of(THIRD), 1.0),)
    assert mix.version == 1


def test_a_job_that_waits_many_cycles_counts_once() -> None:
    mix = PodMix(least=1, every=1)
    waiting = job("gang", WHOLE, count=4).job
    for _ in range(50):
        mix.observe(waiting)
    for i in range(4):
        mix.observe(job(f"s{i}", THIRD).job)
    assert dict(mix.workload or ()) == {PodShape.of(WHOLE): 0.5, PodShape.of(THIRD): 0.5}


def test_the_oldest_pods_leave_the_window() -> None:
    mix = PodMix(window=10, least=1, every=1, drift=0.0)
    mix.observe(job("gang", WHOLE, count=8).job)
    for i in range(6):  # 14 pods: 4 of the gang's have left
        mix.observe(job(f"s{i}", THIRD).job)
    assert dict(mix.workload or ()) == {PodShape.of(WHOLE): 0.4, PodShape.of(THIRD): 0.6}


def test_distance_is_total_variation() -> None:
    a, b = PodShape.of(WHOLE), PodShape.of(THIRD)
    assert distance(((a, 1.0),), ((b, 1.0),)) == 1.0
    assert distance(((a, 0.5), (b, 0.5)), ((a, 0.6), (b, 0.4))) == pytest.approx(0.1)


def _chooser(policy: object) -> FgdLpChooser:
    assert isinstance(policy, NodeScoringPolicy)
    chooser = policy.chooser
    assert isinstance(chooser, FgdLpChooser)
    return chooser


def test_fgd_lp_prices_the_mix_the_service_sees_and_is_remade_only_when_it_moves() -> None:
    book = PolicyBook(JobQueue([QueueSpec("default", "fgd-lp")]), mix=PodMix(least=100))
    first = book.for_job(job("first", THIRD))
    assert _chooser(first).frag.workload == DEFAULT_WORKLOAD  # nothing learnt yet
    for i in range(300):  # thirds only: three to a GPU
        policy = book.for_job(job(f"t{i}", THIRD))
    assert _chooser(policy).loss.prices == {300: Fraction(1, 3)}
    steady = policy
    for i in range(300):
        assert book.for_job(job(f"u{i}", THIRD)) is steady
    for i in range(600):  # the mix moves: as many whole GPUs as thirds
        book.for_job(job(f"w{i}", WHOLE))
    moved = book.for_job(job("last", THIRD))
    assert moved is not steady
    assert dict(_chooser(moved).frag.workload).keys() == {PodShape.of(THIRD), PodShape.of(WHOLE)}


def test_policies_that_take_no_workload_are_made_once() -> None:
    book = PolicyBook(JobQueue([QueueSpec("default", "binpack")]), mix=PodMix(least=1, every=1))
    made = book.for_job(job("a", THIRD))
    for i in range(50):
        res = THIRD if i % 2 else WHOLE
        assert book.for_job(job(f"j{i}", res)) is made
    assert book.mix.version > 1  # the mix did move
