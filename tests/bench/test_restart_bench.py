"""``fedbroker bench --restart`` at a tiny N: the output's shape, and that after two starts
and two ``kill -9`` every job is back, active, with its last history row its state. Nothing
here looks at how fast the broker got ready: a slow machine must not fail the suite."""

from __future__ import annotations

import asyncio
import json

import pytest
from services import PG_URL, postgres_database

from broker.bench.restart import LIVE
from broker.cli.main import main

JOBS = 200
TINY = ["bench", "--restart", "--jobs", str(JOBS), "--clusters", "2", "--nodes-per-cluster", "20"]
# A third of the jobs stay Queued (every third from the first); the rest were placed.
REQUEUED = JOBS - len(range(0, JOBS, len(LIVE)))


def test_every_job_is_back_after_kill(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*TINY, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert (doc["jobs"], doc["store"], doc["jobs_back"], doc["inconsistent"]) == (
        JOBS, "sqlite", JOBS, 0,
    )  # fmt: skip
    assert set(doc["states"]) <= set(LIVE) and sum(doc["states"].values()) == JOBS
    for start in ("first_start", "after_kill"):
        row = doc[start]
        assert set(row) == {
            "ready_s", "rebuild_s", "metrics_s", "rebuilt_jobs", "restored", "requeued",
        }  # fmt: skip
        # Every live job read back; every placed or running one requeued (simulated
        # members: their pods died with the broker), once, counted by the broker itself.
        assert (row["rebuilt_jobs"], row["requeued"], row["restored"]) == (JOBS, REQUEUED, 0)
        assert row["ready_s"] > 0 and row["rebuild_s"] >= 0 and row["metrics_s"] > 0


async def test_postgres_store_and_human_table(capsys: pytest.CaptureFixture[str]) -> None:
    async with postgres_database():  # skips (or fails when required) without a server
        pass
    # main runs its own event loop: in a thread, out of this test's.
    code = await asyncio.to_thread(main, [*TINY, "--store", PG_URL])
    assert code == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith(f"restart: {JOBS} live jobs") and "on postgres" in lines[0]
    assert lines[1].split() == ["start", "jobs", "requeued", "time", "to", "ready", "s",
                                "rebuild", "s", "/metrics", "s"]  # fmt: skip
    for line, label in zip(lines[2:4], ("first", "after kill -9"), strict=True):
        assert line.split()[: len(label.split()) + 2] == [*label.split(), str(JOBS), str(REQUEUED)]
    assert lines[4].split() == ["jobs", "back", str(JOBS), "of", f"{JOBS},", "inconsistent", "0"]


def test_on_kubernetes_members_every_running_job_is_restored_from_its_pod(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``--kube``: the members are kmock emulators over real HTTP holding each job's pod as
    the launcher makes it; each start restores every job from its pod and requeues none,
    without a warning (a requeue, a launch or a failed collection would show here)."""
    assert main(["bench", "--restart", "--kube", "--jobs", "120", "--clusters", "3", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert (doc["jobs"], doc["jobs_back"], doc["states"], doc["inconsistent"]) == (
        120, 120, {"Running": 120}, 0,
    )  # fmt: skip
    assert doc["nodes_per_cluster"] == 5  # 40 one-GPU jobs a member, 8 GPUs a node
    for start in ("first_start", "after_kill"):
        row = doc[start]
        assert (row["rebuilt_jobs"], row["requeued"], row["restored"]) == (120, 0, 120)
        assert (row["problems"], row["first_problem"]) == (0, None)
