"""Why a Cluster API pool cannot be read, in the few words ``/readyz``, the metric and
explain show (``adapters.capi.unreadable``): one row per failure of ``CapiPool.status``
against kmock over real HTTP with the real client, the words expected exactly. The
error's message (for the log) names the object and the status, never the token."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any, cast

import kmock as kmocklib
import pytest
from kubernetes.aio.client import ApiClient, Configuration
from tcp_proxy import TcpProxy
from tenacity import wait_none
from test_capi import CANARY, MD, NAME, NS, UNAVAILABLE, add_pool

from adapters.capi import CapiPool, CapiPoolError, unreadable
from adapters.capi.objects import ANNOTATION_GPU_COUNT

Emulator = kmocklib.KubernetesEmulator
FORBIDDEN = {"kind": "Status", "code": 403, "reason": "Forbidden", "message": "no"}


def served(k8s: Emulator) -> None:
    k8s.resources["cluster.x-k8s.io/v1beta1/machinedeployments"] = kmocklib.ResourceInfo(
        namespaced=True
    )


def answering_503(k8s: Emulator) -> None:
    served(k8s)
    add_pool(k8s)
    k8s["get"][MD] << 503 << UNAVAILABLE


def forbidden(k8s: Emulator) -> None:
    served(k8s)
    add_pool(k8s)
    k8s["get"][MD] << 403 << FORBIDDEN


def missing(k8s: Emulator) -> None:
    served(k8s)  # but no MachineDeployment of that name


def not_served(k8s: Emulator) -> None:
    """Neither v1beta2 nor v1beta1 of cluster.x-k8s.io is served (discovery: 404)."""


def bad_annotation(k8s: Emulator) -> None:
    served(k8s)
    add_pool(k8s, annotations={ANNOTATION_GPU_COUNT: "1.5"})


CASES: list[tuple[str, Callable[[Emulator], None], str, str]] = [
    ("5xx after the retries", answering_503, "HTTP 503", "HTTP 503 ServiceUnavailable"),
    ("forbidden", forbidden, "HTTP 403", "HTTP 403 Forbidden"),
    ("no such object", missing, "HTTP 404", f"no MachineDeployment {NS}/{NAME}"),
    ("Cluster API not served", not_served, "HTTP 404", "serves none of cluster.x-k8s.io"),
    ("annotation does not parse", bad_annotation, "invalid annotations", ANNOTATION_GPU_COUNT),
]


def client_of(server: str) -> ApiClient:
    config = Configuration(
        host=server, api_key={"BearerToken": CANARY}, api_key_prefix={"BearerToken": "Bearer"}
    )
    return ApiClient(config)


@pytest.fixture
async def closed_port() -> AsyncIterator[str]:
    """A loopback address where nothing listens: connections are refused."""
    proxy = TcpProxy(1)
    await proxy.start()
    await proxy.refuse()
    yield proxy.url


@pytest.mark.parametrize(("setup", "reason", "logged"), [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])  # fmt: skip
async def test_why_a_pool_cannot_be_read(
    kmock: Any, setup: Callable[[Emulator], None], reason: str, logged: str
) -> None:
    k8s = cast(Emulator, kmock)
    setup(k8s)
    async with client_of(str(k8s.url).rstrip("/")) as api:
        with pytest.raises(CapiPoolError) as caught:
            await CapiPool(api, NS, NAME, attempts=2, retry_wait=wait_none()).status()
    assert unreadable(caught.value) == reason
    assert logged in str(caught.value) and CANARY not in str(caught.value)


async def test_a_refused_connection(closed_port: str) -> None:
    async with client_of(closed_port) as api:
        with pytest.raises(CapiPoolError) as caught:
            await CapiPool(api, NS, NAME, attempts=2, retry_wait=wait_none()).status()
    assert unreadable(caught.value) == "connection failed"
    assert "ClientConnectorError after 2 attempts" in str(caught.value)
    assert CANARY not in str(caught.value)


async def test_a_server_that_never_answers(kmock: Any) -> None:
    k8s = cast(Emulator, kmock)
    proxy = TcpProxy(int(k8s.url.port or 0))
    await proxy.start()
    proxy.mode = "blackhole"  # accepts, and never answers
    try:
        async with client_of(proxy.url) as api:
            capi = CapiPool(api, NS, NAME, attempts=2, retry_wait=wait_none(), timeout=0.2)
            with pytest.raises(CapiPoolError) as caught:
                await capi.status()
    finally:
        await proxy.close()
    assert unreadable(caught.value) == "timed out"
    assert "TimeoutError after 2 attempts" in str(caught.value)
