"""The schemas admission ships (broker/manifest/schemas/*.json) are exactly what their
generator makes from the upstream sources today: the real CRDs in ``FEDBROKER_CRDS``
(../shared/crds) and the Kubernetes schemas kubernetes-validate ships; each names where it
came from. A source that changed without the data being generated again fails here."""

from __future__ import annotations

import json
from pathlib import Path

from crds import crds_dir
from services import unavailable

from broker.manifest import workloads
from broker.manifest.schemas import HERE, crds, kubernetes
from broker.manifest.schemas.generate import CRDS_FILE, KUBERNETES_FILE, main


def test_the_shipped_schemas_are_what_the_generator_makes_from_the_sources(
    tmp_path: Path,
) -> None:
    folder = crds_dir()
    if not (folder / "README.md").is_file():
        unavailable(f"the real CRDs are not at {folder} (set FEDBROKER_CRDS)")
    assert main(["--crds", str(folder), "--out", str(tmp_path)]) == 0
    for name in (KUBERNETES_FILE, CRDS_FILE):
        made = json.loads((tmp_path / name).read_text())
        shipped = json.loads((HERE / name).read_text())
        assert made == shipped, f"{name} is stale: run python -m broker.manifest.schemas.generate"


def test_every_workload_kind_has_a_schema_and_each_names_its_source() -> None:
    kinds = {f"{i.api_version}/{i.kind}" for i in workloads.INTEGRATIONS}
    assert kinds - set(crds()) == {"batch/v1/Job"}  # built in: Kubernetes' own JobSpec
    for key, entry in crds().items():
        source = entry["source"]
        assert source["repository"] and source["path"] and source["commit"], key
        assert source["file"].endswith(".yaml"), key
    source = kubernetes()["source"]
    assert source["package"] == "kubernetes-validate"
    assert source["kubernetes"].startswith("1.")
    assert "io.k8s.api.core.v1.PodTemplateSpec" in kubernetes()["$defs"]
