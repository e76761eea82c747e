"""A key given twice in a YAML mapping is refused like JSON's, never "the last one wins"
silently: in a manifest (a 400 naming the mapping's path, the key and both lines; both YAML
loaders), in the config file (its name, the key path), and by ``fedbroker submit -f``,
which would otherwise send the file on as JSON without the first value. One row per case,
the exact one-line message."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import yaml

from broker.cli.args import EXIT_USAGE
from broker.cli.main import main
from broker.config import ConfigError, parse_config
from broker.manifest import ManifestError, parse_manifest
from broker.manifest.documents import DuplicateKey
from broker.manifest.parsing import _NoAliasLoader, load_yaml

HEAD = "apiVersion: fedbroker.io/v1alpha1\nkind: FederatedJob\n"
POD_SET = "- name: w\n  count: 1\n  resources: {nvidia.com/gpu: 1}\n"


def job(spec: str = "spec:\n  podSets:\n" + textwrap.indent(POD_SET, "  "), **more: str) -> str:
    return HEAD + more.get("metadata", "metadata:\n  name: train\n") + spec


MANIFESTS: list[tuple[str, str, str | None]] = [
    ("at the top", HEAD + "kind: Job\nmetadata: {name: a}\n",
     'manifest: duplicate key "kind" in a YAML mapping (lines 2 and 3)'),
    ("in metadata", job(metadata="metadata:\n  name: a\n  name: b\n"),
     'metadata: duplicate key "name" in a YAML mapping (lines 4 and 5)'),
    ("in a list item", job("spec:\n  podSets:\n  - name: w\n    count: 1\n    count: 2\n"),
     'spec.podSets[0]: duplicate key "count" in a YAML mapping (lines 8 and 9)'),
    ("in a flow mapping, one line",
     job("spec:\n  podSets:\n  - {name: w, count: 1, resources: {cpu: '1', cpu: '2'}}\n"),
     'spec.podSets[0].resources: duplicate key "cpu" in a YAML mapping (line 7)'),
    ("quoted and plain", job(metadata='metadata:\n  name: a\n  labels: {"app": x, app: y}\n'),
     'metadata.labels: duplicate key "app" in a YAML mapping (line 5)'),
    ("equal once resolved", job(metadata="metadata:\n  name: a\n  labels:\n    1: x\n    0x1: y\n"),
     'metadata.labels: duplicate key "1" in a YAML mapping (lines 6 and 7)'),
    ("a key with dots",
     job(metadata="metadata:\n  name: a\n  labels:\n    a.b/c: x\n    a.b/c: y\n"),
     'metadata.labels: duplicate key "a.b/c" in a YAML mapping (lines 6 and 7)'),
    ("a flow document sniffed as YAML", "{apiVersion: v, kind: a, kind: b}",
     'manifest: duplicate key "kind" in a YAML mapping (line 1)'),
    ("a merged key overridden: YAML's own rule",
     job("spec:\n  podSets:\n  - <<: {name: w, count: 2}\n    count: 1\n"), None),
]  # fmt: skip


@pytest.mark.parametrize(("text", "message"), [m[1:] for m in MANIFESTS],
                         ids=[m[0] for m in MANIFESTS])  # fmt: skip
def test_a_manifest_key_given_twice_is_refused_naming_it(text: str, message: str | None) -> None:
    if message is None:
        assert parse_manifest(text.encode(), "application/yaml").metadata.name == "train"
        return
    with pytest.raises(ManifestError) as refused:
        parse_manifest(text.encode(), "application/yaml")
    assert str(refused.value) == message
    assert refused.value.path == message.split(":")[0]
    # The pure-Python loader (without libyaml) and the config's and CLI's say the same.
    for load in (lambda t: yaml.load(t, Loader=_NoAliasLoader), load_yaml):
        with pytest.raises(DuplicateKey) as same:
            load(text)
        assert same.value.message("manifest") == message


def test_a_json_key_given_twice_is_still_refused_as_json() -> None:
    with pytest.raises(ManifestError) as refused:
        parse_manifest(b'{"kind": "a", "kind": "b"}', "application/json")
    assert str(refused.value) == 'manifest: duplicate key "kind" in a JSON object'


CONFIG = """\
store: {url: "sqlite:///x.db"}
clusters:
- name: sim
  source: {simulated: {shapes: [{gpuType: A100, gpus: 8, cpu: "8", memory: 64Gi, count: 1}]}}
queues: [{name: training}]
tenants:
- name: team-a
  defaultQueue: training
  token: {value: plain-token-0123456789abcdef0123}
"""
CONFIGS: list[tuple[str, str, str | None]] = [
    ("a section", CONFIG + "store: {url: 'sqlite:///y.db'}\n",
     'ops.yaml: duplicate key "store" in a YAML mapping (lines 1 and 10)'),
    ("a tenant's token", CONFIG + "  token: {value: other-token-0123456789abcdef01234}\n",
     'ops.yaml: tenants[0]: duplicate key "token" in a YAML mapping (lines 9 and 10)'),
    ("a nested key", CONFIG.replace("{url:", "{url: 'sqlite:///z.db', url:"),
     'ops.yaml: store: duplicate key "url" in a YAML mapping (line 1)'),
    ("anchors and aliases, no duplicate",
     CONFIG.replace("queues: [{name: training}]", "queues: [&q {name: training}]"), None),
]  # fmt: skip


@pytest.mark.parametrize(("text", "message"), [c[1:] for c in CONFIGS],
                         ids=[c[0] for c in CONFIGS])  # fmt: skip
def test_a_config_key_given_twice_is_refused_with_file_and_path(
    text: str, message: str | None
) -> None:
    if message is None:
        assert parse_config(text, "ops.yaml", environ={}).queues[0].name == "training"
        return
    with pytest.raises(ConfigError) as refused:
        parse_config(text, "ops.yaml", environ={})
    assert str(refused.value) == message


@pytest.mark.parametrize("suffix", [".yaml", ".json"])
def test_submit_f_refuses_a_key_given_twice_before_sending(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], suffix: str
) -> None:
    path = tmp_path / f"job{suffix}"
    text = (
        job("spec:\n  podSets:\n  - name: w\n    count: 1\n    count: 2\n")
        if suffix == ".yaml"
        else '{"apiVersion": "v", "kind": "FederatedJob", "kind": "Job"}'
    )
    path.write_text(text)
    # No broker listens there: the file is refused before anything is sent.
    assert main(["submit", "-f", str(path), "--server", "http://127.0.0.1:9"]) == EXIT_USAGE
    err = capsys.readouterr().err
    where = (
        'spec.podSets[0]: duplicate key "count" in a YAML mapping (lines 8 and 9)'
        if suffix == ".yaml"
        else 'manifest: duplicate key "kind" in a JSON object'
    )
    assert err == f"fedbroker: error: {path}: {where}\n"
