"""``fedbroker submit -f`` with a plain workload object: wrapped into a FederatedJob named
after it, queue and priority from the flags or else its labels (the flag wins), the
broker's labels taken off; a bad priority label is one line naming the label."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from broker.cli.client import SUBMITTED_BY, ClientError, _request_for, submitter
from broker.manifest import parse_manifest, to_job

POD = {"spec": {"containers": [{"name": "m", "image": "t:1",
                                "resources": {"limits": {"nvidia.com/gpu": 1}}}]}}  # fmt: skip


def pytorchjob(labels: dict[str, str]) -> dict[str, Any]:
    replicas = {"Worker": {"replicas": 2, "template": POD}}
    return {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
            "metadata": {"name": "bert", "namespace": "ml", "labels": labels},
            "spec": {"pytorchReplicaSpecs": replicas}}  # fmt: skip


def submit(tmp_path: Path, doc: dict[str, Any], **flags: Any) -> dict[str, Any]:
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(doc))
    args = argparse.Namespace(command="submit", file=path, queue=None, priority=None)
    for key, value in flags.items():
        setattr(args, key, value)
    request = _request_for(args)
    assert request.content_type == "application/json"
    assert request.body is not None
    sent: dict[str, Any] = json.loads(request.body)
    return sent


LABELS = {"fedbroker.io/queue": "training", "fedbroker.io/priority": "5", "team": "nlp"}
CASES: list[tuple[str, dict[str, str], dict[str, Any], str | None, int | None]] = [
    ("labels", LABELS, {}, "training", 5),
    ("flags win", LABELS, {"queue": "batch", "priority": -3}, "batch", -3),
    ("neither", {"team": "nlp"}, {}, None, None),
]


@pytest.mark.parametrize(("labels", "flags", "queue", "priority"), [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])  # fmt: skip
def test_a_plain_object_is_wrapped(
    tmp_path: Path, labels: dict[str, str], flags: dict[str, Any], queue: str | None,
    priority: int | None,
) -> None:  # fmt: skip
    sent = submit(tmp_path, pytorchjob(labels), **flags)
    # The wrapper is labelled with who submitted it (``list --mine``); the object keeps its own.
    assert sent["metadata"] == {"name": "bert", "labels": {SUBMITTED_BY: submitter()}}
    assert sent["spec"].get("queue") == queue
    assert sent["spec"].get("priority") == priority
    assert sent["spec"]["workload"]["metadata"] == {"labels": {"team": "nlp"}}
    manifest = parse_manifest(json.dumps(sent).encode(), "application/json")
    job = to_job(manifest, "team-a", "default")
    assert [(ps.name, ps.count) for ps in job.pod_sets] == [("worker", 2)]


def test_a_bad_priority_label_is_one_line_naming_it(tmp_path: Path) -> None:
    with pytest.raises(ClientError) as refused:
        submit(tmp_path, pytorchjob({"fedbroker.io/priority": "high"}))
    assert "metadata.labels.fedbroker.io/priority: must be an integer" in str(refused.value)


def test_a_federated_job_is_sent_as_written(tmp_path: Path) -> None:
    """As written but for the submitter's label (``list --mine``), which a label of the
    manifest's own overrides; what does not parse is sent as it is (the broker says why)."""
    doc = {"apiVersion": "fedbroker.io/v1alpha1", "kind": "FederatedJob",
           "metadata": {"name": "x", "labels": {"team": "nlp"}},
           "spec": {"podSets": []}}  # fmt: skip
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(doc))
    args = argparse.Namespace(command="submit", file=path, queue=None, priority=None)
    request = _request_for(args)
    labels = {SUBMITTED_BY: submitter(), "team": "nlp"}
    assert request.body is not None and request.content_type == "application/json"
    assert json.loads(request.body) == {**doc, "metadata": {"name": "x", "labels": labels}}
    path.write_text("kind: FederatedJob\nmetadata: [")
    assert _request_for(args).body == path.read_bytes()
    path.write_text(yaml.safe_dump(doc))
    args.queue = "q"
    with pytest.raises(ClientError, match="--queue/--priority"):
        _request_for(args)
