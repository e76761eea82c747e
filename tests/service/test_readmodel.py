"""The typed read model: one computation behind /v1/clusters, /v1/nodes, /v1/queues."""

from __future__ import annotations

import asyncio
from pathlib import Path

from test_api import ADMIN, A, manifest, running, submit

from adapters.simulated import SimulatedLauncher


async def never(seconds: float) -> None:
    """A launch delay that lasts until the test ends: the placement stays reserved."""
    await asyncio.Event().wait()


async def test_reserved_gpus_agree_between_clusters_and_nodes(tmp_path: Path) -> None:
    launcher = SimulatedLauncher(launch_delay_seconds=1.0, sleep=never)
    async with running(tmp_path, launcher) as (client, service, clock):
        assert (await submit(client, manifest("train", pods=2, gpus=4), A)).status == 201
        await service.schedule_once(clock.now)
        [placement] = service.ledger.reservations().values()

        clusters = service.view.clusters()
        nodes = {c.cluster: c for c in service.view.nodes(None)}
        for cluster in clusters:
            for row in cluster.gpu_types:
                of_type = [n for n in nodes[cluster.cluster].nodes if n.gpu_type == row.gpu_type]
                assert row.reserved == sum(n.reserved for n in of_type)
                assert row.free == sum(n.free for n in of_type)
        held = {(c.cluster, t.gpu_type): t.reserved for c in clusters for t in c.gpu_types}
        assert sum(held.values()) == 8  # the gang's 2 pods of 4 GPUs
        assert held[(placement.cluster, "A100")] == 8

        # The API's bodies are the rows' own JSON.
        body = await (await client.get("/v1/clusters", headers=A)).json()
        rows = service.view.clusters(stranded_gpus_too=True)
        assert body == {"clusters": [c.as_json() for c in rows]}
        body = await (await client.get("/v1/nodes", headers=ADMIN)).json()
        assert body == {"clusters": [c.as_json() for c in service.view.nodes(None)]}
        body = await (await client.get("/v1/queues", headers=A)).json()
        assert body == {"queues": [q.as_json() for q in service.view.queues()]}
        [training] = [q for q in service.view.queues() if q.name == "training"]
        assert training.usage == {"A100": 8.0} and training.pending == 0
