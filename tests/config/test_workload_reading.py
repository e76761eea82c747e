"""The workload readers' mapping getters: ``mapping`` refuses an absent key as "required",
``optional_mapping`` reads it as None, and both refuse a present non-mapping with the path
of the key."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import pytest

from broker.manifest.errors import FieldError
from broker.manifest.workloads.reading import Path, mapping, optional_mapping

Reader = Callable[[Mapping[str, Any], str, Path], Mapping[str, Any] | None]
AT: Path = ("spec", "replicas", 0)

# (reader, object, expected value or None, expected error message or None)
CASES: list[tuple[Reader, dict[str, Any], Mapping[str, Any] | None, str | None]] = [
    (mapping, {"k": {"a": 1}}, {"a": 1}, None),
    (mapping, {}, None, "required"),
    (mapping, {"k": None}, None, "required"),
    (mapping, {"k": [1]}, None, "must be a mapping"),
    (mapping, {"k": "x"}, None, "must be a mapping"),
    (optional_mapping, {"k": {"a": 1}}, {"a": 1}, None),
    (optional_mapping, {}, None, None),
    (optional_mapping, {"k": None}, None, None),
    (optional_mapping, {"k": [1]}, None, "must be a mapping"),
    (optional_mapping, {"k": 3}, None, "must be a mapping"),
]


@pytest.mark.parametrize(("reader", "obj", "value", "error"), CASES)
def test_mapping_readers(
    reader: Reader, obj: dict[str, Any], value: Mapping[str, Any] | None, error: str | None
) -> None:
    if error is None:
        assert reader(obj, "k", AT) == value
        return
    with pytest.raises(FieldError) as caught:
        reader(obj, "k", AT)
    assert caught.value.path == (*AT, "k")
    assert caught.value.message == error
