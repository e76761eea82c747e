"""JobRecord: immutable, equal by value, its manifest decoded from the row's text once."""

from __future__ import annotations

import copy
import json
import pickle
from typing import Any

import pytest

from broker.store import JobRecord
from broker.store.sql import job_from_row

DOCUMENT: dict[str, Any] = {"kind": "FederatedJob", "spec": {"podSets": [{"count": 2}]}}
ROW = ("t", "a", "q", 3, json.dumps(DOCUMENT), "Queued", None, None, 0, None, "r", 1.0, 2.0, 7, 1)


def eager(**changes: Any) -> JobRecord:
    fields: dict[str, Any] = {
        "tenant": "t", "name": "a", "queue": "q", "priority": 3, "manifest": DOCUMENT,
        "state": "Queued", "cluster": None, "placement": None, "attempts": 0,
        "not_before": None, "reason": "r", "created_at": 1.0, "updated_at": 2.0, "seq": 7,
        "generation": 1,
    }  # fmt: skip
    return JobRecord(**{**fields, **changes})


def test_a_record_from_a_row_reads_as_the_document_it_was_stored_from() -> None:
    record = job_from_row(ROW)
    assert record.manifest == DOCUMENT
    assert record.manifest is record.manifest  # decoded once, then the same object
    assert record == eager()


def test_a_record_given_its_callers_document_does_not_share_it() -> None:
    handed = {"kind": "FederatedJob"}
    record = job_from_row(ROW, handed)
    assert record.manifest == handed and record.manifest is not handed


@pytest.mark.parametrize(
    ("field", "value"),
    [("tenant", "u"), ("state", "Running"), ("manifest", {"kind": "Other"}), ("seq", 8),
     ("generation", 2), ("placement", {"nodes": []}), ("not_before", 5.0)],
)  # fmt: skip
def test_records_differing_in_one_field_are_not_equal(field: str, value: Any) -> None:
    assert job_from_row(ROW) != eager(**{field: value})
    assert eager(**{field: value}) == eager(**{field: value})


@pytest.mark.parametrize("field", ["state", "manifest", "_text", "seq", "placement", "_placement"])
def test_a_record_cannot_be_changed(field: str) -> None:
    record = job_from_row(ROW)
    with pytest.raises(AttributeError, match=field):
        setattr(record, field, None)
    with pytest.raises(AttributeError, match=field):
        delattr(record, field)
    assert record == eager()


def test_a_record_takes_exactly_one_form_of_its_manifest() -> None:
    with pytest.raises(TypeError, match="exactly one"):
        eager(manifest=None)
    with pytest.raises(TypeError, match="exactly one"):
        eager(manifest_text="{}")


def test_a_record_is_not_hashable_and_shows_its_fields() -> None:
    record = job_from_row(ROW)
    with pytest.raises(TypeError):
        hash(record)
    assert repr(record).startswith("JobRecord(tenant='t', name='a', queue='q', priority=3, ")
    assert "'podSets'" in repr(record)


def test_a_record_copies_and_pickles_as_itself() -> None:
    record = job_from_row(ROW)
    assert copy.copy(record) == copy.deepcopy(record) == pickle.loads(pickle.dumps(record))
    assert copy.deepcopy(record).manifest is not record.manifest


def test_a_replaced_record_changes_only_the_fields_named() -> None:
    record = job_from_row(ROW)
    moved = record.replace(state="Running", cluster="c1")
    assert moved == eager(state="Running", cluster="c1")
    assert record == eager()  # the original is untouched
    assert record.replace() == record
    with pytest.raises(TypeError, match="colour"):
        record.replace(colour="red")


def test_a_copy_passes_an_undecoded_manifest_on_undecoded() -> None:
    record = job_from_row(ROW, spec_text='{"podSets":[{"count":2}]}')
    moved = record.replace(state="Running")
    assert moved.manifest_as_read() == (None, json.dumps(DOCUMENT))  # not decoded to copy
    assert moved.spec_text == record.spec_text  # the spec went with it
    assert moved == eager(state="Running")
    record.manifest  # noqa: B018  # decoded now: a copy takes the document
    assert record.replace(reason="x").manifest_as_read() == (DOCUMENT, None)
    other = {"kind": "Other"}
    changed = record.replace(manifest=other)
    assert changed.manifest == other and changed.spec_text is None  # its spec is unknown


def test_the_spec_text_is_a_hint_outside_equality_and_copies() -> None:
    record = job_from_row(ROW, spec_text='{"podSets":[{"count":2}]}')
    assert record == job_from_row(ROW)
    assert pickle.loads(pickle.dumps(record)).spec_text is None
    assert "spec_text" not in repr(record)


PLACED = {"cluster": "c1", "pods": [{"pod": "p-0", "node": "n1"}]}
PLACED_ROW = (*ROW[:5], "Placed", "c1", json.dumps(PLACED), *ROW[8:])


def test_a_placement_is_decoded_when_read_and_copied_undecoded() -> None:
    record = job_from_row(PLACED_ROW)
    assert record.placement_as_read() == (None, json.dumps(PLACED))  # not decoded to make it
    moved = record.replace(state="Running")
    assert moved.placement_as_read() == (None, json.dumps(PLACED))  # nor to copy it
    assert record.placement == PLACED
    assert record.placement is record.placement  # decoded once, then the same object
    assert record.placement_as_read() == (PLACED, None)
    assert moved == eager(state="Running", cluster="c1", placement=PLACED)
    assert record.replace(placement=None).placement is None
    assert job_from_row(ROW).placement is None and job_from_row(ROW).placement_as_read() == (
        None, None,
    )  # fmt: skip


def test_a_record_takes_at_most_one_form_of_its_placement() -> None:
    with pytest.raises(TypeError, match="at most one"):
        eager(placement=PLACED, placement_text=json.dumps(PLACED))
    assert eager(placement_text=json.dumps(PLACED)) == eager(placement=PLACED)


def test_a_record_is_a_record_and_nothing_else() -> None:
    """Made as its open slots, then frozen: what callers get is a JobRecord, and frozen."""
    record = job_from_row(PLACED_ROW)
    assert type(record) is JobRecord
    with pytest.raises(AttributeError, match="placement"):
        record.placement = None  # type: ignore[misc]
    with pytest.raises(AttributeError, match="_placement_text"):
        object.__getattribute__(record, "__class__").__setattr__(record, "_placement_text", "")
