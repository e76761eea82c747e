"""A stored job back into a queue entry (``pending_of``), as a restart rebuilds every live
job: the validated spec is shared by the jobs sent from one template, but each entry is
its own job, and a stored spec is validated again under today's rules."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from broker.bench.e2e import job_body
from broker.manifest import ManifestError, parse_manifest, to_job
from broker.quantity import QuantityError, parse_quantity
from broker.service.state import pending_of
from broker.store import JobRecord


def record(
    name: str, manifest: dict[str, Any], *, tenant: str = "t", queue: str = "q"
) -> JobRecord:
    return JobRecord(
        tenant=tenant, name=name, queue=queue, priority=0, manifest=manifest, state="Queued",
        cluster=None, placement=None, attempts=0, not_before=None, reason="", created_at=1.0,
        updated_at=1.0, seq=1,
    )  # fmt: skip


def wire(name: str, cpu: str = "4") -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(job_body(name))
    doc["spec"]["podSets"][0]["resources"]["cpu"] = cpu
    return parse_manifest(json.dumps(doc).encode(), "application/json").wire()


def test_each_job_is_its_own_and_equals_the_uncached_one() -> None:
    a, b = pending_of(record("a", wire("a"))).job, pending_of(record("b", wire("b"))).job
    assert (a.name, b.name, a.key, b.key) == ("a", "b", "t/a", "t/b")
    assert a == to_job(parse_manifest(job_body("a"), "application/json"), "t", "q")
    other = pending_of(record("a", wire("a"), tenant="u", queue="bench")).job
    assert (other.tenant, other.queue) == ("u", "bench")
    bigger = pending_of(record("c", wire("c", cpu="8"))).job
    assert bigger.pod_sets[0].resources.cpu_milli == 8000
    assert a.pod_sets[0].resources.cpu_milli == 4000


def test_a_stored_spec_is_validated_again() -> None:
    broken = copy.deepcopy(wire("x"))
    broken["spec"]["podSets"][0]["count"] = 0
    with pytest.raises(ManifestError, match="count"):
        pending_of(record("x", broken))


@pytest.mark.parametrize("value", [[], {}, None, True, "4 cores", "1e99"])
def test_quantities_refuse_what_is_not_one(value: object) -> None:
    # Twice: an error is never remembered as a value, and unhashable input is refused too.
    for _ in range(2):
        with pytest.raises(QuantityError):
            parse_quantity(value)


def test_an_entry_keyed_by_its_specs_text_is_the_one_decoded_from_the_manifest() -> None:
    # A restart's page carries the spec's text: nothing is decoded on a hit, and what
    # comes out is what decoding the manifest gives (templates, port, workload included).
    doc = wire("a")
    doc["spec"]["rendezvous"] = {"masterPort": 23456}
    text = json.dumps(doc["spec"], separators=(",", ":"))
    decoded = [pending_of(record(n, doc)) for n in ("a", "b")]
    paged = [  # the manifest's text is not JSON: decoding it would fail
        pending_of(JobRecord(**{**fields(record(n, doc)), "manifest": None},
                             manifest_text="not read", spec_text=text))
        for n in ("a", "b")
    ]  # fmt: skip
    for one, keyed in zip(decoded, paged, strict=True):
        assert keyed == one
    assert paged[0].job.name == "a" and paged[1].job.name == "b"
    assert paged[0].master_port == 23456


def test_a_refused_spec_by_its_text_is_refused_every_time() -> None:
    broken = copy.deepcopy(wire("x"))
    broken["spec"]["podSets"][0]["count"] = 0
    text = json.dumps(broken["spec"])
    for _ in range(2):  # never remembered as a Job
        with pytest.raises(ManifestError, match="count"):
            pending_of(JobRecord(**{**fields(record("x", broken)), "manifest": None},
                                 manifest_text=json.dumps(broken), spec_text=text))  # fmt: skip


def fields(job: JobRecord) -> dict[str, Any]:
    return {f: getattr(job, f) for f in ("tenant", "name", "queue", "priority", "manifest",
            "state", "cluster", "placement", "attempts", "not_before", "reason", "created_at",
            "updated_at", "seq", "generation")}  # fmt: skip
