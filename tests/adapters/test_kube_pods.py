"""A job's pods and logs from a Kubernetes member (``adapters.kube.pods.KubePods``) against
kmock over real HTTP with the real ``kubernetes.aio`` client. kmock serves the pods; the
log endpoint is served by a subclass of kmock's emulator on the same server, streaming
lines as the test releases them and noting when the client (the broker) closed it."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from typing import Any

import aiohttp.web
import kmock as kmocklib
import pytest
from kubernetes.aio.client import ApiClient, Configuration, CoreV1Api, V1Pod
from tenacity import wait_none

from adapters.kube.objects import GangObjects
from adapters.kube.pods import KubePods, MemberLog
from broker.manifest.workloads import INTEGRATIONS
from broker.ports import LaunchSpec, LogRequest, PodNotFound

_LOG = re.compile(r"/api/v1/namespaces/([^/]+)/pods/([^/]+)/log")


class LogEmulator(kmocklib.KubernetesEmulator):
    """kmock, plus a pod log endpoint fed line by line from ``lines`` (None: the end)."""

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        self.lines: asyncio.Queue[bytes | None] = asyncio.Queue()
        self.queries: list[dict[str, str]] = []
        self.closed = asyncio.Event()
        self.restarted = True  # False: a previous instance is asked for in vain (400)

    async def __call__(self, raw: aiohttp.web.BaseRequest) -> aiohttp.web.StreamResponse:
        if _LOG.fullmatch(raw.path) is None:
            return await super().__call__(raw)
        self.queries.append(dict(raw.query))
        if raw.query.get("previous") == "true" and not self.restarted:
            message = 'previous terminated container "main" in pod "train-w-0" not found'
            return aiohttp.web.json_response(
                {"kind": "Status", "status": "Failure", "message": message, "code": 400},
                status=400,
            )
        response = aiohttp.web.StreamResponse(headers={"Content-Type": "text/plain"})
        await response.prepare(raw)
        ended = False
        try:
            while (line := await self.lines.get()) is not None:
                await response.write(line)
            ended = True
        finally:  # a write failed, or the server cancelled us: the broker went away
            if not ended:
                self.closed.set()
        await response.write_eof()
        return response


pytestmark = pytest.mark.kmock(cls=LogEmulator)
SPEC = LaunchSpec(tenant="acme", job="train")
NS = "fedbroker-acme"


@pytest.fixture
async def api(kmock: Any) -> AsyncIterator[ApiClient]:
    kmock.resources["v1/pods"] = kmocklib.ResourceInfo(namespaced=True)
    async with ApiClient(Configuration(host=str(kmock.url).rstrip("/"))) as client:
        yield client


def reader(api: ApiClient) -> KubePods:
    objects = GangObjects(
        "fedbroker-{tenant}", "pin", "coscheduling", "fedbroker", cluster="east",
        gpu_resource="nvidia.com/gpu", shared_gpu_resource=None, scheduler_name=None,
        default_image="busybox",
    )  # fmt: skip
    return KubePods(api, objects, kinds=INTEGRATIONS, attempts=1, retry_wait=wait_none())


async def put_pod(
    api: ApiClient, name: str, labels: dict[str, str], ns: str = NS, **extra: Any
) -> None:
    body = {
        "metadata": {"name": name, "namespace": ns, "labels": labels, **extra.get("meta", {})},
        "spec": {"nodeName": extra.get("node", "n1"), "containers": [{"name": "main"}]},
        "status": {"phase": "Running", "containerStatuses": extra.get("statuses", [])},
    }
    await CoreV1Api(api).create_namespaced_pod(ns, V1Pod.from_dict(body))  # type: ignore[arg-type]


def ours(tenant: str = "acme", job: str = "train", **more: str) -> dict[str, str]:
    return {"fedbroker.io/origin": "fedbroker", "fedbroker.io/tenant": tenant,
            "fedbroker.io/job": job, **more}  # fmt: skip


async def test_rows_are_only_the_jobs_pods(api: ApiClient) -> None:
    statuses = [
        {"name": n, "restartCount": r, "image": "i", "imageID": "i", "ready": True}
        for n, r in (("main", 2), ("side", 1))
    ]
    await put_pod(api, "train-worker-1", ours(**{"fedbroker.io/pod-set": "worker"}),
                  statuses=statuses)  # fmt: skip
    await put_pod(api, "train-0", ours(**{"batch.kubernetes.io/job-completion-index": "0",
                                          "fedbroker.io/pod-set": "main"}),
                  meta={"annotations": {"fedbroker.io/slot": "main-3"}}, node="n2")  # fmt: skip
    await put_pod(api, "other-w-0", ours(job="other"))
    await put_pod(api, "train-w-0", ours(tenant="zeta"), ns="fedbroker-zeta")
    await put_pod(api, "train-w-9", ours(tenant="acme"), ns="fedbroker-zeta")  # wrong namespace
    rows = await reader(api).pods("east", SPEC)
    assert [(r.name, r.pod_set, r.node, r.phase, r.restarts, r.slot, r.cluster) for r in rows] == [
        ("train-0", "main", "n2", "Running", 0, "main-3", "east"),
        ("train-worker-1", "worker", "n1", "Running", 3, "worker-1", "east"),
    ]


async def test_another_jobs_pod_is_not_found(api: ApiClient, kmock: LogEmulator) -> None:
    await put_pod(api, "other-w-0", ours(job="other"))
    with pytest.raises(PodNotFound):
        await reader(api).logs("east", SPEC, LogRequest("other-w-0"))
    with pytest.raises(PodNotFound):
        await reader(api).logs("east", SPEC, LogRequest("missing-0"))
    await put_pod(api, "train-w-0", ours())
    with pytest.raises(PodNotFound):
        await reader(api).logs("east", SPEC, LogRequest("train-w-0", container="nope"))
    assert kmock.queries == []  # no log was asked for


async def test_follow_streams_as_the_member_writes_and_close_ends_it(
    api: ApiClient, kmock: LogEmulator
) -> None:
    await put_pod(api, "train-w-0", ours())
    stream = await reader(api).logs("east", SPEC, LogRequest("train-w-0", None, 10, True))
    assert isinstance(stream, MemberLog)
    chunks = aiter(stream)
    kmock.lines.put_nowait(b"one\n")
    assert await anext(chunks) == b"one\n"
    kmock.lines.put_nowait(b"two\n")
    assert await anext(chunks) == b"two\n"
    assert kmock.queries == [{"container": "main", "follow": "true", "tailLines": "10"}]
    await stream.aclose()
    assert stream.closed
    async with asyncio.timeout(5):  # the member's next write finds the broker gone
        while not kmock.closed.is_set():
            kmock.lines.put_nowait(b"more\n")
            await asyncio.sleep(0.01)


async def test_timestamps_and_previous_are_asked_of_the_member(
    api: ApiClient, kmock: LogEmulator
) -> None:
    await put_pod(api, "train-w-0", ours())
    for line in (b"2026-01-02T03:04:05.000000006Z a\n", None):
        kmock.lines.put_nowait(line)
    request = LogRequest("train-w-0", timestamps=True, previous=True)
    stream = await reader(api).logs("east", SPEC, request)
    assert b"".join([c async for c in stream]) == b"2026-01-02T03:04:05.000000006Z a\n"
    assert kmock.queries[-1] == {
        "container": "main", "follow": "false", "timestamps": "true", "previous": "true",
    }  # fmt: skip
    kmock.restarted = False
    with pytest.raises(PodNotFound, match=r"no previous instance of container 'main'"):
        await reader(api).logs("east", SPEC, request)


async def test_a_log_that_ends_ends_the_stream(api: ApiClient, kmock: LogEmulator) -> None:
    await put_pod(api, "train-w-0", ours())
    stream = await reader(api).logs("east", SPEC, LogRequest("train-w-0"))
    for line in (b"a\n", b"b\n", None):
        kmock.lines.put_nowait(line)
    assert b"".join([c async for c in stream]) == b"a\nb\n"
    assert stream.closed  # type: ignore[attr-defined]
