"""Shared fixtures. Keep this small: builders live in tests/builders.py."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from broker.sim.traces import traces_dir


@pytest.fixture
def trace_file() -> Callable[[str], Path]:
    """Locate a real trace file under FEDBROKER_TRACES (default ../shared/traces).

    A missing file skips the test with the path in the reason, or fails it when
    FEDBROKER_REQUIRE_SERVICES=1 (CI must not pass by skipping).
    """

    def find(relative: str) -> Path:
        path = traces_dir() / relative
        if path.is_file():
            return path
        if os.environ.get("FEDBROKER_REQUIRE_SERVICES") == "1":
            pytest.fail(f"trace file {path} is required (FEDBROKER_REQUIRE_SERVICES=1)")
        pytest.skip(f"trace file {path} not found (set FEDBROKER_TRACES)")

    return find
