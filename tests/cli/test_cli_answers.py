"""Answers the CLI used to get wrong, each checked as the user reads it: ``fedbroker ...``
(``main``, in a thread) against a real Service behind a real HTTP server (the harness of
tests/cli/test_cli_messages.py): the exit status, stdout and the one line on stderr."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_api import Harness, manifest, settle
from test_cli_messages import as_user, clean_env, cli, served, write

__all__ = ["clean_env", "served"]  # fixtures, used by name


async def running_job(served: tuple[Harness, str], capsys: pytest.CaptureFixture[str],
                      tmp_path: Path, name: str = "train") -> None:  # fmt: skip
    (_client, service, clock), server = served
    path = write(tmp_path, manifest(name, pods=1), f"{name}.yaml")
    assert (await cli(capsys, *as_user(server, "submit", "-f", path)))[0] == 0
    await service.schedule_once(clock.now)
    await settle(service)
    assert (await service.get("team-a", name)).state == "Running"


async def test_logs_of_a_container_the_pod_lacks_names_the_pods_containers(
    served: tuple[Harness, str], capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    await running_job(served, capsys, tmp_path)
    _, server = served
    code, out, err = await cli(capsys, *as_user(server, "logs", "train", "-c", "nosuch"))
    assert (code, out) == (1, "")
    assert err == (
        "fedbroker: error: pod 'train-worker-0' has no container 'nosuch' (its containers: main)\n"
    )
    code, _, err = await cli(capsys, *as_user(server, "logs", "train", "-p", "nosuch"))
    assert code == 1 and err == "fedbroker: error: no pod 'nosuch' in job 'train'\n"


async def test_api_errors_read_without_status_codes_or_lookup_labels(
    served: tuple[Harness, str], capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    _, server = served
    code, _, err = await cli(capsys, *as_user(server, "get", "nosuch"))
    assert (code, err) == (1, "fedbroker: error: job 'nosuch' not found\n")
    path = write(tmp_path, manifest("huge", pods=3))  # 3 x 8 GPUs: waits
    assert (await cli(capsys, *as_user(server, "submit", "-f", path)))[0] == 0
    code, _, err = await cli(capsys, *as_user(server, "pods", "huge"))
    assert code == 1 and err.startswith("fedbroker: error: job 'huge' is Queued; ")
    # A field error keeps its field: it says which input was wrong.
    code, _, err = await cli(capsys, *as_user(server, "list", "-l", "a in (b)"))
    assert code == 1 and err.startswith("fedbroker: error: selector: ")


async def test_https_against_a_plain_http_broker_says_it_does_not_speak_tls(
    served: tuple[Harness, str], capsys: pytest.CaptureFixture[str]
) -> None:
    _, server = served
    code, out, err = await cli(capsys, *as_user(f"https://{server}", "clusters"))
    assert (code, out) == (1, "")
    assert err == (
        f"fedbroker: error: the server at https://{server} does not speak TLS; "
        f"use http://{server}\n"
    )


async def test_clusters_shows_a_stale_cluster_as_stale(
    served: tuple[Harness, str], capsys: pytest.CaptureFixture[str]
) -> None:
    (_client, service, _clock), server = served
    service.ledger.set_stale("small-b", True)
    code, out, _ = await cli(capsys, *as_user(server, "clusters"))
    assert code == 0
    header, *rows = (line.split() for line in out.splitlines())
    assert header[:3] == ["CLUSTER", "STATE", "GPU"]
    assert {(row[0], row[1]) for row in rows} == {("small-a", "ready"), ("small-b", "stale")}


async def test_list_says_every_cluster_is_stale_when_none_can_be_asked(
    served: tuple[Harness, str], capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    (_client, service, clock), server = served
    for name in ("small-a", "small-b"):
        service.ledger.set_stale(name, True)
    path = write(tmp_path, manifest("train", pods=1))
    assert (await cli(capsys, *as_user(server, "submit", "-f", path)))[0] == 0
    await service.schedule_once(clock.now)
    code, out, _ = await cli(capsys, *as_user(server, "list"))
    assert code == 0
    row = out.splitlines()[1]
    assert row.split()[:3] == ["train", "training", "Queued"]
    assert row.endswith(
        "every cluster is stale (small-a, small-b): no placements until one reports"
    )
    _, out, _ = await cli(capsys, *as_user(server, "explain", "train"))
    assert out.count("ClusterStale") == 2


async def test_explain_of_a_running_job_says_where_with_no_empty_table(
    served: tuple[Harness, str], capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    await running_job(served, capsys, tmp_path)
    (_client, service, _clock), server = served
    cluster = (await service.get("team-a", "train")).cluster
    code, out, err = await cli(capsys, *as_user(server, "explain", "train"))
    assert (code, err) == (0, "")
    assert out.splitlines() == [
        f"train: Running on {cluster} (placed: it no longer waits for a cluster)",
        "  pods:  fedbroker pods train",
        "  logs:  fedbroker logs train",
        "  more:  fedbroker get train   (its history)",
    ]


async def test_top_once_down_a_pipe_fits_80_columns_with_every_figure_whole(
    served: tuple[Harness, str], capsys: pytest.CaptureFixture[str], tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    monkeypatch.delenv("COLUMNS", raising=False)  # not a terminal: rich's 80 columns
    await running_job(served, capsys, tmp_path)  # 8 of small-a's 16 A100s
    _, server = served
    code, out, err = await cli(capsys, *as_user(server, "top", "--once"))
    assert (code, err) == (0, "")
    lines = out.splitlines()
    assert max(len(line) for line in lines) <= 80
    [header] = [line for line in lines if line.startswith("CLUSTER")] or [out]
    assert header.split() == ["CLUSTER", "GPU", "TOTAL", "ALLOCATED", "RESERVED", "FREE",
                              "LARGEST", "GANG"]  # fmt: skip
    rows = {line.split()[0]: line.split() for line in lines if line.startswith("small-")}
    assert rows["small-a"][1:6] == ["A100", "16", "8", "0", "8"]
    assert rows["small-b"][1:6] == ["T4", "4", "0", "0", "4"]
