"""Resubmission (issue 13): the same tenant/name with the same spec answers the stored job
(200), another spec while it is active is 409 naming the name and stores nothing, and a
finished job's name starts the next generation (201), placed like any new job."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from test_api import A, B, Harness, manifest, running, settle, submit


@pytest.fixture
async def harness(tmp_path: Path) -> AsyncIterator[Harness]:
    async with running(tmp_path) as h:
        yield h


async def test_same_spec_is_200_and_another_spec_is_409(harness: Harness) -> None:
    client, service, _ = harness
    assert (await submit(client, manifest("train", gpus=4), A)).status == 201
    same = await submit(client, manifest("train", gpus=4), A)
    assert same.status == 200
    other = await submit(client, manifest("train", gpus=2), A)
    assert other.status == 409
    error = (await other.json())["error"]
    assert error.startswith("metadata.name: ") and "'train'" in error and "\n" not in error
    stored = await service.store.get_job("team-a", "train")
    assert stored is not None
    assert stored.manifest["spec"]["podSets"][0]["resources"]["nvidia.com/gpu"] == 4
    # another tenant's job of that name is another job
    assert (await submit(client, manifest("train", gpus=2), B)).status == 201


async def test_a_cancelled_name_is_reused_as_the_next_generation(harness: Harness) -> None:
    client, service, clock = harness
    assert (await submit(client, manifest("again", gpus=8), A)).status == 201
    assert (await client.delete("/v1/jobs/again", headers=A)).status == 200
    resp = await submit(client, manifest("again", gpus=2), A)
    assert resp.status == 201
    body = await resp.json()
    assert body["status"]["state"] == "Queued"
    assert body["spec"]["podSets"][0]["resources"]["nvidia.com/gpu"] == 2
    await service.schedule_once(clock.now)
    await settle(service)
    got = await (await client.get("/v1/jobs/again", headers=A)).json()
    assert got["status"]["state"] == "Running"  # the new generation is placed and runs
    assert got["status"]["generation"] == 2
    assert got["status"]["history"][0]["state"] == "Queued"
    [old] = await service.store.generations("team-a", "again")
    assert old.record["state"] == "Cancelled"
    # the same spec again while generation 2 runs: 200, still generation 2
    same = await submit(client, manifest("again", gpus=2), A)
    assert same.status == 200 and (await same.json())["status"]["generation"] == 2
