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
