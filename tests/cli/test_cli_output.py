"""``-o`` on every printing command, ``--sort-by``, ``--limit`` with the count of the rest,
and an admin's ``--tenant``/``-A``, end to end: ``fedbroker ...`` (``main``, in a thread)
against a real Service behind a real HTTP server (tests/http/test_api.py's ``running``
harness: SQLite, simulated clusters, cycles driven by hand on a fake clock).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from test_api import TOKENS, Harness, manifest, running, settle
from test_cli_messages import Result, as_user, cli, write
from test_replay import NODES_CSV, PODS_CSV

from broker.cli import listing


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[tuple[Harness, str]]:
    async with running(tmp_path) as h:
        client = h[0]
        yield h, f"{client.host}:{client.port}"


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("FEDBROKER_SERVER", "FEDBROKER_TOKEN", "FEDBROKER_CA_FILE", "FEDBROKER_USER"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("FEDBROKER_RETRY_SECONDS", "0")


async def submitted(h: Harness, tenant: str, *names: str, run: bool = True) -> None:
    client, service, clock = h
    headers = {"Authorization": f"Bearer {TOKENS[tenant]}"}
    for name in names:
        doc = manifest(name, pods=1, gpus=2)
        assert (await client.post("/v1/jobs", json=doc, headers=headers)).status == 201
    if run:
        await service.schedule_once(clock.now)
        await settle(service)


def rows(out: str) -> list[list[str]]:
    return [line.split() for line in out.splitlines()]


def parsed(result: Result, output: str) -> Any:
    code, out, _ = result
    assert code == 0, result
    return json.loads(out) if output in ("json", "--json") else yaml.safe_load(out)


async def test_every_printing_command_prints_json_and_yaml_that_parse_back(
    served: tuple[Harness, str], capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    h, server = served
    await submitted(h, "team-a", "train", "gone-json", "gone-yaml", "gone---json")
    job = write(tmp_path, manifest("train", pods=1, gpus=2))
    commands = [
        ["submit", "-f", job], ["get", "train"], ["list"], ["explain", "train"],
        ["clusters"], ["pools"], ["pods", "train"],
    ]  # fmt: skip
    for argv in commands:
        docs = []
        for output in ("json", "yaml", "--json"):
            flags = ["--json"] if output == "--json" else ["-o", output]
            docs.append(parsed(await cli(capsys, *as_user(server, *argv, *flags)), output))
        assert isinstance(docs[0], dict) and docs[0], argv
        assert docs[0] == docs[1] == docs[2], argv
        code, out, _ = await cli(capsys, *as_user(server, *argv, "-o", "wide"))
        assert code == 0 and out.strip() and not out.startswith("{"), argv
    for output in ("json", "yaml", "--json"):
        flags = ["--json"] if output == "--json" else ["-o", output]
        name = f"gone-{output.strip('-')}" if output != "--json" else "gone---json"
        doc = parsed(await cli(capsys, *as_user(server, "cancel", name, *flags)), output)
        assert doc["metadata"]["name"] == name


async def test_simulate_and_bench_print_yaml_as_their_json(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    nodes, pods = tmp_path / "nodes.csv", tmp_path / "pods.csv"
    nodes.write_text(NODES_CSV)
    pods.write_text(PODS_CSV)
    simulate = ["simulate", "--nodes", str(nodes), "--pods", str(pods), "--policy", "binpack",
                "--loads", "80"]  # fmt: skip
    bench = ["bench", "--clusters", "2", "--nodes-per-cluster", "20", "--decisions", "6"]
    for argv in (simulate, bench):
        as_json = parsed(await cli(capsys, *argv, "--json"), "json")
        as_yaml = parsed(await cli(capsys, *argv, "-o", "yaml"), "yaml")
        assert isinstance(as_yaml, dict) and as_yaml.keys() == as_json.keys()
    assert as_yaml["decisions"] == 6 and as_yaml["clusters"] == 2


async def test_list_wide_and_all_tenants_show_the_tenant(
    served: tuple[Harness, str], capsys: pytest.CaptureFixture[str]
) -> None:
    h, server = served
    await submitted(h, "team-a", "train", "solo-a")
    await submitted(h, "team-b", "train", "only-b")
    code, out, _ = await cli(capsys, *as_user(server, "list", "-A", tenant="admin"))
    assert code == 0
    assert rows(out)[0] == ["NAME", "TENANT", "QUEUE", "STATE", "CLUSTER", "AGE", "REASON"]
    assert [r[:2] for r in rows(out)[1:]] == [
        ["train", "team-a"], ["solo-a", "team-a"], ["train", "team-b"], ["only-b", "team-b"],
    ]  # fmt: skip
    code, out, _ = await cli(capsys, *as_user(server, "list", "--tenant", "team-b", "-o", "wide",
                                              tenant="admin"))  # fmt: skip
    assert rows(out)[0] == ["NAME", "TENANT", "QUEUE", "STATE", "CLUSTER", "AGE", "PRIORITY",
                            "ATTEMPTS", "GENERATION", "REASON"]  # fmt: skip
    assert [r[1] for r in rows(out)[1:]] == ["team-b", "team-b"]
    code, out, _ = await cli(capsys, *as_user(server, "list", tenant="admin"))
    assert "TENANT" not in rows(out)[0] and len(rows(out)) == 5


async def test_an_admin_reaches_another_tenants_job(
    served: tuple[Harness, str], capsys: pytest.CaptureFixture[str]
) -> None:
    h, server = served
    await submitted(h, "team-a", "train")
    await submitted(h, "team-b", "train", "only-b")

    async def admin(*argv: str) -> Result:
        return await cli(capsys, *as_user(server, *argv, tenant="admin"))

    doc = json.loads((await admin("get", "train", "--tenant", "team-b", "-o", "json"))[1])
    assert doc["metadata"]["namespace"] == "team-b"
    for argv in (["get", "only-b", "-A"], ["explain", "only-b", "-A"],
                 ["pods", "only-b", "-A"], ["pods", "only-b", "--tenant", "team-b"],
                 ["logs", "only-b", "--tenant", "team-b", "--tail", "1"]):  # fmt: skip
        code, out, err = await admin(*argv)
        assert (code, err) == (0, ""), argv
        assert out.strip(), argv
    code, out, err = await admin("get", "train", "-A")
    assert (code, out) == (1, "")
    assert err == (
        "fedbroker: error: tenants team-a, team-b each have a job named 'train': pick one "
        "with --tenant\n"
    )
    code, _, err = await admin("get", "nosuch", "-A")
    assert code == 1 and "no tenant the token may read has a job named 'nosuch'" in err
    code, _, err = await admin("get", "train", "-A", "--tenant", "team-a")
    assert code == 2 and err == "fedbroker: error: --tenant and -A/--all-tenants: give one\n"
    code, out, _ = await admin("cancel", "only-b", "-A", "-o", "json")
    assert code == 0 and json.loads(out)["metadata"]["namespace"] == "team-b"
    # Another tenant's token: the broker ignores ?tenant= and means its own tenant.
    code, _, err = await cli(capsys, *as_user(server, "get", "only-b", "--tenant", "team-b"))
    assert code == 1 and err.startswith("fedbroker: error: 404 ")


async def test_sort_by_a_column_or_a_path(
    served: tuple[Harness, str], capsys: pytest.CaptureFixture[str]
) -> None:
    h, server = served
    await submitted(h, "team-a", "b-job", "c-job", "a-job")

    async def names(*argv: str) -> list[str]:
        code, out, err = await cli(capsys, *as_user(server, "list", *argv))
        assert (code, err) == (0, "")
        return [r[0] for r in rows(out)[1:]]

    assert await names() == ["b-job", "c-job", "a-job"]  # oldest first
    assert await names("--sort-by", "name") == ["a-job", "b-job", "c-job"]
    assert await names("--sort-by", ".metadata.name") == ["a-job", "b-job", "c-job"]
    assert await names("--sort-by", "AGE") == ["b-job", "c-job", "a-job"]
    code, out, _ = await cli(capsys, *as_user(server, "list", "--sort-by", "name", "-o", "json"))
    assert [j["metadata"]["name"] for j in json.loads(out)["items"]] == ["a-job", "b-job", "c-job"]
    code, out, err = await cli(capsys, *as_user(server, "list", "--sort-by", "colour"))
    assert (code, out) == (2, "")
    assert err.startswith("fedbroker: error: --sort-by colour: no such column (columns: NAME, ")
    code, out, _ = await cli(capsys, *as_user(server, "clusters", "--sort-by", ".gpuTypes.0.free",
                                              "-o", "json"))  # fmt: skip
    free = [c["gpuTypes"][0]["free"] for c in json.loads(out)["clusters"]]
    assert free == sorted(free) and len(free) == 2
    code, out, _ = await cli(capsys, *as_user(server, "clusters", "--sort-by", "cluster"))
    assert [r[0] for r in rows(out)[1:]] == sorted(r[0] for r in rows(out)[1:])


async def test_limit_says_how_many_more(
    served: tuple[Harness, str], capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    h, server = served
    await submitted(h, "team-a", *(f"job-{i}" for i in range(5)), run=False)
    code, out, err = await cli(capsys, *as_user(server, "list", "--limit", "2"))
    assert code == 0 and len(rows(out)) == 3
    assert err == (
        "fedbroker: 3 more jobs not shown: raise --limit (now 2, at most 1000) or narrow the "
        "list (--state, --queue, -l, --name)\n"
    )
    code, out, err = await cli(capsys, *as_user(server, "list", "--limit", "2", "-o", "json"))
    assert err == "" and json.loads(out)["continue"] is not None
    assert (await cli(capsys, *as_user(server, "list", "--limit", "5")))[2] == ""
    # The rest is counted a bounded number of pages far.
    monkeypatch.setattr(listing, "PAGE", 1)
    monkeypatch.setattr(listing, "MORE_PAGES", 2)
    code, _, err = await cli(capsys, *as_user(server, "list", "--limit", "1"))
    assert err.startswith("fedbroker: more than 2 more jobs not shown: ")


async def test_inspect_and_plan_print_yaml_as_their_json(
    kmock: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from test_kube_watch import NODES, PLAN_GANG, node_obj, write_kubeconfig

    kmock.objects[NODES, None, "n1"] = node_obj("n1", gpus=4)
    kc = str(write_kubeconfig(tmp_path / "kc", {"live": str(kmock.url)}))
    job = tmp_path / "job.yaml"
    job.write_text(PLAN_GANG.format(name="pair", pods=2, gpus=2))
    inspect = ["inspect", "--kubeconfig", kc, "--timeout", "2"]
    plan = ["plan", "-f", str(job), "--kubeconfig", kc, "--timeout", "2"]
    for argv in (inspect, plan):
        as_json = parsed(await cli(capsys, *argv, "--json"), "json")
        assert parsed(await cli(capsys, *argv, "-o", "yaml"), "yaml") == as_json
        assert parsed(await cli(capsys, *argv, "-o", "json"), "json") == as_json
    assert isinstance(as_json["fits"], bool) and as_json["clusters"][0]["cluster"] == "live"
