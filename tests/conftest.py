"""Shared fixtures. Keep this small: builders live in tests/builders.py."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from kmock_namespaces import LIVE, member_problems

from broker.sim.traces import traces_dir

pytest_plugins = ("workload_fixtures",)


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


@pytest.fixture(autouse=True)
def member_refuses_what_a_real_server_refuses() -> Iterator[None]:
    """Fail a test whose Kubernetes member (tests/kmock_namespaces.py) refused a write or
    pruned a field that the test did not take as expected: a real API server would have
    refused or dropped what the broker (or a controller the test plays) sent."""
    LIVE.clear()
    yield
    problems = member_problems()
    LIVE.clear()
    if problems:
        pytest.fail("the member refused or pruned what the broker sent:\n" + "\n".join(problems))


@pytest.fixture
def real_logging() -> Iterator[None]:
    """Restores what ``configure_logging`` changes on the root and the audit logger."""
    root, audit = logging.getLogger(), logging.getLogger("fedbroker.audit")
    saved = (root.handlers[:], root.level, audit.handlers[:], audit.level, audit.propagate)
    yield
    for handler in audit.handlers:
        handler.close()
    root.handlers[:], root.level = saved[0], saved[1]
    audit.handlers[:], audit.level, audit.propagate = saved[2], saved[3], saved[4]


@pytest.fixture(autouse=True)
def no_client_config(monkeypatch: pytest.MonkeyPatch) -> None:
    """No test reads the user's own client config file: its current-context would choose
    the server and the token of a CLI command run without --server."""
    nowhere = Path(__file__).parent / "no-such-client-config.yaml"
    monkeypatch.setenv("FEDBROKER_CONFIG", str(nowhere))
