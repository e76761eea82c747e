"""docs/install.md's kind trial and its container image, checked as far as they can be
without docker or kind: the snippets parse as what they are given to (the broker's config,
``submit``'s admission, kind's config, a JSON patch), the names agree with what kind makes
(contexts ``kind-NAME``, nodes ``NAME-worker``, ``NAME-worker2``), every kustomization named
renders with ``kubectl kustomize`` (skipped without kubectl, as tests/deploy/test_deploy.py
does), and ``make -n image`` builds the image the kustomizations run, which an overlay's
``images:`` replaces. ``make test`` builds no image."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import textwrap
import tomllib
from pathlib import Path
from typing import Any

import yaml
from test_deploy import kubectl_or_skip, render
from test_install import make_dry_run

from broker.config import parse_config
from broker.config.members import KubeSource
from broker.manifest import admit_templates, parse_manifest, to_job

ROOT = Path(__file__).resolve().parents[2]
INSTALL = (ROOT / "docs" / "install.md").read_text()
VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
_FENCE = re.compile(r"^( *)```(\w+)\n(.*?)^\1```", re.M | re.S)


def section(title: str) -> str:
    start = INSTALL.index(f"\n## {title}")
    end = INSTALL.find("\n## ", start + 1)
    return INSTALL[start : end if end > 0 else None]


def blocks(text: str, language: str) -> list[str]:
    return [textwrap.dedent(m.group(3)) for m in _FENCE.finditer(text) if m.group(2) == language]


TRIAL = section("A trial on a local kind cluster, without GPUs")
SHELL = "\n".join(blocks(TRIAL, "sh")).replace("\\\n", " ")
YAMLS = [yaml.safe_load(b) for b in blocks(TRIAL, "yaml")]


def one(pattern: str, text: str = SHELL) -> str:
    found = re.findall(pattern, text)
    assert len(set(found)) == 1, (pattern, found)
    return str(found[0])


def doc_with(key: str, value: Any = None) -> dict[str, Any]:
    [doc] = [d for d in YAMLS if key in d and (value is None or d[key] == value)]
    return dict(doc)


KIND_NAME = one(r"kind create cluster --name (\S+)")
CONTEXT = f"kind-{KIND_NAME}"
WORKERS = [f"{KIND_NAME}-worker", f"{KIND_NAME}-worker2"]  # kind's names for two workers


def broker_config_text() -> str:
    [text] = [b for b in blocks(TRIAL, "yaml") if "clusters:" in b]
    return text


def test_the_kind_cluster_has_the_workers_the_commands_patch() -> None:
    config = doc_with("kind", "Cluster")
    assert config["apiVersion"] == "kind.x-k8s.io/v1alpha4"
    assert [n["role"] for n in config["nodes"]] == ["control-plane", "worker", "worker"]
    assert one(r"kind create cluster --name \S+ --config (\S+)") == "kind-trial/kind.yaml"
    assert one(r"for node in ([^;]+);").split() == WORKERS
    # every kubectl of the trial talks to the kind cluster, by its context or its kubeconfig
    for line in SHELL.splitlines():
        words = shlex.split(line, comments=True)
        if words[:1] == ["kubectl"]:
            assert f"--context {CONTEXT}" in line or "--kubeconfig" in line, line


def test_the_patch_advertises_the_gpus_the_broker_counts() -> None:
    patch = json.loads(one(r"--data-binary '([^']+)'"))
    [op] = patch
    assert op["op"] == "add"
    resource = op["path"].removeprefix("/status/capacity/").replace("~1", "/")
    assert op["path"].startswith("/status/capacity/")
    assert one(r"--request PATCH http://127\.0\.0\.1:(\d+)/api/v1/nodes/\$node/status") == one(
        r"proxy --port (\d+)"
    )
    source = kind_source()
    assert resource == source.gpu_resources[0]
    label = one(r"label node \$node ([^=\s]+)=")
    assert label == source.gpu_type_label
    assert int(op["value"]) == 8


def kind_source() -> KubeSource:
    config = parse_config(
        broker_config_text(), "docs/install.md", {"FEDBROKER_TOKEN_TEAM_A": "a" * 32}
    )
    [cluster] = config.clusters
    assert isinstance(cluster.source.kube, KubeSource)
    return cluster.source.kube


def test_the_broker_config_parses_and_names_the_kubeconfig_the_commands_write() -> None:
    source = kind_source()
    assert source.context == CONTEXT
    assert source.launch_mode == "pin"  # kind has no gang scheduler
    assert source.kubeconfig == one(rf"kind get kubeconfig --name {KIND_NAME} > (\S+)")
    assert one(r"config set-context (\S+) --user") == CONTEXT
    assert one(r"serve --config (\S+)") == "kind-trial/federation.yaml"


def test_the_job_is_admitted_and_fills_both_workers() -> None:
    manifest = parse_manifest(
        json.dumps(doc_with("kind", "FederatedJob")).encode(), "application/json"
    )
    job = to_job(admit_templates(manifest, "baseline", ["default"]), "team-a", "training")
    assert [(ps.count, ps.resources.gpus) for ps in job.pod_sets] == [(2, 8)]
    assert sum(ps.count * ps.resources.gpus for ps in job.pod_sets) == 8 * len(WORKERS)
    assert one(r"get (\S+)\s+#") == job.name == "kind-smoke"


def test_the_kustomizations_named_exist_and_render() -> None:
    targets = re.findall(r"apply -k (\S+)", SHELL)
    assert targets == ["deploy/kustomize/member-cluster"]
    kubectl = kubectl_or_skip()
    for target in targets:
        assert (ROOT / target / "kustomization.yaml").is_file()
        kinds = {d["kind"] for d in render(kubectl, target.removeprefix("deploy/kustomize/"))}
        assert {"ServiceAccount", "ClusterRoleBinding", "Secret"} <= kinds


def images(docs: list[dict[str, Any]]) -> set[str]:
    return {
        c["image"]
        for d in docs
        if d["kind"] == "Deployment"
        for c in d["spec"]["template"]["spec"]["containers"]
    }


def test_make_image_builds_what_the_kustomizations_run(tmp_path: Path) -> None:
    image = f"fedbroker:{VERSION}"
    assert make_dry_run(tmp_path, "image").split() == ["docker", "build", "-t", image, "."]
    assert "docker" not in make_dry_run(tmp_path, "test")
    assert one(r"kind load docker-image (\S+)", TRIAL.replace("\n", " ")) == image
    kubectl = kubectl_or_skip()
    for target in ("base", "overlays/sqlite", "overlays/postgres", "agent"):
        assert images(render(kubectl, target)) == {image}, target


def test_an_overlay_of_yours_sets_the_image(tmp_path: Path) -> None:
    [text] = blocks(section("The container image"), "yaml")
    doc = yaml.safe_load(text)
    [base] = doc["resources"]
    assert base.endswith("/deploy/kustomize/overlays/sqlite")
    # kustomize takes a relative path only, as the doc's is
    doc["resources"] = [os.path.relpath(ROOT / base.split("/", 2)[-1], tmp_path)]
    (tmp_path / "kustomization.yaml").write_text(yaml.safe_dump(doc))
    kubectl = kubectl_or_skip()
    done = subprocess.run(
        [kubectl, "kustomize", str(tmp_path)], capture_output=True, text=True, timeout=60,
        check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    [entry] = doc["images"]
    rendered = [d for d in yaml.safe_load_all(done.stdout) if d]
    assert images(rendered) == {f"{entry['newName']}:{entry['newTag']}"}
    edit = one(
        r"kustomize edit set image ([^\s`]+)", section("The container image").replace("\n", " ")
    )
    assert edit == f"fedbroker={entry['newName']}:{entry['newTag']}"


def test_nothing_names_a_placeholder_registry() -> None:
    for path in [ROOT / "Makefile", *sorted((ROOT / "deploy").rglob("*.yaml"))]:
        assert "example/fedbroker" not in path.read_text(), path
