"""The workload tests' member and client (tests/adapters/workload_cluster.py): kmock with
Namespaces and every workload kind served, and the real ``kubernetes.aio`` client on it,
as the fixtures ``k8s`` and ``api`` (a plugin of tests/conftest.py). A module that needs
another member, or another ``api``, defines its own: pytest takes the nearest."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from kubernetes.aio.client import ApiClient
from workload_cluster import Emulator, client_config, emulator


@pytest.fixture
async def k8s(kmock: Any) -> Emulator:
    return await emulator(kmock)


@pytest.fixture
async def api(k8s: Emulator) -> AsyncIterator[ApiClient]:
    async with ApiClient(client_config(k8s)) as client:
        yield client
